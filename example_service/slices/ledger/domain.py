"""The ledger aggregate (full EDA): its log is its state.

A ledger belongs to one org and is keyed ``(org, name)``. People of that org
see it and post to it; its owner closes it. Its events, at ``EVENT_VERSION``
2:

* ``opened`` ``{org, name, owner}``;
* ``posted`` ``{cents, memo, by}`` (a deposit when ``cents > 0``, a
  withdrawal when below);
* ``closed`` ``{by}``.

Version 1 spelt ``posted`` as ``{amount, note, by}`` with ``amount`` a decimal
string (``"12.34"``); `Ledger.upcast` reads it as version 2, so a log an older
build wrote replays unchanged. The kit's generic snapshot carries no
constraint: integrity lives in the write-time gates (no overdraft, no
posting to a closed ledger, a bounded balance) and in `Ledger.check_hydrated`,
the barrier that refuses a rebuilt state those gates could never have
produced.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Self

from service_engine import DomainEvent, EventSourced, FullEda, Gate, Reason, gated

from ...kernel import Principal

NOUN = "ledger"

LEDGER_ERASE = "ledger:erase"
"""The scope (a passport role) erasing a person from every ledger needs."""

MAX_BALANCE = 2_000_000_000
"""A balance stays within a GraphQL ``Int`` (cents)."""
MAX_POSTING = 100_000_000
MAX_MEMO = 200
RECENT = 5
"""How many of the latest postings a ledger keeps in its state (and view)."""
ERASED = "erased"
"""What a person erased from the log is replaced with."""

FORBIDDEN = Reason("ledger.forbidden", "this ledger is not yours to change")
CLOSED = Reason("ledger.closed", "the ledger is closed")
OWNER_ONLY = Reason("ledger.owner_only", "only the ledger's owner may close it")
NOT_SETTLED = Reason("ledger.not_settled", "a ledger closes only at a zero balance")
NO_ORG = Reason("ledger.no_org", "a ledger is opened in the caller's org; the passport has none")
BAD_NAME = Reason("ledger.name_invalid", "a ledger name is 1 to 64 of [A-Za-z0-9_-]")
BAD_AMOUNT = Reason(
    "ledger.amount_invalid", f"a posting is a non-zero number of cents within ±{MAX_POSTING}"
)
BAD_MEMO = Reason("ledger.memo_invalid", f"a memo is at most {MAX_MEMO} characters")
OVERDRAWN = Reason("ledger.insufficient_funds", "the balance does not cover this withdrawal")
TOO_LARGE = Reason("ledger.balance_limit", f"the balance may not exceed {MAX_BALANCE} cents")
ERASE_SCOPE = Reason("ledger.erase_scope_required", f"erasing a person needs {LEDGER_ERASE}")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

LedgerKey = tuple[str, str]


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def ledger_key(org: str, name: str) -> LedgerKey:
    return (org, name)


def key_of(value: Any) -> LedgerKey:
    """A ledger key read back from the log (a JSON array) as the tuple it is."""
    org, name = value
    return (str(org), str(name))


class Ledger(EventSourced):
    NOUN = NOUN
    EVENT_VERSION = 2
    SNAPSHOT_EVERY = 20
    Store: ClassVar[FullEda[Ledger]] = FullEda()

    def __init__(
        self,
        org: str,
        name: str,
        *,
        owner: str | None = None,
        opened: bool = False,
        closed: bool = False,
        balance: int = 0,
        postings: int = 0,
        recent: tuple[tuple[int, str, str], ...] = (),
    ) -> None:
        self.org = org
        self.name = name
        self.owner = owner
        self.opened = opened
        self.closed = closed
        self.balance = balance
        self.postings = postings
        self.recent = recent
        """The latest postings, newest last: ``(cents, memo, by)``."""

    @property
    def key(self) -> LedgerKey:
        return (self.org, self.name)

    # -- who ------------------------------------------------------------------

    def in_org(self, principal: Principal) -> bool:
        return principal.org == self.org

    # -- gates (== affordances) ---------------------------------------------------

    @gated("post")
    def can_post(self, principal: Principal) -> Gate:
        if not self.in_org(principal):
            return Gate.deny(FORBIDDEN)
        if self.closed:
            return Gate.deny(CLOSED)
        return Gate.allow()

    @gated("close")
    def can_close(self, principal: Principal) -> Gate:
        if not self.in_org(principal):
            return Gate.deny(FORBIDDEN)
        if self.closed:
            return Gate.deny(CLOSED)
        if principal.id != self.owner:
            return Gate.deny(OWNER_ONLY)
        if self.balance != 0:
            return Gate.deny(NOT_SETTLED)
        return Gate.allow()

    # -- domain commands (each records one event) -----------------------------------

    @classmethod
    def open(cls, org: str, name: str, owner: str) -> Self:
        ledger = cls.start(ledger_key(org, name))
        ledger.record(DomainEvent("opened", {"org": org, "name": name, "owner": owner}))
        return ledger

    def refusal_to_post(self, cents: int) -> Reason | None:
        """Why posting ``cents`` would break an invariant, if it would."""
        if cents == 0 or abs(cents) > MAX_POSTING:
            return BAD_AMOUNT
        if self.balance + cents < 0:
            return OVERDRAWN
        if self.balance + cents > MAX_BALANCE:
            return TOO_LARGE
        return None

    def post(self, cents: int, memo: str, by: str) -> None:
        self.record(DomainEvent("posted", {"cents": cents, "memo": memo, "by": by}))

    def close(self, by: str) -> None:
        self.record(DomainEvent("closed", {"by": by}))

    # -- the kit's hooks -------------------------------------------------------------

    @classmethod
    def genesis(cls, key: Any) -> Self:
        org, name = key_of(key)
        return cls(org, name)

    def apply(self, event: DomainEvent) -> None:
        data = event.data
        match event.type:
            case "opened":
                self.opened = True
                self.owner = str(data["owner"])
            case "posted":
                cents = data["cents"]
                if not isinstance(cents, int):
                    raise ValueError(f"posted cents is not an int: {cents!r}")
                self.balance += cents
                self.postings += 1
                entry = (cents, str(data["memo"]), str(data["by"]))
                self.recent = (*self.recent, entry)[-RECENT:]
            case "closed":
                self.closed = True
            case other:
                raise ValueError(f"unknown ledger event {other!r}")

    def to_snapshot(self) -> Mapping[str, Any]:
        return {
            "owner": self.owner, "opened": self.opened, "closed": self.closed,
            "balance": self.balance, "postings": self.postings,
            "recent": [list(entry) for entry in self.recent],
        }

    @classmethod
    def from_snapshot(cls, key: Any, state: Mapping[str, Any]) -> Self:
        org, name = key_of(key)
        return cls(
            org, name, owner=state["owner"], opened=state["opened"], closed=state["closed"],
            balance=state["balance"], postings=state["postings"],
            recent=tuple((int(c), str(m), str(b)) for c, m, b in state["recent"]),
        )

    def check_hydrated(self) -> str | None:
        if not self.opened:
            return "the log has no opening event"
        if self.balance < 0:
            return f"the balance is negative ({self.balance}): no gate lets a ledger overdraw"
        if self.balance > MAX_BALANCE:
            return f"the balance {self.balance} exceeds the limit {MAX_BALANCE}"
        return None

    @classmethod
    def upcast(cls, event: DomainEvent, version: int) -> DomainEvent:
        if version == 1 and event.type == "posted":
            data = event.data
            return DomainEvent("posted", {
                "cents": cents_of(str(data["amount"])),
                "memo": str(data.get("note") or ""),
                "by": str(data["by"]),
            })
        if version == 1:
            return event  # opened and closed kept their shape
        return super().upcast(event, version)


def cents_of(amount: str) -> int:
    """A version-1 decimal amount (``"12.34"``, ``"-5"``) in whole cents."""
    try:
        value = Decimal(amount)
    except InvalidOperation as exc:
        raise ValueError(f"not a decimal amount: {amount!r}") from exc
    cents = value * 100
    if cents != cents.to_integral_value():
        raise ValueError(f"{amount!r} is not a whole number of cents")
    return int(cents)


def redact_person(event: DomainEvent, person: str) -> DomainEvent | None:
    """The ledger's erasure redactor: ``person`` leaves no trace in its log.

    A posting they made keeps its amount (the balance must still replay) but
    loses its author and its memo (free text may name them); a ledger they
    opened keeps no owner name.
    """
    data = event.data
    if event.type == "posted" and data.get("by") == person:
        return DomainEvent("posted", {**data, "by": ERASED, "memo": ""})
    if event.type == "opened" and data.get("owner") == person:
        return DomainEvent("opened", {**data, "owner": ERASED})
    if event.type == "closed" and data.get("by") == person:
        return DomainEvent("closed", {**data, "by": ERASED})
    return None
