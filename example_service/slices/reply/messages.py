"""The reply slice's integration contract.

Command addressed to this service (``integration.cmd.{service}.reply.finish``):

* `FinishReply` — the producer streamed the reply's chunks ``0..last_seq``
  on ``stream.{service}.{reply_id}``; seal them against ``hash`` (the
  SHA-256 of the concatenated chunks, hex). Answered with `ReplyFinished`,
  or `ReplySealFailed` when the seal cannot honour it (``last_seq`` below a
  durable chunk, a hash mismatch, a stream still truncated after a few
  redeliveries): the producer resends a corrected finish.

Events it emits (``integration.evt.{service}.reply.…``): `ReplyFinished`,
`ReplySealFailed`, `ReplyCancelled`.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from service_engine.integration import DeclaredSequence

AGGREGATE = "reply"


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class _Event(_Payload):
    AGGREGATE: ClassVar[str] = AGGREGATE
    FACT: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def sequence(self) -> DeclaredSequence | None:
        return None


class FinishReply(_Payload):
    """``reply.finish``: seal the reply's stream at ``last_seq`` against ``hash``."""

    reply_id: str
    org: str
    last_seq: int = Field(ge=0, le=2**63 - 1)
    hash: str


class ReplyFinished(_Event):
    FACT: ClassVar[str] = "finished"

    reply_id: str
    chunks: int
    hash: str
    length: int


class ReplySealFailed(_Event):
    """The finish was refused; ``code`` says why (``seal_truncated``,
    ``seal_hash_mismatch``, ``seal_chunk_beyond_last_seq``). Its causation
    id is the refused finish's command id."""

    FACT: ClassVar[str] = "seal_failed"

    reply_id: str
    code: str
    message: str
    last_seq: int


class ReplyCancelled(_Event):
    FACT: ClassVar[str] = "cancelled"

    reply_id: str
    length: int
