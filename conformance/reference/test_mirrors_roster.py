"""The reference service's leader work over real Postgres and a spawned
nats-server: the roster slice mirrors the twin's published roster into
known_persons and a live session over it receives the mirrored change; the
board slice offers its boards and the twin reads them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from example_service.slices.board.commands import archive_board, create_board, rename_board
from example_service.slices.roster.views import PEOPLE, PeopleQuery
from example_twin.contract import Person
from example_twin.roster import DEFAULT_ROSTER, publish_roster, read_boards, retract_person
from service_engine import Query, Success, WindowSpec
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.render import Remove, Reset, Upsert

from ..blackbox.harness import provision_kv
from ..support.example_support import Running, person, running
from ..support.harness import wait_until
from ..support.nats_support import engine_nats

ALICE = person("alice", "acme")
BOUND = 10.0



@pytest.fixture
async def service(store: ProvisionedDatabase, nats_server: EmbeddedNats) -> AsyncIterator[Running]:
    await provision_kv(nats_server.url)
    async with engine_nats(nats_server) as nats, running(
        store, ["board", "roster"], nats=nats
    ) as run:
        yield run


async def known_persons(run: Running) -> dict[str, tuple[str, str]]:
    rows = await run.db.pool.fetch("SELECT id, name, org FROM known_persons")
    return {r["id"]: (r["name"], r["org"]) for r in rows}


async def test_the_roster_is_mirrored_before_the_pod_reports_ready(service: Running) -> None:
    """The pod is UP only once the twin's roster is in known_persons."""
    assert await known_persons(service) == {p.id: (p.name, p.org) for p in DEFAULT_ROSTER}


async def test_a_live_session_over_known_persons_receives_the_mirrored_change(
    service: Running, nats_server: EmbeddedNats
) -> None:
    """A session over the people of acme gets a Reset of the mirrored roster,
    then an Upsert when the twin publishes a new person of acme and a Remove
    when it retracts one; a person of another org reaches no acme session."""
    stream = await service.engine.attach(ALICE, PEOPLE, WindowSpec(Query(PeopleQuery())))
    try:
        reset = await stream.next()
        assert isinstance(reset, Reset)
        assert sorted(reset.views) == ['"alice"', '"carol"']
        async with engine_nats(nats_server) as nats:
            await publish_roster(nats, [Person(id="dave", name="Dave", org="globex")])
            await publish_roster(nats, [Person(id="erin", name="Erin", org="acme")])
            upsert = await stream.next()
            assert isinstance(upsert, Upsert) and upsert.key == '"erin"'
            assert upsert.view.name == "Erin"
            await retract_person(nats, "carol")
            remove = await stream.next()
            assert isinstance(remove, Remove) and remove.key == '"carol"'
        assert "dave" in await known_persons(service)
    finally:
        await stream.aclose()


async def test_the_board_offer_reaches_the_twin(
    service: Running, nats_server: EmbeddedNats
) -> None:
    """A created board is offered under example.board.<id> with its id,
    title, org and archived flag; a rename and an archive are re-published."""
    executor = service.executor
    created = await executor.execute(ALICE, create_board, "Roadmap", "b1")
    assert created == "b1"
    async with engine_nats(nats_server) as nats:

        async def offered(title: str, archived: bool) -> bool:
            board = (await read_boards(nats)).get("b1")
            return board is not None and (board.title, board.archived) == (title, archived)

        await wait_until(lambda: offered("Roadmap", False), timeout=BOUND, what="the offer")
        board = (await read_boards(nats))["b1"]
        assert board.org == "acme"
        assert isinstance(await executor.ack(ALICE, rename_board, "b1", "Plan"), Success)
        await wait_until(lambda: offered("Plan", False), timeout=BOUND, what="the rename")
        archiver = person("alice", "acme", "board:archive")
        assert isinstance(await executor.ack(archiver, archive_board, "b1"), Success)
        await wait_until(lambda: offered("Plan", True), timeout=BOUND, what="the archive")
