"""The integration outbox, write side: rows staged with a write.

`write_outbox` is the one writer of `OutboxRow` rows (the pipeline's flush
of ``cx.emit`` / ``cx.command``, `stage_outbound`, `stage_outbox_row`), in
the caller's transaction, so a message exists exactly when the write
committed. With ``frames`` (a commit's framed impacts) and a reaction's
``confirmation`` it writes all three in one statement: the pipeline's flush
is one round trip. The relay that publishes them (`outbox.relay.OutboxRelay`)
runs above the pipeline.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..db.literals import dollar_quoted, sql_bigint, sql_uuid
from ..db.types import Conn
from ..failures import ConfigError, DeclarationError
from ..impacts.model import JsonValue, canonical_json
from ..impacts.transport import CHANNEL, OUTBOX_CHANNEL
from ..messaging.claims import Confirmation
from ..messaging.envelope import (
    HEADER_MESSAGE_ID,
    DeclaredSequence,
    Envelope,
    OutboundMessage,
    outbound_message,
)

__all__ = [
    "OutboxRow", "outbox_statement", "stage_outbound", "stage_outbox_row", "write_outbox",
]


@dataclass(frozen=True, slots=True, init=False)
class OutboxRow:
    """One ``service_engine.integration_outbox`` row, staged in a write.

    Written in the write's transaction; the relay publishes it after the
    commit with ``Nats-Msg-Id`` = ``message_id``. The payload and headers
    are encoded at construction, so a value that is not JSON (a `OneShot`
    secret included) is refused here with `TypeError`. Build the row of an
    envelope with `OutboxRow.of`.
    """

    message_id: uuid.UUID
    subject: str
    payload_json: str
    headers_json: str
    producer: str | None
    seq_key: str | None
    seq: int | None

    def __init__(
        self,
        subject: str,
        payload: Mapping[str, JsonValue],
        *,
        message_id: uuid.UUID | None = None,
        headers: Mapping[str, str] | None = None,
        producer: str | None = None,
        seq_key: str | None = None,
        seq: int | None = None,
    ) -> None:
        if not isinstance(subject, str) or not subject:
            raise ConfigError("an outbox row needs a subject")
        if not isinstance(payload, Mapping):
            raise DeclarationError("an outbox payload is a JSON object")
        try:
            payload_json = canonical_json(payload)
            headers_json = canonical_json(dict(headers or {}))
        except (TypeError, ValueError) as exc:
            raise DeclarationError(f"an outbox row must be JSON: {exc}") from exc
        object.__setattr__(self, "message_id", message_id or uuid.uuid4())
        object.__setattr__(self, "subject", subject)
        object.__setattr__(self, "payload_json", payload_json)
        object.__setattr__(self, "headers_json", headers_json)
        object.__setattr__(self, "producer", producer)
        object.__setattr__(self, "seq_key", seq_key)
        object.__setattr__(self, "seq", seq)

    @classmethod
    def of(cls, message: OutboundMessage, *, replay: bool = False) -> OutboxRow:
        """The row that publishes ``message``: its ``message_id`` is the
        envelope id (the dedup token and the logical id alike).

        ``replay=True`` re-emits a message published before (a stored
        confirmation): a fresh dedup token, so JetStream does not drop it
        inside its duplicate window, with the original logical id in
        ``Br-Message-Id``, so a consumer's claim still sees the same message.
        """
        seq = message.sequence
        if replay:
            return cls(
                message.subject, message.body,
                message_id=uuid.uuid4(),
                headers={HEADER_MESSAGE_ID: str(message.message_id)},
                producer=None if seq is None else seq.producer,
                seq_key=None if seq is None else seq.seq_key,
                seq=None if seq is None else seq.seq,
            )
        if not isinstance(message.subject, str) or not message.subject:
            raise ConfigError("an outbox row needs a subject")
        try:
            payload_json = message.body_text()  # encoded once, shared with the confirmation
        except (TypeError, ValueError) as exc:
            raise DeclarationError(f"an outbox row must be JSON: {exc}") from exc
        row = object.__new__(cls)
        for name, value in (
            ("message_id", message.message_id), ("subject", message.subject),
            ("payload_json", payload_json), ("headers_json", _NO_HEADERS),
            ("producer", None if seq is None else seq.producer),
            ("seq_key", None if seq is None else seq.seq_key),
            ("seq", None if seq is None else seq.seq),
        ):
            object.__setattr__(row, name, value)
        return row


_NO_HEADERS = canonical_json({})


_INSERTED = """inserted AS (
    INSERT INTO service_engine.integration_outbox
           (message_id, subject, payload, headers, producer, seq_key, seq)
    SELECT r.message_id, r.subject, r.payload::jsonb, r.headers::jsonb, r.producer, r.seq_key,
           r.seq
      FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                  $7::bigint[]) WITH ORDINALITY
           AS r(message_id, subject, payload, headers, producer, seq_key, seq, ord)
     ORDER BY r.ord
    RETURNING 1
)"""
"""The outbox rows ($1-$7, in order) as a CTE named ``inserted``."""

# The insert and its wake-up (the relay's leader publishes now instead of
# on its next beat) in one statement: no extra round trip, and a rollback
# delivers neither.
_INSERT = f"""
WITH {_INSERTED}
SELECT pg_notify('{OUTBOX_CHANNEL}', '') WHERE EXISTS (SELECT 1 FROM inserted)
"""


# The flush of one commit in one statement: the reaction's confirmation on
# its claim (none: $8 is NULL and no row matches), the outbox rows, the
# impact frames' NOTIFYs in order, then the outbox wake-up (as `_INSERT`).
# The data-modifying CTEs run whether or not they are referenced.
_FLUSH = f"""
WITH confirmed AS (
    UPDATE service_engine.message_claim SET confirmations = $10::text::jsonb
     WHERE message_id = $8::uuid AND reaction = $9::text
), {_INSERTED}
SELECT pg_notify('{CHANNEL}', f.frame) FROM unnest($11::text[]) AS f(frame)
UNION ALL
SELECT pg_notify('{OUTBOX_CHANNEL}', '') WHERE EXISTS (SELECT 1 FROM inserted)
"""


async def write_outbox(
    conn: Conn,
    rows: Sequence[OutboxRow],
    *,
    frames: Sequence[str] = (),
    confirmation: Confirmation | None = None,
) -> None:
    """Insert ``rows`` in the caller's open transaction, in order, in one
    statement (the one writer of outbox rows).

    ``frames`` (`impacts.framing.encode_group`'s payloads of the commit's
    impacts) are NOTIFYed on the impact channel, in order, and
    ``confirmation`` is stored on its claim, in that same statement.
    """
    if not frames and confirmation is None:
        if rows:
            await conn.execute(_INSERT, *_columns(rows))
        return
    if confirmation is None:
        claim: tuple[uuid.UUID | None, str | None, str | None] = (None, None, None)
    else:
        claim = (confirmation.message_id, confirmation.reaction, confirmation.json)
    await conn.execute(_FLUSH, *_columns(rows), *claim, list(frames))


def outbox_statement(
    rows: Sequence[OutboxRow],
    *,
    frames: Sequence[str] = (),
    confirmation: Confirmation | None = None,
) -> str:
    """`write_outbox`'s writes with every value inlined (text dollar-quoted,
    ids and sequence numbers formatted from their own types): statements
    without parameters, to ride in another round trip of the caller's
    transaction (the pipeline sends them with COMMIT). ``""`` when there
    is nothing to write. The confirmation first, then the impact frames'
    NOTIFYs in order, then the rows (in order) with the outbox wake-up."""
    statements: list[str] = []
    if confirmation is not None:
        statements.append(
            "UPDATE service_engine.message_claim"
            f" SET confirmations = {dollar_quoted(confirmation.json)}::jsonb"
            f" WHERE message_id = {sql_uuid(confirmation.message_id)}"
            f" AND reaction = {dollar_quoted(confirmation.reaction)}"
        )
    statements.extend(
        f"SELECT pg_notify('{CHANNEL}', {dollar_quoted(frame)})" for frame in frames
    )
    if rows:
        values = ", ".join(
            f"({sql_uuid(r.message_id)}, {dollar_quoted(r.subject)},"
            f" {dollar_quoted(r.payload_json)}::jsonb, {dollar_quoted(r.headers_json)}::jsonb,"
            f" {dollar_quoted(r.producer)}, {dollar_quoted(r.seq_key)},"
            f" {sql_bigint(r.seq)})"
            for r in rows
        )
        statements.append(
            "WITH inserted AS (INSERT INTO service_engine.integration_outbox"
            " (message_id, subject, payload, headers, producer, seq_key, seq)"
            f" VALUES {values} RETURNING 1)"
            f" SELECT pg_notify('{OUTBOX_CHANNEL}', '') WHERE EXISTS (SELECT 1 FROM inserted)"
        )
    return "; ".join(statements)


def _columns(rows: Sequence[OutboxRow]) -> tuple[list[object], ...]:
    return (
        [r.message_id for r in rows], [r.subject for r in rows],
        [r.payload_json for r in rows], [r.headers_json for r in rows],
        [r.producer for r in rows], [r.seq_key for r in rows], [r.seq for r in rows],
    )


async def stage_outbound(conn: Conn, message: OutboundMessage) -> None:
    """Insert ``message``'s outbox row in the caller's open transaction."""
    await write_outbox(conn, [OutboxRow.of(message)])


async def stage_outbox_row(
    conn: Conn,
    envelope: Envelope,
    subject: str,
    sequence: DeclaredSequence | None,
    service: str | None,
) -> OutboundMessage:
    """Stage ``envelope`` for publication on ``subject`` in the caller's
    transaction; the relay publishes it after the commit. The message id is
    the envelope id. (A handler uses ``cx.emit`` / ``cx.command``, which
    stage through the same writer at the pipeline's flush.)

    Raises `SequenceWithoutService` (a `ConfigError`) when a ``sequence`` is
    declared and no service is configured: nothing is staged.
    """
    message = outbound_message(envelope, subject, sequence, service)
    await stage_outbound(conn, message)
    return message
