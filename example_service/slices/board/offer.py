"""The board slice's published language: every board, offered to other
services under ``example.board.<id>`` in the ``PUBLISHED_example`` bucket.

A board's image is its id, title, org, owner and archived flag (an erased
owner is re-published as ``erased``). A created, renamed,
archived or deleted board is re-published (or retracted) by the leader's
drain within a beat; nothing here writes to the bucket itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from service_engine import Conn
from service_engine.offers import Offer, Published

from .domain import Board

BOARD_BUCKET = "PUBLISHED_example"
"""The gitops-declared bucket of the service's published languages."""


class BoardPublished(Published):
    """A board as other services read it (the wire, JSON)."""

    BUCKET: ClassVar[str] = BOARD_BUCKET
    PREFIX: ClassVar[str] = "example.board"

    id: str
    title: str
    org: str
    owner: str
    archived: bool


class BoardOffer(Offer[Board, str, BoardPublished]):
    NAME = "boards"
    ROW = Board
    PUBLISHED = BoardPublished

    def publish(self, row: Board) -> BoardPublished | None:
        return BoardPublished(
            id=row.id, title=row.title, org=row.org, owner=row.owner, archived=row.archived
        )

    async def keys(self, conn: Conn) -> Iterable[str]:
        return [r["id"] for r in await conn.fetch("SELECT id FROM board")]
