"""The ledger slice's erasure: the person's events rewritten in every
ledger's log, each touched ledger re-snapshotted."""

from __future__ import annotations

from service_engine import Erase

from .domain import NOUN, Ledger, key_of, redact_person


class LedgerErasure:
    """Erasable (full EDA): the in-log erasure kit rewrites the person's
    events through `redact_person` (postings keep their amounts, lose their
    author and memo) and re-snapshots every touched ledger from genesis, in
    the erasure's transaction; each touched ledger's views re-render."""

    async def erase(self, cx: Erase, person: str) -> None:
        for key in await cx.erase_events(Ledger, redact_person):
            cx.impact(NOUN, key_of(key))
