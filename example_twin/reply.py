"""The twin as the producer of a streamed reply.

It publishes the reply's chunks on the service's accumulated lane
(``stream.{service}.{reply_id}``, one ``(key, seq, chunk)`` frame each, with
a ``Nats-Msg-Id`` so a retried publish is deduplicated), then sends the
finish (``reply.finish``: ``last_seq`` and the SHA-256 of the concatenated
chunks) and reads the service's answer on ``INTEGRATION_EVT``:
``reply.finished``, or ``reply.seal_failed``, to which it answers with a
corrected finish (the true last sequence and hash), a bounded number of times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from pydantic import BaseModel, ConfigDict, Field

from service_engine import EventMetadata
from service_engine.integration import Acked, Duplicate, Unanswered, event_subject
from service_engine.lanes import ChunkFrame, ChunkSeq, encode_frame, seal_hash

from .runner import EVENT_STREAM, Twin, TwinError

__all__ = [
    "REPLY", "FinishReply", "ReplyRun", "finish_reply", "reply_cycle", "split_text",
    "stream_reply",
]

REPLY = "reply"
"""The aggregate of the service's reply commands and events."""
CORRECTIONS = 3
"""Corrected finishes the twin sends before it gives up on a reply."""
_PUBLISH_RETRY = 0.2


class FinishReply(BaseModel):
    """Command ``integration.cmd.{service}.reply.finish``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    reply_id: str
    org: str
    last_seq: int = Field(ge=0)
    hash: str


@dataclass
class ReplyRun:
    """One streamed reply: ``finished`` once ``reply.finished`` came back;
    ``failures`` the ``reply.seal_failed`` codes answered on the way."""

    reply_id: str
    chunks: int
    hash: str
    finished: bool = False
    failures: list[str] = field(default_factory=list)
    finishes: int = 0
    elapsed_ms: float = 0.0
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({"ok": self.finished, **asdict(self)}, sort_keys=True)


def split_text(text: str, size: int) -> list[bytes]:
    """``text``'s UTF-8 bytes in chunks of ``size`` bytes (a character may
    straddle two chunks: the service decodes only the sealed whole)."""
    data = text.encode()
    return [data[i:i + size] for i in range(0, len(data), max(1, size))] or [b""]


async def stream_reply(
    twin: Twin, reply_id: str, chunks: Sequence[bytes], *, start: int = 0, within: float = 10.0
) -> None:
    """Publish ``chunks`` as seqs ``start, start + 1, ...`` of ``reply_id``'s stream."""
    for offset, chunk in enumerate(chunks):
        frame = ChunkFrame(reply_id, ChunkSeq(start + offset), chunk)
        subject, headers, payload = encode_frame(twin.target, frame)
        deadline = time.monotonic() + within
        while True:
            outcome = await twin.nats.publish(subject, payload, headers)
            if isinstance(outcome, Acked | Duplicate):
                break
            if not isinstance(outcome, Unanswered) or time.monotonic() > deadline:
                raise TwinError(f"publish to {subject} failed: {outcome}")
            await asyncio.sleep(_PUBLISH_RETRY)


async def finish_reply(
    twin: Twin, reply_id: str, org: str, last_seq: int, hash: str, metadata: EventMetadata
) -> None:
    await twin.command(
        "finish", FinishReply(reply_id=reply_id, org=org, last_seq=last_seq, hash=hash),
        metadata, aggregate=REPLY,
    )


async def reply_cycle(
    twin: Twin,
    reply_id: str,
    chunks: Sequence[bytes],
    *,
    org: str,
    first_finish: tuple[int, str] | None = None,
    bound: float = 30.0,
) -> ReplyRun:
    """Stream ``chunks``, finish (with ``first_finish`` — a deliberately
    wrong ``(last_seq, hash)`` — when given) and answer every
    ``reply.seal_failed`` with the corrected finish until ``reply.finished``."""
    run = ReplyRun(reply_id, len(chunks), seal_hash(chunks))
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    started = time.monotonic()

    async def route(msg: Msg) -> None:
        with contextlib.suppress(ValueError, TypeError):
            event = json.loads(msg.data)
            if event.get("payload", {}).get("reply_id") == reply_id:
                inbox.put_nowait(event)

    js = twin.nats.client.jetstream()
    subscription = await js.subscribe(
        event_subject(twin.target, REPLY, "finished").rsplit(".", 1)[0] + ".*",
        stream=EVENT_STREAM, cb=route, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW,
    )
    try:
        origin = EventMetadata.originating(twin.actor)
        await stream_reply(twin, reply_id, chunks)
        last_seq, hash = first_finish or (len(chunks) - 1, run.hash)
        await finish_reply(twin, reply_id, org, last_seq, hash, origin)
        run.finishes += 1
        deadline = started + bound
        while not run.finished:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TwinError(f"no answer to the finish of {reply_id} within {bound:g}s")
            event = await asyncio.wait_for(inbox.get(), remaining)
            if event.get("type") == f"{REPLY}.finished":
                run.finished = True
            elif event.get("type") == f"{REPLY}.seal_failed":
                run.failures.append(str(event["payload"].get("code")))
                if run.finishes > CORRECTIONS:
                    raise TwinError(f"reply {reply_id} still refused: {run.failures}")
                await finish_reply(twin, reply_id, org, len(chunks) - 1, run.hash, origin)
                run.finishes += 1
    except (TwinError, TimeoutError) as exc:
        run.error = str(exc) or type(exc).__name__
    finally:
        run.elapsed_ms = (time.monotonic() - started) * 1000
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()
    return run
