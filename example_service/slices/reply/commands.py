"""The reply slice's mutations, each in the engine's write pipeline.

* `start_reply` opens a streaming reply in the caller's org (the producer
  then streams its chunks on the lane);
* `cancel_reply` cancels it in flight: ``cx.seal_current`` folds whatever
  is durable under the lane lock and seals it (a finish that lost the race
  is answered ``already_sealed``);
* `attach_to_reply` mints the author's presigned upload of an attachment
  (``cx.blob``) and points the reply at it;
* `typing` says the caller is typing on a streaming reply (presence, put
  after the commit: loss-tolerant, gone at its ttl).
"""

from __future__ import annotations

import re
import uuid

from service_engine import Mutation
from service_engine.blobs import BlobKind, UploadUrl
from service_engine.errors import Refused
from service_engine.lanes import PresenceHandle

from ...kernel import Principal
from .domain import (
    ATTACHMENTS_OFF,
    BAD_ID,
    EXISTS,
    NO_ORG,
    REPLY_TEXT,
    Reply,
    valid_id,
)
from .messages import ReplyCancelled

__all__ = ["attach_to_reply", "cancel_reply", "start_reply", "typing", "typing_key"]

Cx = Mutation[Principal]

_UNSAFE = re.compile(r"[^-_=a-zA-Z0-9]")


def typing_key(reply_id: str, person: str) -> str:
    """The presence key of ``person`` typing on ``reply_id`` (subject tokens)."""
    return f"{reply_id}.{_UNSAFE.sub('_', person) or '_'}"


async def start_reply(cx: Cx, reply_id: str | None) -> str:
    principal = cx.principal
    if principal.org is None:
        raise Refused(NO_ORG)
    reply_id = reply_id or uuid.uuid4().hex
    if not valid_id(reply_id):
        raise Refused(BAD_ID)
    if await cx.load_optional(Reply, reply_id) is not None:
        raise Refused(EXISTS)
    await cx.create(Reply(reply_id, principal.org, principal.id, cx.now().value))
    return reply_id


async def attach_to_reply(
    cx: Cx, kind: BlobKind | None, reply_id: str, content_type: str
) -> UploadUrl:
    """Mint the author's presigned upload of the reply's attachment and
    point the reply at it (a previous attachment is released with the
    save). ``kind`` is None where the deployment has no blob store."""
    if kind is None:
        raise Refused(ATTACHMENTS_OFF)
    reply = await cx.load(Reply, reply_id)
    cx.require(reply.can_attach)
    upload = cx.blob(kind, content_type=content_type)
    reply.attach(upload.reference)
    await cx.save(reply)
    return upload


async def cancel_reply(cx: Cx, reply_id: str) -> None:
    reply = await cx.load(Reply, reply_id)
    cx.require(reply.can_cancel)
    text = (await cx.seal_current(REPLY_TEXT, reply_id)).state
    reply.cancel(text)
    await cx.save(reply)
    cx.emit(ReplyCancelled(reply_id=reply_id, length=len(reply.text)))


async def typing(cx: Cx, presence: PresenceHandle, reply_id: str) -> None:
    reply = await cx.load(Reply, reply_id)
    cx.require(reply.can_type)
    principal = cx.principal
    cx.present(
        presence, typing_key(reply_id, principal.id),
        {"reply_id": reply_id, "person": principal.id, "org": reply.org},
    )
