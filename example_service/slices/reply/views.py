"""The reply slice's projectors: the caller's org's replies, newest first
(`RepliesView`), and who is typing on them (`TypingView`, a presence lane:
no table, the bucket's fold)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

import strawberry

from service_engine import Projector, TableWindow, Visibility
from service_engine.lanes import PresenceEntry, PresenceProjector

from ...kernel import Affordance, Principal, affordance_list
from .domain import Reply

REPLIES = "replies"
TYPING = "reply_typing"

MAX_WINDOW = 200


@strawberry.type(description="A reply as the caller sees it: streaming, finished (sealed "
                             "against its hash) or cancelled.")
class ReplyView:
    id: strawberry.ID
    org: str
    author: str
    status: str = strawberry.field(description="streaming, finished or cancelled.")
    text: str = strawberry.field(description="The sealed text (empty while streaming).")
    hash: str | None = strawberry.field(description="SHA-256 of the sealed chunks, hex.")
    chunks: int
    created_at: datetime
    affordances: list[Affordance]
    attachment: strawberry.ID | None = strawberry.field(
        default=None, description="The attachment's reference (download it with replyAttachment).")


@strawberry.type(description="Someone typing on a reply.")
class TypingView:
    reply_id: strawberry.ID
    person: str


@dataclass(frozen=True, slots=True)
class RepliesQuery:
    limit: int = 50


class RepliesView(Projector[Reply, ReplyView, Principal, RepliesQuery]):
    """The caller's org's replies, newest first (the principals of one org
    share one load)."""

    NAME = REPLIES
    WINDOW = TableWindow("reply", cohort="org", kind="org", order=("created_at", "id"),
                         descending=True, limit=MAX_WINDOW)

    def project(self, row: Reply, principal: Principal) -> ReplyView:
        return ReplyView(
            id=strawberry.ID(row.id), org=row.org, author=row.author, status=row.status,
            text=row.text, hash=row.hash, chunks=row.chunks, created_at=row.created_at,
            affordances=affordance_list(row, principal),
            attachment=None if row.attachment is None else strawberry.ID(row.attachment),
        )


class TypingVisibility(Visibility[PresenceEntry, Principal]):
    def cohorts(self, row: PresenceEntry) -> Iterable[Hashable]:
        value = row.value if isinstance(row.value, Mapping) else {}
        return (("org", str(value.get("org", ""))),)

    def memberships(self, principal: Principal) -> Iterable[Hashable]:
        if principal.org is not None:
            yield ("org", principal.org)


class TypingProjector(PresenceProjector[TypingView, Principal, str]):
    """Who is typing on reply ``query`` (keys ``<reply_id>.<person>``)."""

    NAME = TYPING
    VISIBILITY = TypingVisibility()

    def select(self, entry: PresenceEntry, query: str) -> bool:
        return entry.key.startswith(f"{query}.")

    def project(self, row: PresenceEntry, principal: Principal) -> TypingView:
        value = row.value if isinstance(row.value, Mapping) else {}
        return TypingView(
            reply_id=strawberry.ID(str(value.get("reply_id", ""))),
            person=str(value.get("person", "")),
        )

