"""The reply aggregate (CRUD), its accumulator and its gates.

A reply is streamed in chunks on the engine's accumulated lane (lane A):
the producer publishes ``(reply_id, seq, chunk)`` frames on
``stream.{service}.{reply_id}`` and the engine folds them into `REPLY_TEXT`
(the UTF-8 bytes, concatenated; decoded once sealed, so a character split
across two chunks is whole). A reply-finished command seals the stream
against the SHA-256 of its chunks and the sealed text lands on the row;
a person of the reply's org may cancel it in flight (``seal_current``:
whatever is durable is kept). Its author may attach one blob
(`ATTACHMENT`, only where the deployment has a blob store); the reply lists
it in ``blob_refs``, so a replaced attachment's blob is released.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from service_engine import Aggregate, CrudStore, Gate, Reason, gated
from service_engine.blobs import BlobPolicy
from service_engine.lanes import Accumulator

from ...kernel import Principal

NOUN = "reply"

Status = Literal["streaming", "finished", "cancelled"]

FORBIDDEN = Reason("reply.forbidden", "this reply is not yours to change")
ENDED = Reason("reply.ended", "the reply is no longer streaming")
NOT_AUTHOR = Reason("reply.not_author", "only the reply's author may attach to it")
ATTACHMENTS_OFF = Reason(
    "reply.attachments_unavailable", "this deployment has no blob store: attachments are off"
)

ATTACHMENT = "reply_attachment"
"""The blob kind of a reply's attachment (registered only with a blob store)."""
ATTACHMENT_POLICY = BlobPolicy(
    max_bytes=5 * 1024 * 1024,
    content_types=("text/plain", "image/png", "image/jpeg", "application/pdf"),
    orphan_after=timedelta(hours=1),
)
NO_ORG = Reason("reply.no_org", "a reply is started in the caller's org; the passport has none")
BAD_ID = Reason("reply.id_invalid", "a reply id is 1 to 64 of [A-Za-z0-9_-]")
EXISTS = Reason("reply.exists", "a reply with this id exists")

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def valid_id(reply_id: str) -> bool:
    return _ID.fullmatch(reply_id) is not None


def _fold(text: bytes, chunk: bytes) -> bytes:
    return text + chunk


REPLY_TEXT: Accumulator[bytes] = Accumulator("reply", initial=bytes, fold=_fold)
"""A reply's chunks, concatenated (bytes: decoded once, when sealed)."""


def decode(text: bytes) -> str:
    return text.decode("utf-8", errors="replace")


@dataclass
class Reply(Aggregate):
    id: str
    org: str
    author: str
    created_at: datetime
    status: Status = "streaming"
    text: str = ""
    hash: str | None = None
    chunks: int = 0
    version: int = 1
    attachment: str | None = None
    """The reference of the reply's attached blob (`ATTACHMENT`), if any."""

    def in_org(self, principal: Principal) -> bool:
        return principal.org == self.org

    @gated("cancel")
    def can_cancel(self, principal: Principal) -> Gate:
        if principal.kind != "service" and not self.in_org(principal):
            return Gate.deny(FORBIDDEN)
        if self.status != "streaming":
            return Gate.deny(ENDED)
        return Gate.allow()

    @gated("type")
    def can_type(self, principal: Principal) -> Gate:
        if not self.in_org(principal):
            return Gate.deny(FORBIDDEN)
        if self.status != "streaming":
            return Gate.deny(ENDED)
        return Gate.allow()

    @gated("attach")
    def can_attach(self, principal: Principal) -> Gate:
        if not self.in_org(principal) or principal.id != self.author:
            return Gate.deny(NOT_AUTHOR)
        return Gate.allow()

    def blob_refs(self) -> tuple[str, ...]:
        """The blobs the reply holds: replacing or dropping the attachment
        releases the old blob in the same transaction."""
        return () if self.attachment is None else (self.attachment,)

    def attach(self, reference: str) -> None:
        self.attachment = reference
        self.version += 1

    def finish(self, text: bytes, hash: str, chunks: int) -> None:
        self.status = "finished"
        self.text, self.hash, self.chunks = decode(text), hash, chunks
        self.version += 1

    def cancel(self, text: bytes) -> None:
        self.status = "cancelled"
        self.text = decode(text)
        self.version += 1


Reply.Store = CrudStore.of(Reply, "reply")
