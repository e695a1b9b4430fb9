"""The reply slice's root fields: the replies and who is typing (queries
and live subscriptions), a reply's attachment download, and the mutations
that start, cancel, attach to and type on a reply."""

from __future__ import annotations

import strawberry

from service_engine import MutationError, Query, WindowSpec
from service_engine.graphql import (
    Live,
    MutationResult,
    Views,
    presence_subscription_union,
)

from ...kernel import Info
from .commands import attach_to_reply, cancel_reply, start_reply, typing
from .domain import ATTACHMENT, REPLY_TEXT, decode
from .views import REPLIES, TYPING, RepliesQuery, ReplyView, TypingView

REPLY_VIEWS = Views(REPLIES, ReplyView, description="the caller's org's replies")
TYPING_UNION = presence_subscription_union(
    "ReplyTyping", TypingView, description="who is typing on a reply"
)


@strawberry.type(description="The outcome of a reply mutation: the reply as the caller now "
                             "sees it, or why nothing changed.")
class ReplyResult(MutationResult):
    reply_id: strawberry.Private[str | None] = None
    reply: ReplyView | None = REPLY_VIEWS.after_commit("reply_id")


@strawberry.type(description="One form field of a presigned upload.")
class UploadField:
    name: str
    value: str


@strawberry.type(description="A presigned POST: send the fields in order, then the file as "
                             "the form's `file` part, to url (at most maxBytes).")
class ReplyUpload:
    reference: strawberry.ID
    url: str
    fields: list[UploadField]
    max_bytes: int


@strawberry.type(description="The outcome of attaching to a reply: where to upload it.")
class AttachResult(MutationResult):
    upload: ReplyUpload | None = None
    reply_id: strawberry.Private[str | None] = None
    reply: ReplyView | None = REPLY_VIEWS.after_commit("reply_id")


@strawberry.type(description="A presigned GET of a reply's attachment; hand it on, never store it.")
class ReplyDownload:
    url: str
    expires_in_seconds: int


@strawberry.type(description="What of a streaming reply is durable so far: the fold of its "
                             "contiguous chunks (a late joiner's catch-up).")
class ReplyProgress:
    text: str
    chunks: int = strawberry.field(description="Chunks folded: the fold stops at a gap.")
    hash: str = strawberry.field(description="SHA-256 of those chunks, hex.")
    sealed: bool


@strawberry.type
class ReplyQuery:
    @strawberry.field(description="The caller's org's newest replies.")
    async def replies(self, info: Info, limit: int = 50) -> list[ReplyView]:
        return await REPLY_VIEWS.window(info.context, RepliesQuery(limit))

    @strawberry.field(description="One reply, if the caller sees it.")
    async def reply(self, info: Info, id: strawberry.ID) -> ReplyView | None:
        return await REPLY_VIEWS.one(info.context, str(id))

    @strawberry.field(description="A presigned download of a reply's attachment, only while "
                                  "the caller sees the reply and it still holds the reference.")
    async def reply_attachment(
        self, info: Info, id: strawberry.ID, reference: strawberry.ID
    ) -> ReplyDownload | None:
        url = await REPLY_VIEWS.download(info.context, str(id), str(reference))
        if url is None:
            return None
        return ReplyDownload(url=url.url, expires_in_seconds=int(url.expires_in.total_seconds()))

    @strawberry.field(description="A reply's durable progress, if the caller sees the reply.")
    async def reply_progress(self, info: Info, id: strawberry.ID) -> ReplyProgress | None:
        if await REPLY_VIEWS.one(info.context, str(id)) is None:
            return None
        folded = await info.context.engine.fold(REPLY_TEXT, str(id))
        return ReplyProgress(
            text=decode(folded.state), chunks=folded.next_seq, hash=folded.hash,
            sealed=folded.sealed_at is not None,
        )


@strawberry.type
class ReplyMutation:
    @strawberry.mutation(description="Attach a file to the caller's own reply: a presigned "
                                     "upload the store enforces (size, content type); a "
                                     "previous attachment is released.")
    async def attach_to_reply(
        self, info: Info, id: strawberry.ID, content_type: str
    ) -> AttachResult:
        kind = info.context.engine.blob_kind(ATTACHMENT)
        outcome = await info.context.execute(attach_to_reply, kind, str(id), content_type)
        if isinstance(outcome, MutationError):
            return AttachResult.refused(outcome)
        upload = ReplyUpload(
            reference=strawberry.ID(outcome.reference), url=outcome.url,
            fields=[UploadField(name=k, value=v) for k, v in outcome.fields.items()],
            max_bytes=outcome.max_bytes,
        )
        return AttachResult(success=True, upload=upload, reply_id=str(id))

    @strawberry.mutation(description="Open a streaming reply in the caller's org; its chunks "
                                     "arrive on stream.{service}.{id}.")
    async def start_reply(self, info: Info, id: strawberry.ID | None = None) -> ReplyResult:
        outcome = await info.context.execute(start_reply, None if id is None else str(id))
        return ReplyResult.of(outcome, "reply_id")

    @strawberry.mutation(description="Cancel a streaming reply: what is durable is kept.")
    async def cancel_reply(self, info: Info, id: strawberry.ID) -> ReplyResult:
        outcome = await info.context.execute(cancel_reply, str(id))
        return ReplyResult.of(outcome, reply_id=str(id))

    @strawberry.mutation(description="Say the caller is typing on a streaming reply "
                                     "(presence: gone at its ttl unless repeated).")
    async def reply_typing(self, info: Info, id: strawberry.ID) -> ReplyResult:
        presence = info.context.engine.presence(TYPING)
        outcome = await info.context.execute(typing, presence, str(id))
        return ReplyResult.of(outcome, reply_id=str(id))


@strawberry.type
class ReplySubscription:
    @REPLY_VIEWS.field(description="The caller's org's newest replies, live.")
    def replies(self, limit: int = 50) -> WindowSpec[RepliesQuery]:
        return WindowSpec(Query(RepliesQuery(limit)))

    @TYPING_UNION.field(description="Who is typing on reply id, live.")
    def reply_typing(self, id: strawberry.ID) -> Live:
        return Live(TYPING, WindowSpec(Query(str(id))))


TYPES = (
    ReplyView, TypingView, ReplyResult, ReplyProgress, UploadField, ReplyUpload, AttachResult,
    ReplyDownload, *REPLY_VIEWS.types, *TYPING_UNION.types,
)
