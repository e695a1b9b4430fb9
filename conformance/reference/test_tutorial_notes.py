"""The tutorial's finished `notes` service (``examples/notes``, walked through
in ``docs/tutorial/``) boots on real Postgres and NATS and does what the
tutorial says, and the tutorial quotes its code as it is.

Driven as GraphiQL drives it: over HTTP and graphql-transport-ws, with the
passport in ``X-Passport``. A subscriber first gets a Reset of its org's
notes; a note written by one of its org reaches it as an Upsert whose view
is personalised (``canEdit`` true for the author only); an edit by anyone
but the author is refused with the gate's typed code, changing nothing; a
subscriber of another org is sent nothing of it.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import re
import secrets
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from examples.notes import SERVICE
from service_engine import Engine, EngineConfig, ReadinessHandle, connect_pool, service_migrations
from service_engine.embedded import (
    EmbeddedNats,
    EmbeddedPostgres,
    ProvisionedDatabase,
    drop_database,
    free_port,
    provision_database,
)
from service_engine.graphql import PASSPORT_HEADER, Passport
from service_engine.server import graphql_app

from ..blackbox.harness import GqlSocket
from ..support.example_support import Running, serving_engine
from ..support.harness import wait_until
from ..support.nats_support import engine_nats

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial"
CODE = ROOT / "examples" / "notes"
MIGRATIONS = service_migrations(CODE / "migrations")
TEMPLATE = "notes_tutorial_template"
QUIET = 0.5
"""How long a subscriber of another org is watched for a message it must not get."""

ALICE = Passport(sub="alice", org="acme")
BOB = Passport(sub="bob", org="acme")
GINA = Passport(sub="gina", org="globex")

SUBSCRIBE = """subscription { notes { __typename
  ... on NotesReset { revision views { id author body canEdit } }
  ... on NotesUpsert { revision key view { id author body canEdit } } } }"""
CREATE = 'mutation { createNote(body: "Buy milk") { success id error { code } } }'
READ = "{ notes { id body canEdit } }"
EDIT = """mutation($id: ID!, $body: String!) {
  editNote(id: $id, body: $body) { success id error { code action } } }"""


async def notes_database(pg: EmbeddedPostgres) -> ProvisionedDatabase:
    """A fresh database with the engine's migrations and the tutorial's one."""
    admin = await asyncpg.connect(pg.admin_url)
    try:
        built = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", TEMPLATE)
    finally:
        await admin.close()
    if not built:
        await provision_database(pg, TEMPLATE, is_template=True, extra_migrations=MIGRATIONS)
    return await provision_database(pg, f"notes_{secrets.token_hex(6)}", template=TEMPLATE)


@pytest.fixture
async def notes(pg_server: EmbeddedPostgres, nats_server: EmbeddedNats) -> AsyncIterator[Running]:
    """The tutorial's service, served by ``graphql_app`` as its ``__main__``
serves it (registered with the engine, its principal the default
`OrgMember`), on a free port."""
    store = await notes_database(pg_server)
    db = await connect_pool(store.app_url)
    try:
        async with engine_nats(nats_server) as nats:
            readiness = ReadinessHandle()
            engine = await Engine.boot(EngineConfig(service="notes"), db, nats, readiness)
            async with serving_engine(engine, graphql_app(engine, SERVICE)) as (addr, http):
                yield Running(engine, db, SERVICE, readiness, addr, http)
    finally:
        await db.aclose()
        await drop_database(pg_server, store.name)


async def subscribed(stack: contextlib.AsyncExitStack, run: Running, who: Passport
                     ) -> tuple[GqlSocket, list[dict[str, object]]]:
    """A socket of ``who`` subscribed to ``notes``, and the views of its
    Reset (revision 1, as the tutorial says)."""
    socket = await stack.enter_async_context(run.socket(who))
    await socket.subscribe("notes", SUBSCRIBE)
    reset = (await socket.next("notes"))["notes"]
    assert reset["__typename"] == "NotesReset" and reset["revision"] == 1, reset
    return socket, reset["views"]


async def test_a_note_reaches_its_org_live_and_only_its_author_edits_it(notes: Running) -> None:
    """A subscriber gets its Reset; the author's createNote answers success
    and the subscriber gets the Upsert (``canEdit`` true for the author,
    false for another member); another member's editNote is refused with
    ``note.not_author`` on action ``edit`` and nothing is delivered; the
    author's edit is delivered; a subscriber of another org gets nothing."""
    async with contextlib.AsyncExitStack() as stack:
        alice, alice_views = await subscribed(stack, notes, ALICE)
        bob, bob_views = await subscribed(stack, notes, BOB)
        gina, gina_views = await subscribed(stack, notes, GINA)
        assert alice_views == bob_views == gina_views == []

        created = (await notes.gql(CREATE, passport=ALICE))["createNote"]
        assert created["success"] is True and created["error"] is None, created
        note_id = created["id"]
        for socket, can_edit in ((alice, True), (bob, False)):
            upsert = (await socket.next("notes"))["notes"]
            assert upsert["__typename"] == "NotesUpsert" and upsert["revision"] == 2, upsert
            assert upsert["key"] == f'"{note_id}"'  # a key is its canonical JSON text
            assert upsert["view"] == {"id": note_id, "author": "alice", "body": "Buy milk",
                                      "canEdit": can_edit}

        refused = (await notes.gql(EDIT, {"id": note_id, "body": "Sell milk"}, BOB))["editNote"]
        assert refused == {"success": False, "id": None,
                           "error": {"code": "note.not_author", "action": "edit"}}

        edited = (await notes.gql(EDIT, {"id": note_id, "body": "Buy oat milk"}, ALICE))
        assert edited["editNote"]["success"] is True
        upsert = (await bob.next("notes"))["notes"]
        assert upsert["revision"] == 3 and upsert["view"]["body"] == "Buy oat milk", upsert
        await gina.quiet(QUIET)


async def test_another_orgs_subscriber_sees_nothing_of_a_write(notes: Running) -> None:
    """A note written in one org is never sent to a subscriber of another,
    while a subscriber of the writer's org gets it (the bound on the
    absence is measured from that delivery); the ``notes`` query field
    answers each org its own notes."""
    async with contextlib.AsyncExitStack() as stack:
        alice, _ = await subscribed(stack, notes, ALICE)
        gina, _ = await subscribed(stack, notes, GINA)
        assert (await notes.gql(CREATE, passport=ALICE))["createNote"]["success"] is True
        assert (await alice.next("notes"))["notes"]["__typename"] == "NotesUpsert"
        await gina.quiet(QUIET)
        # Her own org's window is still empty: a new subscription's Reset says so.
        _, views = await subscribed(stack, notes, GINA)
        assert views == []
        # The query field the projector also declares reads the same windows.
        assert (await notes.gql(READ, passport=GINA))["notes"] == []
        assert [n["body"] for n in (await notes.gql(READ, passport=BOB))["notes"]] == ["Buy milk"]


async def test_a_passport_without_an_org_is_refused_by_name(
    notes: Running, caplog: pytest.LogCaptureFixture
) -> None:
    """The default principal (`OrgMember`) refuses a passport naming no org
    with ``passport_refused``: a note always belongs to an org. The refusal
    is the client's: logged as one line naming its code, with no traceback
    and nothing at error level."""
    with caplog.at_level(logging.INFO):
        answer = await notes.post(CREATE, passport=Passport(sub="nobody"))
    assert answer["errors"][0]["extensions"]["code"] == "passport_refused", answer
    assert any("passport_refused" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


SERVE = """
import sys
from pathlib import Path

from examples.notes import SERVICE
from service_engine.server import serve_embedded

serve_embedded(SERVICE, "notes", migrations=Path(sys.argv[1]), data=Path(sys.argv[2]),
               addr=sys.argv[3])
"""
"""The tutorial's ``__main__``, its data folder and address the test's."""


@pytest.mark.slow
async def test_serve_embedded_serves_the_service_until_interrupted(tmp_path: Path) -> None:
    """`serve_embedded`, as the tutorial's ``__main__`` calls it, starts
    Postgres and NATS under its data folder, applies the tutorial's
    migration and serves the service: it goes UP and a note created over
    HTTP commits; SIGINT stops the service and the servers it started
    (exit status 0, no Postgres left running on the folder)."""
    data, addr = tmp_path / "data", f"127.0.0.1:{free_port()}"
    with (tmp_path / "serve.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SERVE, str(CODE / "migrations"), str(data), addr,
            cwd=ROOT, stdout=log, stderr=log,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://{addr}") as http:
            async def up() -> bool:
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return process.returncode is not None  # it died: fail below, not by timeout

            await wait_until(up, timeout=120, what="the served notes service UP")
            assert process.returncode is None, (tmp_path / "serve.log").read_text()
            answer = await http.post("/graphql", json={"query": CREATE},
                                     headers={PASSPORT_HEADER: ALICE.to_header()})
            assert answer.json()["data"]["createNote"]["success"] is True, answer.text
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 60) == 0, (tmp_path / "serve.log").read_text()
        assert not (data / "postgres" / "pgdata" / "postmaster.pid").exists()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# -- the tutorial quotes the finished code ---------------------------------------------

_QUOTE = re.compile(r'^```\w+ title="notes/([\w./]+)"\n(.*?)^```$', re.S | re.M)


def test_every_code_block_of_the_tutorial_is_in_the_finished_files() -> None:
    """Each ``title="notes/<file>"`` code block of ``docs/tutorial/``
    appears verbatim in ``examples/notes/<file>``, and together the blocks
    quote every line of those files: the tutorial cannot
    drift from the code the tests above run."""
    quoted: dict[str, list[str]] = {}
    for page in sorted(TUTORIAL.glob("*.md")):
        for name, block in _QUOTE.findall(page.read_text(encoding="utf-8")):
            source = (CODE / name).read_text(encoding="utf-8")
            assert block in source, f"{page.name} quotes {name} as it is not:\n{block}"
            quoted.setdefault(name, []).append(block)
    assert quoted, "the tutorial quotes no code"
    for name, blocks in quoted.items():
        unquoted = [line for line in (CODE / name).read_text(encoding="utf-8").splitlines()
                    if line.strip() and not any(line in block for block in blocks)]
        assert not unquoted, f"the tutorial never shows these lines of {name}: {unquoted}"


def test_the_tutorial_service_imports_only_the_public_surface() -> None:
    """``examples/notes`` imports from the engine only the root package and
    the public sub-packages the tutorial introduces (`service_engine.graphql`,
    `service_engine.server`, `service_engine.embedded`)."""
    public = {"service_engine", "service_engine.graphql", "service_engine.server",
              "service_engine.embedded"}
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for path in sorted(CODE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0)
        for alias in node.names
    }
    engine = {name for name in imported if name.split(".")[0] == "service_engine"}
    assert engine and engine <= public, sorted(engine - public)
