"""The reference service's card slice, in process against real Postgres and a
spawned nats-server.

Each test states the property it proves: soft EDA writes the state row and
its facts together or not at all; the gates are the affordances; a bulk
import stages one reset impact; the paging pair serves only the session's
own principal; the reactions run in the pipeline — create_card refuses a
sender that is not a service, a re-sent command re-emits its confirmation,
an early event is parked until its card exists, a deadline scheduled at
creation flags the card overdue — the cron publishes once per slot; and the
twin closes the cycle against it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from example_service.slices.card.commands import (
    ImportedCard,
    create_card,
    import_cards,
    rename_card,
)
from example_service.slices.card.domain import CARD_ADVANCE, Card
from example_service.slices.card.messages import ReviewApproved
from example_service.slices.card.reactions import digest_cron
from example_service.slices.card.views import CARDS, CardsQuery
from example_service.slices.card.workflow import FINISH_CARD, START_CARD
from example_twin import Twin
from service_engine import (
    ActionName,
    Actor,
    MutationError,
    MutationExecutor,
    Query,
    Reason,
    Success,
    WindowSpec,
    affordances,
)
from service_engine.commands import CommandRunner
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.gates import check_gates_match_affordances
from service_engine.graphql import Passport
from service_engine.impacts import ImpactKind
from service_engine.integration import DeclaredSequence, Tick
from service_engine.render import Reset, Upsert

from ..support.example_support import Running, person, running
from ..support.harness import owner_connection, wait_until
from ..support.inbound_support import consumer_state, producer
from ..support.nats_support import StoredMessage, engine_nats, stream_messages
from ..support.sample_counter import listen_impacts

ALICE = person("alice", "acme", CARD_ADVANCE)
BOB = person("bob")
GLOBEX = person("gina", "globex")
BOUND = 5.0



@pytest.fixture
async def card(store: ProvisionedDatabase, nats_server: EmbeddedNats) -> AsyncIterator[Running]:
    async with engine_nats(nats_server) as nats, running(store, ["card"], nats=nats) as run:
        yield run


async def owner_fetch(store: ProvisionedDatabase, query: str, *args: Any) -> list[dict[str, Any]]:
    async with owner_connection(store) as conn:
        return [dict(r) for r in await conn.fetch(query, *args)]


async def facts(store: ProvisionedDatabase, card_id: str) -> list[str]:
    rows = await owner_fetch(
        store, "SELECT fact_type FROM card_fact WHERE card_id = $1 ORDER BY id", card_id
    )
    return [r["fact_type"] for r in rows]


async def advance_card(
    run: MutationExecutor, principal: Any, card_id: str
) -> Success | MutationError:
    """The card's next stage change (the declared StartCard or FinishCard) at
    the revision it has now, answered as a mutation is."""
    rows = await run.db.pool.fetch("SELECT stage, version FROM card WHERE id = $1", card_id)
    stage, revision = (rows[0]["stage"], rows[0]["version"]) if rows else ("todo", 1)
    command = FINISH_CARD if stage == "doing" else START_CARD
    outcome = await CommandRunner(run).run(command, principal, {
        "idempotency_key": uuid.uuid4().hex, "card_id": card_id, "expected_revision": revision})
    if isinstance(outcome, MutationError) or outcome.ok:
        return outcome if isinstance(outcome, MutationError) else Success()
    action = outcome.data.get("action")
    return MutationError(outcome.code("card") or outcome.name, outcome.name, False,
                         ActionName(action) if isinstance(action, str) else None)


async def card_events(url: str, fact: str | None = None) -> list[tuple[StoredMessage, dict[str, Any]]]:
    """The example service's card events on the stream, decoded."""
    found = []
    for message in await stream_messages(url, "INTEGRATION_EVT"):
        if message.subject.startswith("integration.evt.example.card."):
            body = json.loads(message.data)
            if fact is None or body["type"] == f"card.{fact}":
                found.append((message, body))
    return found


# -- the wire as another service writes it -----------------------------------------------


class CreateCardCommand(BaseModel):
    SERVICE: ClassVar[str] = "example"
    AGGREGATE: ClassVar[str] = "card"
    VERB: ClassVar[str] = "create"
    VERSION: ClassVar[int] = 1

    card_id: str
    org: str = "acme"
    title: str = "from the bus"
    due_in_seconds: float | None = None

    def sequence(self) -> DeclaredSequence | None:
        return None


class AdvanceCardCommand(BaseModel):
    SERVICE: ClassVar[str] = "example"
    AGGREGATE: ClassVar[str] = "card"
    VERB: ClassVar[str] = "advance"
    VERSION: ClassVar[int] = 1

    card_id: str
    expected_revision: int

    def sequence(self) -> DeclaredSequence | None:
        return None


class ReviewEvent(ReviewApproved):
    AGGREGATE: ClassVar[str] = "review"
    FACT: ClassVar[str] = "approved"
    VERSION: ClassVar[int] = 1

    def sequence(self) -> DeclaredSequence | None:
        return None


# -- soft EDA, gates, bulk -------------------------------------------------------------


async def test_soft_eda_writes_the_state_row_and_its_facts_together_or_not_at_all(
    card: Running, store: ProvisionedDatabase
) -> None:
    """Soft EDA: the card's state row and its facts commit together or not at all (a refused
    or failed command writes neither)."""
    run = card.executor
    assert await run.execute(BOB, create_card, "first", "c-1") == "c-1"
    assert await facts(store, "c-1") == ["card.created"]
    again = await run.execute(BOB, create_card, "second", "c-1")
    assert isinstance(again, MutationError) and again.code == "unique_violation"
    assert await facts(store, "c-1") == ["card.created"]  # the fact rolled back with the row

    assert await run.ack(BOB, rename_card, "c-1", "renamed") == Success()
    assert await advance_card(run, ALICE, "c-1") == Success()
    rows = await owner_fetch(store, "SELECT title, stage, version FROM card WHERE id = 'c-1'")
    assert rows == [{"title": "renamed", "stage": "doing", "version": 3}]
    assert await facts(store, "c-1") == ["card.created", "card.renamed", "card.advanced"]
    # A refused command writes neither.
    bad = await run.ack(BOB, rename_card, "c-1", "")
    assert isinstance(bad, MutationError) and bad.code == "card.title_invalid"
    assert len(await facts(store, "c-1")) == 3


async def test_the_gates_are_the_affordances(card: Running) -> None:
    """The card slice's gates are its affordances: for each principal, what the view offers
    is what running each mutation does."""
    run = card.executor
    await run.execute(BOB, create_card, "gated", "c-g")
    refused = await advance_card(run, BOB, "c-g")
    assert isinstance(refused, MutationError)
    assert (refused.code, refused.action) == ("card.advance_scope_required", "advance")
    view = await card.engine.fetch(CARDS, "c-g", BOB)
    assert view is not None
    assert {a.action: (a.allowed, a.reason) for a in view.affordances} == {
        "rename": (True, None), "advance": (False, "card.advance_scope_required")}
    assert await card.engine.fetch(CARDS, "c-g", GLOBEX) is None

    # What each principal is offered is what running each mutation does.
    def reason_of(outcome: object) -> Reason | None:
        return Reason(outcome.code) if isinstance(outcome, MutationError) else None

    for n, principal in enumerate((ALICE, BOB, GLOBEX)):
        ids = {action: f"c-{n}-{action}" for action in ("rename", "advance")}
        for card_id in ids.values():
            await run.execute(BOB, create_card, "gated", card_id)
        async with card.db.pool.acquire() as conn:
            loaded = await Card.Store.load(conn, ids["rename"])
        attempted = {
            ActionName("rename"): reason_of(await run.ack(principal, rename_card, ids["rename"], "ok")),
            ActionName("advance"): reason_of(await advance_card(run, principal, ids["advance"])),
        }
        assert check_gates_match_affordances(affordances(loaded, principal), attempted) == []


async def test_a_bulk_import_stages_one_reset_impact_and_reaches_a_window_in_one_frame(
    card: Running, store: ProvisionedDatabase
) -> None:
    """A bulk import stages one projector-reset impact, and a live window receives every
    imported card on a contiguous revision."""
    stream = await card.engine.attach(BOB, CARDS, WindowSpec(Query(CardsQuery(limit=100))))
    try:
        reset = await asyncio.wait_for(stream.next(), BOUND)
        assert isinstance(reset, Reset) and not reset.views
        items = [ImportedCard(f"imported {i}", f"imp-{i:03}") for i in range(60)]
        async with listen_impacts(card.db) as probe:
            assert await card.executor.execute_bulk(BOB, import_cards, items) == 60
            impacts = await probe.next()
        assert [(i.kind, i.noun) for i in impacts] == [(ImpactKind.PROJECTOR_RESET, "card")]

        delivered: dict[str, Any] = {}
        revisions = []
        while len(delivered) < 60:
            delta = await asyncio.wait_for(stream.next(), BOUND)
            revisions.append(delta.revision)
            if isinstance(delta, Reset):
                delivered = dict(delta.views)
            else:
                assert isinstance(delta, Upsert)
                delivered[delta.key] = delta.view
        assert revisions == list(range(reset.revision + 1, reset.revision + 1 + len(revisions)))
        assert len(await owner_fetch(store, "SELECT 1 FROM card_fact WHERE fact_type = 'card.created'")) == 60
    finally:
        await stream.aclose()
    too_many = await card.executor.execute_bulk(BOB, import_cards, [])
    assert isinstance(too_many, MutationError) and too_many.code == "card.import_invalid"


# -- the paging pair ---------------------------------------------------------------------

VIEW = "id title cursor"
PAGE_SUBSCRIPTION = f"""subscription($sid: String!, $limit: Int!) {{
  cardPageDeltas(sessionId: $sid, limit: $limit) {{
    __typename
    ... on CardsReset {{ revision keys views {{ {VIEW} }} }}
    ... on CardsUpsert {{ revision key view {{ {VIEW} }} }}
    ... on CardsRemove {{ revision key }}
  }} }}"""
PAGE = """mutation($sid: String!, $cursor: String!) { pageCards(sessionId: $sid, cursor: $cursor) {
    success delivered released truncated error { code retryable } } }"""


async def test_the_paging_pair_appends_older_cards_to_the_callers_session_only(
    card: Running,
) -> None:
    """The paging pair appends older cards to the caller's own live session; another
    principal paging it gets no_live_session and the owner's wire receives nothing from
    that attempt."""
    for i in range(8):
        assert await card.executor.execute(BOB, create_card, f"card {i}", f"p-{i}") == f"p-{i}"
    bob = Passport(sub="bob", org="acme")
    async with card.socket(bob) as ws:
        await ws.subscribe("s", PAGE_SUBSCRIPTION, {"sid": "bobs-cards", "limit": 3})
        reset = (await ws.next("s"))["cardPageDeltas"]
        assert reset["__typename"] == "CardsReset"
        assert [v["id"] for v in reset["views"]] == ["p-7", "p-6", "p-5"]
        oldest = reset["views"][-1]["cursor"]

        # Someone else, knowing the session id, gets nothing.
        for intruder in (Passport(sub="carol", org="acme"), Passport(sub="gina", org="globex")):
            stolen = (await card.gql(PAGE, {"sid": "bobs-cards", "cursor": oldest}, intruder))
            assert stolen["pageCards"]["error"] == {"code": "no_live_session", "retryable": False}
        bad = (await card.gql(PAGE, {"sid": "bobs-cards", "cursor": "nonsense"}, bob))["pageCards"]
        assert bad["error"]["code"] == "card.cursor_invalid"
        await ws.quiet(0.2)

        page = (await card.gql(PAGE, {"sid": "bobs-cards", "cursor": oldest}, bob))["pageCards"]
        assert page == {"success": True, "delivered": 3, "released": [], "truncated": 0,
                        "error": None}
        paged = [(await ws.next("s"))["cardPageDeltas"] for _ in range(3)]
        assert [m["__typename"] for m in paged] == ["CardsUpsert"] * 3
        assert [m["view"]["id"] for m in paged] == ["p-4", "p-3", "p-2"]
        assert [m["revision"] for m in paged] == [reset["revision"] + n for n in (1, 2, 3)]

        # The paged keys live like any other: an edit reaches the holder.
        await card.executor.ack(BOB, rename_card, "p-3", "older, renamed")
        edit = (await ws.next("s"))["cardPageDeltas"]
        assert (edit["__typename"], edit["view"]["id"], edit["view"]["title"]) == (
            "CardsUpsert", "p-3", "older, renamed")
        assert edit["revision"] == reset["revision"] + 4

    gone = (await card.gql(PAGE, {"sid": "bobs-cards", "cursor": oldest}, bob))["pageCards"]
    assert gone["error"]["code"] == "no_live_session"


# -- the reactions -----------------------------------------------------------------------


async def test_create_card_by_command_answers_card_created_with_the_inbound_metadata(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """create_card by command on the bus answers card.created correlated and caused by the
    inbound command, with the card's producer sequence headers."""
    async with producer(nats_server) as bus:
        sent = await bus.command(CreateCardCommand(card_id="bus-1"))
        await wait_until(lambda: _events_of(nats_server.url, "created", "bus-1"), timeout=BOUND,
                         what="card.created")
    ((message, body),) = await card_events(nats_server.url, "created")
    assert body["payload"]["card_id"] == "bus-1" and body["payload"]["stage"] == "todo"
    meta = body["metadata"]
    assert meta["correlation_id"] == str(sent.correlation_id)
    assert meta["causation_id"] == str(sent.envelope_id)
    assert meta["actor"] == {"kind": "service", "id": str(Actor.service("example").id)}
    # The card's events declare its producer sequence: the card id and its version.
    assert (message.headers["Br-Producer"], message.headers["Br-Seq-Key"],
            message.headers["Br-Seq"]) == ("example", "bus-1", "1")
    rows = await owner_fetch(store, "SELECT org, owner FROM card WHERE id = 'bus-1'")
    assert rows == [{"org": "acme", "owner": str(Actor.service("twin").id)}]


async def _events_of(url: str, fact: str, card_id: str) -> bool:
    return any(b["payload"].get("card_id") == card_id for _, b in await card_events(url, fact))


async def test_create_card_refuses_a_command_whose_actor_is_a_person(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A card command whose actor is a person is answered card.rejected (not dead-lettered)
    and creates nothing."""
    impostor = Actor.person(uuid.uuid4())
    async with producer(nats_server, impostor) as bus:
        sent = await bus.command(CreateCardCommand(card_id="bus-person"))
        await wait_until(lambda: _events_of(nats_server.url, "rejected", "bus-person"),
                         timeout=BOUND, what="card.rejected")
    ((_, body),) = await card_events(nats_server.url, "rejected")
    assert body["payload"] == {
        "card_id": "bus-person", "command": "card.create", "code": "card.sender_not_service",
        "message": "card commands on the integration bus come from services only",
        "outcome": None, "revision": None}
    assert body["metadata"]["causation_id"] == str(sent.envelope_id)
    assert await owner_fetch(store, "SELECT id FROM card") == []
    assert await card_events(nats_server.url, "created") == []
    # Answered, not dead-lettered.
    assert await owner_fetch(store, "SELECT id FROM service_engine.dead_letter") == []


async def test_a_resent_create_reemits_its_confirmation_and_creates_one_card(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A create command resent past the dedup window re-emits its stored confirmation and
    creates the card once."""
    command_id = uuid.uuid4()
    async with producer(nats_server) as bus:
        await bus.command(CreateCardCommand(card_id="bus-2"), command_id=command_id)
        await wait_until(lambda: _events_of(nats_server.url, "created", "bus-2"), timeout=BOUND,
                         what="the first card.created")
        # Past JetStream's dedup window: the same command under a new Nats-Msg-Id.
        await bus.command(CreateCardCommand(card_id="bus-2", title="again"),
                          command_id=command_id, nats_msg_id=f"resend-{command_id}")

        async def twice() -> bool:
            return len(await card_events(nats_server.url, "created")) == 2

        await wait_until(twice, timeout=BOUND, what="the re-emitted card.created")
    (first, body1), (again, body2) = await card_events(nats_server.url, "created")
    assert body1 == body2  # the stored confirmation, not a new effect
    assert first.headers["Br-Message-Id"] == again.headers["Br-Message-Id"]
    assert first.headers["Nats-Msg-Id"] != again.headers["Nats-Msg-Id"]
    assert await owner_fetch(store, "SELECT title FROM card") == [{"title": "from the bus"}]
    assert await facts(store, "bus-2") == ["card.created"]


async def _answers(url: str, card_id: str) -> list[dict[str, Any]]:
    return [b for _, b in await card_events(url)
            if b["type"] in ("card.advanced", "card.rejected")
            and b["payload"].get("card_id") == card_id]


async def test_a_bus_advance_is_a_revision_checked_transition(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """card.advance runs the declared transition from the sender's expected revision: at the
    card's revision it advances (card.advanced, caused by the command); from a stale revision
    it answers card.rejected with the StaleRevision outcome and the card's current revision,
    and changes nothing (no state, no fact, no card.advanced)."""
    async with producer(nats_server) as bus:
        await bus.command(CreateCardCommand(card_id="bus-adv"))
        await wait_until(lambda: _events_of(nats_server.url, "created", "bus-adv"),
                         timeout=BOUND, what="card.created")
        sent = await bus.command(AdvanceCardCommand(card_id="bus-adv", expected_revision=1))

        async def answered(n: int) -> bool:
            return len(await _answers(nats_server.url, "bus-adv")) == n

        await wait_until(lambda: answered(1), timeout=BOUND, what="card.advanced")
        (advanced,) = await _answers(nats_server.url, "bus-adv")
        assert advanced["type"] == "card.advanced"
        assert advanced["payload"] == {"card_id": "bus-adv", "version": 2, "stage": "doing"}
        assert advanced["metadata"]["causation_id"] == str(sent.envelope_id)

        # The same revision again is stale now: answered, nothing moves.
        stale = await bus.command(AdvanceCardCommand(card_id="bus-adv", expected_revision=1))
        await wait_until(lambda: answered(2), timeout=BOUND, what="the stale answer")
    rejected = (await _answers(nats_server.url, "bus-adv"))[1]
    assert rejected["type"] == "card.rejected"
    assert rejected["payload"] == {
        "card_id": "bus-adv", "command": "card.advance", "code": "card.stale_revision",
        "message": "FinishCard: StaleRevision", "outcome": "StaleRevision", "revision": 2}
    assert rejected["metadata"]["causation_id"] == str(stale.envelope_id)
    assert await owner_fetch(store, "SELECT stage, version FROM card WHERE id = 'bus-adv'") == [
        {"stage": "doing", "version": 2}]
    assert await facts(store, "bus-adv") == ["card.created", "card.advanced"]
    assert len(await card_events(nats_server.url, "advanced")) == 1
    assert await owner_fetch(store, "SELECT id FROM service_engine.dead_letter") == []


async def test_a_bus_advance_of_a_done_card_is_the_gates_refusal(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A bus advance of a done card at its revision answers the gate's card.done (outcome
    Refused, the affordance's reason) with zero mutation."""
    await card.executor.execute(ALICE, create_card, "to finish", "bus-done")
    for _ in range(2):
        assert await advance_card(card.executor, ALICE, "bus-done") == Success()
    async with producer(nats_server) as bus:
        await bus.command(AdvanceCardCommand(card_id="bus-done", expected_revision=3))
        await wait_until(lambda: _events_of(nats_server.url, "rejected", "bus-done"),
                         timeout=BOUND, what="card.rejected")
    ((_, body),) = await card_events(nats_server.url, "rejected")
    assert (body["payload"]["code"], body["payload"]["outcome"], body["payload"]["revision"]) \
        == ("card.done", "Refused", 3)
    assert await owner_fetch(store, "SELECT stage, version FROM card WHERE id = 'bus-done'") == [
        {"stage": "done", "version": 3}]


async def test_an_early_review_is_parked_until_its_card_exists(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A review that arrives before its card is parked, then applied once the card exists."""
    async with producer(nats_server) as bus:
        await bus.event(ReviewEvent(card_id="early"), producer="twin")

        async def parked() -> bool:
            rows = await owner_fetch(
                store, "SELECT 1 FROM service_engine.message_claim WHERE reaction = 'record_review'")
            return not rows

        await wait_until(parked, timeout=BOUND, what="the review parked")
        await bus.command(CreateCardCommand(card_id="early"))
        await wait_until(lambda: _events_of(nats_server.url, "reviewed", "early"), timeout=BOUND,
                         what="card.reviewed once the card exists")
    rows = await owner_fetch(store, "SELECT reviewed_by, version FROM card WHERE id = 'early'")
    assert rows == [{"reviewed_by": "twin", "version": 2}]
    assert await facts(store, "early") == ["card.created", "card.reviewed"]


async def test_a_deadline_scheduled_at_creation_flags_an_open_card_overdue(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A deadline scheduled at creation flags the still-open card overdue (seen live on the
    window); both deadlines fire."""
    stream = await card.engine.attach(BOB, CARDS, WindowSpec(Query(CardsQuery())))
    try:
        await asyncio.wait_for(stream.next(), BOUND)
        assert await card.executor.execute(BOB, create_card, "soon due", "due-1", 0.3) == "due-1"
        await card.executor.execute(ALICE, create_card, "done in time", "due-2", 0.3)
        for _ in range(2):
            await advance_card(card.executor, ALICE, "due-2")
        await wait_until(lambda: _events_of(nats_server.url, "overdue", "due-1"), timeout=BOUND,
                         what="card.overdue")
        while True:  # the live window sees it flagged
            delta = await asyncio.wait_for(stream.next(), BOUND)
            if isinstance(delta, Upsert) and delta.key == '"due-1"' and delta.view.overdue:
                break
    finally:
        await stream.aclose()
    # Both deadlines fire; due-2's may land after due-1 was already flagged.
    await wait_until(lambda: _events_of(nats_server.url, "due", "due-2"), timeout=BOUND,
                     what="due-2's deadline")
    due = await card_events(nats_server.url, "due")
    assert sorted(b["payload"]["card_id"] for _, b in due) == ["due-1", "due-2"]
    rows = await owner_fetch(store, "SELECT id, overdue FROM card ORDER BY id")
    assert rows == [{"id": "due-1", "overdue": True}, {"id": "due-2", "overdue": False}]
    assert [b["payload"]["card_id"] for _, b in await card_events(nats_server.url, "overdue")] \
        == ["due-1"]


async def test_a_card_due_ahead_of_the_cards_own_deadline_flags_nothing_until_it_passes(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A due event that arrives before the card's own deadline flags nothing; the card is
    flagged only once its deadline passed."""
    await card.executor.execute(BOB, create_card, "no deadline", "stray")
    await card.executor.execute(BOB, create_card, "due later", "later", 1.5)

    class Due(BaseModel):
        AGGREGATE: ClassVar[str] = "card"
        FACT: ClassVar[str] = "due"
        VERSION: ClassVar[int] = 1
        card_id: str

        def sequence(self) -> DeclaredSequence | None:
            return None

    async with producer(nats_server) as bus:
        for card_id in ("stray", "later"):  # early copies on the service's own subject
            await bus.event(Due(card_id=card_id), producer="example")

        async def both_seen() -> bool:
            state = await consumer_state(nats_server.url, "INTEGRATION_EVT", "example-expire_card")
            return int(state.delivered.stream_seq) >= 2

        await wait_until(both_seen, timeout=BOUND, what="both early copies delivered")
    assert await owner_fetch(store, "SELECT id, overdue FROM card ORDER BY id") == [
        {"id": "later", "overdue": False}, {"id": "stray", "overdue": False}]

    # Once the deadline passes the card is flagged, once.
    await wait_until(lambda: _events_of(nats_server.url, "overdue", "later"), timeout=BOUND,
                     what="card.overdue at the deadline")
    assert await owner_fetch(store, "SELECT id, overdue FROM card ORDER BY id") == [
        {"id": "later", "overdue": True}, {"id": "stray", "overdue": False}]
    assert len(await card_events(nats_server.url, "overdue")) == 1
    assert await owner_fetch(store, "SELECT id FROM service_engine.dead_letter") == []


async def digests(store: ProvisionedDatabase) -> list[dict[str, Any]]:
    rows = await owner_fetch(
        store, "SELECT payload FROM service_engine.integration_outbox"
               " WHERE subject = 'integration.evt.example.card.digest' ORDER BY id")
    return [json.loads(r["payload"]) for r in rows]


async def test_the_digest_cron_publishes_once_per_slot(card: Running, store: ProvisionedDatabase
                                                       ) -> None:
    """The digest cron publishes once per slot as the service, counting the cards per org
    and stage at that slot."""
    await card.executor.execute(BOB, create_card, "one", "d-1")
    await card.executor.execute(GLOBEX, create_card, "two", "d-2")
    # The beat fired the current slot at start; firing it again does nothing.
    await wait_until(lambda: _has_digest(store), timeout=BOUND, what="the slot's digest")
    outcomes = await card.engine.integration.crons.fire_due()
    assert [o.outcome for o in outcomes if o.cron == "card_digest"] == ["done"]
    (first,) = await digests(store)
    assert first["metadata"]["actor"] == {"kind": "service", "id": str(Actor.service("example").id)}

    # A slot's tick counts the cards per org and stage at that moment.
    slot = datetime(2030, 1, 1, tzinfo=UTC)
    async with card.db.pool.acquire() as conn, conn.transaction():
        await digest_cron("example").run(conn, Tick("card_digest", slot, 1, Actor.service("example")))
    latest = (await digests(store))[-1]
    assert latest["payload"] == {"slot": "2030-01-01T00:00:00Z",
                                 "counts": {"acme": {"todo": 1}, "globex": {"todo": 1}}}


async def _has_digest(store: ProvisionedDatabase) -> bool:
    return bool(await digests(store))


async def test_the_twin_closes_the_cycle_against_the_slice(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """The twin closes every cross-service cycle against the card slice: each card ends
    doing, reviewed by the twin and overdue."""
    async with Twin.connect(nats_server.url) as twin:
        summary = await twin.run_cycles(3, org="acme", bound=BOUND, due_in=0.3)
    assert summary.ok, summary.to_json()
    ids = sorted(r.card_id for r in summary.results)
    rows = await owner_fetch(
        store, "SELECT id, stage, reviewed_by, overdue FROM card ORDER BY id")
    assert rows == [{"id": i, "stage": "doing", "reviewed_by": "twin", "overdue": True}
                    for i in ids]


async def test_the_twins_reviewer_approves_every_card_the_service_creates(
    card: Running, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """The twin's reviewer approves every card the service creates, in any org, once each."""
    stop = asyncio.Event()
    async with Twin.connect(nats_server.url) as twin:
        reviewer = asyncio.create_task(twin.review(stop))
        try:
            await card.executor.execute(BOB, create_card, "by a person", "r-1")
            await card.executor.execute(GLOBEX, create_card, "elsewhere", "r-2")

            async def reviewed() -> bool:
                rows = await owner_fetch(store, "SELECT reviewed_by FROM card")
                return [r["reviewed_by"] for r in rows] == ["twin", "twin"]

            await wait_until(reviewed, timeout=BOUND, what="both cards reviewed")
        finally:
            stop.set()
            approved = await asyncio.wait_for(reviewer, BOUND)
    assert approved == 2

    async def published() -> bool:  # the outbox relays the second review in its own time
        return len(await card_events(nats_server.url, "reviewed")) >= 2

    await wait_until(published, timeout=BOUND, what="both reviews published")
    assert sorted(b["payload"]["card_id"] for _, b in await card_events(nats_server.url, "reviewed")) \
        == ["r-1", "r-2"]
