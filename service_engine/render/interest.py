"""Interest routing: which projectors and sessions a commit's impacts concern.

Projectors register a `Route` (the nouns they read), sessions `watch`
(before their snapshot: the connect barrier), and `Interest.route` folds a
batch of deliveries into a `RenderFrame` of `Dirty` sets, one per projector.
`Interest.sessions_for` then names the sessions a projector's dirty set
concerns.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

from ..failures import ConfigError, DuplicateRegistration, EngineError
from ..impacts.model import Cause, Delivery, Impact, ImpactKind, JsonValue, Reconnected
from .deltas import KeyText
from .windows import Emission, keyed

__all__ = [
    "Dirty",
    "Interest",
    "InvalidRoute",
    "Inverse",
    "RenderFrame",
    "Route",
    "UnknownProjector",
]

S = TypeVar("S", bound=Hashable)

Inverse: TypeAlias = Callable[[JsonValue], Iterable[JsonValue] | None]
"""Maps a changed key of a secondary noun to the projector's keys it
affects; ``None`` means every key of the projector may be affected."""


@dataclass(frozen=True, slots=True)
class Route:
    """What Interest needs to know about one registered projector.

    ``nouns`` maps each noun the projector reads to its `Inverse`, or to
    ``None`` when that noun's keys *are* the projector's keys (an ergonomic
    ``projector.Projector`` has exactly ``{NOUN: None}``). ``emission`` is the
    projector's emission hook; leave it ``None`` when it always coalesces
    (it is then never called).
    """

    projector: str
    nouns: Mapping[str, Inverse | None]
    emission: Callable[[Impact], Emission] | None = None


@dataclass(slots=True)
class Dirty:
    """What changed for one projector in one frame (or in one held barrier).

    ``keys`` maps each changed key's text to its value, in first-seen order.
    ``caused`` lists, in order, the caused impacts a PerImpact projector
    delivers one by one (their keys are also in ``keys``). ``everything``
    means every key may have changed (a projector reset, or an overflowing
    barrier). ``principals`` holds the ids (key texts) of principals whose
    facts changed in a way that concerns this projector.
    """

    keys: dict[KeyText, JsonValue] = field(default_factory=dict)
    caused: list[tuple[KeyText, Cause]] = field(default_factory=list)
    everything: bool = False
    principals: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.keys or self.everything or self.principals)

    def merge(self, other: Dirty) -> None:
        """Fold ``other`` (a later change) into this one."""
        self.keys.update(other.keys)
        self.caused.extend(other.caused)
        self.everything = self.everything or other.everything
        self.principals |= other.principals

    def size(self) -> int:
        """How many entries this holds (the barrier's bound counts these)."""
        return len(self.keys) + len(self.caused) + len(self.principals)


@dataclass(slots=True)
class RenderFrame:
    """One render pass's input, folded from the deliveries it drained.

    ``projectors`` maps projector name to its `Dirty` set (only projectors
    with sessions appear). ``principals`` maps the id text of every principal
    whose facts changed to the id value: re-resolve each once, then refresh
    its sessions (a refreshed principal object is harmless on projectors
    that do not depend on the facts; only dependent ones re-render).
    ``reconnected`` is set when continuity was lost: re-snapshot every live
    session (the dirty sets are then covered by the snapshots), and hold
    ``Dirty(everything=True)`` on every holding session so its replay
    re-renders the whole window.
    """

    projectors: dict[str, Dirty] = field(default_factory=dict)
    principals: dict[str, JsonValue] = field(default_factory=dict)
    reconnected: Reconnected | None = None
    impacts: int = 0

    def dirty(self, projector: str) -> Dirty:
        found = self.projectors.get(projector)
        if found is None:
            found = self.projectors[projector] = Dirty()
        return found


class UnknownProjector(EngineError):
    """A session watched, or a frame named, a projector never registered."""


class InvalidRoute(ConfigError):
    """A projector's route reads no noun: nothing could ever render it."""


@dataclass(frozen=True, slots=True)
class _Watch:
    projector: str
    principal: str
    keys: tuple[KeyText, ...] | None


class Interest(Generic[S]):
    """Routing from changed (noun, key) to the projectors and sessions that care.

    ``S`` is whatever handle the runtime files sessions under (the session
    object itself works: it hashes by identity). Register every projector's
    `Route` at boot; `watch` a session *before* its snapshot reads anything
    (the connect barrier: from then on every change reaches it, held until
    it is live) and `unwatch` it when it ends.

    Routing rules (`route`):

    * ENTITY and FOREIGN ``(noun, key)``: every projector reading ``noun``
      gets the key (through its inverse when ``noun`` is a secondary noun).
      A FOREIGN impact (a mirrored ``known_*`` row) never carries a cause,
      so it is always coalesced.
    * A caused ENTITY impact is also listed in ``caused`` when the
      projector's emission hook answers `Emission.PER_IMPACT`.
    * PROJECTOR_RESET ``noun``: every projector reading ``noun`` is dirty
      everywhere (``everything``).
    * PRINCIPAL_FACTS ``(id, deps)``: every projector reading one of
      ``deps`` (every projector when ``deps`` is empty) refreshes the
      sessions of principal ``id``; the frame lists ``id`` for re-resolution.
    """

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        self._by_noun: dict[str, list[tuple[Route, Inverse | None]]] = {}
        self._all: dict[str, set[S]] = {}
        self._wide: dict[str, set[S]] = {}
        self._keyed: dict[str, dict[KeyText, set[S]]] = {}
        self._principals: dict[str, dict[str, tuple[S] | set[S]]] = {}
        """Per projector, each principal's sessions: a 1-tuple while it has
        one (most principals: one socket each), a set from the second on."""
        self._watching: dict[S, _Watch] = {}

    # -- registration -------------------------------------------------------

    def register(self, route: Route) -> None:
        """Add a projector's route. Raises `DuplicateRegistration` for a name
        already registered and `InvalidRoute` for a route that reads no noun."""
        if route.projector in self._routes:
            raise DuplicateRegistration("projector", route.projector)
        if not route.nouns:
            raise InvalidRoute(f"projector {route.projector!r} reads no noun")
        self._routes[route.projector] = route
        for noun, inverse in route.nouns.items():
            self._by_noun.setdefault(noun, []).append((route, inverse))
        self._all[route.projector] = set()
        self._wide[route.projector] = set()
        self._keyed[route.projector] = {}
        self._principals[route.projector] = {}

    def route_of(self, projector: str) -> Route:
        try:
            return self._routes[projector]
        except KeyError:
            raise UnknownProjector(f"no projector registered as {projector!r}") from None

    # -- sessions -----------------------------------------------------------

    def watch(
        self,
        session: S,
        projector: str,
        principal: str,
        keys: Iterable[KeyText] | None,
    ) -> None:
        """Start routing ``projector``'s changes to ``session``.

        ``principal`` is the principal id text (`cohort.principal_key`).
        ``keys`` is the fixed key set of a `Keys` window; pass ``None`` for a
        window that discovers (every changed key of the noun concerns it).
        Call it before the session's snapshot reads anything. Watching a
        session twice replaces its first watch.
        """
        self.route_of(projector)
        if session in self._watching:
            self.unwatch(session)
        fixed = None if keys is None else tuple(keys)
        self._watching[session] = _Watch(projector, principal, fixed)
        self._all[projector].add(session)
        by_principal = self._principals[projector]
        peers = by_principal.get(principal)
        if peers is None:
            by_principal[principal] = (session,)
        elif isinstance(peers, tuple):
            by_principal[principal] = {*peers, session}
        else:
            peers.add(session)
        if fixed is None:
            self._wide[projector].add(session)
        else:
            index = self._keyed[projector]
            for key in fixed:
                index.setdefault(key, set()).add(session)

    def unwatch(self, session: S) -> None:
        """Stop routing to ``session`` (idempotent)."""
        watch = self._watching.pop(session, None)
        if watch is None:
            return
        projector = watch.projector
        self._all[projector].discard(session)
        by_principal = self._principals[projector]
        peers = by_principal.get(watch.principal)
        if peers is not None:
            if isinstance(peers, tuple):
                if session in peers:
                    del by_principal[watch.principal]
            else:
                peers.discard(session)
                if not peers:
                    del by_principal[watch.principal]
        if watch.keys is None:
            self._wide[projector].discard(session)
        else:
            index = self._keyed[projector]
            for key in watch.keys:
                holders = index.get(key)
                if holders is not None:
                    holders.discard(session)
                    if not holders:
                        del index[key]

    def watched(self, projector: str) -> set[S]:
        """Every session watching ``projector`` (a live view: do not modify)."""
        return self._all[projector]

    def __len__(self) -> int:
        return len(self._watching)

    # -- routing ------------------------------------------------------------

    def route(self, deliveries: Iterable[Delivery]) -> RenderFrame:
        """Fold drained deliveries into one `RenderFrame`, in delivery order.

        Projectors with no watching session are skipped: nothing would
        render their changes.
        """
        frame = RenderFrame()
        active = self._all
        for delivery in deliveries:
            if not isinstance(delivery, list | tuple):
                frame.reconnected = delivery  # a Reconnected marker
                continue
            frame.impacts += len(delivery)
            for impact in delivery:
                kind = impact.kind
                if kind is ImpactKind.ENTITY or kind is ImpactKind.FOREIGN:
                    for route, inverse in self._by_noun.get(impact.noun, ()):
                        if active[route.projector]:
                            _route_entity(frame.dirty(route.projector), route, inverse, impact)
                elif kind is ImpactKind.PROJECTOR_RESET:
                    for route, _ in self._by_noun.get(impact.noun, ()):
                        if active[route.projector]:
                            frame.dirty(route.projector).everything = True
                else:  # PRINCIPAL_FACTS
                    self._route_facts(frame, impact)
        return frame

    def _route_facts(self, frame: RenderFrame, impact: Impact) -> None:
        principal = impact.key_json
        frame.principals[principal] = impact.key
        if impact.deps:
            names = {
                route.projector
                for noun in impact.deps
                for route, _ in self._by_noun.get(noun, ())
            }
        else:
            names = set(self._routes)
        for name in names:
            if principal in self._principals[name]:
                frame.dirty(name).principals.add(principal)

    def keyed_sessions(self, projector: str, keys: Mapping[KeyText, JsonValue]) -> set[S]:
        """The `Keys` sessions of ``projector`` holding one of ``keys``
        (never the discovering sessions)."""
        out: set[S] = set()
        index = self._keyed[projector]
        if index:
            if len(keys) <= len(index):
                for key in keys:
                    holders = index.get(key)
                    if holders:
                        out |= holders
            else:
                for key, holders in index.items():
                    if key in keys:
                        out |= holders
        return out

    def principal_sessions(self, projector: str, principals: Iterable[str]) -> set[S]:
        """The sessions of ``projector`` held by one of ``principals``."""
        out: set[S] = set()
        by_principal = self._principals[projector]
        for principal in principals:
            peers = by_principal.get(principal)
            if peers:
                out.update(peers)
        return out

    def sessions_for(self, projector: str, dirty: Dirty) -> set[S]:
        """The sessions of ``projector`` that ``dirty`` concerns.

        Every session on ``everything``; otherwise the sessions of the
        refreshed principals, every discovering session when a key changed,
        and the `Keys` sessions holding a changed key. Returns a new set.
        """
        if dirty.everything:
            return set(self._all[projector])
        out: set[S] = set()
        if dirty.principals:
            by_principal = self._principals[projector]
            for principal in dirty.principals:
                peers = by_principal.get(principal)
                if peers:
                    out.update(peers)
        if dirty.keys:
            out |= self._wide[projector]
            index = self._keyed[projector]
            if index:
                # Walk whichever side is smaller: a big frame over a few
                # Keys windows, or a few dirty keys over many.
                if len(dirty.keys) <= len(index):
                    for key in dirty.keys:
                        holders = index.get(key)
                        if holders:
                            out |= holders
                else:
                    for key, holders in index.items():
                        if key in dirty.keys:
                            out |= holders
        return out


def _route_entity(dirty: Dirty, route: Route, inverse: Inverse | None, impact: Impact) -> None:
    if inverse is None:
        text = impact.key_json
        dirty.keys[text] = impact.key
        targets: Iterable[KeyText] = (text,)
    else:
        mapped = inverse(impact.key)
        if mapped is None:
            dirty.everything = True
            return
        mapped_keys = keyed(mapped)
        dirty.keys.update(mapped_keys)
        targets = mapped_keys
    cause = impact.cause
    emission = route.emission
    if cause is not None and emission is not None and emission(impact) is Emission.PER_IMPACT:
        dirty.caused.extend((text, cause) for text in targets)
