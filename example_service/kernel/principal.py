"""The principal and its generic facts bag.

A `Principal` is what the service authorises against: the passport's
identity (``sub``, ``actor``, ``org``, ``roles``) plus `PrincipalFacts`,
named sets of strings the slices derive from the service's own state (the
boards a person was invited to, say). The kernel knows no fact by name and
keeps no registry: a slice registers its fact loader with the engine
(``Engine.register_principal_fact``) from its own ``register``, and the
engine runs every loader right after `principal_of` resolves a passport
(each HTTP request, each WebSocket) and on a principal-facts refresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service_engine.graphql import Passport

__all__ = ["Principal", "PrincipalFacts", "principal_of"]


@dataclass(frozen=True, slots=True)
class PrincipalFacts:
    """A bag of named facts about a principal, each a set of strings.

    Generic on purpose: the kernel stores whatever the slices load and
    reads nothing itself. A fact never loaded reads as the empty set.
    """

    items: tuple[tuple[str, frozenset[str]], ...] = ()

    @classmethod
    def of(cls, facts: Mapping[str, Iterable[str]]) -> PrincipalFacts:
        return cls(tuple(sorted((name, frozenset(values)) for name, values in facts.items())))

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
        roles=frozenset(passport.roles),
        kind=passport.kind,
    )
