"""Window declarations: which keys a window holds, and how its changes arrive.

A window's `Population` is one of three shapes:

* `Keys` — a fixed set of keys. Membership never changes; a key's row is
  shown while it exists and is visible to the principal, and re-enters when
  it becomes visible again. Populate is never called.
* `Ordered` — ``populate(cx, query)`` lists the head in order, and the window
  then grows by *discovery*: any changed row of the projector's noun that is
  visible to the principal enters (Upsert); a member leaves only when its row
  is deleted or becomes invisible (Remove). Older pages can be appended
  behind the head (`service_engine.render.paging`).
* `Query` — like `Ordered` (discovery-only, unordered intent), unless built
  with `Query.with_keys`: then populate is **authoritative**. Whenever the
  noun changes the runtime re-runs populate, and the membership becomes
  exactly its result plus the keys discovered this pass (see
  `membership.Membership.plan`); a key that leaves the result is Removed, so
  the membership stays bounded by what populate returns.

A principal-facts change for the session's principal, a projector reset
(bulk write) and a snapshot re-run populate for every shape that has one and
re-render every member (a `Keys` window included), so rows enter and leave
within the frame.

A subscriber asks for a `WindowSpec` (a population, and its RLS assertion);
a projector chooses its `Emission`.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from sys import intern
from typing import Generic, TypeAlias, TypeVar

from ..failures import DeclarationError
from ..impacts.model import JsonValue, canonical_json
from .deltas import KeyText

__all__ = [
    "Emission",
    "InvalidWindow",
    "Keys",
    "MembershipRule",
    "Ordered",
    "Population",
    "Query",
    "WindowSpec",
    "keyed",
]

Q = TypeVar("Q")


class InvalidWindow(DeclarationError):
    """A window declaration is malformed (e.g. ``Keys("abc")``: one str, not keys)."""


def keyed(keys: Iterable[JsonValue]) -> dict[KeyText, JsonValue]:
    """Return ``keys`` as an ordered map from canonical key text to key value.

    Duplicates (by canonical text) keep their first position. Use it once on
    populate's result and hand the map to every session that shares it.
    """
    out: dict[KeyText, JsonValue] = {}
    for key in keys:
        # Interned: every session whose window holds the key (its last_sent,
        # its head) keys it with one string.
        text = intern(canonical_json(key))
        if text not in out:
            out[text] = key
    return out


class MembershipRule(enum.Enum):
    """How a population's membership moves."""

    FIXED = "fixed"
    """`Keys`: members never change."""
    DISCOVERY = "discovery"
    """`Ordered`, `Query`: visible changed rows enter, gone rows leave."""
    AUTHORITATIVE = "authoritative"
    """`Query.with_keys()`: populate's result (plus this pass's discoveries) is the head."""


@dataclass(frozen=True, slots=True, init=False)
class Keys:
    """A fixed window of exactly these keys (duplicates dropped, order kept)."""

    keys: Mapping[KeyText, JsonValue]

    def __init__(self, keys: Iterable[JsonValue]) -> None:
        if isinstance(keys, str | bytes):
            raise InvalidWindow("Keys takes an iterable of keys, not one str")
        object.__setattr__(self, "keys", keyed(keys))

    @property
    def rule(self) -> MembershipRule:
        return MembershipRule.FIXED


@dataclass(frozen=True, slots=True)
class Ordered(Generic[Q]):
    """A head listed in order by ``populate(cx, query)``, grown by discovery
    and extendable with older pages."""

    query: Q

    @property
    def rule(self) -> MembershipRule:
        return MembershipRule.DISCOVERY


@dataclass(frozen=True, slots=True)
class Query(Generic[Q]):
    """The keys ``populate(cx, query)`` returns.

    Discovery-only as built; `with_keys` makes populate authoritative.
    """

    query: Q
    authoritative: bool = False

    def with_keys(self) -> Query[Q]:
        """This query, authoritative: membership is re-derived from populate
        whenever the noun changes, so keys that leave its result are Removed."""
        return Query(self.query, True)

    @property
    def rule(self) -> MembershipRule:
        return MembershipRule.AUTHORITATIVE if self.authoritative else MembershipRule.DISCOVERY


Population: TypeAlias = Keys | Ordered[Q] | Query[Q]
"""The shape of a window."""


@dataclass(frozen=True, slots=True)
class WindowSpec(Generic[Q]):
    """What a subscriber asks for at attach: a population, and whether it
    asserts the projector renders under RLS (validated against the projector
    at attach, see `service_engine.render.projector.check_window_spec`)."""

    population: Population[Q]
    rls: bool = False


class Emission(enum.Enum):
    """How a projector delivers the changes an impact causes."""

    COALESCED = "coalesced"
    """Fold every change of a frame into one delta per key (the default)."""
    PER_IMPACT = "per_impact"
    """One delta per caused impact, carrying its `Cause`. A causeless impact
    (principal facts, foreign, scheduled, bulk) is folded coalesced."""
