"""The reaction entry point: one inbound message through the write pipeline.

    BEGIN; SET LOCAL lock_timeout          (sent with the claim)
      claim (message_id, reaction)         taken before: stage the stored
                                           confirmations again, run nothing
      sequence guard (producer, reaction,  stale or equal: roll back, a no-op
                      seq_key)
      resolve the sender's principal
      handler(cx, payload)                 a Disposition returned or raised
                                           rolls back
      store the emitted messages on the claim   (with the flush's outbox rows)
      flush: impacts, outbox rows, scheduled messages
    COMMIT

A message without a producer sequence has no guard to run before the
handler: its claim is deferred to the handler's first statement (one round
trip with BEGIN and its first advisory lock, the lock taken only when the
claim is). A claim found taken there raises `ClaimedBefore` into the
handler, from that call and every later one; whatever the handler then
answers, the transaction replays instead. A handler that fails or answers
a disposition before touching the database sends the claim before the
rollback, so a message claimed before replays exactly as it did when the
claim came first. What differs is only that the handler's code up to its
first database call runs for a redelivered message too, as it already does
for a redelivery after a crash before the commit.

`run_reaction` is what the inbound loop calls once it identified a frame
and decoded its payload. It answers `Applied`, `Replayed` or `Stale` once
committed, or raises what the pipeline raises (`DatabaseError`, ...), the
handler's `Disposition` or whatever the handler raised; nothing committed
then. A database error the handler caught and answered with something
else (a coarse ``except DatabaseError: return Retry(...)``) is raised in
its place: the engine classifies its own transaction's faults.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from ..clock import Clock, Timestamp
from ..config import EngineConfig
from ..db.errors import Stage
from ..db.pool import Database
from ..db.types import Conn
from ..messaging.claims import (
    Confirmation,
    advance_sequence,
    claim_statement,
    claim_taken,
    stored_confirmations,
)
from ..messaging.envelope import Actor
from ..messaging.reactions import Disposition, ReactionDelivery
from ..metrics import Metrics
from ..outbox.staging import OutboxRow
from .contexts import Reaction
from .run import StageHook, run_pipeline
from .transaction import ClaimedBefore

__all__ = [
    "Applied",
    "ReactionOutcome",
    "ReactionPrincipal",
    "Replayed",
    "Stale",
    "run_reaction",
]

T = TypeVar("T")

ReactionPrincipal: TypeAlias = Callable[[Actor], Awaitable[Any] | Any]
"""Resolves a sender's envelope actor into the service's own principal (or
None when it does not know the sender); sync or async. Register it with
``Engine.register_reaction_principal``."""


@dataclass(frozen=True, slots=True)
class Applied:
    """The effect committed; ``confirmations`` messages were stored on the claim."""

    confirmations: int


@dataclass(frozen=True, slots=True)
class Replayed:
    """The message was claimed before: its ``confirmations`` stored messages
    were staged again (fresh dedup token, original logical id); no effect ran."""

    confirmations: int


@dataclass(frozen=True, slots=True)
class Stale:
    """The producer sequence was at or below the reaction's watermark: a no-op."""


ReactionOutcome: TypeAlias = Applied | Replayed | Stale


class _StaleSequence(Exception):
    """Rolls back the claim of a stale message."""


async def run_reaction(
    db: Database,
    config: EngineConfig,
    delivery: ReactionDelivery,
    payload: T,
    handler: Callable[[Reaction[Any], T], Awaitable[object]],
    *,
    clock: Clock,
    resolve_principal: ReactionPrincipal | None = None,
    metrics: Metrics | None = None,
    hook: StageHook | None = None,
    nouns: Collection[str] | None = None,
) -> ReactionOutcome:
    """Run ``handler(cx, payload)`` for ``delivery`` in one pipeline
    transaction, under the message's claim and sequence guard."""
    incoming = delivery.incoming
    name = delivery.reaction
    opened: list[Reaction[Any]] = []

    def open_context(conn: Conn, now: Timestamp) -> Reaction[Any]:
        cx: Reaction[Any] = Reaction(conn, config, now, delivery)
        opened.append(cx)
        return cx

    async def replay(cx: Reaction[Any]) -> ReactionOutcome:
        cx._discard_staged()
        conn = cx._conn
        stored = await cx._db(
            Stage.CLAIM, lambda: stored_confirmations(conn, incoming.message_id, name)
        )
        for message in stored:
            cx._stage_outbox(OutboxRow.of(message, replay=True))
        return Replayed(len(stored))

    async def run_handler(cx: Reaction[Any]) -> None:
        if resolve_principal is not None:
            cx._principal = principal
        result = await handler(cx, payload)
        if isinstance(result, Disposition):
            raise result
        await cx._ensure_begun()  # a handler that sent nothing: the claim now

    async def body(cx: Reaction[Any]) -> ReactionOutcome:
        conn = cx._conn
        sequence = incoming.sequence
        if sequence is None:
            # The claim rides with the handler's first statement (its first
            # lock); the handler learns it was taken before from that call.
            cx._defer_claim(incoming.message_id, name)
        else:
            # Claim, then the guard, before the handler runs.
            status = await cx._execute_first(
                Stage.CLAIM, claim_statement(incoming.message_id, name)
            )
            if not claim_taken(status):
                return await replay(cx)
            if not await cx._db(Stage.CLAIM, lambda: advance_sequence(conn, sequence, name)):
                raise _StaleSequence
        try:
            await run_handler(cx)
        except ClaimedBefore:
            return await replay(cx)
        except Exception:
            if cx._claim_pending:
                # It failed before its first statement: a message claimed
                # before replays whatever its handler would have answered.
                try:
                    await cx._ensure_begun()
                except ClaimedBefore:
                    return await replay(cx)
            if cx._claimed_before:
                return await replay(cx)
            raise
        if cx._claimed_before:  # the handler swallowed ClaimedBefore
            return await replay(cx)
        emitted = list(cx._messages)
        # Stored on the claim by the flush's one statement, with the outbox rows.
        cx._confirmation = Confirmation.of(incoming.message_id, name, emitted)
        return Applied(len(emitted))

    principal: Any = None
    if resolve_principal is not None:
        # Before the pipeline takes its connection: a resolver that reads the
        # database (a principal fact) takes a pool connection of its own, and
        # reactions holding every connection while each waits for a second
        # one would never move again.
        resolved = resolve_principal(incoming.metadata.actor)
        principal = await resolved if inspect.isawaitable(resolved) else resolved
    try:
        return await run_pipeline(
            db, config, open_context, body, clock=clock, metrics=metrics, hook=hook,
            nouns=nouns,
        )
    except _StaleSequence:
        return Stale()
    except Exception as exc:
        failed = opened[-1]._failed if opened else None
        if failed is not None and exc is not failed:
            # The handler caught its transaction's database error and answered
            # something else: the engine's classification of the fault wins.
            raise failed  # noqa: B904 - its __cause__ stays the driver error
        raise
