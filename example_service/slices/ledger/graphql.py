"""The ledger slice's root fields: queries read rendered views through the
engine; mutations run on the engine's mutation executor; the subscription
streams the ledgers projector's typed union."""

from __future__ import annotations

import strawberry

from service_engine import MutationError, Query, WindowSpec
from service_engine.errors import Refused
from service_engine.graphql import MutationResult, Views

from ...kernel import Info
from .commands import (
    close_ledger,
    erase_person,
    key_for,
    open_ledger,
    post_to_ledger,
)
from .domain import LedgerKey
from .views import LEDGERS, LedgerEntryView, LedgersQuery, LedgerView

LEDGER_VIEWS = Views(LEDGERS, LedgerView, description="the caller's org's ledgers")


@strawberry.type(description="The outcome of a ledger mutation: the ledger as the caller now "
                             "sees it, or why nothing changed.")
class LedgerResult(MutationResult):
    key: strawberry.Private[list[str] | None] = None
    ledger: LedgerView | None = LEDGER_VIEWS.after_commit("key")


@strawberry.type(description="The outcome of an erasure: how many ledgers it rewrote.")
class ErasureResult(MutationResult):
    ledgers: int = 0


def _result(outcome: LedgerKey | MutationError) -> LedgerResult:
    if isinstance(outcome, MutationError):
        return LedgerResult.refused(outcome)
    return LedgerResult(success=True, key=list(outcome))


@strawberry.type
class LedgerQuery:
    @strawberry.field(description="The ledgers of the caller's org, by key.")
    async def ledgers(self, info: Info, limit: int = 100) -> list[LedgerView]:
        return await LEDGER_VIEWS.window(info.context, LedgersQuery(limit))

    @strawberry.field(description="One ledger of the caller's org, by name.")
    async def ledger(self, info: Info, name: str) -> LedgerView | None:
        try:
            key = key_for(info.context.principal, name)
        except Refused:
            return None
        return await LEDGER_VIEWS.one(info.context, list(key))


@strawberry.type
class LedgerMutation:
    @strawberry.mutation(description="Open a ledger in the caller's org; the caller owns it.")
    async def open_ledger(self, info: Info, name: str) -> LedgerResult:
        return _result(await info.context.execute(open_ledger, name))

    @strawberry.mutation(description="Post to a ledger: a deposit (cents > 0) or a withdrawal.")
    async def post_to_ledger(
        self, info: Info, name: str, cents: int, memo: str = ""
    ) -> LedgerResult:
        return _result(await info.context.execute(post_to_ledger, name, cents, memo))

    @strawberry.mutation(description="Close a settled ledger (its owner only).")
    async def close_ledger(self, info: Info, name: str) -> LedgerResult:
        return _result(await info.context.execute(close_ledger, name))

    @strawberry.mutation(description="Erase a person from every ledger's log (needs "
                                     "ledger:erase): their postings keep their amounts but "
                                     "lose their author and memo.")
    async def erase_ledger_person(self, info: Info, person: str) -> ErasureResult:
        touched = await info.context.engine.mutation_executor().execute_bulk(
            info.context.principal, erase_person, person
        )
        if isinstance(touched, MutationError):
            return ErasureResult.refused(touched)
        return ErasureResult(success=True, ledgers=len(touched))


@strawberry.type
class LedgerSubscription:
    @LEDGER_VIEWS.field(description="The caller's org's ledgers, live: a Reset, then Upserts "
                                    "and Removes on a contiguous revision.")
    def ledgers(self, limit: int = 100) -> WindowSpec[LedgersQuery]:
        return WindowSpec(Query(LedgersQuery(limit)))


TYPES = (LedgerView, LedgerEntryView, LedgerResult, ErasureResult, *LEDGER_VIEWS.types)
