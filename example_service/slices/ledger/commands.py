"""The ledger slice's commands: each runs inside the engine's write pipeline
(one transaction: load — a replay through both hydration barriers — gate,
domain command, append, impacts). The erasure too: it rewrites the log in
place through the kit (`Mutation.redact_events`) and stages the views'
reset in the same transaction."""

from __future__ import annotations

from service_engine import Bulk, Cause, Mutation
from service_engine.errors import Refused

from ...kernel import Principal
from .domain import (
    BAD_MEMO,
    BAD_NAME,
    ERASE_SCOPE,
    LEDGER_ERASE,
    MAX_MEMO,
    NO_ORG,
    NOUN,
    Ledger,
    LedgerKey,
    key_of,
    ledger_key,
    redact_person,
    valid_name,
)

__all__ = [
    "close_ledger",
    "erase_person",
    "key_for",
    "open_ledger",
    "post_to_ledger",
    "require_erase_scope",
]

Cx = Mutation[Principal]


def key_for(principal: Principal, name: str) -> LedgerKey:
    """The key of the caller's org's ledger ``name``: a ledger is addressed
    by name within the caller's org, so another org's ledger is unreachable."""
    if principal.org is None:
        raise Refused(NO_ORG)
    if not valid_name(name):
        raise Refused(BAD_NAME)
    return ledger_key(principal.org, name)


def _changed(cx: Cx, ledger: Ledger, event: str, **data: str | int) -> None:
    cx.impact_caused(NOUN, ledger.key, Cause(event, {"by": cx.principal.id, **data}))


async def open_ledger(cx: Cx, name: str) -> LedgerKey:
    """Open the ledger ``name`` in the caller's org, owned by the caller."""
    org, name = key_for(cx.principal, name)
    ledger = Ledger.open(org, name, cx.principal.id)
    await cx.create(ledger)  # a second open of one key fails on the log's primary key
    _changed(cx, ledger, "ledger.opened")
    return ledger.key


async def post_to_ledger(cx: Cx, name: str, cents: int, memo: str = "") -> LedgerKey:
    """Deposit (``cents > 0``) or withdraw (``cents < 0``)."""
    ledger = await cx.load(Ledger, key_for(cx.principal, name))
    cx.require(ledger.can_post)
    if len(memo) > MAX_MEMO:
        raise Refused(BAD_MEMO, ledger.can_post.action)
    refusal = ledger.refusal_to_post(cents)
    if refusal is not None:
        raise Refused(refusal, ledger.can_post.action)
    ledger.post(cents, memo, cx.principal.id)
    await cx.save(ledger)
    _changed(cx, ledger, "ledger.posted", cents=cents)
    return ledger.key


async def close_ledger(cx: Cx, name: str) -> LedgerKey:
    ledger = await cx.load(Ledger, key_for(cx.principal, name))
    cx.require(ledger.can_close)
    ledger.close(cx.principal.id)
    await cx.save(ledger)
    _changed(cx, ledger, "ledger.closed")
    return ledger.key


def require_erase_scope(principal: Principal) -> None:
    if not principal.has_role(LEDGER_ERASE):
        raise Refused(ERASE_SCOPE)


async def erase_person(cx: Bulk[Principal], person: str) -> list[LedgerKey]:
    """Rewrite ``person``'s events in every ledger's log (`redact_person`) and
    re-snapshot each touched ledger from genesis; answer the touched keys.
    Needs `LEDGER_ERASE`. A bulk mutation: the rewrite and the views' reset
    (one projector-reset impact, however many ledgers it touched) commit in
    one transaction, so every live window re-renders without the person.
    Idempotent: a second erase touches nothing and resets nothing.

    A rewritten log that no longer replays raises `HydrationFailed`
    (answered ``hydration_failed``) and nothing commits.
    """
    require_erase_scope(cx.principal)
    touched = await cx.redact_events(Ledger, redact_person, person)
    if touched:
        cx.impact_all(NOUN)
    return [key_of(key) for key in touched]
