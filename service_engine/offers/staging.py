"""The dirty marks a write transaction stages for its offered nouns.

`DirtyMarks` collects, per transaction, the ``(offer, kv_key)`` of every
saved, created or deleted aggregate that carries an offer (and every
``cx.dirty_offer``); `stage_offer_dirty` writes them with the transaction
in one statement. A mark already waiting has its generation bumped, so a
drain that read it before this write leaves it for the next pass. The
statement also notifies `OFFER_CHANNEL`, waking the leader's drain.
`offer_dirty_statement` is the same statement with its values as
literals, for the pipeline to send in COMMIT's round trip.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..db.literals import dollar_quoted
from ..db.types import Conn
from .model import Offer, offers_of

__all__ = [
    "OFFER_CHANNEL",
    "DirtyMark",
    "DirtyMarks",
    "dollar_quoted",
    "offer_dirty_statement",
    "stage_offer_dirty",
]

OFFER_CHANNEL = "service_engine_offer"
"""NOTIFY channel a commit that staged dirty offer keys wakes the drain on."""


@dataclass(frozen=True, slots=True)
class DirtyMark:
    offer: str
    kv_key: str
    agg_key: str | None
    """The aggregate key as canonical JSON (None: no row behind the key)."""


class DirtyMarks:
    """The marks of one transaction, by ``(offer, kv_key)``."""

    def __init__(self) -> None:
        self._marks: dict[tuple[str, str], DirtyMark] = {}

    def aggregate(self, aggregate_type: type[Any], key: Any) -> None:
        """Every offer ``aggregate_type`` carries: mark ``key`` dirty."""
        for offer in offers_of(aggregate_type):
            self.offer(offer, key)

    def offer(self, offer: Offer[Any, Any, Any], key: Any) -> None:
        kv_key = offer.kv_key(key)
        self._marks[(offer.NAME, kv_key)] = DirtyMark(offer.NAME, kv_key, offer.agg_key_json(key))

    def __len__(self) -> int:
        return len(self._marks)

    def marks(self) -> list[DirtyMark]:
        return list(self._marks.values())


_STAGE = "SELECT service_engine.mark_offers_dirty($1::text[], $2::text[], $3::text[])"
"""The marks as three parallel arrays: inserted, or a waiting mark's
generation bumped, and `OFFER_CHANNEL` notified (migration 0011's
function, whose statement each session plans once)."""


async def stage_offer_dirty(conn: Conn, marks: Iterable[DirtyMark]) -> int:
    """Write ``marks`` in the open transaction; returns how many."""
    rows = list(marks)
    if not rows:
        return 0
    await conn.execute(
        _STAGE, [m.offer for m in rows], [m.kv_key for m in rows], [m.agg_key for m in rows]
    )
    return len(rows)


_STAGE_LITERAL = (
    "SELECT service_engine.mark_offers_dirty({offers}::text[], {keys}::text[], {aggs}::text[])"
)


def _array(values: list[str | None]) -> str:
    return "ARRAY[" + ", ".join(dollar_quoted(v) for v in values) + "]"


def offer_dirty_statement(marks: Iterable[DirtyMark]) -> str:
    """`stage_offer_dirty`'s statement with its values inlined (dollar
    quoted), to ride in another round trip of the same transaction; ``""``
    when there is nothing to stage."""
    rows = list(marks)
    if not rows:
        return ""
    return _STAGE_LITERAL.format(
        offers=_array([m.offer for m in rows]), keys=_array([m.kv_key for m in rows]),
        aggs=_array([m.agg_key for m in rows]),
    )
