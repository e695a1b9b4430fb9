"""The scopes component: the service's scope manifest and its handshake.

`Scopes` is what `Engine` composes for Identity: the slices contribute
their scope keys, the service declares the assembled manifest (or one it
assembled itself), and `Engine.run` drives the handshake with Identity as a
supervised worker that holds readiness DOWN until Identity accepted it and
every mirror converged. A service that declares nothing skips it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from ..beat.component import NO_STEPS, BeatStep
from ..messaging.nats import Nats
from ..readiness import ReadinessHandle
from ..supervisor import Worker
from .handshake import ScopeHandshake
from .manifest import ScopeDeclaration, ScopeManifest, ScopeWithoutNats

__all__ = ["Scopes"]


class Scopes:
    """The scope keys contributed, the declaration and its handshake."""

    def __init__(
        self,
        nats: Nats | None,
        readiness: ReadinessHandle,
        *,
        service: str | None,
        pod_id: str,
        converged: Callable[[], bool],
    ) -> None:
        self._nats = nats
        self._readiness = readiness
        self._service = service
        self._pod_id = pod_id
        self._converged = converged
        self._contributions: list[frozenset[str]] = []
        self.declaration: ScopeDeclaration | None = None
        """The validated scope manifest `run` declares to Identity (None: scopeless)."""
        self.handshake: ScopeHandshake | None = None

    def contribute(self, keys: Collection[str]) -> None:
        """A slice's scope keys, for `declare_contributed_scopes`."""
        self._contributions.append(ScopeManifest.of(keys).keys)

    def declare_contributed(self) -> ScopeDeclaration | None:
        """Assemble the contributed keys into one manifest, validate it
        (`MalformedScopeKey`, `ScopeManifestSpansServices`,
        `EmptyScopeManifest`) and declare it; None when nothing was
        contributed (a scopeless service skips the handshake)."""
        if not self._contributions:
            return None
        return self.declare(ScopeManifest.assemble(self._contributions))

    def declare(self, manifest: ScopeManifest) -> ScopeDeclaration:
        """Declare a manifest the service assembled itself (validated as
        `declare_contributed_scopes` does); `run` drives the handshake."""
        self.declaration = manifest.declaration(self._service)
        return self.declaration

    async def start(self) -> None:
        """Hold readiness DOWN for the handshake of a declared manifest;
        `ScopeWithoutNats` when there is no broker to declare it on."""
        declaration = self.declaration
        if declaration is None:
            return
        if self._nats is None:
            error = ScopeWithoutNats("scopes are declared but the engine has no NATS connection")
            self._readiness.set_down(error.reason, str(error))
            raise error
        handshake = ScopeHandshake(
            self._nats, declaration, self._readiness, pod_id=self._pod_id,
            converged=self._converged,
        )
        handshake.hold()
        self.handshake = handshake

    def tasks(self) -> Mapping[str, Worker]:
        return {} if self.handshake is None else {"scope_declaration": self.handshake.run}

    def beat_steps(self) -> Mapping[str, BeatStep]:
        return NO_STEPS

    async def aclose(self) -> None:
        return None
