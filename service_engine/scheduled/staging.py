"""Scheduled messages, write side: `stage_scheduled` writes a
``service_engine.scheduled_message`` row in the caller's transaction
(``cx.schedule_at``); a rollback schedules nothing. The publisher that fires
them (`scheduled.publisher.ScheduledPublisher`) runs above the pipeline.
"""

from __future__ import annotations

from ..clock import Timestamp
from ..db.literals import dollar_quoted, sql_bigint, sql_timestamptz, sql_uuid
from ..db.types import Conn
from ..messaging.envelope import DeclaredSequence, Envelope, OutboundMessage, outbound_message

__all__ = ["scheduled_message_statement", "stage_scheduled", "stage_scheduled_message"]

_INSERT = """
INSERT INTO service_engine.scheduled_message
       (message_id, subject, payload, producer, seq_key, seq, due_at)
VALUES ($1, $2, $3::text::jsonb, $4, $5, $6, $7)
"""


def scheduled_message_statement(message: OutboundMessage, at: Timestamp) -> str:
    """`stage_scheduled_message`'s insert with its values inlined
    (`db.literals`), to ride in another round trip of the caller's
    transaction."""
    seq = message.sequence
    return (
        "INSERT INTO service_engine.scheduled_message"
        " (message_id, subject, payload, producer, seq_key, seq, due_at) VALUES ("
        f"{sql_uuid(message.message_id)}, {dollar_quoted(message.subject)},"
        f" {dollar_quoted(message.body_json())}::jsonb,"
        f" {dollar_quoted(None if seq is None else seq.producer)},"
        f" {dollar_quoted(None if seq is None else seq.seq_key)},"
        f" {sql_bigint(None if seq is None else seq.seq)}, {sql_timestamptz(at.value)})"
    )


async def stage_scheduled_message(conn: Conn, message: OutboundMessage, at: Timestamp) -> None:
    """Insert ``message`` to be published once the database clock passes
    ``at``, in the caller's open transaction (a rollback schedules nothing)."""
    seq = message.sequence
    await conn.execute(
        _INSERT, message.message_id, message.subject, message.body_json(),
        None if seq is None else seq.producer, None if seq is None else seq.seq_key,
        None if seq is None else seq.seq, at.value,
    )


async def stage_scheduled(
    conn: Conn,
    envelope: Envelope,
    subject: str,
    at: Timestamp,
    sequence: DeclaredSequence | None = None,
    service: str | None = None,
) -> OutboundMessage:
    """Schedule ``envelope`` on ``subject`` for ``at`` (``cx.schedule_at``).

    Raises `SequenceWithoutService` for a declared sequence with no service.
    """
    message = outbound_message(envelope, subject, sequence, service)
    await stage_scheduled_message(conn, message, at)
    return message
