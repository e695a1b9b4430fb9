"""The frontier envelope: what the engine puts on, and reads off, the bus.

Everything on the integration bus is an `IntegrationEvent` or an
`IntegrationCommand` (event_id / command_id, a ``{aggregate}.{fact|verb}``
type, the coordinate version, occurred_at and `EventMetadata`). Outbound,
`outbound_message` wraps an author's payload into the envelope, its subject
and the producer sequence the outbox row persists; inbound, `identify`
turns a frame into an `Incoming` or refuses it as terminal.

Pure: no I/O, no driver imports. The row writers live in ``outbox/staging.py``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeAlias, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_jsonable_python

from ..failures import ConfigError, EngineError
from ..impacts.model import canonical_json

T = TypeVar("T")

# -- wire names -------------------------------------------------------------------

HEADER_NATS_MSG_ID = "Nats-Msg-Id"
"""JetStream's dedup token: the outbox row's message id (fresh on a retry)."""
HEADER_MESSAGE_ID = "Br-Message-Id"
"""The logical message id a consumer claims on; a retry keeps the original."""
HEADER_PRODUCER = "Br-Producer"
HEADER_SEQ_KEY = "Br-Seq-Key"
HEADER_SEQ = "Br-Seq"
ENGINE_HEADERS = frozenset(
    {HEADER_NATS_MSG_ID, HEADER_MESSAGE_ID, HEADER_PRODUCER, HEADER_SEQ_KEY, HEADER_SEQ}
)
"""Headers the engine renders itself; a row's own headers never override them."""

EVENT_SUBJECT_PREFIX = "integration.evt"
COMMAND_SUBJECT_PREFIX = "integration.cmd"

SERVICE_NAMESPACE = uuid.UUID("7ae4cb96-7748-5b65-a5af-12505acfc8ef")
"""Fixed namespace of service identities (uuid5 of the service name).

Never change it: every service's identity, as peers see it, derives from it.
"""
DEAD_LETTER_NAMESPACE = uuid.UUID("87d6a158-0eb9-5a8e-9855-2b8cab328a82")
"""Fixed namespace of derived dead-letter ids."""

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")
_TYPE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")


class EnvelopeError(EngineError):
    """An outbound envelope cannot be built from what the author gave."""

    code = "envelope"


class ServiceRequired(ConfigError):
    """An engine gesture needs ``EngineConfig.service`` and none is configured."""


class SequenceWithoutService(ServiceRequired):
    """An outbound type declared a producer sequence but no service
    (producer) is configured.

    Refused at emit: a sequence a consumer would order or dedup on must never
    vanish. A reaction that hits it is a terminal violation (dead-lettered).
    """

    code = "sequence_without_service"


def check_token(value: str, what: str) -> str:
    """Return ``value`` if it is one NATS subject token (letters, digits,
    ``_``, ``-``); raise `EnvelopeError` naming ``what`` otherwise."""
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise EnvelopeError(f"{what} {value!r} is not a subject token ([A-Za-z0-9_-]+)")
    return value


def event_subject(service: str, aggregate: str, fact: str) -> str:
    """``integration.evt.{service}.{aggregate}.{fact}``: where ``service``
    publishes that fact."""
    return ".".join(
        (
            EVENT_SUBJECT_PREFIX, check_token(service, "service"),
            check_token(aggregate, "aggregate"), check_token(fact, "fact"),
        )
    )


def command_subject(service: str, aggregate: str, verb: str) -> str:
    """``integration.cmd.{service}.{aggregate}.{verb}``: a command addressed
    to ``service``, the service that handles it."""
    return ".".join(
        (
            COMMAND_SUBJECT_PREFIX, check_token(service, "service"),
            check_token(aggregate, "aggregate"), check_token(verb, "verb"),
        )
    )


def service_identity(service: str) -> uuid.UUID:
    """The engine's v5 identity of ``service``: the actor of everything a
    reaction, cron or erasure of that service sends."""
    if not service:
        raise ServiceRequired("a service identity needs a service name")
    return uuid.uuid5(SERVICE_NAMESPACE, service)


def derive_dead_letter_id(source: str, *parts: str) -> uuid.UUID:
    """A stable dead-letter id for one piece of work.

    The same ``(source, *parts)`` always gives the same id, so re-recording
    the same failure (a redelivery, a stuck worker on every beat) hits one
    row. The parts are framed as a JSON array: no two part lists collide.
    """
    return uuid.uuid5(DEAD_LETTER_NAMESPACE, json.dumps([source, *parts]))


# -- the envelope -------------------------------------------------------------------


ActorKind: TypeAlias = Literal["person", "service"]


class Actor(BaseModel):
    """Who sent a message: a person (a mutation's passport actor) or a
    service (the engine's v5 service identity).

    The wire models ignore fields they do not know, so a newer producer's
    additions never make a frame unidentifiable."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: ActorKind
    id: uuid.UUID

    @classmethod
    def service(cls, name: str) -> Actor:
        """The actor of work ``name`` does on its own authority (a reaction,
        a cron tick, an erasure)."""
        return cls(kind="service", id=service_identity(name))

    @classmethod
    def person(cls, person_id: uuid.UUID) -> Actor:
        return cls(kind="person", id=person_id)

    @property
    def is_service(self) -> bool:
        return self.kind == "service"


class EventMetadata(BaseModel):
    """Who sent a message, the conversation it belongs to and what caused it.

    ``correlation_id`` is shared by every message of one conversation;
    ``causation_id`` is the envelope id of the message that caused this one
    (None for an origin).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    actor: Actor
    correlation_id: uuid.UUID
    causation_id: uuid.UUID | None = None

    @classmethod
    def originating(cls, actor: Actor, correlation_id: uuid.UUID | None = None) -> EventMetadata:
        """Metadata of a message that starts a conversation."""
        return cls(actor=actor, correlation_id=correlation_id or uuid.uuid4())

    def caused(self, by_envelope: uuid.UUID, actor: Actor) -> EventMetadata:
        """Metadata of a message ``actor`` sends because of the message
        carrying this metadata and envelope id ``by_envelope``."""
        return EventMetadata(
            actor=actor, correlation_id=self.correlation_id, causation_id=by_envelope
        )


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    type: str = Field(pattern=_TYPE.pattern)
    version: int = Field(ge=1)
    occurred_at: AwareDatetime
    metadata: EventMetadata

    @property
    def aggregate(self) -> str:
        return self.type.split(".", 1)[0]

    @property
    def name(self) -> str:
        """The fact (of an event) or the verb (of a command)."""
        return self.type.split(".", 1)[1]


class IntegrationEvent(_Envelope, Generic[T]):
    """A fact a service publishes: ``{aggregate}.{fact}`` at ``version``."""

    event_id: uuid.UUID
    payload: T

    @property
    def envelope_id(self) -> uuid.UUID:
        return self.event_id


class IntegrationCommand(_Envelope, Generic[T]):
    """A request addressed to one service: ``{aggregate}.{verb}``."""

    command_id: uuid.UUID
    payload: T

    @property
    def envelope_id(self) -> uuid.UUID:
        return self.command_id


Envelope: TypeAlias = IntegrationEvent[Any] | IntegrationCommand[Any]


# -- outbound ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeclaredSequence:
    """What an outbound type's ``sequence()`` declares: by convention the
    aggregate key and the aggregate version. The producer is the
    configured service."""

    seq_key: str
    seq: int

    def __post_init__(self) -> None:
        if not self.seq_key:
            raise EnvelopeError("a producer sequence needs a non-empty seq_key")
        if isinstance(self.seq, bool) or not isinstance(self.seq, int) or self.seq < 0:
            raise EnvelopeError(f"a producer sequence is a non-negative int, not {self.seq!r}")


@dataclass(frozen=True, slots=True)
class ProducerSequence:
    """A sequence as it travels: ``Br-Producer`` / ``Br-Seq-Key`` / ``Br-Seq``."""

    producer: str
    seq_key: str
    seq: int


class OutboundEvent(Protocol):
    """A payload a service emits as an integration event (``cx.emit``).

    Declare the coordinates as class attributes. Override `sequence` to
    declare a producer sequence (convention: aggregate key and version);
    the default is None.
    """

    AGGREGATE: ClassVar[str]
    FACT: ClassVar[str]
    VERSION: ClassVar[int]

    def sequence(self) -> DeclaredSequence | None: ...


class OutboundCommand(Protocol):
    """A payload a service sends as a command (``cx.command``) to ``SERVICE``,
    the service that handles it."""

    SERVICE: ClassVar[str]
    AGGREGATE: ClassVar[str]
    VERB: ClassVar[str]
    VERSION: ClassVar[int]

    def sequence(self) -> DeclaredSequence | None: ...


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """One message ready for the outbox: its ids, subject, envelope body and
    producer sequence. ``message_id`` is the envelope id."""

    message_id: uuid.UUID
    subject: str
    body: dict[str, Any]
    sequence: ProducerSequence | None
    _text: str | None = field(default=None, init=False, repr=False, compare=False)

    def body_json(self) -> str:
        return json.dumps(self.body, separators=(",", ":"), sort_keys=True)

    def body_text(self) -> str:
        """``body`` as canonical JSON (`canonical_json`: sorted keys, compact,
        non-ASCII kept), encoded once: the outbox row and the confirmation
        stored on the claim share it. Raises `TypeError` / `ValueError` for
        a body JSON cannot carry."""
        text = self._text
        if text is None:
            text = canonical_json(self.body)
            object.__setattr__(self, "_text", text)
        return text


def _payload_json(payload: object) -> Any:
    try:
        value = to_jsonable_python(payload)
    except Exception as exc:  # pydantic_core raises its own serialisation errors
        raise EnvelopeError(f"payload is not JSON-serialisable: {exc}") from exc
    if not isinstance(value, dict):
        raise EnvelopeError(f"an integration payload is a JSON object, not {type(value).__name__}")
    return value


def stamp_sequence(
    declared: DeclaredSequence | None, service: str | None
) -> ProducerSequence | None:
    """The sequence an outbox row persists; the producer is ``service``.

    Raises `SequenceWithoutService` for a declared sequence with no service.
    """
    if declared is None:
        return None
    if not service:
        raise SequenceWithoutService(
            f"a producer sequence (seq_key={declared.seq_key!r}) was declared but no "
            "service is configured to be its producer; set EngineConfig.service"
        )
    return ProducerSequence(service, declared.seq_key, declared.seq)


def outbound_message(
    envelope: Envelope,
    subject: str,
    sequence: DeclaredSequence | None,
    service: str | None,
) -> OutboundMessage:
    """The outbox form of ``envelope`` on ``subject``.

    Raises `SequenceWithoutService` for a declared sequence when no service
    is configured, `EnvelopeError` for a payload that is not a JSON object.
    """
    stamped = stamp_sequence(sequence, service)
    body = envelope.model_dump(mode="json", exclude={"payload"})
    body["payload"] = _payload_json(envelope.payload)
    return OutboundMessage(envelope.envelope_id, subject, body, stamped)


def build_event(
    payload: OutboundEvent,
    *,
    service: str | None,
    metadata: EventMetadata,
    occurred_at: datetime,
    event_id: uuid.UUID | None = None,
) -> OutboundMessage:
    """Wrap ``payload`` as an event ``service`` publishes (``cx.emit``).

    Raises `ServiceRequired` with no service: an event's subject names its
    producer.
    """
    if not service:
        raise ServiceRequired("emitting an integration event needs EngineConfig.service")
    cls = type(payload)
    envelope: IntegrationEvent[Any] = IntegrationEvent(
        event_id=event_id or uuid.uuid4(),
        type=f"{check_token(cls.AGGREGATE, 'aggregate')}.{check_token(cls.FACT, 'fact')}",
        version=cls.VERSION, occurred_at=occurred_at, metadata=metadata, payload=payload,
    )
    subject = event_subject(service, cls.AGGREGATE, cls.FACT)
    return outbound_message(envelope, subject, payload.sequence(), service)


def build_command(
    payload: OutboundCommand,
    *,
    service: str | None,
    metadata: EventMetadata,
    occurred_at: datetime,
    command_id: uuid.UUID | None = None,
) -> OutboundMessage:
    """Wrap ``payload`` as a command to ``payload.SERVICE`` (``cx.command``);
    ``service`` is the sender, the producer of a declared sequence."""
    cls = type(payload)
    envelope: IntegrationCommand[Any] = IntegrationCommand(
        command_id=command_id or uuid.uuid4(),
        type=f"{check_token(cls.AGGREGATE, 'aggregate')}.{check_token(cls.VERB, 'verb')}",
        version=cls.VERSION, occurred_at=occurred_at, metadata=metadata, payload=payload,
    )
    subject = command_subject(cls.SERVICE, cls.AGGREGATE, cls.VERB)
    return outbound_message(envelope, subject, payload.sequence(), service)


def publish_headers(
    message_id: uuid.UUID | str,
    *,
    logical_id: uuid.UUID | str | None = None,
    sequence: ProducerSequence | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The headers one publish carries.

    ``Nats-Msg-Id`` is ``message_id`` (the dedup token); ``Br-Message-Id``
    is ``logical_id`` (defaults to ``message_id``; a retry passes the
    original); the three ``Br-*`` sequence headers when ``sequence`` is
    given. ``extra`` headers ride along but never override these.
    """
    headers = {k: v for k, v in (extra or {}).items() if k not in ENGINE_HEADERS}
    headers[HEADER_NATS_MSG_ID] = str(message_id)
    headers[HEADER_MESSAGE_ID] = str(logical_id if logical_id is not None else message_id)
    if sequence is not None:
        headers[HEADER_PRODUCER] = sequence.producer
        headers[HEADER_SEQ_KEY] = sequence.seq_key
        headers[HEADER_SEQ] = str(sequence.seq)
    return headers


def row_publish_headers(
    message_id: uuid.UUID,
    headers_json: str,
    producer: str | None,
    seq_key: str | None,
    seq: int | None,
) -> dict[str, str]:
    """`publish_headers` of a stored outbox or scheduled-message row: its own
    ``headers`` (JSON text) ride along; the sequence when all three columns
    are set. A stored ``Br-Message-Id`` (a replayed confirmation) is the
    logical id; otherwise the row's ``message_id`` is both ids."""
    stored = json.loads(headers_json) if headers_json else {}
    extra = {str(k): str(v) for k, v in stored.items()} if isinstance(stored, dict) else {}
    logical = _as_uuid(extra.get(HEADER_MESSAGE_ID))
    sequence = (
        None if producer is None or seq_key is None or seq is None
        else ProducerSequence(producer, seq_key, int(seq))
    )
    return publish_headers(message_id, logical_id=logical, sequence=sequence, extra=extra)


# -- inbound ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Incoming:
    """An identified inbound frame.

    ``message_id`` is the logical id the claim is keyed on: the
    ``Br-Message-Id`` header when it is a uuid, else the envelope id.
    ``payload`` is the raw JSON payload; `decode_payload` types it.
    """

    message_id: uuid.UUID
    kind: Literal["event", "command"]
    envelope: Envelope
    sequence: ProducerSequence | None

    @property
    def metadata(self) -> EventMetadata:
        return self.envelope.metadata

    @property
    def payload(self) -> Any:
        return self.envelope.payload

    def dead_letter_id(self, reaction: str) -> uuid.UUID:
        """The id of this message's dead letter under ``reaction``."""
        return derive_dead_letter_id("Reaction", reaction, str(self.message_id))


@dataclass(frozen=True, slots=True)
class Unidentified:
    """A frame refused at identify: terminal (one dead-letter row, then Term).

    ``frame_id`` is the frame's ``Br-Message-Id`` or ``Nats-Msg-Id`` header
    (any string), so every redelivery derives the same dead-letter id; only a
    frame with neither falls back to a fresh id.
    """

    reason: Literal["no_envelope", "bad_sequence"]
    detail: str
    frame_id: str | None
    _fallback: uuid.UUID = field(default_factory=uuid.uuid4, repr=False, compare=False)

    def dead_letter_id(self, reaction: str) -> uuid.UUID:
        if self.frame_id is None:
            return self._fallback
        return derive_dead_letter_id("Reaction", reaction, "frame", self.frame_id)


class PayloadMismatch(EngineError):
    """An identified message's payload does not fit the reaction's type:
    terminal, the frame is dead-lettered."""


def _frame_id(headers: Mapping[str, str]) -> str | None:
    return headers.get(HEADER_MESSAGE_ID) or headers.get(HEADER_NATS_MSG_ID) or None


def _as_uuid(value: str | None) -> uuid.UUID | None:
    if not value:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _sequence(headers: Mapping[str, str]) -> ProducerSequence | str | None:
    present = [h for h in (HEADER_PRODUCER, HEADER_SEQ_KEY, HEADER_SEQ) if h in headers]
    if not present:
        return None
    if len(present) != 3:
        return f"a partial producer sequence: only {', '.join(present)}"
    producer, key, raw = headers[HEADER_PRODUCER], headers[HEADER_SEQ_KEY], headers[HEADER_SEQ]
    if not producer or not key or not raw.isdigit():
        return f"a malformed producer sequence ({producer!r}, {key!r}, {raw!r})"
    return ProducerSequence(producer, key, int(raw))


_ANY_EVENT: type[IntegrationEvent[Any]] = IntegrationEvent[Any]
_ANY_COMMAND: type[IntegrationCommand[Any]] = IntegrationCommand[Any]
"""The envelope models `identify` validates against, parametrised once
(subscripting a generic model costs a cache lookup per frame)."""


def identify(data: bytes, headers: Mapping[str, str] | None) -> Incoming | Unidentified:
    """Identify an inbound frame, or refuse it as terminal.

    A frame with no valid envelope (not JSON, neither ``event_id`` nor
    ``command_id``, a missing or malformed field) or a malformed producer
    sequence is `Unidentified`. A non-uuid ``Nats-Msg-Id`` (a foreign
    producer) is tolerated: the logical id falls back to the envelope id.
    """
    hdrs = headers or {}
    frame_id = _frame_id(hdrs)
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return Unidentified("no_envelope", f"the frame is not JSON: {exc}", frame_id)
    if not isinstance(obj, dict):
        return Unidentified("no_envelope", "the frame is not a JSON object", frame_id)
    has_event, has_command = "event_id" in obj, "command_id" in obj
    if has_event == has_command:
        detail = (
            "the frame carries both event_id and command_id" if has_event
            else "the frame carries no integration envelope (no event_id or command_id)"
        )
        return Unidentified("no_envelope", detail, frame_id)
    if "payload" not in obj:
        return Unidentified("no_envelope", "the envelope carries no payload", frame_id)
    model = _ANY_EVENT if has_event else _ANY_COMMAND
    try:
        envelope = model.model_validate(obj)
    except ValidationError as exc:
        return Unidentified("no_envelope", f"malformed envelope: {exc}", frame_id)
    sequence = _sequence(hdrs)
    if isinstance(sequence, str):
        return Unidentified("bad_sequence", sequence, frame_id)
    message_id = _as_uuid(hdrs.get(HEADER_MESSAGE_ID)) or envelope.envelope_id
    return Incoming(message_id, "event" if has_event else "command", envelope, sequence)


PayloadT = TypeVar("PayloadT", bound=BaseModel)


def decode_payload(incoming: Incoming, model: type[PayloadT]) -> PayloadT:
    """The payload of ``incoming`` as ``model``; raises `PayloadMismatch`
    (terminal) when it does not fit."""
    try:
        return model.model_validate(incoming.payload)
    except ValidationError as exc:
        raise PayloadMismatch(
            f"payload of {incoming.envelope.type} v{incoming.envelope.version} "
            f"does not fit {model.__name__}: {exc}"
        ) from exc
