"""The reply slice's reaction: ``reply.finish`` seals a streamed reply.

`finish_reply` seals the reply's stream in the reaction's transaction
(``cx.seal``: the replay, the hash check and the marker commit with the
reply's row and the answer):

* sealed: the reply is finished (created in the command's org if no one
  started it over GraphQL), answered with ``reply.finished``;
* `SealChunkBeyondLastSeq` (a chunk is durable past ``last_seq``) or
  `SealHashMismatch`: answered at once with ``reply.seal_failed``;
* `SealTruncated`: a chunk may still be in flight on the lane, so the
  finish is retried (``cx.delivered``) up to `FINISH_ATTEMPTS` deliveries,
  then answered with ``reply.seal_failed``;
* `AlreadySealed` (cancelled, or finished by an earlier copy): nothing to do.

A finish is never nak'ed into a silent dead letter: the producer always
hears back, and resends a corrected finish.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from service_engine import InboundReaction, Reaction
from service_engine.errors import (
    AlreadySealed,
    SealChunkBeyondLastSeq,
    SealError,
    SealHashMismatch,
    SealTruncated,
)
from service_engine.integration import ReactionBudget, Retry

from ...kernel import Principal
from .domain import REPLY_TEXT, Reply, valid_id
from .messages import AGGREGATE, FinishReply, ReplyFinished, ReplySealFailed

__all__ = ["FINISH_ATTEMPTS", "finish_reply", "reactions"]

Cx = Reaction[Principal]

FINISH_ATTEMPTS = 4
"""Deliveries of a truncated finish before it is answered ``reply.seal_failed``."""
FINISH_BUDGET = ReactionBudget(
    max_deliveries=FINISH_ATTEMPTS + 2,
    retry_backoff=timedelta(milliseconds=250), retry_backoff_cap=timedelta(seconds=2),
)


def _failed(cx: Cx, command: FinishReply, refusal: SealError) -> None:
    cx.emit(ReplySealFailed(
        reply_id=command.reply_id, code=refusal.code, message=str(refusal),
        last_seq=command.last_seq,
    ))


async def finish_reply(cx: Cx, command: FinishReply) -> Retry | None:
    if not valid_id(command.reply_id) or not command.org:
        cx.emit(ReplySealFailed(
            reply_id=command.reply_id, code="reply.id_invalid",
            message="a reply id is 1 to 64 of [A-Za-z0-9_-], in an org", last_seq=command.last_seq,
        ))
        return None
    reply = await cx.load_optional(Reply, command.reply_id)
    if reply is not None and reply.status != "streaming":
        return None  # ended already (an earlier copy finished it, or it was cancelled)
    try:
        text = await cx.seal(REPLY_TEXT, command.reply_id, command.last_seq, command.hash)
    except SealTruncated as truncated:
        if cx.delivered < FINISH_ATTEMPTS:
            return Retry("reply.truncated", str(truncated))
        _failed(cx, command, truncated)
        return None
    except (SealHashMismatch, SealChunkBeyondLastSeq) as refusal:
        _failed(cx, command, refusal)
        return None
    except AlreadySealed:
        return None
    if reply is None:
        reply = Reply(command.reply_id, command.org, str(cx.actor.id), cx.now().value)
        reply.finish(text, command.hash.lower(), command.last_seq + 1)
        await cx.create(reply)
    else:
        reply.finish(text, command.hash.lower(), command.last_seq + 1)
        await cx.save(reply)
    cx.emit(ReplyFinished(
        reply_id=reply.id, chunks=reply.chunks, hash=reply.hash or "", length=len(reply.text),
    ))
    return None


def reactions() -> list[InboundReaction[Any]]:
    return [
        InboundReaction.command(
            "finish_reply", aggregate=AGGREGATE, verb="finish", payload=FinishReply,
            handler=finish_reply, budget=FINISH_BUDGET,
        ),
    ]
