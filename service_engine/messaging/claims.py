"""The idempotency claim and the sequence guard, inside the effect's transaction.

* ``service_engine.message_claim`` is keyed ``(message_id, reaction)``. The
  inbound loop claims a message before the handler runs; a transaction that
  finds the claim taken (a redelivery after a crash past the commit, a
  command re-sent past the broker's dedup window) re-emits the
  confirmations stored on it instead of running the effect again. The
  claim row's primary key also serialises two pods handed the same frame:
  the second waits (under ``lock_timeout``) for the first to commit or roll
  back.
* ``service_engine.sequence_guard`` holds one watermark per ``(producer,
  reaction, seq_key)``: a message at or below it is a stale replay and a
  no-op, so two reactions on one producer's facts never drop each other's
  messages.

Both statements run in the caller's open transaction; a rollback releases
the claim and leaves the watermark where it was.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..db.types import Conn
from ..failures import ConfigError
from .envelope import OutboundMessage, ProducerSequence

__all__ = [
    "Confirmation",
    "advance_sequence",
    "claim_and_lock_statement",
    "claim_message",
    "claim_statement",
    "claim_taken",
    "confirmations_json",
    "parse_confirmations",
    "record_confirmations",
    "stored_confirmations",
]

_REACTION = re.compile(r"^[A-Za-z0-9_]+$")

_CLAIM = """
INSERT INTO service_engine.message_claim (message_id, reaction)
VALUES ($1, $2)
ON CONFLICT (message_id, reaction) DO NOTHING
RETURNING true
"""

_STORED = """
SELECT confirmations::text FROM service_engine.message_claim
 WHERE message_id = $1 AND reaction = $2
"""

_CONFIRM = """
UPDATE service_engine.message_claim SET confirmations = $3::text::jsonb
 WHERE message_id = $1 AND reaction = $2
"""

_ADVANCE = """
INSERT INTO service_engine.sequence_guard (producer, reaction, seq_key, seq)
VALUES ($1, $2, $3, $4)
ON CONFLICT (producer, reaction, seq_key) DO UPDATE
   SET seq = EXCLUDED.seq, updated_at = now()
 WHERE service_engine.sequence_guard.seq < EXCLUDED.seq
RETURNING seq
"""


async def claim_message(
    conn: Conn, message_id: uuid.UUID, reaction: str
) -> list[OutboundMessage] | None:
    """Claim ``message_id`` for ``reaction`` in the caller's transaction.

    Returns None when this transaction now holds the claim (run the
    effect), or the confirmations stored by the transaction that claimed it
    first (re-emit them; do not run the effect).
    """
    if await conn.fetchval(_CLAIM, message_id, reaction):
        return None
    return await stored_confirmations(conn, message_id, reaction)


def claim_statement(message_id: uuid.UUID, reaction: str) -> str:
    """`claim_message`'s INSERT with its values inlined, so it can ride in
    one round trip with BEGIN; its command status ends in ``1`` when it
    took the claim, ``0`` when the claim was taken before."""
    if not isinstance(message_id, uuid.UUID) or not _REACTION.match(reaction):
        raise ConfigError(f"not a claim: {message_id!r} / {reaction!r}")
    return (
        "INSERT INTO service_engine.message_claim (message_id, reaction) "
        f"VALUES ('{message_id}'::uuid, '{reaction}') "
        "ON CONFLICT (message_id, reaction) DO NOTHING"
    )


def claim_and_lock_statement(message_id: uuid.UUID, reaction: str, lock_key: int) -> str:
    """`claim_statement` taking the transaction advisory lock ``lock_key``
    once (and only when) it took the claim, in one statement: its status is
    ``SELECT 1`` when it took both, ``SELECT 0`` when the claim was taken
    before (and no lock was taken); `claim_taken` reads it."""
    if not isinstance(lock_key, int) or isinstance(lock_key, bool):
        raise ConfigError(f"not an advisory lock key: {lock_key!r}")
    return (
        f"WITH claimed AS ({claim_statement(message_id, reaction)} RETURNING 1) "
        f"SELECT pg_advisory_xact_lock({lock_key:d}) FROM claimed"
    )


def claim_taken(status: str) -> bool:
    """Whether a `claim_statement` status says this transaction took the claim."""
    return status.endswith(" 1")


async def stored_confirmations(
    conn: Conn, message_id: uuid.UUID, reaction: str
) -> list[OutboundMessage]:
    """The confirmations stored on a claim taken before."""
    stored = await conn.fetchval(_STORED, message_id, reaction)
    return parse_confirmations(stored or "[]")


@dataclass(frozen=True, slots=True)
class Confirmation:
    """What a reaction emitted, to store on its claim ``(message_id,
    reaction)`` in its transaction (`record_confirmations`, or the pipeline's
    one-statement flush, `outbox.write_outbox`); ``json`` is
    `confirmations_json`'s form."""

    message_id: uuid.UUID
    reaction: str
    json: str

    @classmethod
    def of(
        cls, message_id: uuid.UUID, reaction: str, messages: Sequence[OutboundMessage]
    ) -> Confirmation | None:
        """The confirmation of ``messages``; None when nothing was emitted."""
        if not messages:
            return None
        return cls(message_id, reaction, confirmations_json(messages))


async def record_confirmations(
    conn: Conn, message_id: uuid.UUID, reaction: str, messages: Sequence[OutboundMessage]
) -> None:
    """Store what the reaction emitted on its claim, in the same transaction."""
    if messages:
        await conn.execute(_CONFIRM, message_id, reaction, confirmations_json(messages))


async def advance_sequence(conn: Conn, sequence: ProducerSequence, reaction: str) -> bool:
    """Move ``reaction``'s watermark for ``(producer, seq_key)`` to ``seq``.

    True when the message is newer than the watermark (apply it); False
    when it is stale or equal (a no-op). The row lock taken here orders two
    concurrent messages of one key.
    """
    advanced = await conn.fetchval(
        _ADVANCE, sequence.producer, reaction, sequence.seq_key, sequence.seq
    )
    return advanced is not None


def confirmations_json(messages: Sequence[OutboundMessage]) -> str:
    """The stored form of the messages a reaction emitted: a JSON array of
    ``{message_id, subject, body, sequence}``. Each body is spliced in as the
    text its outbox row carries (`OutboundMessage.body_text`, encoded once)."""
    dumps = json.dumps
    return "[" + ",".join(
        f'{{"message_id":"{m.message_id}","subject":{dumps(m.subject)},'
        f'"body":{m.body_text()},"sequence":'
        + ("null" if m.sequence is None else dumps(
            {"producer": m.sequence.producer, "seq_key": m.sequence.seq_key,
             "seq": m.sequence.seq},
            separators=(",", ":"),
        ))
        + "}"
        for m in messages
    ) + "]"


def parse_confirmations(text: str) -> list[OutboundMessage]:
    """The messages stored by `confirmations_json`."""
    out = []
    for item in json.loads(text):
        seq: Any = item.get("sequence")
        out.append(
            OutboundMessage(
                uuid.UUID(item["message_id"]), item["subject"], item["body"],
                None if seq is None
                else ProducerSequence(seq["producer"], seq["seq_key"], int(seq["seq"])),
            )
        )
    return out
