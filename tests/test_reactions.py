"""Pure parts of the inbound loop: dispositions routed against budgets, the
failure classification, the declaration, stored confirmations, replay
headers and the passport actor of a principal."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from service_engine.db.errors import DatabaseFault
from service_engine.errors import ConfigError
from service_engine.gates import Reason, Refused
from service_engine.inbound.declaration import InboundReaction
from service_engine.inbound.dispatch import classify_failure
from service_engine.messaging.claims import confirmations_json, parse_confirmations
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    Actor,
    OutboundMessage,
    ProducerSequence,
    SequenceWithoutService,
    row_publish_headers,
)
from service_engine.messaging.reactions import (
    DeadLetterIt,
    Nak,
    Park,
    PrincipalUnresolved,
    ReactionBudget,
    Retry,
    Terminal,
    backoff_delay,
    is_terminal_sqlstate,
    route,
)
from service_engine.outbox.staging import OutboxRow
from service_engine.persistence.base import NotFound
from service_engine.pipeline import ConstraintViolation, LockTimeout, Stage, principal_actor

MS = timedelta(milliseconds=1)
BUDGET = ReactionBudget(
    max_deliveries=4, retry_backoff=100 * MS, retry_backoff_cap=500 * MS,
    park_delay=2000 * MS, park_for=timedelta(minutes=10),
)


class Ping(BaseModel):
    n: int = 0


async def _noop(cx: Any, payload: Ping) -> None:
    return None


# -- budgets and routing ---------------------------------------------------------------


def test_retry_backoff_grows_and_is_capped() -> None:
    """The retry backoff doubles per delivery from its base and stops at its cap."""
    delays = [backoff_delay(n, 100 * MS, 500 * MS) for n in range(1, 7)]
    assert delays == [0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
    assert backoff_delay(10_000, 100 * MS, 500 * MS) == 0.5


@given(st.integers(min_value=0, max_value=10**9))
def test_backoff_never_exceeds_its_cap(delivered: int) -> None:
    """The backoff is positive and never exceeds its cap, for any delivery count (property test)."""
    assert 0 < backoff_delay(delivered, 100 * MS, 500 * MS) <= 0.5


def test_a_retry_naks_until_the_delivery_budget_then_dead_letters() -> None:
    """A Retry naks with growing delays until the delivery budget is spent, then dead-letters as
    retry_budget_spent."""
    answers = [route(Retry("down"), delivered=n, age=None, budget=BUDGET) for n in (1, 2, 3, 4)]
    assert [type(a) for a in answers] == [Nak, Nak, Nak, DeadLetterIt]
    assert [a.delay for a in answers[:3]] == [0.1, 0.2, 0.4]  # type: ignore[union-attr]
    assert answers[3].reason == "retry_budget_spent"


def test_a_retry_may_name_its_own_delay() -> None:
    """A Retry naming its own delay is nak'ed with that delay."""
    answer = route(Retry("down", delay=3 * MS), delivered=1, age=None, budget=BUDGET)
    assert answer == Nak(0.003, "down", "")


def test_a_park_naks_with_the_park_delay_until_the_message_is_too_old() -> None:
    """A Park naks with the park delay whatever the delivery count, until the message is older than
    park_for, then dead-letters as park_budget_spent."""
    young = route(Park("early"), delivered=40, age=timedelta(minutes=1), budget=BUDGET)
    assert young == Nak(2.0, "early", "")
    old = route(Park("early"), delivered=2, age=timedelta(minutes=10), budget=BUDGET)
    assert isinstance(old, DeadLetterIt) and old.reason == "park_budget_spent"


def test_terminal_dead_letters_with_its_reason() -> None:
    """A Terminal dead-letters at once with its reason and detail; an unresolved principal as
    principal_unresolved."""
    answer = route(Terminal("order.refused", "no stock"), delivered=1, age=None, budget=BUDGET)
    assert answer == DeadLetterIt("order.refused", "no stock")
    unresolved = route(PrincipalUnresolved(), delivered=1, age=None, budget=BUDGET)
    assert isinstance(unresolved, DeadLetterIt) and unresolved.reason == "principal_unresolved"


@pytest.mark.parametrize(
    ("fields", "relation"),
    [
        ({"max_deliveries": 0}, "max_deliveries >= 1"),
        ({"retry_backoff": timedelta(0)}, "retry_backoff > 0"),
        ({"retry_backoff_cap": MS}, "retry_backoff_cap >= retry_backoff"),
        ({"park_delay": timedelta(0)}, "park_delay > 0"),
        ({"park_for": timedelta(seconds=1)}, "park_for >= park_delay"),
    ],
)
def test_a_budget_refuses_each_bad_bound_by_name(fields: dict[str, Any], relation: str) -> None:
    """A reaction budget refuses each bound out of range, naming the relation it breaks."""
    with pytest.raises(ConfigError, match=relation):
        ReactionBudget(**fields)


# -- the engine's classification ---------------------------------------------------------


def classify(exc: BaseException, delivered: int = 1) -> Nak | DeadLetterIt:
    return classify_failure(exc, delivered=delivered, age=None, budget=BUDGET)


def test_integrity_and_data_violations_are_terminal_whatever_the_delivery() -> None:
    """Constraint violations and data exceptions are terminal (integrity_violation, data_exception);
    lock timeouts and unknown SQLSTATEs are not."""
    violation = ConstraintViolation("check", "qty_positive", "order", Stage.CREATE, "23514")
    assert classify(violation).reason == "integrity_violation"
    data = DatabaseFault("bad number", Stage.SAVE, "22003")
    assert classify(data).reason == "data_exception"
    assert is_terminal_sqlstate("23505") and is_terminal_sqlstate("22P02")
    assert not is_terminal_sqlstate("55P03") and not is_terminal_sqlstate(None)


def test_retryable_database_faults_nak_without_a_budget() -> None:
    """A lock timeout or a lost connection naks at the capped delay whatever the delivery count; a
    non-retryable database fault dead-letters as database."""
    timeout = LockTimeout("lock", Stage.LOCK, "55P03")
    lost = DatabaseFault("gone", Stage.LOAD, "08006", retryable=True)
    for exc in (timeout, lost):
        answer = classify(exc, delivered=100)
        assert isinstance(answer, Nak) and answer.delay == 0.5
    assert classify(DatabaseFault("syntax", Stage.LOAD, "42601")).reason == "database"


def test_other_failures_are_terminal_with_a_reason_an_operator_reads() -> None:
    """Handler bugs, a sequence without service, refusals and not-found dead-letter with reasons an
    operator reads."""
    assert classify(RuntimeError("bug")) == DeadLetterIt("handler_error", "RuntimeError: bug")
    assert classify(SequenceWithoutService("x")).reason == "sequence_without_service"
    assert classify(Refused(Reason("order.closed"))).reason == "refused:order.closed"
    assert classify(NotFound("order", "o1")).reason == "not_found"


# -- the declaration ----------------------------------------------------------------------


def test_a_command_reaction_defaults_to_the_engines_service() -> None:
    """A command reaction binds the command stream and the engine's service's subject and durable;
    with no service its subject is refused."""
    r = InboundReaction.command("place", aggregate="order", verb="place", payload=Ping, handler=_noop)
    assert r.stream == "INTEGRATION_CMD"
    assert r.subject("orders") == "integration.cmd.orders.order.place"
    assert r.durable("orders") == "orders-place"
    with pytest.raises(ConfigError, match="names no service"):
        r.subject(None)


def test_an_event_reaction_binds_the_producers_subject() -> None:
    """An event reaction binds the event stream and the producer's subject, its durable named for
    the reaction."""
    r = InboundReaction.event(
        "on_shipped", producer="warehouse", aggregate="order", fact="shipped",
        payload=Ping, handler=_noop,
    )
    assert r.stream == "INTEGRATION_EVT"
    assert r.subject(None) == "integration.evt.warehouse.order.shipped"
    assert r.durable(None) == "on_shipped"


@pytest.mark.parametrize("name", ["", "a-b", "a.b", "a b", "a>"])
def test_a_reaction_name_is_one_durable_safe_token(name: str) -> None:
    """A reaction name that is empty or holds a dash, dot, space or wildcard is refused."""
    with pytest.raises(ConfigError):
        InboundReaction.command(name, aggregate="order", verb="place", payload=Ping, handler=_noop)


def test_a_reaction_refuses_bad_coordinates_and_payloads() -> None:
    """A reaction with a dotted aggregate, a payload that is not a pydantic model or a concurrency
    of 0 is refused."""
    with pytest.raises(ConfigError):
        InboundReaction.command("x", aggregate="or.der", verb="place", payload=Ping, handler=_noop)
    with pytest.raises(ConfigError, match="pydantic"):
        InboundReaction.command(
            "x", aggregate="order", verb="place", payload=dict,  # type: ignore[type-var]
            handler=_noop,  # type: ignore[arg-type]  # the handler's payload cannot match dict
        )
    with pytest.raises(ConfigError, match="concurrency"):
        InboundReaction.command(
            "x", aggregate="order", verb="place", payload=Ping, handler=_noop, concurrency=0
        )


# -- confirmations and replay ------------------------------------------------------------


def test_stored_confirmations_round_trip() -> None:
    """Confirmations stored on a claim parse back to the same outbound messages, sequences included."""
    messages = [
        OutboundMessage(uuid.uuid4(), "integration.evt.a.b.c", {"event_id": "x", "n": [1]}, None),
        OutboundMessage(uuid.uuid4(), "integration.cmd.a.b.c", {"command_id": "y"},
                        ProducerSequence("a", "k", 7)),
    ]
    assert parse_confirmations(confirmations_json(messages)) == messages


def test_a_replayed_row_keeps_the_logical_id_under_a_fresh_dedup_token() -> None:
    """A replayed outbox row gets a fresh Nats-Msg-Id and keeps the original message id as its
    logical id; the first row uses the message id for both."""
    message = OutboundMessage(uuid.uuid4(), "integration.evt.a.b.c", {"event_id": "x"},
                              ProducerSequence("a", "k", 3))
    first, again = OutboxRow.of(message), OutboxRow.of(message, replay=True)
    assert first.message_id == message.message_id
    assert again.message_id != message.message_id
    headers = row_publish_headers(
        again.message_id, again.headers_json, again.producer, again.seq_key, again.seq
    )
    assert headers[HEADER_NATS_MSG_ID] == str(again.message_id)
    assert headers[HEADER_MESSAGE_ID] == str(message.message_id)
    original = row_publish_headers(
        first.message_id, first.headers_json, first.producer, first.seq_key, first.seq
    )
    assert original[HEADER_NATS_MSG_ID] == original[HEADER_MESSAGE_ID] == str(message.message_id)


# -- the passport actor ---------------------------------------------------------------


@dataclass(frozen=True)
class WithActor:
    actor: Any
    kind: str = "person"


@dataclass(frozen=True)
class Plain:
    id: str
    NOTE: ClassVar[str] = "no actor"


def test_a_principal_exposes_its_passport_actor() -> None:
    """principal_actor reads a principal's actor (a UUID string, a UUID with a kind, or an Actor); a
    non-UUID or an absent actor gives None."""
    ident = uuid.uuid4()
    assert principal_actor(WithActor(str(ident))) == Actor.person(ident)
    assert principal_actor(WithActor(ident, "service")) == Actor(kind="service", id=ident)
    assert principal_actor(WithActor(Actor.service("x"))) == Actor.service("x")
    assert principal_actor(Actor.person(ident)) == Actor.person(ident)
    assert principal_actor(WithActor("u-42")) is None
    assert principal_actor(Plain("bob")) is None


def test_an_outbox_row_of_a_message_is_the_row_built_field_by_field() -> None:
    """`OutboxRow.of` reuses the message's canonical body text: the row is
    the one the public constructor builds, non-ASCII and sequence included."""
    for sequence in (None, ProducerSequence("a", "k", 7)):
        message = OutboundMessage(
            uuid.uuid4(), "integration.evt.a.b.c",
            {"event_id": "x", "z": "é ☃", "a": {"n": [1, 2.5, None]}}, sequence,
        )
        built = OutboxRow(
            message.subject, message.body, message_id=message.message_id,
            producer=None if sequence is None else sequence.producer,
            seq_key=None if sequence is None else sequence.seq_key,
            seq=None if sequence is None else sequence.seq,
        )
        assert OutboxRow.of(message) == built
        assert message.body_text() == built.payload_json


def test_a_confirmation_stores_each_body_as_its_outbox_row_carries_it() -> None:
    """The stored confirmations are valid JSON holding the messages exactly
    (subjects and bodies with quotes and non-ASCII), and each body's text is
    the outbox row's."""
    messages = [
        OutboundMessage(uuid.uuid4(), 'integration.evt.a."b".c', {"q": 'say "hi"\n', "u": "ü"},
                        None),
        OutboundMessage(uuid.uuid4(), "integration.cmd.a.b.c", {}, ProducerSequence("a", "k", 1)),
    ]
    stored = confirmations_json(messages)
    assert [item["body"] for item in json.loads(stored)] == [m.body for m in messages]
    assert parse_confirmations(stored) == messages
    assert OutboxRow.of(messages[0]).payload_json in stored
