"""The frontier envelope: building, subjects, headers, identify (pure)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from service_engine.errors import ConfigError
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    HEADER_PRODUCER,
    HEADER_SEQ,
    HEADER_SEQ_KEY,
    SERVICE_NAMESPACE,
    Actor,
    DeclaredSequence,
    EnvelopeError,
    EventMetadata,
    Incoming,
    IntegrationCommand,
    IntegrationEvent,
    PayloadMismatch,
    ProducerSequence,
    SequenceWithoutService,
    ServiceRequired,
    Unidentified,
    build_command,
    build_event,
    command_subject,
    decode_payload,
    derive_dead_letter_id,
    event_subject,
    identify,
    outbound_message,
    publish_headers,
    row_publish_headers,
    service_identity,
)

NOW = datetime(2026, 9, 11, 12, 0, tzinfo=UTC)


class CardCreated(BaseModel):
    AGGREGATE: ClassVar[str] = "card"
    FACT: ClassVar[str] = "created"
    VERSION: ClassVar[int] = 2

    card_id: uuid.UUID
    title: str
    version: int = 1

    def sequence(self) -> DeclaredSequence | None:
        return DeclaredSequence(str(self.card_id), self.version)


class CardRenamed(BaseModel):
    AGGREGATE: ClassVar[str] = "card"
    FACT: ClassVar[str] = "renamed"
    VERSION: ClassVar[int] = 1

    title: str

    def sequence(self) -> DeclaredSequence | None:
        return None


class CreateCard(BaseModel):
    SERVICE: ClassVar[str] = "cards"
    AGGREGATE: ClassVar[str] = "card"
    VERB: ClassVar[str] = "create"
    VERSION: ClassVar[int] = 1

    title: str

    def sequence(self) -> DeclaredSequence | None:
        return None


def metadata() -> EventMetadata:
    return EventMetadata.originating(Actor.service("twin"))


# -- subjects and identity ------------------------------------------------------------


def test_subjects_follow_the_integration_layout() -> None:
    """Event and command subjects are integration.evt|cmd.<service>.<aggregate>.<name>."""
    assert event_subject("cards", "card", "created") == "integration.evt.cards.card.created"
    assert command_subject("cards", "card", "create") == "integration.cmd.cards.card.create"


@pytest.mark.parametrize("bad", ["", "a.b", "a*", ">", "a b", "é"])
def test_a_subject_token_refuses_separators_and_wildcards(bad: str) -> None:
    """A subject token that is empty, holds a dot, a wildcard, a space or a non-ASCII letter is
    refused with EnvelopeError."""
    with pytest.raises(EnvelopeError):
        event_subject("cards", bad, "created")


def test_service_identity_is_uuid5_of_the_name_in_the_fixed_namespace() -> None:
    """A service's identity is the UUIDv5 of its name in the fixed namespace, stable per name and
    distinct across names, and a service actor carries it."""
    identity = service_identity("cards")
    assert identity == uuid.uuid5(SERVICE_NAMESPACE, "cards")
    assert identity.version == 5
    assert service_identity("cards") == identity != service_identity("ledger")
    assert Actor.service("cards") == Actor(kind="service", id=identity)
    assert Actor.service("cards").is_service and not Actor.person(uuid.uuid4()).is_service


def test_service_identity_needs_a_name() -> None:
    """An empty service name has no identity: ServiceRequired."""
    with pytest.raises(ServiceRequired):
        service_identity("")


def test_caused_metadata_keeps_the_correlation_and_names_the_cause() -> None:
    """Caused metadata keeps the origin's correlation id, names the cause and the new actor, and
    leaves the origin unchanged."""
    origin = metadata()
    cause = uuid.uuid4()
    caused = origin.caused(cause, Actor.service("cards"))
    assert caused.correlation_id == origin.correlation_id
    assert caused.causation_id == cause
    assert caused.actor == Actor.service("cards")
    assert origin.causation_id is None


# -- outbound -----------------------------------------------------------------------------


def test_an_event_is_wrapped_with_its_coordinates_and_sequence() -> None:
    """An event is built with its subject, its declared producer sequence and an envelope body (id,
    type, version, payload, metadata) that round-trips through the wire model."""
    card = uuid.uuid4()
    meta = metadata()
    msg = build_event(
        CardCreated(card_id=card, title="t", version=7), service="cards", metadata=meta,
        occurred_at=NOW,
    )
    assert msg.subject == "integration.evt.cards.card.created"
    assert msg.sequence == ProducerSequence("cards", str(card), 7)
    body = json.loads(msg.body_json())
    assert body["event_id"] == str(msg.message_id)
    assert body["type"] == "card.created"
    assert body["version"] == 2
    assert body["payload"] == {"card_id": str(card), "title": "t", "version": 7}
    assert body["metadata"]["actor"] == {"kind": "service", "id": str(service_identity("twin"))}
    assert body["metadata"]["correlation_id"] == str(meta.correlation_id)
    # the body round-trips through the wire model
    back = IntegrationEvent[CardCreated].model_validate(body)
    assert back.payload.card_id == card and back.occurred_at == NOW


def test_an_event_without_a_declared_sequence_carries_none() -> None:
    """An event type without a declared sequence builds a message with no sequence."""
    msg = build_event(CardRenamed(title="x"), service="cards", metadata=metadata(), occurred_at=NOW)
    assert msg.sequence is None


def test_an_event_needs_a_service_for_its_subject() -> None:
    """Building an event with no service is refused: ServiceRequired."""
    with pytest.raises(ServiceRequired):
        build_event(CardRenamed(title="x"), service=None, metadata=metadata(), occurred_at=NOW)


def test_a_command_is_addressed_to_its_handling_service() -> None:
    """A command's subject names the handling service, and its body carries a command_id and no
    event_id."""
    msg = build_command(CreateCard(title="x"), service="twin", metadata=metadata(), occurred_at=NOW)
    assert msg.subject == "integration.cmd.cards.card.create"
    body = json.loads(msg.body_json())
    assert body["command_id"] == str(msg.message_id) and "event_id" not in body
    assert body["type"] == "card.create"


def test_a_declared_sequence_without_a_service_is_a_config_error() -> None:
    """A declared sequence with no service is SequenceWithoutService (a ConfigError); no sequence
    and no service is fine."""
    envelope: IntegrationCommand[CreateCard] = IntegrationCommand(
        command_id=uuid.uuid4(), type="card.create", version=1, occurred_at=NOW,
        metadata=metadata(), payload=CreateCard(title="x"),
    )
    with pytest.raises(SequenceWithoutService) as raised:
        outbound_message(envelope, "integration.cmd.cards.card.create", DeclaredSequence("k", 1), None)
    assert isinstance(raised.value, ConfigError)
    # no sequence, no service: fine
    assert outbound_message(envelope, "integration.cmd.cards.card.create", None, None).sequence is None


def test_a_payload_must_be_a_json_object() -> None:
    """An envelope whose payload is not a JSON object is refused with EnvelopeError."""
    envelope: IntegrationCommand[list[int]] = IntegrationCommand(
        command_id=uuid.uuid4(), type="card.create", version=1, occurred_at=NOW,
        metadata=metadata(), payload=[1, 2],
    )
    with pytest.raises(EnvelopeError):
        outbound_message(envelope, "s", None, None)


@pytest.mark.parametrize("seq", [-1, True, 1.5])
def test_a_declared_sequence_is_a_non_negative_int(seq: object) -> None:
    """A declared sequence that is negative, a bool or a float is refused with EnvelopeError."""
    with pytest.raises(EnvelopeError):
        DeclaredSequence("k", seq)  # type: ignore[arg-type]


def test_publish_headers_render_ids_and_the_sequence() -> None:
    """Publish headers carry the Nats-Msg-Id, the logical id (the message id when none is given) and
    the sequence, overriding forged values in the extra headers."""
    mid, logical = uuid.uuid4(), uuid.uuid4()
    headers = publish_headers(
        mid, logical_id=logical, sequence=ProducerSequence("cards", "k1", 4),
        extra={"X-Trace": "t", HEADER_NATS_MSG_ID: "forged", HEADER_PRODUCER: "forged"},
    )
    assert headers == {
        "X-Trace": "t", HEADER_NATS_MSG_ID: str(mid), HEADER_MESSAGE_ID: str(logical),
        HEADER_PRODUCER: "cards", HEADER_SEQ_KEY: "k1", HEADER_SEQ: "4",
    }
    plain = publish_headers(mid)
    assert plain == {HEADER_NATS_MSG_ID: str(mid), HEADER_MESSAGE_ID: str(mid)}


def test_row_headers_need_all_three_sequence_columns() -> None:
    """A stored row's publish headers carry a sequence only when producer, key and number are all
    set, and keep the row's extra headers."""
    mid = uuid.uuid4()
    assert HEADER_SEQ not in row_publish_headers(mid, "{}", "cards", None, 3)
    full = row_publish_headers(mid, '{"A": 1}', "cards", "k", 3)
    assert full["A"] == "1" and full[HEADER_SEQ] == "3" and full[HEADER_NATS_MSG_ID] == str(mid)


# -- inbound ------------------------------------------------------------------------------


def frame(msg_headers: dict[str, str] | None = None, **overrides: Any) -> tuple[bytes, dict[str, str]]:
    meta = metadata()
    body: dict[str, object] = {
        "event_id": str(uuid.uuid4()), "type": "card.created", "version": 1,
        "occurred_at": NOW.isoformat(), "metadata": meta.model_dump(mode="json"),
        "payload": {"card_id": str(uuid.uuid4()), "title": "t"},
    }
    body.update(overrides)
    body = {k: v for k, v in body.items() if v is not None}
    return json.dumps(body).encode(), dict(msg_headers or {})


def test_identify_reads_the_envelope_and_the_logical_id() -> None:
    """identify reads an event frame's envelope, kind, coordinates and logical id (the envelope id),
    and its payload decodes to the reaction's type."""
    data, headers = frame()
    incoming = identify(data, headers)
    assert isinstance(incoming, Incoming)
    assert incoming.kind == "event"
    assert incoming.message_id == incoming.envelope.envelope_id
    assert incoming.envelope.aggregate == "card" and incoming.envelope.name == "created"
    assert incoming.sequence is None
    assert decode_payload(incoming, CardCreated).title == "t"


def test_br_message_id_is_the_logical_id_when_it_is_a_uuid() -> None:
    """A Br-Message-Id header that is a UUID is the frame's logical id."""
    logical = uuid.uuid4()
    data, headers = frame({HEADER_MESSAGE_ID: str(logical), HEADER_NATS_MSG_ID: str(uuid.uuid4())})
    incoming = identify(data, headers)
    assert isinstance(incoming, Incoming) and incoming.message_id == logical


def test_a_non_uuid_nats_msg_id_is_tolerated() -> None:
    """A foreign, non-UUID Nats-Msg-Id is tolerated; the logical id falls back to the envelope id."""
    data, headers = frame({HEADER_NATS_MSG_ID: "foreign-fabric-17"})
    incoming = identify(data, headers)
    assert isinstance(incoming, Incoming)
    assert incoming.message_id == incoming.envelope.envelope_id


def test_identify_reads_a_command_and_a_sequence() -> None:
    """identify reads a command frame's kind and its producer sequence from the headers."""
    data, headers = frame(
        {HEADER_PRODUCER: "twin", HEADER_SEQ_KEY: "k", HEADER_SEQ: "12"},
        event_id=None, command_id=str(uuid.uuid4()), type="card.create",
    )
    incoming = identify(data, headers)
    assert isinstance(incoming, Incoming)
    assert incoming.kind == "command"
    assert incoming.sequence == ProducerSequence("twin", "k", 12)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"title": "a bare body"}',
        json.dumps({"event_id": str(uuid.uuid4()), "command_id": str(uuid.uuid4())}).encode(),
    ],
)
def test_an_envelope_less_frame_is_refused(data: bytes) -> None:
    """A frame that is not a JSON object envelope (bad bytes, a list, a bare body, both ids) is
    Unidentified with reason no_envelope."""
    refused = identify(data, {HEADER_NATS_MSG_ID: "m-1"})
    assert isinstance(refused, Unidentified) and refused.reason == "no_envelope"


@pytest.mark.parametrize(
    "overrides",
    [
        {"type": "no-dot"},
        {"type": "a.b.c"},
        {"version": 0},
        {"occurred_at": "2026-09-11T12:00:00"},  # naive
        {"metadata": {"correlation_id": str(uuid.uuid4())}},
        {"payload": None},
    ],
)
def test_a_malformed_envelope_is_refused(overrides: dict[str, Any]) -> None:
    """An envelope with a malformed type, a version of 0, a naive time, incomplete metadata or a
    null payload is Unidentified."""
    data, headers = frame(**overrides)
    assert isinstance(identify(data, headers), Unidentified)


@pytest.mark.parametrize(
    "seq_headers",
    [
        {HEADER_PRODUCER: "twin"},
        {HEADER_PRODUCER: "twin", HEADER_SEQ_KEY: "k", HEADER_SEQ: "x"},
        {HEADER_PRODUCER: "", HEADER_SEQ_KEY: "k", HEADER_SEQ: "1"},
    ],
)
def test_a_malformed_sequence_is_refused_not_dropped(seq_headers: dict[str, str]) -> None:
    """Incomplete or malformed sequence headers make the frame Unidentified with reason
    bad_sequence, not a frame without sequence."""
    data, headers = frame(seq_headers)
    refused = identify(data, headers)
    assert isinstance(refused, Unidentified) and refused.reason == "bad_sequence"


def test_a_refused_frame_derives_one_dead_letter_id_per_reaction_from_its_headers() -> None:
    """A refused frame's dead-letter id derives from its id headers (Br-Message-Id first): the same
    per reaction across redeliveries, distinct across reactions."""
    first = identify(b"junk", {HEADER_NATS_MSG_ID: "not-a-uuid"})
    again = identify(b"junk", {HEADER_NATS_MSG_ID: "not-a-uuid"})
    assert isinstance(first, Unidentified) and isinstance(again, Unidentified)
    assert first.dead_letter_id("r1") == again.dead_letter_id("r1")
    assert first.dead_letter_id("r1") != first.dead_letter_id("r2")
    by_br = identify(b"junk", {HEADER_MESSAGE_ID: "m", HEADER_NATS_MSG_ID: "n"})
    assert isinstance(by_br, Unidentified) and by_br.frame_id == "m"


def test_a_refused_frame_without_id_headers_gets_a_fresh_id_that_is_stable_per_frame() -> None:
    """A refused frame without id headers gets an id stable for that frame and distinct from
    another's."""
    a, b = identify(b"junk", None), identify(b"junk", None)
    assert isinstance(a, Unidentified) and isinstance(b, Unidentified)
    assert a.dead_letter_id("r") == a.dead_letter_id("r")
    assert a.dead_letter_id("r") != b.dead_letter_id("r")


def test_a_payload_that_does_not_fit_the_reaction_type_is_a_mismatch() -> None:
    """A payload that does not validate as the reaction's type raises PayloadMismatch on decode."""
    data, headers = frame(payload={"unrelated": 1})
    incoming = identify(data, headers)
    assert isinstance(incoming, Incoming)
    with pytest.raises(PayloadMismatch):
        decode_payload(incoming, CardCreated)


@pytest.mark.slow
@given(st.lists(st.text(max_size=8), min_size=1, max_size=4), st.lists(st.text(max_size=8), min_size=1, max_size=4))
def test_derived_dead_letter_ids_are_distinct_for_distinct_parts(a: list[str], b: list[str]) -> None:
    """Derived dead-letter ids are equal exactly when their parts are equal (property test)."""
    same = a == b
    assert (derive_dead_letter_id("Reaction", *a) == derive_dead_letter_id("Reaction", *b)) == same


@given(st.binary(max_size=64))
def test_identify_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    """identify answers Incoming or Unidentified for any bytes, never raises (property test)."""
    assert isinstance(identify(data, {}), Incoming | Unidentified)


def test_unknown_envelope_fields_are_tolerated() -> None:
    """Unknown fields in the envelope and its metadata are tolerated."""
    meta = metadata().model_dump(mode="json")
    meta["trace_id"] = "abc"
    meta["actor"]["display"] = "Twin"
    data, headers = frame(metadata=meta, schema="v9")
    assert isinstance(identify(data, headers), Incoming)
