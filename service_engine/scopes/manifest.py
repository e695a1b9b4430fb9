"""The scope manifest a service declares at boot, and its validation. Pure.

A scope key is the string a gate checks in the passport's roles:
``{area}:{verb}[:{more}]`` — lower_snake segments joined by ``:``
(``board:archive``) — optionally qualified by its service as
``{service}.{area}:{verb}`` (``example.board:archive``). An unqualified key
belongs to the declaring pod's service; the declaration carries the
service once and the keys unqualified. Slices contribute their keys
(``Engine.contribute_scopes``); `ScopeManifest.assemble` takes the union
and `ScopeManifest.declaration` validates it into the `ScopeDeclaration`
the handshake sends. Boot errors, all `ScopeError`:

* `MalformedScopeKey` — a key that is not of that shape;
* `ScopeManifestSpansServices` — keys of two services in one manifest, or
  keys of another service than the pod's own;
* `EmptyScopeManifest` — a manifest with no key (a service that gates on
  no scope contributes nothing and skips the handshake instead).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..failures import EngineError

__all__ = [
    "SCOPE_KEY",
    "EmptyScopeManifest",
    "MalformedScopeKey",
    "ScopeDeclaration",
    "ScopeError",
    "ScopeManifest",
    "ScopeManifestSpansServices",
    "ScopeRejected",
    "ScopeWithoutNats",
]

SCOPE_KEY = re.compile(
    r"^(?:(?P<service>[a-z][a-z0-9_-]*)\.)?(?P<scope>[a-z][a-z0-9_]*(?::[a-z][a-z0-9_]*)+)$"
)
MAX_SCOPE_KEY = 200


class ScopeError(EngineError):
    """The base of the scope declaration errors (``EngineError::Scope``)."""

    reason = "scope_declaration"


class MalformedScopeKey(ScopeError):
    """A scope key not of the shape ``service.segment.segment``."""


class ScopeManifestSpansServices(ScopeError):
    """A manifest whose keys name more than one service (or not the pod's)."""


class EmptyScopeManifest(ScopeError):
    """A manifest declared with no key."""


class ScopeRejected(ScopeError):
    """Identity refused the declaration: the pod stays DOWN with the reason."""

    def __init__(self, service: str, reason: str) -> None:
        super().__init__(f"Identity rejected the scope declaration of {service!r}: {reason}")
        self.service = service
        self.rejection = reason


class ScopeWithoutNats(ScopeError):
    """Scopes are declared but the engine has no NATS connection to declare them over."""


@dataclass(frozen=True, slots=True)
class ScopeDeclaration:
    """A validated manifest: one service, its sorted scope keys, and their
    digest (sha256 of the keys joined by newlines, hex)."""

    service: str
    scopes: tuple[str, ...]

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.scopes).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ScopeManifest:
    """The scope keys a service gates on (unvalidated until `declaration`)."""

    keys: frozenset[str]

    @classmethod
    def of(cls, keys: Iterable[str]) -> ScopeManifest:
        if isinstance(keys, str):
            raise MalformedScopeKey(f"a manifest lists scope keys, got the str {keys!r}")
        return cls(frozenset(keys))

    @classmethod
    def assemble(cls, contributions: Iterable[Iterable[str]]) -> ScopeManifest:
        """The union of every slice's contribution."""
        keys: set[str] = set()
        for contributed in contributions:
            keys |= cls.of(contributed).keys
        return cls(frozenset(keys))

    def declaration(self, service: str | None = None) -> ScopeDeclaration:
        """Validate into a `ScopeDeclaration` for ``service`` (the pod's own);
        without ``service`` every key must be qualified by one service."""
        if not self.keys:
            raise EmptyScopeManifest("the scope manifest is empty: declare no manifest instead")
        named: set[str] = set()
        scopes: set[str] = set()
        for key in sorted(self.keys, key=repr):
            match = SCOPE_KEY.match(key) if isinstance(key, str) else None
            if match is None or len(key) > MAX_SCOPE_KEY:
                raise MalformedScopeKey(
                    f"scope key {key!r} is not area:verb or service.area:verb (lower_snake "
                    f"segments, at most {MAX_SCOPE_KEY} characters)"
                )
            if match["service"] is not None:
                named.add(match["service"])
            scopes.add(match["scope"])
        if len(named) > 1:
            raise ScopeManifestSpansServices(
                f"one manifest declares the scopes of one service, got {sorted(named)}"
            )
        if service is not None and named and named != {service}:
            raise ScopeManifestSpansServices(
                f"the manifest declares {sorted(named)[0]!r} scopes, but this pod is {service!r}"
            )
        owner = service if service is not None else next(iter(named), None)
        if owner is None:
            raise ScopeManifestSpansServices(
                "unqualified scope keys need the declaring service (EngineConfig.service)"
            )
        return ScopeDeclaration(owner, tuple(sorted(scopes)))
