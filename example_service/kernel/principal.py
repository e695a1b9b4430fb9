"""The principal and its generic facts bag.

A `Principal` is what the service authorises against: the passport's
identity (``sub``, ``actor``, ``org``, ``roles``) plus `PrincipalFacts`,
named sets of strings the slices derive from the service's own state (the
boards a person was invited to, say). The kernel knows no fact by name and
keeps no registry: a slice registers its fact loader with the engine
(``Engine.register_principal_fact``) from its own ``register``, and the
engine runs every loader right after `principal_of` resolves a passport
(each HTTP request, each WebSocket) and on a principal-facts refresh.

Equal values are shared: a pod holds one principal per live session, and
the sessions of one org mostly carry the same roles and the same facts, so
`shared` keeps one frozenset per distinct value (and `PrincipalFacts.of` one
bag per distinct set of facts) while any principal holds it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service_engine.graphql import Passport

__all__ = ["Principal", "PrincipalFacts", "principal_of", "shared"]

_EMPTY: frozenset[str] = frozenset()
_SETS: weakref.WeakValueDictionary[frozenset[str], frozenset[str]] = (
    weakref.WeakValueDictionary()
)


def shared(values: Iterable[str]) -> frozenset[str]:
    """``values`` as the pod's one frozenset of them (held while in use)."""
    value = values if type(values) is frozenset else frozenset(values)
    if not value:
        return _EMPTY
    held = _SETS.get(value)
    if held is None:
        # The table holds its keys strongly: the key is an equal copy, so the
        # value itself stays weakly held (and its entry goes with it).
        _SETS[frozenset(list(value))] = held = value
    return held


@dataclass(frozen=True, slots=True, weakref_slot=True)
class PrincipalFacts:
    """A bag of named facts about a principal, each a set of strings.

    Generic on purpose: the kernel stores whatever the slices load and
    reads nothing itself. A fact never loaded reads as the empty set.
    """

    items: tuple[tuple[str, frozenset[str]], ...] = ()

    @classmethod
    def of(cls, facts: Mapping[str, Iterable[str]]) -> PrincipalFacts:
        """The bag of ``facts``: one shared instance per distinct bag."""
        items = tuple(sorted((name, shared(values)) for name, values in facts.items()))
        held = _BAGS.get(items)
        if held is None:
            _BAGS[items] = held = cls(items)
        return held

    def get(self, name: str) -> frozenset[str]:
        for fact, values in self.items:
            if fact == name:
                return values
        return frozenset()

    def with_fact(self, name: str, values: Iterable[str]) -> PrincipalFacts:
        """The bag with ``name`` set to ``values`` (replacing what it held)."""
        return PrincipalFacts.of({**self.as_dict(), name: values})

    def as_dict(self) -> dict[str, frozenset[str]]:
        return dict(self.items)


_BAGS: weakref.WeakValueDictionary[
    tuple[tuple[str, frozenset[str]], ...], PrincipalFacts
] = weakref.WeakValueDictionary()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: the passport's claims plus the slices' facts.

    ``id`` is the passport's ``sub`` (the engine groups sessions by it and
    addresses principal-facts impacts to it).
    """

    id: str
    actor: str
    org: str | None = None
    roles: frozenset[str] = frozenset()
    kind: str = "person"
    facts: PrincipalFacts = field(default_factory=PrincipalFacts)

    def has_role(self, role: str) -> bool:
        return role in self.roles

    def fact(self, name: str) -> frozenset[str]:
        return self.facts.get(name)

    def with_fact(self, name: str, values: Iterable[str]) -> Principal:
        """This principal with the fact ``name`` loaded as ``values``."""
        return replace(self, facts=self.facts.with_fact(name, values))


def principal_of(passport: Passport) -> Principal:
    """The principal a passport stands for, before the slices' facts (the
    engine loads those right after)."""
    return Principal(
        id=passport.sub,
        actor=passport.actor,
        org=passport.org,
        roles=shared(passport.roles),
        kind=passport.kind,
    )
