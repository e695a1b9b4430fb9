"""The ledger slice registers its projector, its scope (`LEDGER_ERASE`, so
Identity grants what ``eraseLedgerPerson`` gates on) and its erasure (the
person's events rewritten in every ledger's log, each touched ledger
re-snapshotted)."""

from __future__ import annotations

from service_engine import Engine, Erase

from .domain import LEDGER_ERASE, NOUN, Ledger, key_of, redact_person
from .views import LedgersView


def register(engine: Engine) -> None:
    engine.register_projector(LedgersView())
    engine.contribute_scopes([LEDGER_ERASE])
    engine.register_erasable("ledger", LedgerErasure())


class LedgerErasure:
    """Erasable (full EDA): the in-log erasure kit rewrites the person's
    events through `redact_person` (postings keep their amounts, lose their
    author and memo) and re-snapshots every touched ledger from genesis, in
    the erasure's transaction; each touched ledger's views re-render."""

    async def erase(self, cx: Erase, person: str) -> None:
        for key in await cx.erase_events(Ledger, redact_person):
            cx.impact(NOUN, key_of(key))
