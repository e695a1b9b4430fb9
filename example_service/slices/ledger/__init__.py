"""The ledger slice: full EDA through the engine's kit — an event log with a
lagging snapshot, an older event version upcast at read time, a hydration
barrier (`Ledger.check_hydrated`), in-log erasure of a person — a projector
over the log, and a contributed scope (`LEDGER_ERASE`).

Remove it by deleting this folder and its line in ``slices/__init__.py``.
Its log lives in the engine's own ``event_log`` / ``event_snapshot``
tables, so it brings no migration.
"""

from service_engine.graphql import SliceFragment

from .domain import LEDGER_ERASE
from .erasure import LedgerErasure
from .graphql import TYPES, LedgerMutation, LedgerQuery, LedgerSubscription
from .views import LedgersView

SLICE = SliceFragment(
    "ledger",
    query=LedgerQuery,
    mutation=LedgerMutation,
    subscription=LedgerSubscription,
    types=TYPES,
    projectors=[LedgersView()],
    scopes=[LEDGER_ERASE],  # Identity grants what eraseLedgerPerson gates on
    erasure=LedgerErasure(),
)

__all__ = ["LEDGER_ERASE", "SLICE"]
