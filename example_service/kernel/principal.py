"""The principal, its facts, and the directory that resolves them.

A `Principal` is what the service authorises against: the passport's
identity (``sub``, ``actor``, ``org``, ``roles``) plus `PrincipalFacts`,
named sets of strings the slices derive from the service's own state (the
boards a person was invited to, say). The kernel knows no fact by name: each
slice contributes its facts to the engine's `PrincipalDirectory` from its own
``register``, and the directory loads them all when it resolves a passport
(once per HTTP request, once per WebSocket) and again when the engine
re-resolves a principal after a principal-facts impact.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeAlias

from service_engine import Database

from .errors import ServiceError

if TYPE_CHECKING:
    from service_engine import Engine
    from service_engine.graphql import Passport

__all__ = ["FactSource", "Principal", "PrincipalDirectory", "PrincipalFacts"]


@dataclass(frozen=True, slots=True)
class PrincipalFacts:
    """A bag of named facts about a principal, each a set of strings.

    Generic on purpose: the kernel stores whatever the slices contribute and
    reads nothing itself. A fact never contributed reads as the empty set.
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


FactSource: TypeAlias = Callable[[Database, str], Awaitable[Iterable[str]]]
"""Loads one named fact of a subject (``sub``) from the service's state."""


_DIRECTORIES: weakref.WeakKeyDictionary[Engine, PrincipalDirectory] = weakref.WeakKeyDictionary()


class PrincipalDirectory:
    """Resolves passports to principals for one engine.

    Slices call `contribute` from their ``register``; the service hands
    `resolve` to the GraphQL app as its principal resolver and `refresh` to
    `Engine.register_principal_refresh`.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._sources: dict[str, FactSource] = {}

    @classmethod
    def of(cls, engine: Engine) -> PrincipalDirectory:
        """The directory of ``engine`` (created on first use)."""
        directory = _DIRECTORIES.get(engine)
        if directory is None:
            directory = _DIRECTORIES[engine] = cls(engine.db)
        return directory

    @property
    def facts(self) -> tuple[str, ...]:
        """The names of the contributed facts."""
        return tuple(self._sources)

    def contribute(self, name: str, source: FactSource) -> None:
        """Add the fact ``name``, loaded by ``source``, to every principal."""
        if name in self._sources:
            raise ServiceError(f"principal fact {name!r} is contributed twice")
        self._sources[name] = source

    async def facts_of(self, subject: str) -> PrincipalFacts:
        loaded = {name: await source(self._db, subject) for name, source in self._sources.items()}
        return PrincipalFacts.of(loaded)

    async def resolve(self, passport: Passport) -> Principal:
        """The principal a passport stands for, with its current facts."""
        return Principal(
            id=passport.sub,
            actor=passport.actor,
            org=passport.org,
            roles=frozenset(passport.roles),
            kind=passport.kind,
            facts=await self.facts_of(passport.sub),
        )

    async def refresh(self, principal: Principal) -> Principal:
        """``principal`` with its facts reloaded (same identity, same claims)."""
        return replace(principal, facts=await self.facts_of(principal.id))
