"""Presence (lane B) against real Postgres and a spawned nats-server: writes
with a per-lane ttl, Upsert on a put and Remove at expiry or clear through
the ordinary session machinery, two lanes sharing one bucket, the reseed
and Reset after a NATS restart, cx.present after commit only, and every
boot refusal of the bucket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

import nats
import pytest
from nats.js.api import KeyValueConfig, StreamConfig

from service_engine import Database, Engine, ReadinessHandle
from service_engine.embedded import EmbeddedNats
from service_engine.lanes import (
    InvalidPresenceKey,
    PresenceBucketMissing,
    PresenceBucketNoMarkers,
    PresenceBucketNoMsgTtl,
    PresenceBucketNoTtl,
    PresenceBucketRefused,
    PresenceBucketTtlTooShort,
    PresenceWithoutNats,
    PresenceWithoutService,
)
from service_engine.lanes.presence.model import PresenceChange, PresenceFold
from service_engine.lanes.presence.runtime import REASON_PRESENCE_WATCH
from service_engine.messaging.nats import Nats
from service_engine.pipeline import Mutation
from service_engine.render import Remove, Reset, Upsert

from ..support.harness import assert_never, fast_engine_config, wait_until
from ..support.nats_support import engine_nats
from ..support.presence_support import (
    ALICE,
    SERVICE,
    OrgVisibility,
    Replica,
    Typing,
    key,
    presence_engine,
    provision,
    room,
)
from ..support.sample_cards import Principal

OUTAGE = 2.0
"""Seconds a NATS outage lasts where the scenario needs a key to expire in it."""


async def _until(replica: Replica, check: Callable[[Any], bool], what: str,
                 timeout: float = 10.0) -> Any:
    return await replica.until(check, timeout=timeout, what=what)


async def test_a_put_upserts_and_the_key_is_removed_at_its_ttl(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A presence put reaches a watching session as an Upsert, and the key's
    expiry (its lane's ttl as a per-key Nats-TTL, no store write) reaches it
    as a Remove at about the ttl, not before."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(db, conn) as lanes:
        replica = await lanes.attach("typing", room("r1"))
        assert await lanes.typing.put("r1.alice", {"who": "alice"})
        put_at = time.monotonic()
        upsert = await replica.next()
        assert isinstance(upsert, Upsert) and upsert.key == key("r1.alice")
        assert upsert.view == {"who": "alice"}
        removed = await replica.next(timeout=5)
        waited = time.monotonic() - put_at
        assert isinstance(removed, Remove) and removed.key == key("r1.alice")
        assert 0.8 <= waited <= 3.0, f"removed after {waited:.2f}s for a 1s ttl"
        assert replica.window == {}
        rows = await db.pool.fetchval(
            "SELECT count(*) FROM pg_stat_user_tables WHERE n_tup_ins > 0 "
            "AND schemaname NOT IN ('service_engine')"
        )
        assert rows == 0, "presence wrote to the store"


async def test_a_clear_removes_at_once_and_a_second_put_wins(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Last write wins (a second put replaces the view) and a clear is a
    Remove well before the ttl."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, typing_ttl=timedelta(seconds=30)
    ) as lanes:
        replica = await lanes.attach("typing", room("r1"))
        await lanes.typing.put("r1.bob", {"n": 1})
        await lanes.typing.put("r1.bob", {"n": 2})
        await _until(replica, lambda d: isinstance(d, Upsert) and d.view == {"n": 2}, "n=2")
        assert await lanes.typing.clear("r1.bob")
        removed = await replica.next(timeout=3)
        assert isinstance(removed, Remove) and removed.key == key("r1.bob")


async def test_two_lanes_with_different_ttls_share_one_bucket(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Two lanes of different lifetimes in one EPHEMERAL bucket: each key
    expires at its own lane's ttl (the 1 s lane is gone while the 3 s lane
    is still present), and each lane's sessions see only their lane."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(db, conn) as lanes:
        typing = await lanes.attach("typing", room("r1"))
        viewing = await lanes.attach("viewing", room("r1"))
        started = time.monotonic()
        await lanes.typing.put("r1.alice", {"typing": True})
        await lanes.viewing.put("r1.alice", {"viewing": True})
        assert isinstance(await typing.next(), Upsert)
        assert isinstance(await viewing.next(), Upsert)
        assert typing.window == {key("r1.alice"): {"typing": True}}
        assert viewing.window == {key("r1.alice"): {"viewing": True}}
        assert isinstance(await typing.next(timeout=5), Remove)
        typing_gone = time.monotonic() - started
        assert viewing.stream.pending() == 0, "the 3 s lane expired with the 1 s lane"
        assert isinstance(await viewing.next(timeout=6), Remove)
        viewing_gone = time.monotonic() - started
        assert typing_gone < 2.5 <= viewing_gone + 0.5
        assert viewing_gone - typing_gone >= 1.2, (typing_gone, viewing_gone)


async def test_nats_restart_reseeds_and_resets_with_the_expired_key_gone(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """After a NATS restart the watcher reseeds every lane from the bucket
    and Resets each presence session: a key that expired while NATS was down
    is repaired rather than served on (gone from the Reset, or removed right
    after it when the restarted server purges the key only after the reseed
    read it), a live key is kept, revisions stay contiguous."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, typing_ttl=timedelta(seconds=1), viewing_ttl=timedelta(seconds=60),
        nats_grace=timedelta(seconds=60),
    ) as lanes:
        typing = await lanes.attach("typing", room("r1"))
        viewing = await lanes.attach("viewing", room("r1"))
        await lanes.viewing.put("r1.bob", {"here": True})
        await viewing.next()
        await lanes.typing.put("r1.alice", {"typing": True})
        await typing.next()
        await asyncio.to_thread(nats_server.stop)
        await wait_until(lambda: not conn.reachable(), what="the outage")
        # The outage outlasts the 1 s key: it expires while NATS is down, so
        # no watcher ever saw its expiry marker.
        await asyncio.sleep(OUTAGE)
        await asyncio.to_thread(nats_server.start)
        await wait_until(conn.reachable, timeout=15, what="the reconnect")
        assert lanes.engine.lanes.presence_lanes is not None
        await wait_until(lambda: lanes.engine.lanes.presence_lanes.reseeds >= 1,  # type: ignore[union-attr]
                         what="the reseed")
        await _until(typing, lambda d: isinstance(d, Reset), "the typing Reset")
        if typing.window:
            assert typing.window == {key("r1.alice"): {"typing": True}}
            await _until(typing, lambda d: not typing.window, "the expired key's Remove")
        reset = await _until(viewing, lambda d: isinstance(d, Reset), "the viewing Reset")
        assert reset.views == {key("r1.bob"): {"here": True}}


# -- cx.present: after the commit only --------------------------------------------------------


async def test_cx_present_puts_after_commit_and_a_rolled_back_mutation_presents_nothing(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """cx.present writes once the mutation committed; a mutation that raises
    after cx.present (rolled back) presents nothing, on any session, ever."""
    await provision(nats_server)

    class Boom(Exception):
        pass

    async def typing_then_fail(cx: Mutation[Any], who: str) -> None:
        cx.present(lanes.typing, f"r1.{who}", {"who": who})
        raise Boom

    async def typing(cx: Mutation[Any], who: str) -> None:
        cx.present(lanes.typing, f"r1.{who}", {"who": who})

    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, typing_ttl=timedelta(seconds=30)
    ) as lanes:
        replica = await lanes.attach("typing", room("r1"))
        executor = lanes.engine.mutation_executor()
        with pytest.raises(Boom):
            await executor.ack(ALICE, typing_then_fail, "ghost")
        await executor.ack(ALICE, typing, "alice")
        # The bucket is watched in revision order: once the later write is
        # here, the rolled-back one would have been seen first.
        upsert = await replica.next()
        assert isinstance(upsert, Upsert) and upsert.key == key("r1.alice")
        assert replica.window == {key("r1.alice"): {"who": "alice"}}
        assert replica.stream.pending() == 0
        fold = cast(Any, lanes.engine.render.projector("typing").STORE).fold
        assert set(fold.entries) == {"r1.alice"}


async def test_a_bad_presence_key_is_refused_where_it_is_written(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A key the bucket cannot carry raises InvalidPresenceKey at cx.present
    (the mutation rolls back) and at a direct put, never silently after commit."""
    await provision(nats_server)

    async def bad(cx: Mutation[Any]) -> None:
        cx.present(lanes.typing, "r1.not a token", {"x": 1})

    async with engine_nats(nats_server) as conn, presence_engine(db, conn) as lanes:
        with pytest.raises(InvalidPresenceKey):
            await lanes.engine.mutation_executor().ack(ALICE, bad)
        with pytest.raises(InvalidPresenceKey):
            await lanes.typing.put("", {"x": 1})
        with pytest.raises(InvalidPresenceKey):
            await lanes.engine.present("typing", "a.>", {"x": 1})


# -- boot: bind-only, fail-loud ---------------------------------------------------------------


async def _kv(server: EmbeddedNats, **config: Any) -> None:
    client = await nats.connect(server.url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        await client.jetstream().create_key_value(
            KeyValueConfig(bucket=f"EPHEMERAL_{SERVICE}", history=1, **config)
        )
    finally:
        await client.close()


async def _stream(server: EmbeddedNats, **config: Any) -> None:
    client = await nats.connect(server.url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        name = f"EPHEMERAL_{SERVICE}"
        await client.jetstream().add_stream(StreamConfig(
            name=f"KV_{name}", subjects=[f"$KV.{name}.>"], max_msgs_per_subject=1,
            allow_rollup_hdrs=True, deny_delete=True, **config,
        ))
    finally:
        await client.close()


async def _refused(db: Database, conn: Nats, ttl: timedelta) -> tuple[BaseException, ReadinessHandle]:
    readiness = ReadinessHandle()
    config = fast_engine_config(SERVICE, lock_timeout=timedelta(seconds=1))
    engine = await Engine.boot(config, db, conn, readiness)
    engine.register_presence(Typing(), ttl)
    with pytest.raises(PresenceBucketRefused) as refused:
        await asyncio.wait_for(engine.run(), 10)
    return refused.value, readiness


@pytest.mark.parametrize(
    ("declare", "ttl", "error"),
    [
        (None, timedelta(seconds=5), PresenceBucketMissing),
        ("kv_no_ttl", timedelta(seconds=5), PresenceBucketNoTtl),
        ("stream_no_msg_ttl", timedelta(seconds=5), PresenceBucketNoMsgTtl),
        ("kv_no_markers", timedelta(seconds=5), PresenceBucketNoMarkers),
        ("kv", timedelta(seconds=120), PresenceBucketTtlTooShort),
    ],
)
async def test_boot_refuses_a_presence_bucket_that_cannot_serve_presence(
    db: Database, nats_server: EmbeddedNats, declare: str | None, ttl: timedelta,
    error: type[PresenceBucketRefused],
) -> None:
    """The engine binds EPHEMERAL_{service} and never creates it: absent, no
    TTL, refusing per-message TTL, writing no expiry markers, or a max_age
    below the longest lane's ttl each fail run() with their typed error and
    hold readiness DOWN under presence_bucket with the reason."""
    if declare == "kv_no_ttl":
        await _kv(nats_server, limit_marker_ttl=5)
    elif declare == "stream_no_msg_ttl":
        await _stream(nats_server, max_age=60, allow_msg_ttl=False)
    elif declare == "kv_no_markers":
        await _kv(nats_server, ttl=60)
    elif declare == "kv":
        await _kv(nats_server, ttl=60, limit_marker_ttl=5)
    async with engine_nats(nats_server) as conn:
        exc, readiness = await _refused(db, conn, ttl)
    assert type(exc) is error
    assert not readiness.is_up
    reasons = readiness.current().reasons
    assert "presence_bucket" in reasons and error.__name__ in reasons["presence_bucket"]
    if declare is not None:  # never created nor altered by the engine
        client = await nats.connect(nats_server.url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            info = await client.jetstream().stream_info(f"KV_EPHEMERAL_{SERVICE}")
            assert info.state.messages == 0
        finally:
            await client.close()
    else:
        client = await nats.connect(nats_server.url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            with pytest.raises(nats.js.errors.NotFoundError):
                await client.jetstream().stream_info(f"KV_EPHEMERAL_{SERVICE}")
        finally:
            await client.close()


async def test_presence_needs_nats_and_a_service(db: Database, nats_server: EmbeddedNats) -> None:
    """register_presence on an engine without NATS, or without a service (the
    bucket is EPHEMERAL_{service}), is refused at registration."""
    config = fast_engine_config(None, lock_timeout=timedelta(seconds=1))
    engine = await Engine.boot(config, db, None, ReadinessHandle())
    with pytest.raises(PresenceWithoutNats):
        engine.register_presence(Typing(), timedelta(seconds=5))
    async with engine_nats(nats_server) as conn:
        engine = await Engine.boot(config, db, conn, ReadinessHandle())
        with pytest.raises(PresenceWithoutService):
            engine.register_presence(Typing(), timedelta(seconds=5))


async def test_the_presence_dependency_and_counters_are_labelled(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """dependency_up{dependency="presence"} is 1 while the watcher watches;
    writes and folded changes are counted by lane, labelled service and pod."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(db, conn) as lanes:
        metrics = lanes.engine.metrics
        assert metrics.sample("service_engine_dependency_up", dependency="presence") == 1
        replica = await lanes.attach("typing", room("r1"))
        await lanes.typing.put("r1.alice", {"x": 1})
        await replica.next()
        assert metrics.sample(
            "service_engine_presence_writes_total", lane="typing", op="put", outcome="stored"
        ) == 1
        await wait_until(lambda: metrics.sample(
            "service_engine_presence_changes_total", lane="typing", op="upsert") == 1,
            what="the change counted")
        assert metrics.labels["service"] == SERVICE and metrics.labels["pod"]


# -- visibility and pods ------------------------------------------------------------------------


class OrgTyping(Typing):
    """Typing scoped by org: a row's cohort is its value's org."""

    NAME = "org_typing"
    VISIBILITY = OrgVisibility()


async def test_presence_honours_the_declared_visibility(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A presence lane with a declared Visibility serves each principal only
    the keys their cohorts admit, through the same cohort rule as every
    view: an Upsert for the org that sees it, nothing for the other."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, typing=OrgTyping(), typing_ttl=timedelta(seconds=30)
    ) as lanes:
        acme = await lanes.attach("org_typing", room("r1"), Principal("alice", frozenset({"acme"})))
        globex = await lanes.attach("org_typing", room("r1"), Principal("carol", frozenset({"globex"})))
        await lanes.typing.put("r1.bob", {"who": "bob", "org": "acme"})
        await lanes.typing.put("r1.dave", {"who": "dave", "org": "globex"})
        seen_by_acme, seen_by_globex = await acme.next(), await globex.next()
        assert isinstance(seen_by_acme, Upsert) and seen_by_acme.key == key("r1.bob")
        assert isinstance(seen_by_globex, Upsert) and seen_by_globex.key == key("r1.dave")
        await assert_never(lambda: acme.stream.pending() + globex.stream.pending() > 0,
                           what="a key crossing orgs")


async def test_every_pod_watches_the_bucket(db: Database, nats_server: EmbeddedNats) -> None:
    """A put through one pod reaches the sessions of another pod (each pod
    folds the bucket itself), and the expiry reaches both."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn_a, engine_nats(nats_server) as conn_b, \
            presence_engine(db, conn_a) as pod_a, presence_engine(db, conn_b) as pod_b:
        on_a = await pod_a.attach("typing", room("r1"))
        on_b = await pod_b.attach("typing", room("r1"))
        await pod_a.typing.put("r1.alice", {"who": "alice"})
        for replica in (on_a, on_b):
            upsert = await replica.next()
            assert isinstance(upsert, Upsert) and upsert.view == {"who": "alice"}
        for replica in (on_a, on_b):
            assert isinstance(await replica.next(timeout=5), Remove)


async def test_a_write_nats_does_not_take_is_dropped_and_counted_never_raised(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Loss tolerance: while NATS is down a put answers False at once (no
    wait on the outage), is counted dropped, and raises nothing; cx.present
    after a commit does the same without failing the committed mutation."""
    await provision(nats_server)

    async def typing(cx: Mutation[Any], who: str) -> None:
        cx.present(lanes.typing, f"r1.{who}", {"who": who})

    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, nats_grace=timedelta(seconds=60)
    ) as lanes:
        await asyncio.to_thread(nats_server.stop)
        await wait_until(lambda: not conn.reachable(), what="the outage")
        started = time.monotonic()
        assert await lanes.typing.put("r1.alice", {"who": "alice"}) is False
        assert time.monotonic() - started < 0.5
        outcome = await lanes.engine.mutation_executor().ack(ALICE, typing, "bob")
        assert type(outcome).__name__ == "Success", outcome
        dropped = lanes.engine.metrics.sample(
            "service_engine_presence_writes_total", lane="typing", op="put", outcome="dropped"
        )
        assert dropped == 2
        await asyncio.to_thread(nats_server.start)
        await wait_until(conn.reachable, timeout=15, what="the reconnect")


async def test_a_bucket_deleted_at_runtime_holds_down_and_recovers_when_recreated(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The presence bucket deleted under a running pod: the watcher holds
    readiness DOWN with the reason (the bucket is missing) and retries with
    a bounded backoff instead of stopping the pod; once the bucket is
    recreated the pod is UP again, its sessions get a Reset and new puts
    reach them."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, typing_ttl=timedelta(seconds=30)
    ) as lanes:
        typing = await lanes.attach("typing", room("r1"))
        await lanes.typing.put("r1.alice", {"n": 1})
        assert isinstance(await typing.next(), Upsert)
        client = await nats.connect(nats_server.url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            await client.jetstream().delete_stream(f"KV_EPHEMERAL_{SERVICE}")
        finally:
            await client.close()
        await wait_until(
            lambda: lanes.readiness.holds(REASON_PRESENCE_WATCH), what="the watcher DOWN"
        )
        detail = lanes.readiness.current().reasons[REASON_PRESENCE_WATCH]
        assert "PresenceBucketMissing" in detail, detail
        assert lanes.engine.lanes.presence_lanes is not None
        assert not lanes.engine.lanes.presence_lanes.seeded.is_set()
        await provision(nats_server)
        await wait_until(lambda: lanes.readiness.is_up, timeout=15, what="the pod UP again")
        reset = await _until(typing, lambda d: isinstance(d, Reset), "the Reset")
        assert reset.views == {}
        await lanes.typing.put("r1.bob", {"n": 2})
        upsert = await _until(typing, lambda d: isinstance(d, Upsert), "the new put")
        assert upsert.key == key("r1.bob") and upsert.view == {"n": 2}


class _ExplodingFold(PresenceFold):
    """A lane fold that raises once, on the first change of a ``boom`` key."""

    __slots__ = ("armed",)

    def __init__(self) -> None:
        super().__init__()
        self.armed = True

    def apply(self, change: PresenceChange) -> bool:
        if self.armed and change.key.endswith(".boom"):
            self.armed = False
            raise RuntimeError("the fold exploded")
        return super().apply(change)


async def test_a_fold_that_raises_is_retried_and_the_pod_keeps_serving(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A presence projector's fold raising in the watcher does not stop the
    pod: the failure is held DOWN with its reason and retried; the reseed
    repairs the lane (the key that broke the fold is in the Reset) and the
    pod is UP and watching again."""
    await provision(nats_server)
    projector = Typing()
    projector.STORE.fold = _ExplodingFold()
    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, typing_ttl=timedelta(seconds=30), typing=projector
    ) as lanes:
        watcher = lanes.engine.lanes.presence_lanes
        assert watcher is not None
        typing = await lanes.attach("typing", room("r1"))
        await lanes.typing.put("r1.boom", {"n": 1})
        await wait_until(lambda: watcher.failures >= 1, what="the watcher failure")
        assert "RuntimeError: the fold exploded" in (watcher.last_failure or "")
        reset = await _until(typing, lambda d: isinstance(d, Reset), "the Reset")
        assert reset.views == {key("r1.boom"): {"n": 1}}
        await wait_until(lambda: lanes.readiness.is_up, what="the pod UP again")
        assert lanes.engine.lanes.presence_lanes is watcher and watcher.failures == 1
        await lanes.typing.put("r1.bob", {"n": 2})
        upsert = await _until(typing, lambda d: isinstance(d, Upsert), "the next put")
        assert upsert.key == key("r1.bob")
