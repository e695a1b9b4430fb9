"""Scope declaration at boot: the manifest (pure) and the handshake with
Identity. A slice contributes its scope keys (``Engine.contribute_scopes``);
a service that assembles its own manifest declares a `ScopeManifest`
(``Engine.declare_scopes``) and gets its `ScopeDeclaration`."""

from __future__ import annotations

from .manifest import (
    EmptyScopeManifest,
    MalformedScopeKey,
    ScopeDeclaration,
    ScopeError,
    ScopeManifest,
    ScopeManifestSpansServices,
    ScopeRejected,
    ScopeWithoutNats,
)

__all__ = [
    "EmptyScopeManifest",
    "MalformedScopeKey",
    "ScopeDeclaration",
    "ScopeError",
    "ScopeManifest",
    "ScopeManifestSpansServices",
    "ScopeRejected",
    "ScopeWithoutNats",
]
