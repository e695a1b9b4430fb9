"""The scope manifest a service declares at boot, and its validation. Pure.

A scope key is ``{service}.{segment}[.{segment}...]`` — at least three
dot-separated lower_snake segments, the first naming the declaring service
(``example.board.archive``). Slices contribute their keys
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

from ..errors import EngineError

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

SCOPE_KEY = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*){2,}$")
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
        """Validate into a `ScopeDeclaration`; ``service``, when given, is the
        pod's own (a key of any other service is refused)."""
        if not self.keys:
            raise EmptyScopeManifest("the scope manifest is empty: declare no manifest instead")
        for key in sorted(self.keys, key=repr):
            if not isinstance(key, str) or len(key) > MAX_SCOPE_KEY or not SCOPE_KEY.match(key):
                raise MalformedScopeKey(
                    f"scope key {key!r} is not service.segment.segment (lower_snake, dotted, "
                    f"at most {MAX_SCOPE_KEY} characters)"
                )
        services = sorted({key.split(".", 1)[0] for key in self.keys})
        if len(services) > 1:
            raise ScopeManifestSpansServices(
                f"one manifest declares the scopes of one service, got {services}"
            )
        if service is not None and services[0] != service:
            raise ScopeManifestSpansServices(
                f"the manifest declares {services[0]!r} scopes, but this pod is {service!r}"
            )
        return ScopeDeclaration(services[0], tuple(sorted(self.keys)))
