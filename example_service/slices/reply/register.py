"""What the reply slice registers beyond its declared data: its
accumulator, its typing lane (with its ttl) and its attachments' blob kind;
and its erasure (the person's replies, their lane-A chunks and their typing
marks)."""

from __future__ import annotations

from datetime import timedelta

from service_engine import Engine, Erase

from ...kernel import ConfigurationError
from .commands import typing_key
from .domain import ATTACHMENT, ATTACHMENT_POLICY, NOUN, REPLY_TEXT
from .views import TYPING, TypingProjector

TYPING_TTL = timedelta(seconds=10)
"""How long a typing mark lasts without a repeat."""


def register(engine: Engine) -> None:
    if not engine.config.service:
        raise ConfigurationError(
            "the reply slice needs EngineConfig.service: its chunks ride STREAMING_{service}"
        )
    engine.register_accumulator(REPLY_TEXT)
    engine.register_presence(TypingProjector(), TYPING_TTL)
    # Attachments need a blob store: without one the service runs without S3
    # (the engine says so at run) and attachToReply is refused.
    if engine.blob_store_configured:
        engine.register_blobs(ATTACHMENT, ATTACHMENT_POLICY)


class ReplyErasure:
    """Erasable (CRUD): a reply is its author's text, so the person's
    replies are deleted and their lane-A chunks and attachments purged after
    the commit (the key stays sealed: a late chunk is refused). A typing mark names its
    typist in its key: the person's mark on every streaming reply is
    cleared."""

    async def erase(self, cx: Erase, person: str) -> None:
        authored = await cx.fetch("SELECT id, attachment FROM reply WHERE author = $1", person)
        await cx.execute("DELETE FROM reply WHERE author = $1", person)
        for row in authored:
            reply_id = str(row["id"])
            cx.erased.stream(REPLY_TEXT.name, reply_id)
            if row["attachment"] is not None:
                cx.erased.blob(str(row["attachment"]))
            cx.impact(NOUN, reply_id)
        streaming = await cx.fetch("SELECT id FROM reply WHERE status = 'streaming'")
        for row in [*authored, *streaming]:
            cx.erased.presence_key(TYPING, typing_key(str(row["id"]), person))
