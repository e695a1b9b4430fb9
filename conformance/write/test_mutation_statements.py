"""What one GraphQL mutation sends to Postgres, statement by statement.

The reference service's ``renameBoard`` over HTTP, on a pool whose every
connection logs its statements; only the statements sent on behalf of the
request itself are kept (its context is marked by an ASGI wrapper: the
driver calls its query logger in the context of the statement), so the
offer drain, the render side and the beat are not counted there. The offer
drain's own pass is pinned separately, driven by hand on a logged pool.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import httpx
import pytest

from example_service.graphql import build_app
from example_service.register import register
from example_service.slices import compose
from example_service.slices.board.commands import create_board, rename_board
from example_service.slices.board.offer import BOARD_BUCKET, BoardOffer
from service_engine import (
    Database,
    Engine,
    Mutation,
    MutationExecutor,
    ReadinessHandle,
    Success,
    connect_pool,
)
from service_engine.blobs.staging import BlobStaging, NewBlob, blob_statement, stage_blobs
from service_engine.clock import SystemClock, Timestamp
from service_engine.commands import CommandConfig, CommandOutcome, CommandRunner
from service_engine.db.errors import ConstraintViolation, Stage
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.graphql import PASSPORT_HEADER, Passport
from service_engine.impacts.model import Impact
from service_engine.impacts.transport import schedule_in, schedule_statement
from service_engine.messaging.envelope import (
    Actor,
    EventMetadata,
    OutboundMessage,
    build_event,
)
from service_engine.offers.drain import OfferDrain, OfferDrainBounds
from service_engine.offers.model import register_offer_type
from service_engine.offers.staging import DirtyMark, dollar_quoted, offer_dirty_statement
from service_engine.outbox.staging import OutboxRow, outbox_statement, write_outbox
from service_engine.persistence import CrudStore
from service_engine.pipeline.run import run_pipeline
from service_engine.scheduled.staging import (
    scheduled_message_statement,
    stage_scheduled_message,
)

from ..blackbox.harness import provision_kv
from ..support.example_support import example_config, person, serving_engine
from ..support.harness import Statements, owner_connection, wait_until
from ..support.nats_support import engine_nats
from ..support.sample_commands import ALICE, COMMANDS
from ..support.sample_commands import executor_for as commands_executor_for
from ..support.sample_counter import WRITER, CrudCounter, create_counter, executor_for, increment
from ..support.sample_orders import SERVICE, OrderPlaced

ADMIN = Passport(sub="root", org="acme", roles=("board:archive",))
CREATE = ("mutation($id: ID, $title: String!) { createBoard(id: $id, title: $title) "
          "{ success error { code } } }")
RENAME = ("mutation($id: ID!, $title: String!) { renameBoard(id: $id, title: $title) "
          "{ success error { code } } }")
RENAME_WITH_BOARD = ("mutation($id: ID!, $title: String!) { renameBoard(id: $id, title: $title) "
                     "{ success error { code } board { id title } } }")
BOUND = 10.0

RENAME_ROUND_TRIPS = 5
"""A ``renameBoard`` over HTTP, its board not selected: the principal fact's
read (released without the pool's reset); BEGIN + lock bound; the
``RenameBoard`` command's one call (its board lock and row, its permit, the
title's claim and release, the UPDATE: the compiled function); the org
projection's advisory lock, its RLS context (the store's ``settings``) and
its UPDATE (no separate row pin: a CrudStore's UPDATE locks the row) in one
batch; the impacts' NOTIFY, the offer's dirty mark (and its NOTIFY), COMMIT
and the release reset in one round trip. Nothing after COMMIT. (21 before
the first round of issue 11, 11 before the second, 8 with the interpreted
command, 7 with the projection's lock, context and write apart.)"""

CREATE_ROUND_TRIPS = 4
"""A ``createBoard``: the principal fact's read; BEGIN + lock bound; the
``CreateBoard`` command's one call; then the org projection's lock, RLS
context and INSERT (a blind insert: it waits for the next statement) with
the impacts' NOTIFY, the offer's dirty mark, COMMIT and the release reset.
(5 with the projection's insert in a round trip of its own.)"""

DRAIN_PASS_ROUND_TRIPS = 4
"""One offer-drain pass over one dirty key, between lease renewals: the
claim, the lease check before the image, the image read, the fenced settle
(each one statement on one connection, no BEGIN/COMMIT, no reset). (17
before: the lease acquire and its reset, then three fenced transactions of
BEGIN, lease assert, statement, COMMIT and reset each.)"""

_REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)


class RequestStatements(Statements):
    """The statements sent while serving a marked HTTP request."""

    def __call__(self, record: Any) -> None:
        if _REQUEST.get() is not None:
            super().__call__(record)



@contextlib.asynccontextmanager
async def served(
    store: ProvisionedDatabase, nats_server: EmbeddedNats, statements: RequestStatements,
    engines: list[Engine] | None = None, drain_bounds: dict[str, Any] | None = None,
) -> AsyncIterator[httpx.AsyncClient]:
    """The board slice on an engine with NATS (its offer registered), its
    pool logging, every HTTP request's context marked."""
    await provision_kv(nats_server.url)
    # Every connection opened up front: a connection the pool opens while a
    # measured request runs (a busy machine) would add its own statements.
    db = await connect_pool(store.app_url, min_size=10, max_size=10, setup=statements.setup)
    try:
        async with engine_nats(nats_server) as nats:
            engine = await Engine.boot(example_config(), db, nats, ReadinessHandle())
            service = compose(("board",))
            register(engine, service)
            if engines is not None:
                engines.append(engine)
            if drain_bounds is not None and engine.offers.drain is not None:
                engine.offers.drain.bounds = replace(engine.offers.drain.bounds, **drain_bounds)
            app = build_app(engine, service)

            async def marked(scope: Any, receive: Any, send: Any) -> None:
                token = _REQUEST.set(scope.get("path")) if scope["type"] == "http" else None
                try:
                    await app(scope, receive, send)
                finally:
                    if token is not None:
                        _REQUEST.reset(token)

            async with serving_engine(engine, marked) as (_, http):
                yield http
    finally:
        await db.aclose()


async def _gql(http: httpx.AsyncClient, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    response = await http.post("/graphql", json={"query": query, "variables": variables},
                               headers={PASSPORT_HEADER: ADMIN.to_header()})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert not body.get("errors"), body
    data: dict[str, Any] = body["data"]
    return data


async def test_a_rename_over_graphql_takes_its_pinned_round_trips(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A ``renameBoard`` whose result does not select the board: the
    statements are the transaction's own (BEGIN, the ``RenameBoard``
    command's one call taking the board's lock and row, the title's claim
    and release, the org projection's lock and write, the impacts' NOTIFY,
    the offer's dirty mark and the reset in COMMIT's) after the principal
    fact's read, and nothing is sent once COMMIT returned (no read of a view
    nobody selected)."""
    statements = RequestStatements()
    async with served(store, nats_server, statements) as http:
        assert (await _gql(http, CREATE, {"id": "b-1", "title": "t0"}))["createBoard"]["success"]
        for n in range(12):  # every pool connection past its type introspection
            await _gql(http, RENAME, {"id": "b-1", "title": f"warm {n}"})
        statements.take()
        renamed = await _gql(http, RENAME, {"id": "b-1", "title": "plan"})
        assert renamed["renameBoard"] == {"success": True, "error": None}
        sent = statements.take_own()
    assert len(sent) == RENAME_ROUND_TRIPS, "\n".join(sent)
    assert sent[0].startswith("SELECT person, board_id FROM board_member")  # a batch of one
    assert sent[1].startswith("BEGIN; SET LOCAL lock_timeout")
    assert sent[2].startswith('SELECT service_engine."cmd_rename_board_'), sent
    # The board's lock, row, claim and release are the call's own.
    assert not any(s.endswith("FOR UPDATE") for s in sent), sent
    assert not any("command_occupancy" in s for s in sent), sent
    locks = [s for s in sent if "pg_advisory_xact_lock" in s]
    assert len(locks) == 1 and locks[0] == sent[3], locks  # the org projection's
    assert not any("integration_outbox" in s for s in sent), sent  # no outbox row to write
    last = sent[-1]
    assert last.startswith("SELECT pg_notify('service_engine_impacts', $m0$1|")
    assert '"c":"board.renamed"' in last and last.index("board.renamed") < last.index("COMMIT")
    # The offer's mark (and the drain's wake-up): one call, planned once per session.
    assert "; SELECT service_engine.mark_offers_dirty(ARRAY[$m0$boards$m0$]" in last
    assert '$m0$"b-1"$m0$' in last
    assert last.endswith("COMMIT; SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL;")
    assert not any(s.startswith("SELECT pg_advisory_unlock_all") for s in sent), sent


async def test_a_create_over_graphql_takes_its_pinned_round_trips(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A ``createBoard``: after the principal fact's read and BEGIN, the
    ``CreateBoard`` command's one call, then the org projection's lock, its
    RLS context and its INSERT riding with the riders and COMMIT (the row
    lands under the org's policy)."""
    statements = RequestStatements()
    async with served(store, nats_server, statements) as http:
        for n in range(12):  # every pool connection past its type introspection
            await _gql(http, CREATE, {"id": f"w-{n}", "title": f"warm {n}"})
        statements.take()
        created = await _gql(http, CREATE, {"id": "b-1", "title": "plan"})
        assert created["createBoard"] == {"success": True, "error": None}
        sent = statements.take_own()
    assert len(sent) == CREATE_ROUND_TRIPS, "\n".join(sent)
    assert sent[2].startswith('SELECT service_engine."cmd_create_board_'), sent
    batch = sent[3].split("; ")
    assert batch[0].startswith("SELECT pg_advisory_xact_lock("), batch
    assert batch[1] == "SELECT set_config($m0$app.current_org_id$m0$, $m0$acme$m0$, true)"
    assert batch[2].startswith('INSERT INTO "org_board"'), batch
    assert batch[3].startswith("SELECT pg_notify('service_engine_impacts'"), batch
    assert "COMMIT" in batch[5:], batch
    async with owner_connection(store) as conn:  # org_board is deny-when-unset
        await conn.execute("SELECT set_config('app.current_org_id', 'acme', false)")
        row = await conn.fetchrow("SELECT org, title FROM org_board WHERE id = 'b-1'")
    assert row is not None and dict(row) == {"org": "acme", "title": "plan"}


async def test_a_rename_selecting_its_board_reads_the_view_after_the_commit(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """Selecting ``board`` reads the view the caller now sees, after the
    commit (the same statements before it, the read after): the answer
    carries the renamed title."""
    statements = RequestStatements()
    async with served(store, nats_server, statements) as http:
        assert (await _gql(http, CREATE, {"id": "b-1", "title": "t0"}))["createBoard"]["success"]
        for n in range(12):
            await _gql(http, RENAME_WITH_BOARD, {"id": "b-1", "title": f"warm {n}"})
        statements.take()
        renamed = await _gql(http, RENAME_WITH_BOARD, {"id": "b-1", "title": "plan"})
        sent = statements.take_own()
    assert renamed["renameBoard"]["board"] == {"id": "b-1", "title": "plan"}
    commit = next(i for i, s in enumerate(sent) if "; COMMIT; " in s)
    assert commit == RENAME_ROUND_TRIPS - 1, sent
    assert any('FROM "board"' in s for s in sent[commit + 1:]), sent


async def test_an_offer_drain_pass_takes_four_statements(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """Between lease renewals a drain pass over one dirty key sends the
    claim, the lease check, the image read and the fenced settle, and no
    transaction control or reset; a pass with nothing dirty sends the
    claim alone. The bucket holds the renamed board."""
    await provision_kv(nats_server.url)
    register_offer_type(BoardOffer())
    statements = Statements()
    db = await connect_pool(store.app_url, min_size=1, max_size=1, setup=statements.setup)
    try:
        async with engine_nats(nats_server) as nats:
            executor = MutationExecutor(db, example_config())
            alice = person("alice")
            assert await executor.execute(alice, create_board, "t0", "b-1") == "b-1"
            bounds = OfferDrainBounds(lease=timedelta(minutes=3), interval=timedelta(minutes=1))
            drain = OfferDrain(db, nats, "pod-m", bounds)
            drain.add(BoardOffer())
            await drain.bind()
            await drain.step()  # the tenure's first pass: acquire and reconcile
            for n in range(3):
                assert isinstance(await executor.ack(alice, rename_board, "b-1", f"w{n}"), Success)
                await drain.step()
            assert isinstance(await executor.ack(alice, rename_board, "b-1", "plan"), Success)
            statements.take()
            [report] = (await drain.step()).values()
            sent = statements.take_own()
            assert report.published == 1
            assert len(sent) == DRAIN_PASS_ROUND_TRIPS, sent
            assert "offer_dirty" in sent[0] and "SKIP LOCKED" in sent[0]
            assert "leader_slot" in sent[1] and 'FROM "board"' in sent[2]
            assert "FOR SHARE" in sent[3] and "DELETE FROM service_engine.offer_dirty" in sent[3]
            assert not any(s.startswith(("BEGIN", "COMMIT")) or "RESET ALL" in s
                           for s in sent), sent
            await drain.step()
            assert len(statements.take_own()) == 1  # the claim alone
            bucket = await nats.bind_bucket(BOARD_BUCKET)
            entry = await bucket.get("example.board.b-1")
            assert entry is not None and json.loads(entry.value)["title"] == "plan"
    finally:
        await db.aclose()


TRICKY = ["O'Brien", "back\\slash", '"json"', "$m0$", "ends $m0", "$$", "é ☃", ""]


async def test_the_inlined_offer_marks_read_back_exactly_in_postgres(db: Database) -> None:
    """The dollar-quoted values the marks ride COMMIT with read back as the
    very text under the server's own lexer, with and without
    standard_conforming_strings; the statement stages each mark."""
    async with db.pool.acquire() as conn:
        for conforming in ("on", "off"):
            await conn.execute(f"SET standard_conforming_strings = {conforming}")
            for value in TRICKY:
                assert await conn.fetchval(f"SELECT {dollar_quoted(value)}::text") == value
        await conn.execute("RESET standard_conforming_strings")
        marks = [DirtyMark("boards", f"example.board.k{n}", json.dumps(value))
                 for n, value in enumerate(TRICKY)]
        async with conn.transaction():
            await conn.execute(offer_dirty_statement(marks))
        rows = await conn.fetch(
            "SELECT kv_key, agg_key #>> '{}' AS agg FROM service_engine.offer_dirty"
            " WHERE offer = 'boards' ORDER BY kv_key"
        )
    assert [(r["kv_key"], r["agg"]) for r in rows] == [
        (f"example.board.k{n}", value) for n, value in enumerate(TRICKY)
    ]


@pytest.mark.slow
async def test_the_commits_of_one_coalescing_window_ride_one_drain_pass(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """Ten renames committed one after another inside the drain's coalescing
    window wake it ten times and are published by one pass over all ten
    keys (not a pass per commit); the bucket holds every new title."""
    engines: list[Engine] = []
    # A window ten sequential HTTP renames fit inside on a loaded machine
    # (2 s did not, beside the parallel battery: one straggler rode a second pass).
    window = {"coalesce": timedelta(seconds=10), "interval": timedelta(minutes=1)}
    async with served(store, nats_server, RequestStatements(), engines, window) as http:
        [engine] = engines
        assert engine.nats is not None
        ids = [f"b-{n}" for n in range(10)]
        for board in ids:
            await _gql(http, CREATE, {"id": board, "title": f"t {board}"})
        bucket = await engine.nats.bind_bucket(BOARD_BUCKET)

        async def titles() -> dict[str, str]:
            entries, _ = await bucket.read_prefix("example.board")
            return {k.rpartition(".")[2]: json.loads(e.value)["title"] for k, e in entries.items()}

        async def published(prefix: str) -> bool:
            return await titles() == {b: f"{prefix} {b}" for b in ids}

        # The creates' pass, too, starts a whole window after their first wake.
        await wait_until(lambda: published("t"), timeout=BOUND + window["coalesce"].total_seconds(),
                         what="the creates offered")
        batches: list[int] = []

        async def count(point: str, offer: str, keys: Any) -> None:
            batches.append(len(keys))

        engine.set_offer_drain_hook(count)
        for board in ids:
            await _gql(http, RENAME, {"id": board, "title": f"r {board}"})
        await wait_until(lambda: published("r"), timeout=BOUND + window["coalesce"].total_seconds(),
                         what="the renames offered")
        assert batches == [10]


CRUD_CREATE_ROUND_TRIPS = 1
"""A CRUD handler creating one aggregate: BEGIN + lock bound + its advisory
lock + the INSERT (its values inlined) + the impact's NOTIFY + COMMIT + the
release reset (3 before the INSERT rode with BEGIN, 2 before it waited for
COMMIT's round trip)."""

CRUD_WRITE_ROUND_TRIPS = 3
"""A CRUD handler loading, saving and emitting: BEGIN + lock bound + the
advisory lock; the load pinning its row (``SELECT ... FOR UPDATE``); the
UPDATE (its values inlined: the row is pinned, so it may wait for COMMIT's
round trip), the impact's NOTIFY, the outbox row and its wake-up + COMMIT +
the release reset (4 before the pinned row's save rode with COMMIT, 5
before the staged rows did). The load takes parameters and answers a row:
asyncpg sends such a statement alone in its round trip (no pipelining in
its public API, MagicStack/asyncpg#588), so it cannot share BEGIN's."""


async def test_a_crud_handlers_mutation_takes_its_pinned_round_trips(
    logged: tuple[Database, Statements],
) -> None:
    """A CRUD create takes one round trip and a load + save + emit three;
    every staged row (the impact's NOTIFY, the outbox row) rides in COMMIT's
    round trip, after the writes and before COMMIT; nothing after COMMIT."""
    db, statements = logged
    executor = executor_for(db, service=SERVICE)

    async def bump(cx: Mutation[Any], key: str) -> None:
        await increment(cx, CrudCounter, key)
        cx.emit(OrderPlaced(order_id=key, qty=1))

    assert await executor.ack(WRITER, create_counter, CrudCounter, "warm") == Success()
    assert await executor.ack(WRITER, bump, "warm") == Success()
    statements.take()
    assert await executor.ack(WRITER, create_counter, CrudCounter, "k1") == Success()
    created = statements.take_own()
    assert await executor.ack(WRITER, bump, "k1") == Success()
    written = statements.take_own()
    assert len(created) == CRUD_CREATE_ROUND_TRIPS, created
    assert len(written) == CRUD_WRITE_ROUND_TRIPS, written
    for sent in (created, written):
        assert sent[0].startswith("BEGIN; SET LOCAL lock_timeout")
        assert "pg_advisory_xact_lock" in sent[0]
        assert "; COMMIT; " in sent[-1] and "RESET ALL" in sent[-1]
        assert sent[-1].index("pg_notify('service_engine_impacts'") < sent[-1].index("COMMIT")
    assert 'INSERT INTO "sample_counter_crud"' in created[0], created
    assert written[1].endswith("FOR UPDATE")
    last = written[-1]
    assert last.startswith('UPDATE "sample_counter_crud"') and "json_populate_record" in last
    assert last.index("integration_outbox") < last.index("; COMMIT; ")
    assert await db.pool.fetchval("SELECT value FROM sample_counter_crud WHERE id = 'k1'") == 1
    [row] = await db.pool.fetch(
        "SELECT payload->'payload'->>'order_id' AS order_id FROM service_engine.integration_outbox"
        " WHERE payload->'payload'->>'order_id' = 'k1'"
    )
    assert row["order_id"] == "k1"


async def test_a_pinned_saves_violation_is_the_saves_and_commits_nothing(
    logged: tuple[Database, Statements],
) -> None:
    """A pinned row's save that breaks a constraint of its table, sent in
    COMMIT's round trip, fails the command as a `ConstraintViolation` at
    stage ``save`` (not ``commit``); nothing commits, the row keeps its value.
    A save followed by a statement with parameters is sent before it (an
    insert it precedes that breaks the table's key is the insert's)."""
    db, _ = logged
    executor = executor_for(db, service=SERVICE)
    assert await executor.ack(WRITER, create_counter, CrudCounter, "v1") == Success()
    assert await executor.ack(WRITER, create_counter, CrudCounter, "v2") == Success()

    async def too_far(cx: Mutation[Any]) -> None:
        await increment(cx, CrudCounter, "v1", 2_000_000)
        cx.emit(OrderPlaced(order_id="v1", qty=1))

    with pytest.raises(ConstraintViolation) as caught:
        await run_pipeline(db, example_config(), lambda conn, now: Mutation(
            conn, example_config(), now, WRITER), too_far, clock=SystemClock())
    assert (caught.value.kind, caught.value.stage) == ("check", Stage.SAVE)

    async def then_taken(cx: Mutation[Any]) -> None:
        await increment(cx, CrudCounter, "v1", 5)  # its save sent before the insert
        await create_counter(cx, CrudCounter, "v2")

    with pytest.raises(ConstraintViolation) as caught:
        await run_pipeline(db, example_config(), lambda conn, now: Mutation(
            conn, example_config(), now, WRITER), then_taken, clock=SystemClock())
    assert (caught.value.kind, caught.value.stage) == ("unique", Stage.CREATE)

    async def then_load(cx: Mutation[Any]) -> int:
        await increment(cx, CrudCounter, "v1", 3)
        other = await cx.load(CrudCounter, "v2")  # after the save, parameterised
        again = await cx.load(CrudCounter, "v1")  # reads the saved row
        return int(other.value) + int(again.value)

    assert await executor.execute(WRITER, then_load) == 3
    assert await db.pool.fetchval(
        "SELECT value FROM sample_counter_crud WHERE id = 'v1'") == 3
    assert await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.integration_outbox"
        " WHERE payload->'payload'->>'order_id' = 'v1'") == 0


class _Wide:
    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row


class _WideStore(CrudStore[_Wide, str]):
    TABLE = "wide_inlined"
    COLUMNS = ("id", "t", "i", "b", "n", "f", "ok", "u", "at", "d", "span", "raw", "j",
               "js", "tags")

    def to_row(self, aggregate: _Wide) -> dict[str, Any]:
        return aggregate.row

    def from_row(self, row: Any) -> _Wide:
        return _Wide(dict(row))


class _OwnSave(_WideStore):
    async def save(self, conn: Any, aggregate: _Wide) -> None:
        await super().save(conn, aggregate)


async def test_an_inlined_save_writes_what_the_parameterised_save_writes(
    database: ProvisionedDatabase, db: Database
) -> None:
    """`CrudStore.save_inlined` (one JSON literal read by each column's own
    type) writes exactly the row `save` writes through the driver's codecs,
    for texts that try to break out of their quoting, numbers at their
    edges, instants, intervals, bytes, JSON objects, JSON strings and
    arrays; a value without an exact JSON text (a naive instant, NaN, a
    set) and a store with its own `save` are not inlined (None)."""
    store = _WideStore()
    values: list[dict[str, Any]] = []
    for n, text in enumerate([*TRICKY, "'; DROP TABLE wide_inlined; --", "$m0$}\\\"", None]):
        values.append({
            "t": text, "i": -(2**63) + n if n % 2 else 2**63 - 1 - n,
            "b": n % 2 == 0, "n": Decimal("12345678901234567890.0123456789") + n,
            "f": 0.1 + n if n % 3 else -1.5e300, "ok": None if n == 3 else n > 2,
            "u": uuid.uuid4(), "at": datetime(2026, 12, 7, 10, n, 5, 123456,
                                             tzinfo=timezone(timedelta(hours=n - 4))),
            "d": date(2026, 1, 1 + n), "span": timedelta(days=n, seconds=7, microseconds=n),
            "raw": bytes(range(n * 7 % 256, n * 7 % 256 + 5)),
            "j": {"text": text, "nested": [1, {"k": text}], "n": None},
            "js": text if n % 2 else [text, n], "tags": [text or "", "x"] if n % 4 else [],
        })
    async with owner_connection(database) as owner:
        await owner.execute(
            "CREATE TABLE wide_inlined (id text PRIMARY KEY, t text, i bigint,"
            " b boolean, n numeric, f double precision, ok boolean, u uuid,"
            " at timestamptz, d date, span interval, raw bytea, j jsonb, js jsonb,"
            " tags text[]); GRANT SELECT, INSERT, UPDATE ON wide_inlined TO service_engine_app")
    async with db.pool.acquire() as conn, conn.transaction():
        for n, row in enumerate(values):
            for way in ("p", "i"):
                await store.create(conn, _Wide({c: None for c in store.COLUMNS} | {
                    "id": f"{way}{n}"}))
            await store.save(conn, _Wide({**row, "id": f"p{n}"}))
            inlined = store.save_inlined(_Wide({**row, "id": f"i{n}"}))
            assert inlined is not None and "$1" not in inlined
            assert await conn.execute(inlined) == "UPDATE 1"
        rows = {r["id"]: dict(r) for r in await conn.fetch("SELECT * FROM wide_inlined")}
        for n in range(len(values)):
            p, i = rows[f"p{n}"], rows[f"i{n}"]
            assert {**p, "id": None} == {**i, "id": None}, (p, i)
            assert p["j"] == values[n]["j"] and p["js"] == values[n]["js"]
        base = {**values[0], "id": "x"}
        assert store.save_inlined(_Wide({**base, "at": datetime(2026, 1, 1)})) is None
        assert store.save_inlined(_Wide({**base, "f": float("nan")})) is None
        assert store.save_inlined(_Wide({**base, "tags": {"a"}})) is None
        assert _OwnSave().save_inlined(_Wide(base)) is None


async def test_a_handler_that_sends_nothing_commits_in_two_round_trips(
    logged: tuple[Database, Statements],
) -> None:
    """A handler that only stages (an impact, an emitted event) is BEGIN,
    then its staged rows with COMMIT in one round trip, and they commit."""
    db, statements = logged
    executor = executor_for(db, service=SERVICE)

    async def announce(cx: Mutation[Any]) -> None:
        cx.impact("sample_counter", "k9")
        cx.emit(OrderPlaced(order_id="announced", qty=3))

    assert await executor.ack(WRITER, announce) == Success()
    statements.take()
    assert await executor.ack(WRITER, announce) == Success()
    begin, commit = statements.take_own()
    assert begin.startswith("BEGIN; SET LOCAL lock_timeout") and "COMMIT" not in begin
    assert "integration_outbox" in commit and "; COMMIT; " in commit
    assert await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.integration_outbox"
        " WHERE payload->'payload'->>'order_id' = 'announced'"
    ) == 2


async def test_the_inlined_staged_rows_equal_the_parameterised_ones(db: Database) -> None:
    """Every staged row the pipeline sends inlined in COMMIT's round trip
    (outbox row with its confirmation, scheduled impact, scheduled message,
    blob row and its release) reads back exactly as the same row written
    through its parameterised staging entry point, tricky texts included."""
    now = Timestamp.now()
    tricky = [*TRICKY, "NUL-free but\nmulti-line", "'; DROP TABLE x; --"]

    def message(n: int, text: str) -> OutboundMessage:
        return build_event(OrderPlaced(order_id=text, qty=n), service=SERVICE,
                           metadata=EventMetadata.originating(Actor.service("bench")),
                           occurred_at=now.value)

    async def write(conn: Any, inline: bool, tag: str) -> None:
        rows = [OutboxRow.of(message(n, f"{tag}{t}")) for n, t in enumerate(tricky)]
        impacts = [Impact.entity("sample_counter", f"{tag}{t}") for t in tricky]
        blobs = BlobStaging()
        for n, t in enumerate(tricky):
            blobs.mint(NewBlob(uuid.uuid4(), "doc", f"{tag}/{n}", t or None, 1000 + n,
                               timedelta(days=1, seconds=n, microseconds=7),
                               "store" if n % 2 else None, json.dumps([t]) if n % 2 else None))
        due = Timestamp(now.value + timedelta(minutes=5, microseconds=123))
        if inline:
            sql = "; ".join(s for s in (
                outbox_statement(rows), schedule_statement(due, impacts),
                scheduled_message_statement(message(99, f"{tag}late"), due),
                blob_statement(blobs)) if s)
            await conn.execute(sql)
        else:
            await write_outbox(conn, rows)
            await schedule_in(conn, due, impacts)
            await stage_scheduled_message(conn, message(99, f"{tag}late"), due)
            await stage_blobs(conn, blobs)

    async def read(conn: Any, tag: str) -> list[Any]:
        outbox = await conn.fetch(
            "SELECT subject, payload - 'event_id' - 'payload' AS p, payload->'payload' AS body,"
            " headers, producer, seq_key, seq FROM service_engine.integration_outbox"
            " WHERE payload->'payload'->>'order_id' LIKE $1 || '%' ORDER BY id", tag)
        scheduled = await conn.fetch(
            "SELECT due_at, payload->'payload' AS body FROM service_engine.scheduled_message"
            " WHERE payload->'payload'->>'order_id' = $1 || 'late'", tag)
        impacts = await conn.fetch(
            "SELECT due_at, impacts::text FROM service_engine.scheduled_impact"
            " WHERE impacts::text LIKE '%' || $1 || '%' ORDER BY id", tag)
        blobs = await conn.fetch(
            "SELECT kind, substr(object_key, 3) AS k, content_type, max_bytes, owner_store,"
            " owner_key, orphan_after, state FROM service_engine.blob"
            " WHERE object_key LIKE $1 || '/%' ORDER BY object_key", tag)
        return [
            [(r["subject"], r["body"], r["headers"], r["producer"], r["seq_key"], r["seq"])
             for r in outbox],
            [tuple(r) for r in scheduled],
            [(r["due_at"], r["impacts"].replace(tag, "")) for r in impacts],
            [tuple(r) for r in blobs],
        ]

    async with db.pool.acquire() as conn, conn.transaction():
        await write(conn, False, "p:")
        await write(conn, True, "i:")
        parameterised, inlined = await read(conn, "p:"), await read(conn, "i:")
    strip = [[tuple(str(v).replace("p:", "").replace("i:", "") for v in row) for row in part]
             for part in (parameterised, inlined)]
    assert strip[0] == strip[1]
    assert len(parameterised[0]) == len(tricky) and len(parameterised[3]) == len(tricky)


DECLARED_ROUND_TRIPS = {"CreateTask": 3, "RenameTask": 3, "StartTask": 3}
"""A declared command run by `CommandRunner` (its compiled function), per
command of the sample (`sample_commands`), whatever it declares: BEGIN +
lock bound; the one call (the key's and the bindings' advisory locks, the
key's record, the reads, requirements, claims, writes and the record
write); the impacts' NOTIFY + COMMIT + the release reset. (The interpreter
took 10, 5 and 8.)"""


async def test_a_declared_commands_mutation_takes_its_pinned_round_trips(
    logged: tuple[Database, Statements],
) -> None:
    """A declared command's run sends the pinned number of round trips:
    BEGIN, the command's one call, and every staged row (the impact's
    NOTIFY) with COMMIT and the release reset; nothing after COMMIT."""
    db, statements = logged
    runner = CommandRunner(commands_executor_for(db), CommandConfig())

    async def sent(command: str, inputs: dict[str, Any]) -> list[str]:
        outcome = await runner.run(COMMANDS[command], ALICE, inputs)
        assert isinstance(outcome, CommandOutcome) and outcome.ok, outcome
        return statements.take_own()

    org = ALICE.org
    await sent("CreateProject", {"request_key": "k0", "org": org, "project_id": "p", "name": "P"})
    # Every statement prepared once on the pool's one connection.
    await sent("CreateTask", {"request_key": "k1", "org": org, "task_id": "t0",
                              "project_id": "p", "title": "warm"})
    await sent("RenameTask", {"org": org, "task_id": "t0", "title": "warm 2"})
    await sent("StartTask", {"request_key": "k2", "org": org, "task_id": "t0",
                             "expected_revision": 2})
    runs = {
        "CreateTask": await sent("CreateTask", {"request_key": "k3", "org": org, "task_id": "t1",
                                                "project_id": "p", "title": "a"}),
        "RenameTask": await sent("RenameTask", {"org": org, "task_id": "t1", "title": "b"}),
        "StartTask": await sent("StartTask", {"request_key": "k4", "org": org, "task_id": "t1",
                                              "expected_revision": 2}),
    }
    for command, statements_sent in runs.items():
        assert len(statements_sent) == DECLARED_ROUND_TRIPS[command], (command, statements_sent)
        first, last = statements_sent[0], statements_sent[-1]
        assert first.startswith("BEGIN; SET LOCAL lock_timeout")
        assert statements_sent[1].startswith("SELECT service_engine.\"cmd_")
        assert last.startswith("SELECT pg_notify('service_engine_impacts'")
        assert last.endswith("COMMIT; SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;"
                             " RESET ALL;")
