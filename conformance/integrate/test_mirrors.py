"""Mirrors against a real Postgres and a spawned nats-server: the boot read
before converged and the watch from its revision (a put in the gap
arrives), leader-gated projection and the standby's takeover, an empty
prefix holding DOWN while known_* is kept, the reconcile repairing a
hand-edited row, a stuck mirror dead-lettered once (s169), and two offers
merged by keyed_by."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from service_engine import Database, Engine, ReadinessHandle
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase, provision_buckets
from service_engine.errors import WorkerStopped
from service_engine.messaging.dead_letters import DeadLetters, DeadLetterSource
from service_engine.messaging.nats import KvBucket, Nats
from service_engine.mirrors.declaration import Merged, Mirror
from service_engine.mirrors.projection import Known, KnownScope, Projection
from service_engine.offers.model import Published

from ..support.harness import assert_never, fast_engine_config, owner_connection, wait_until
from ..support.nats_support import engine_nats

BUCKET = "twin_published"
TABLE = "known_sample_persons"


class PersonPublished(Published):
    BUCKET: ClassVar[str] = BUCKET
    PREFIX: ClassVar[str] = "twin.person"
    id: str
    name: str


@dataclass
class KnownSamplePerson(Known):
    TABLE: ClassVar[str] = TABLE
    id: str
    name: str


async def project_people(projection: Projection, key: Any, merged: Merged) -> None:
    person = merged.get(PersonPublished)
    if person is None:
        await projection.remove(KnownScope.of(KnownSamplePerson, id=key))
    else:
        await projection.replace_one(KnownSamplePerson(id=person.id, name=person.name))


def people_mirror(name: str = "sample_people") -> Mirror:
    return Mirror(name).consume(PersonPublished).keyed_by(lambda p: p.id).project(project_people)


@pytest.fixture
async def known_table(database: ProvisionedDatabase) -> None:
    async with owner_connection(database) as conn:
        await conn.execute(
            f"CREATE TABLE {TABLE} (id text PRIMARY KEY, name text NOT NULL);"
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO service_engine_app"
        )


@contextlib.asynccontextmanager
async def bucket_of(server: EmbeddedNats) -> AsyncIterator[tuple[Nats, KvBucket]]:
    await provision_buckets(server.url, [BUCKET])
    async with engine_nats(server) as conn:
        yield conn, await conn.bind_bucket(BUCKET)


def put(bucket: KvBucket, person: str, name: str) -> Any:
    return bucket.put(f"twin.person.{person}", PersonPublished(id=person, name=name).encode())


@contextlib.asynccontextmanager
async def pod(
    db: Database, conn: Nats, *mirrors: Mirror, pod_id: str = "pod-a", wait_up: bool = True,
    before_run: Any = None, **config: Any,
) -> AsyncIterator[tuple[Engine, ReadinessHandle]]:
    settings: dict[str, Any] = {"lock_timeout": timedelta(seconds=1), "pod_id": pod_id, **config}
    readiness = ReadinessHandle()
    engine = await Engine.boot(fast_engine_config("sample", **settings), db, conn, readiness)
    for mirror in mirrors:
        engine.register_mirror(mirror)
    if before_run is not None:
        before_run(engine)
    task = asyncio.create_task(engine.run())
    try:
        if wait_up:
            await wait_until(lambda: readiness.is_up, what=f"{pod_id} UP")
        yield engine, readiness
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, 10)


async def known(db: Database) -> dict[str, str]:
    rows = await db.pool.fetch(f"SELECT id, name FROM {TABLE}")
    return {r["id"]: r["name"] for r in rows}


@pytest.mark.usefixtures("known_table")
async def test_boot_read_before_converged_and_a_put_in_the_watch_gap_arrives(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The pod reports UP only after its boot read projected the prefix; a
    put landing between the boot read and the watch start is not lost (the
    watch resumes from the boot read's revision), and a retract is mirrored
    as a delete."""
    async with bucket_of(nats_server) as (conn, bucket):
        await put(bucket, "p1", "Ann")
        await put(bucket, "p2", "Bob")

        def gap(engine: Engine) -> None:
            async def put_in_gap() -> None:
                await put(bucket, "p3", "Cy")

            engine.mirror("sample_people").boot_hook = put_in_gap

        async with pod(db, conn, people_mirror(), before_run=gap) as (engine, _):
            assert {"p1", "p2"} <= (await known(db)).keys()

            async def all_three() -> bool:
                return await known(db) == {"p1": "Ann", "p2": "Bob", "p3": "Cy"}

            await wait_until(all_three, what="the put from the gap mirrored")
            await bucket.delete("twin.person.p2")

            async def retracted() -> bool:
                return await known(db) == {"p1": "Ann", "p3": "Cy"}

            await wait_until(retracted, what="the retract mirrored")
            shadow = engine.mirror("sample_people").shadow(PersonPublished)
            assert sorted(p.id for p in shadow.values()) == ["p1", "p3"]

            def mirrors_up() -> bool:
                # The gauge is set on the beat, not by the projection itself.
                up = engine.metrics.sample("service_engine_dependency_up", dependency="mirrors")
                return bool(up == 1)

            await wait_until(mirrors_up, what="dependency_up{mirrors} set by the beat")


@pytest.mark.usefixtures("known_table")
async def test_only_the_leader_projects_and_the_standby_re_projects_on_takeover(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Two pods mirror one prefix; only the lease holder writes known_*. A
    change inside the failover window (the leader gone, its lease not yet
    taken) reaches known_* once the standby takes over and re-projects its
    shadow."""
    async with bucket_of(nats_server) as (conn, bucket):
        await put(bucket, "p1", "Ann")
        async with contextlib.AsyncExitStack() as leader:
            await leader.enter_async_context(pod(db, conn, people_mirror(), pod_id="pod-a"))
            async with pod(db, conn, people_mirror(), pod_id="pod-b") as (standby, ready_b):
                assert ready_b.is_up  # a standby converges on the leader's watermark
                assert await _holder(db) == "pod-a"
                assert not standby.mirror("sample_people").projected.is_set()
                await leader.aclose()  # pod-a goes; as if it died, its lease stays live 1s
                await db.pool.execute(
                    "UPDATE service_engine.leader_slot SET holder = 'pod-a', "
                    "expires_at = clock_timestamp() + interval '1 second' "
                    "WHERE slot = 'mirror:sample_people'"
                )
                await standby_window(db, bucket, standby)


async def _holder(db: Database) -> str:
    holder: str = await db.pool.fetchval(
        "SELECT holder FROM service_engine.leader_slot WHERE slot = 'mirror:sample_people'"
    )
    return holder


async def standby_window(db: Database, bucket: KvBucket, standby: Engine) -> None:
    await put(bucket, "p2", "Bob")

    async def shadowed() -> bool:
        shadow = standby.mirror("sample_people").shadow(PersonPublished)
        return shadow.get("twin.person.p2") is not None

    await wait_until(shadowed, what="the standby's shadow current")

    async def taken_over() -> bool:
        return await known(db) == {"p1": "Ann", "p2": "Bob"}

    await wait_until(taken_over, what="the standby taking over and re-projecting")
    assert await _holder(db) == "pod-b"


@pytest.mark.usefixtures("known_table")
async def test_an_empty_prefix_holds_down_and_keeps_known(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A prefix that reads empty at boot holds readiness DOWN naming it and
    leaves known_* as it is; once it has keys the pod converges; a retract
    that would empty it again holds DOWN and keeps both known_* and the
    shadow, never projecting to empty."""
    await db.pool.execute(f"INSERT INTO {TABLE} VALUES ('old', 'Kept')")
    async with (
        bucket_of(nats_server) as (conn, bucket),
        pod(db, conn, people_mirror(), wait_up=False) as (engine, readiness),
    ):
        reason = "mirror:sample_people:empty"
        await wait_until(lambda: readiness.holds(reason), what="DOWN on the empty prefix")
        assert "twin_published/twin.person" in readiness.current().reasons[reason]
        assert await known(db) == {"old": "Kept"}

        await put(bucket, "p1", "Ann")
        await wait_until(lambda: readiness.is_up, what="UP once the prefix has a key")
        assert (await known(db))["p1"] == "Ann"

        await bucket.delete("twin.person.p1")
        await wait_until(lambda: readiness.holds(reason), what="DOWN on the emptying retract")
        await assert_never(
            lambda: _missing(db, "p1"), within=0.5, what="known_* projected to empty"
        )
        shadow = engine.mirror("sample_people").shadow(PersonPublished)
        assert shadow.get("twin.person.p1") is not None


async def _missing(db: Database, person: str) -> bool:
    return person not in await known(db)


@pytest.mark.usefixtures("known_table")
async def test_the_reconcile_repairs_a_hand_edited_known_row(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A known_* row edited behind the mirror's back is put back from the
    shadow by the periodic reconcile (``mirror_reconcile``)."""
    async with bucket_of(nats_server) as (conn, bucket):
        await put(bucket, "p1", "Ann")
        async with pod(db, conn, people_mirror(), mirror_reconcile=timedelta(milliseconds=300)):
            await db.pool.execute(f"UPDATE {TABLE} SET name = 'Mallory' WHERE id = 'p1'")
            await db.pool.execute(f"DELETE FROM {TABLE} WHERE id <> 'p1'")

            async def repaired() -> bool:
                return await known(db) == {"p1": "Ann"}

            await wait_until(repaired, what="the reconcile repairing the row")


@pytest.mark.usefixtures("known_table")
async def test_s169_a_stuck_mirror_is_dead_lettered_once_through_the_worker_and_beat(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s169: a mirror whose projection keeps failing restarts with backoff;
    past its restart threshold the beat re-records its one dead letter on
    every beat (one row, many occurrences) and dead_letters_total{source}
    counts it once; a genuinely distinct stuck mirror still counts."""

    async def broken(projection: Projection, key: Any, merged: Merged) -> None:
        raise RuntimeError("projection bug")

    def stuck(name: str) -> Mirror:
        return Mirror(name).consume(PersonPublished).keyed_by(lambda p: p.id).project(broken)

    async with bucket_of(nats_server) as (conn, bucket):
        await put(bucket, "p1", "Ann")
        config: dict[str, Any] = {
            "mirror_failure_threshold": 2,
            "mirror_restart_backoff": timedelta(milliseconds=20),
            "mirror_restart_backoff_cap": timedelta(milliseconds=60),
        }
        async with pod(db, conn, stuck("stuck_one"), stuck("stuck_two"), wait_up=False,
                       **config) as (engine, readiness):
            store = DeadLetters(db)

            async def re_recorded() -> bool:
                letters = await store.list(DeadLetterSource.MIRROR)
                return len(letters) == 2 and all(d.occurrences >= 3 for d in letters)

            await wait_until(re_recorded, what="both stuck mirrors re-recorded on the beat")
            letters = await store.list(DeadLetterSource.MIRROR)
            assert {d.work for d in letters} == {"stuck_one", "stuck_two"}
            assert "projection bug" in letters[0].detail
            assert engine.metrics.sample(
                "service_engine_dead_letters_total", source="Mirror"
            ) == 2
            assert readiness.holds("mirror:stuck_one")
            assert engine.metrics.sample("service_engine_dependency_up", dependency="mirrors") == 0


@pytest.mark.usefixtures("known_table")
async def test_a_standby_converges_on_an_idle_leader_without_waiting_for_a_projection(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A change the leader applies with nothing to project (an equal re-put)
    still advances its watermark, so a standby whose boot read reached that
    revision converges at once, not at the leader's next projection or
    reconcile (set to an hour here)."""
    async with bucket_of(nats_server) as (conn, bucket):
        await put(bucket, "p1", "Ann")
        hour = timedelta(hours=1)
        async with pod(db, conn, people_mirror(), pod_id="pod-a", mirror_reconcile=hour):
            assert await known(db) == {"p1": "Ann"}
            revision = await put(bucket, "p1", "Ann")  # equal value: nothing to project

            async def advanced() -> bool:
                mark = await db.pool.fetchval(
                    "SELECT revision FROM service_engine.mirror_watermark"
                    " WHERE mirror = 'sample_people'"
                )
                return mark is not None and int(mark) >= revision

            await wait_until(advanced, what="the idle leader's watermark at the re-put")
            async with pod(
                db, conn, people_mirror(), pod_id="pod-b", mirror_reconcile=hour
            ) as (standby, ready_b):
                assert ready_b.is_up
                assert not standby.mirror("sample_people").projected.is_set()


@pytest.mark.usefixtures("known_table")
async def test_one_transient_failure_of_a_converged_mirror_keeps_readiness(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A converged mirror whose projection fails once restarts (self-heal)
    without taking readiness DOWN, and the change reaches known_*."""
    failed = asyncio.Event()

    async def once(projection: Projection, key: Any, merged: Merged) -> None:
        if key == "p2" and not failed.is_set():
            failed.set()
            raise RuntimeError("a transient projection failure")
        await project_people(projection, key, merged)

    mirror = Mirror("flaky").consume(PersonPublished).keyed_by(lambda p: p.id).project(once)
    async with bucket_of(nats_server) as (conn, bucket):
        await put(bucket, "p1", "Ann")
        config: dict[str, Any] = {
            "mirror_failure_threshold": 3,
            "mirror_restart_backoff": timedelta(seconds=1),
        }
        async with pod(db, conn, mirror, **config) as (engine, readiness):
            supervisor = engine.mirrors.supervisors["flaky"]
            await put(bucket, "p2", "Bob")
            await asyncio.wait_for(failed.wait(), 10)
            await wait_until(lambda: supervisor.restarts >= 1, what="the mirror restarted")
            assert not readiness.holds("mirror:flaky"), "a transient failure flapped readiness"

            async def healed() -> bool:
                return await known(db) == {"p1": "Ann", "p2": "Bob"}

            await wait_until(healed, what="the change projected after the restart")
            assert readiness.is_up


ROLE_BUCKET = "other_published"
ROLES_TABLE = "known_sample_person_roles"


class RolePublished(Published):
    """A second service's offer about the same people: the role it gives one."""

    BUCKET: ClassVar[str] = ROLE_BUCKET
    PREFIX: ClassVar[str] = "other.role"
    id: str
    role: str


@dataclass
class KnownSamplePersonRole(Known):
    TABLE: ClassVar[str] = ROLES_TABLE
    id: str
    name: str
    role: str | None


async def project_roles(projection: Projection, key: Any, merged: Merged) -> None:
    person, role = merged.get(PersonPublished), merged.get(RolePublished)
    if person is None:  # a role alone names no one this service knows
        await projection.remove(KnownScope.of(KnownSamplePersonRole, id=key))
    else:
        await projection.replace_one(KnownSamplePersonRole(
            id=person.id, name=person.name, role=None if role is None else role.role,
        ))


@pytest.fixture
async def roles_table(database: ProvisionedDatabase) -> None:
    async with owner_connection(database) as conn:
        await conn.execute(
            f"CREATE TABLE {ROLES_TABLE} (id text PRIMARY KEY, name text NOT NULL, role text);"
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {ROLES_TABLE} TO service_engine_app"
        )


async def known_roles(db: Database) -> dict[str, tuple[str, str | None]]:
    rows = await db.pool.fetch(f"SELECT id, name, role FROM {ROLES_TABLE}")
    return {r["id"]: (r["name"], r["role"]) for r in rows}


@pytest.mark.usefixtures("roles_table")
async def test_mirror_merges_two_offers_over_nats(db: Database, nats_server: EmbeddedNats) -> None:
    """A mirror consuming two offers (two buckets of two producers) merges
    their values under one key by ``keyed_by``: the projection sees both
    offers' current value for a person, at the boot read and on every later
    put or retract of either one, and known_* follows the merge (a person
    with no role has none; a role for no known person projects nothing; a
    retracted person goes though their role stays)."""
    await provision_buckets(nats_server.url, [BUCKET, ROLE_BUCKET])
    async with engine_nats(nats_server) as conn:
        people, roles = await conn.bind_bucket(BUCKET), await conn.bind_bucket(ROLE_BUCKET)

        def give(person: str, role: str) -> Any:
            return roles.put(f"other.role.{person}", RolePublished(id=person, role=role).encode())

        await put(people, "p1", "Ann")
        await put(people, "p2", "Bob")
        await give("p1", "admin")
        await give("p3", "viewer")
        mirror = (
            Mirror("sample_roles").consume(PersonPublished).consume(RolePublished)
            .keyed_by(lambda value: value.id).project(project_roles)
        )
        async with pod(db, conn, mirror):
            # UP only once the boot read of both prefixes is projected.
            assert await known_roles(db) == {"p1": ("Ann", "admin"), "p2": ("Bob", None)}
            expected = await known_roles(db)
            for change, effect in (
                (lambda: put(people, "p3", "Cy"), {"p3": ("Cy", "viewer")}),
                (lambda: give("p2", "editor"), {"p2": ("Bob", "editor")}),
                (lambda: roles.delete("other.role.p1"), {"p1": ("Ann", None)}),
            ):
                await change()
                expected.update(effect)
                await wait_until(_known_roles_now(db, dict(expected)), what=f"known_* after {effect}")
            await people.delete("twin.person.p2")
            del expected["p2"]
            await wait_until(lambda: _known_roles_are(db, expected), what="p2 retracted")


async def _known_roles_are(db: Database, want: dict[str, tuple[str, str | None]]) -> bool:
    return await known_roles(db) == want


def _known_roles_now(
    db: Database, want: dict[str, tuple[str, str | None]]
) -> Callable[[], Awaitable[bool]]:
    return lambda: _known_roles_are(db, want)
