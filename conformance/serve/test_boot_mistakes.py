"""Setup mistakes are caught at boot or named, and writes stage their own
impacts (issue 33, 1a and 1b), on the tutorial's ``notes`` service against
real Postgres and NATS.

- a write through a store a registered projector reads stages its noun's
  impact by itself, one per ``(noun, key)`` (a cause replaces the causeless
  one); an impact on a noun no projector watches is refused where it is
  staged, and nothing commits;
- a served `Views` naming no registered projector fails ``graphql_app``
  with the name and the registered names;
- a registered store's table the app role cannot read or write holds the
  pod DOWN naming the GRANT to run;
- a migration altered after it was applied is refused naming the file,
  both digests and how to proceed;
- a committed write whose read after the commit fails answers
  ``success: true`` with the view null and the read's error on that field
  alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import asyncpg
import pytest
import strawberry

from examples.notes import SERVICE, Note, NotesView, NoteView, create_note
from service_engine import (
    Cause,
    CrudStore,
    Engine,
    EngineConfig,
    Mutation,
    MutationError,
    ReadinessHandle,
    connect_pool,
)
from service_engine.db.migrate import migrate, service_migrations
from service_engine.embedded import (
    APP_ROLE,
    EmbeddedNats,
    EmbeddedPostgres,
    ProvisionedDatabase,
    drop_database,
)
from service_engine.errors import (
    MigrationAltered,
    UnknownProjectorName,
    UnregisteredProjector,
    UnwatchedNoun,
)
from service_engine.graphql import (
    GraphQLContext,
    MutationResult,
    SliceFragment,
    Views,
    compose_service,
)
from service_engine.impacts.transport import CHANNEL
from service_engine.readiness import REASON_MISSING_GRANT
from service_engine.server import OrgMember, Passport, graphql_app

from ..reference.test_tutorial_notes import ALICE, notes_database
from ..support.example_support import Running, serving_engine
from ..support.harness import wait_until
from ..support.nats_support import engine_nats
from ..support.sample_counter import ImpactProbe

Info: TypeAlias = strawberry.Info[GraphQLContext[OrgMember], None]
principal_of = OrgMember.of


@contextlib.asynccontextmanager
async def notes_store(pg: EmbeddedPostgres) -> AsyncIterator[ProvisionedDatabase]:
    store = await notes_database(pg)
    try:
        yield store
    finally:
        await drop_database(pg, store.name)


async def as_superuser(pg: EmbeddedPostgres, database: str, *sql: str) -> Any:
    conn = await asyncpg.connect(pg.url(pg.SUPERUSER, pg.superuser_password, database))
    try:
        answer = None
        for statement in sql:
            answer = await conn.fetch(statement)
        return answer
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def booted(store: ProvisionedDatabase, readiness: ReadinessHandle | None = None,
                 *, register: bool = True) -> AsyncIterator[Engine]:
    """An engine over ``store`` with the notes slice registered (not running)."""
    db = await connect_pool(store.app_url, min_size=1, max_size=4)
    try:
        engine = await Engine.boot(EngineConfig(service="notes"), db, None,
                                   readiness or ReadinessHandle())
        if register:
            SERVICE.register(engine)
        yield engine
    finally:
        await db.aclose()


@contextlib.asynccontextmanager
async def impacts_of(engine: Engine) -> AsyncIterator[ImpactProbe]:
    probe = ImpactProbe()
    conn = await engine.db.connect_dedicated()
    try:
        await conn.add_listener(CHANNEL, probe._on_notify)
        yield probe
    finally:
        await conn.close()


# -- 1a: writes stage their own impacts ------------------------------------------------


async def test_a_write_stages_its_own_impact_once_per_key(pg_server: EmbeddedPostgres) -> None:
    """``cx.create`` and ``cx.save`` through the store ``NotesView`` reads
    stage the impact of ``note`` themselves; a hand-staged duplicate adds
    nothing, and a save's cause replaces the causeless impact of its key:
    the commit carries exactly one impact per key."""
    async with notes_store(pg_server) as store, booted(store) as engine:
        executor = engine.mutation_executor()
        principal = principal_of(ALICE)
        cause = Cause("note.edited", {"by": "alice"})

        async def write(cx: Mutation[Any]) -> None:
            await cx.create(Note("n1", "acme", "alice", "one"))
            cx.impact("note", "n1")  # a duplicate of the create's own
            await cx.create(Note("n2", "acme", "alice", "two"))
            note = await cx.load(Note, "n2")
            note.body = "two, edited"
            await cx.save(note, cause=cause)

        async with impacts_of(engine) as probe:
            assert not isinstance(await executor.execute(principal, write), MutationError)
            impacts = await probe.next()
        assert [(i.noun, i.key, i.cause) for i in impacts] == [
            ("note", "n1", None), ("note", "n2", cause),
        ]


async def test_an_impact_on_a_noun_no_projector_watches_is_refused(
    pg_server: EmbeddedPostgres,
) -> None:
    """A misspelt noun (``notes`` for ``note``) is refused with
    `UnwatchedNoun` where the handler stages it, naming the watched nouns,
    and the handler's write does not commit."""
    async with notes_store(pg_server) as store, booted(store) as engine:

        async def misspelt(cx: Mutation[Any]) -> None:
            await cx.create(Note("n1", "acme", "alice", "one"))
            cx.impact("notes", "n1")

        with pytest.raises(UnwatchedNoun) as refused:
            await engine.mutation_executor().execute(principal_of(ALICE), misspelt)
        assert refused.value.noun == "notes" and refused.value.watched == ("note",)
        assert "'notes'" in str(refused.value) and "'note'" in str(refused.value)
        assert await engine.db.pool.fetchval("SELECT count(*) FROM note") == 0


# -- 1b: mistakes caught at boot, or named ----------------------------------------------------


@strawberry.type
class GhostView:
    id: strawberry.ID


GHOSTS = Views("ghosts", GhostView)


@strawberry.type
class GhostQuery:
    @strawberry.field
    async def ghost(self, info: Info, id: strawberry.ID) -> GhostView | None:
        return await GHOSTS.one(info.context, str(id))


async def test_a_view_naming_no_registered_projector_fails_the_app(
    pg_server: EmbeddedPostgres,
) -> None:
    """A schema serving a `Views` of a projector the engine never registered
    is refused by ``graphql_app`` with `UnregisteredProjector`, naming it
    and the registered projectors."""

    service = compose_service([SliceFragment("ghosts", query=GhostQuery, types=(GhostView,))])
    async with notes_store(pg_server) as store, booted(store) as engine:
        with pytest.raises(UnregisteredProjector) as refused:
            graphql_app(engine, service.schema(), principal_of)
        assert refused.value.names == ("ghosts",)
        assert refused.value.registered == ("notes",)
        assert "'ghosts'" in str(refused.value) and "'notes'" in str(refused.value)
        graphql_app(engine, SERVICE.schema(), principal_of)  # names only registered ones


async def test_a_live_or_read_of_an_unknown_projector_names_the_registered_ones(
    pg_server: EmbeddedPostgres,
) -> None:
    """A `Live` or read built by hand with a name no projector has (never
    checked at boot) is refused with `UnknownProjectorName` naming the name
    and the registered projectors."""
    async with notes_store(pg_server) as store, booted(store) as engine:
        with pytest.raises(UnknownProjectorName) as refused:
            await engine.fetch("note", "n1", principal_of(ALICE))
        assert "'note'" in str(refused.value) and "registered projectors: 'notes'" in str(
            refused.value
        )


async def test_a_store_table_without_its_grant_holds_the_pod_down_naming_it(
    pg_server: EmbeddedPostgres,
) -> None:
    """With UPDATE and DELETE on ``note`` revoked from the app role, the pod
    runs but stays DOWN under ``missing_grant``, whose detail is the GRANT
    to run; the table fully granted again, a new pod goes UP."""
    async with notes_store(pg_server) as store:
        await as_superuser(pg_server, store.name,
                           f"REVOKE UPDATE, DELETE ON note FROM {APP_ROLE}")
        readiness = ReadinessHandle()
        async with booted(store, readiness) as engine:
            task = asyncio.create_task(engine.run())
            try:
                await wait_until(lambda: readiness.holds(REASON_MISSING_GRANT),
                                 what="readiness DOWN under missing_grant")
                detail = readiness.current().to_json()
                assert f"GRANT UPDATE, DELETE ON note TO {APP_ROLE}" in str(detail), detail
                assert not readiness.is_up
            finally:
                engine.shutdown()
                await asyncio.wait_for(task, 10)
        await as_superuser(pg_server, store.name,
                           f"GRANT SELECT, INSERT, UPDATE, DELETE ON note TO {APP_ROLE}")
        again = ReadinessHandle()
        async with booted(store, again, register=False) as engine, serving_engine(engine, graphql_app(engine, SERVICE)):
            assert again.is_up and not again.holds(REASON_MISSING_GRANT)


async def test_a_migration_altered_after_it_was_applied_says_how_to_proceed(
    pg_server: EmbeddedPostgres, tmp_path: Path,
) -> None:
    """Editing an applied migration's file is refused with `MigrationAltered`
    naming the file, the applied and the current SHA-256, and the way on (a
    new migration; in development, drop the database)."""
    async with notes_store(pg_server) as store:
        path = tmp_path / "1500_extra.sql"
        path.write_text("CREATE TABLE extra (id int);\n")
        conn = await asyncpg.connect(store.owner_url)
        try:
            assert await migrate(conn, service_migrations(tmp_path)) == [1500]
            applied = service_migrations(tmp_path)[0].checksum
            path.write_text("CREATE TABLE extra (id int, more text);\n")
            found = service_migrations(tmp_path)[0].checksum
            with pytest.raises(MigrationAltered) as refused:
                await migrate(conn, service_migrations(tmp_path))
        finally:
            await conn.close()
        message = str(refused.value)
        assert (refused.value.applied, refused.value.found) == (applied, found)
        for part in (str(path), applied, found, "new migration", "drop the database"):
            assert part in message, message


# -- a committed write is never answered as a failure -------------------------------------


class GuardedNoteStore(CrudStore[Note, str]):
    """A store of the note table, whose batched read also reads a table the
    app role may not: every read after the commit fails (42501), no write does."""

    TABLE = "note"
    AGGREGATE = Note

    async def read_many(self, conn: Any, keys: Sequence[str]) -> list[Note]:
        await conn.fetch("SELECT 1 FROM guarded")
        return await super().read_many(conn, keys)


class GuardedNotesView(NotesView):
    NAME = "guarded_notes"
    STORE = GuardedNoteStore()


GUARDED = Views(GuardedNotesView.NAME, NoteView)


@strawberry.type
class GuardedResult(MutationResult):
    note_id: strawberry.Private[str | None] = None
    note: NoteView | None = GUARDED.after_commit("note_id")


@strawberry.type
class GuardedMutation:
    @strawberry.mutation
    async def create_guarded_note(self, info: Info, body: str) -> GuardedResult:
        executor = info.context.engine.mutation_executor()
        outcome = await executor.execute(info.context.principal, create_note, body)
        if isinstance(outcome, MutationError):
            return GuardedResult.refused(outcome)
        return GuardedResult(success=True, note_id=outcome)


GUARDED_SERVICE = compose_service([
    SliceFragment("guarded", mutation=GuardedMutation, types=(NoteView, GuardedResult),
                  register=lambda engine: engine.register_projector(GuardedNotesView())),
])
CREATE = 'mutation { createGuardedNote(body: "kept") { success error { code } note { id } } }'


async def test_a_failed_read_after_the_commit_leaves_the_write_answered_as_committed(
    pg_server: EmbeddedPostgres, nats_server: EmbeddedNats,
) -> None:
    """The mutation commits its note, then the read of its view fails: the
    answer is ``success: true`` with ``note: null`` and one error, on the
    path ``createGuardedNote.note`` alone; the row is in the table."""
    async with notes_store(pg_server) as store:
        await as_superuser(pg_server, store.name, "CREATE TABLE guarded (id int)")
        db = await connect_pool(store.app_url)
        try:
            async with engine_nats(nats_server) as nats:
                readiness = ReadinessHandle()
                engine = await Engine.boot(EngineConfig(service="notes"), db, nats, readiness)
                GUARDED_SERVICE.register(engine)
                served = graphql_app(engine, GUARDED_SERVICE.schema(), principal_of)
                async with serving_engine(engine, served) as (addr, http):
                    run = Running(engine, db, GUARDED_SERVICE, readiness, addr, http)
                    answer = await run.post(CREATE, passport=Passport(sub="alice", org="acme"))
        finally:
            await db.aclose()
        assert answer["data"]["createGuardedNote"] == {
            "success": True, "error": None, "note": None,
        }, answer
        assert [e["path"] for e in answer["errors"]] == [["createGuardedNote", "note"]], answer
        rows = await as_superuser(pg_server, store.name, "SELECT body FROM note")
        assert [r["body"] for r in rows] == ["kept"]
