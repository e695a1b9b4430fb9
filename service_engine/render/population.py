"""Populations (which keys a window holds) and Interest routing (who cares).

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
  `Membership.plan`); a key that leaves the result is Removed, so the
  membership stays bounded by what populate returns.

A principal-facts change for the session's principal, a projector reset
(bulk write) and a snapshot re-run populate for every shape that has one and
re-render every member (a `Keys` window included), so rows enter and leave
within the frame.

`Interest` is the routing table: projectors register a `Route` (the nouns
they read), sessions `watch` (before their snapshot: the connect barrier),
and `Interest.route` folds a batch of deliveries into a `Frame` of `Dirty`
sets, one per projector. `Interest.sessions_for` then names the sessions
a projector's dirty set concerns.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar

from ..errors import DuplicateRegistration, EngineError
from ..impacts.model import Cause, Impact, ImpactKind, JsonValue, canonical_json
from .deltas import KeyText

if TYPE_CHECKING:
    # Types only: the transport module pulls in the driver, the render core must not.
    from ..impacts.transport import Delivery, Reconnected

__all__ = [
    "Dirty",
    "Emission",
    "Frame",
    "Interest",
    "Inverse",
    "Keys",
    "Membership",
    "MembershipRule",
    "Ordered",
    "PageSet",
    "PopulateRequired",
    "Population",
    "Query",
    "RenderPlan",
    "Route",
    "UnknownProjector",
    "WindowSpec",
    "keyed",
]

Q = TypeVar("Q")
S = TypeVar("S", bound=Hashable)


def keyed(keys: Iterable[JsonValue]) -> dict[KeyText, JsonValue]:
    """Return ``keys`` as an ordered map from canonical key text to key value.

    Duplicates (by canonical text) keep their first position. Use it once on
    populate's result and hand the map to every session that shares it.
    """
    out: dict[KeyText, JsonValue] = {}
    for key in keys:
        text = canonical_json(key)
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
            raise TypeError("Keys takes an iterable of keys, not one str")
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
    at attach, see `service_engine.view.check_window_spec`)."""

    population: Population[Q]
    rls: bool = False


class Emission(enum.Enum):
    """How a projector delivers the changes an impact causes."""

    COALESCED = "coalesced"
    """Fold every change of a frame into one delta per key (the default)."""
    PER_IMPACT = "per_impact"
    """One delta per caused impact, carrying its `Cause`. A causeless impact
    (principal facts, foreign, scheduled, bulk) is folded coalesced."""


Inverse: TypeAlias = Callable[[JsonValue], Iterable[JsonValue] | None]
"""Maps a changed key of a secondary noun to the projector's keys it
affects; ``None`` means every key of the projector may be affected."""


@dataclass(frozen=True, slots=True)
class Route:
    """What Interest needs to know about one registered projector.

    ``nouns`` maps each noun the projector reads to its `Inverse`, or to
    ``None`` when that noun's keys *are* the projector's keys (an ergonomic
    ``view.Projector`` has exactly ``{NOUN: None}``). ``emission`` is the
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
class Frame:
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
        self._principals: dict[str, dict[str, set[S]]] = {}
        self._watching: dict[S, _Watch] = {}

    # -- registration -------------------------------------------------------

    def register(self, route: Route) -> None:
        """Add a projector's route. Raises `DuplicateRegistration` for a name
        already registered and ``ValueError`` for a route that reads no noun."""
        if route.projector in self._routes:
            raise DuplicateRegistration("projector", route.projector)
        if not route.nouns:
            raise ValueError(f"projector {route.projector!r} reads no noun")
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
        self._principals[projector].setdefault(principal, set()).add(session)
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

    def route(self, deliveries: Iterable[Delivery]) -> Frame:
        """Fold drained deliveries into one `Frame`, in delivery order.

        Projectors with no watching session are skipped: nothing would
        render their changes.
        """
        frame = Frame()
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

    def _route_facts(self, frame: Frame, impact: Impact) -> None:
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
                out |= peers
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
                    out |= peers
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


# -- membership -----------------------------------------------------------------


class PageSet(Protocol):
    """The pages appended behind a window's head (see `paging.Pages`)."""

    def __contains__(self, key: object) -> bool: ...
    def discard(self, key: KeyText) -> bool: ...
    def items(self) -> Iterable[tuple[KeyText, JsonValue]]: ...


class PopulateRequired(EngineError):
    """A membership step needed populate's result and was not given one:
    check `Membership.needs_populate` first and pass ``populated``."""


@dataclass(frozen=True, slots=True)
class RenderPlan:
    """What one session renders in one pass.

    ``scope`` is the keys to load and render, each once, in window order
    (treat it as read-only: it may be the frame's own dirty map).
    ``leaving`` are members that left an authoritative result: Removed if
    sent, never rendered. ``populated`` is the populate result the plan was
    built from (``None`` when populate did not run); ``head`` is the head an
    authoritative window will hold once the plan settles.
    """

    scope: Mapping[KeyText, JsonValue]
    leaving: tuple[KeyText, ...] = ()
    populated: Mapping[KeyText, JsonValue] | None = None
    head: Mapping[KeyText, JsonValue] | None = None


class Membership:
    """The head of one session's window: the keys it holds before any page.

    Pure bookkeeping over the population's rule; `session.Session` drives
    it and owns the pages. ``head`` maps key text to key value in window
    order: read it, never modify it.
    """

    __slots__ = ("head", "population", "rule")

    def __init__(self, population: Population[Any]) -> None:
        self.population = population
        self.rule = population.rule
        self.head: dict[KeyText, JsonValue] = (
            dict(population.keys) if isinstance(population, Keys) else {}
        )

    @property
    def query(self) -> object:
        """The query populate receives (``None`` for a `Keys` window)."""
        return None if isinstance(self.population, Keys) else self.population.query

    @property
    def populates(self) -> bool:
        """Whether this window has a populate (every shape but `Keys`)."""
        return self.rule is not MembershipRule.FIXED

    @property
    def discovers(self) -> bool:
        """Whether every changed key of the noun concerns this window
        (watch it with ``keys=None``)."""
        return self.rule is not MembershipRule.FIXED

    def needs_populate(self, dirty: Dirty, *, refreshed: bool) -> bool:
        """Whether `plan` needs populate's result for this pass.

        ``refreshed``: the session's principal facts changed this frame.
        """
        if self.rule is MembershipRule.FIXED:
            return False
        if self.rule is MembershipRule.AUTHORITATIVE:
            return True
        return dirty.everything or refreshed

    # -- snapshot -----------------------------------------------------------

    def snapshot_keys(
        self, populated: Mapping[KeyText, JsonValue] | None, pages: PageSet
    ) -> dict[KeyText, JsonValue]:
        """The keys a snapshot loads and renders, in window order: the head
        (populate's result, or the fixed keys), then the appended pages."""
        if self.rule is MembershipRule.FIXED:
            return dict(self.head)
        if populated is None:
            raise PopulateRequired("a snapshot of a populated window needs populate's result")
        keys = dict(populated)
        for key, value in pages.items():
            keys.setdefault(key, value)
        return keys

    def settle_snapshot(
        self,
        populated: Mapping[KeyText, JsonValue] | None,
        rendered: Mapping[KeyText, object],
        pages: PageSet,
    ) -> None:
        """Rebuild the head from a snapshot and drop pages whose rows are gone."""
        if self.rule is MembershipRule.FIXED:
            return
        if populated is None:
            raise PopulateRequired("a snapshot of a populated window needs populate's result")
        if self.rule is MembershipRule.AUTHORITATIVE:
            head = dict(populated)
        else:
            head = {key: value for key, value in populated.items() if key in rendered}
        for key in head:
            pages.discard(key)  # the head owns a key populate lists again
        stale = [key for key, _ in pages.items() if key not in rendered]
        for key in stale:
            pages.discard(key)
        self.head = head

    # -- a render pass ------------------------------------------------------

    def plan(
        self,
        dirty: Dirty,
        pages: PageSet,
        *,
        refreshed: bool = False,
        populated: Mapping[KeyText, JsonValue] | None = None,
        discovered: Mapping[KeyText, JsonValue] | None = None,
    ) -> RenderPlan:
        """Which keys this window renders for ``dirty``.

        ``populated`` is populate's result for this pass (required when
        `needs_populate` says so). ``discovered`` only matters to an
        authoritative window: keys found outside populate this pass that
        join its membership with populate's result.
        """
        everything = dirty.everything or refreshed
        rule = self.rule
        head = self.head
        if rule is MembershipRule.FIXED:
            if everything:
                return RenderPlan(head)
            if len(dirty.keys) <= len(head):
                return RenderPlan({k: v for k, v in dirty.keys.items() if k in head})
            return RenderPlan({k: v for k, v in head.items() if k in dirty.keys})

        if rule is MembershipRule.DISCOVERY:
            if not everything:
                # Every changed key of the noun may enter: the frame's own
                # map is the scope, shared by every discovering session.
                return RenderPlan(dirty.keys)
            if populated is None:
                raise PopulateRequired("a full re-render of a discovering window needs populate")
            scope = dict(populated)
            for key, value in head.items():
                scope.setdefault(key, value)
            for key, value in pages.items():
                scope.setdefault(key, value)
            for key, value in dirty.keys.items():
                scope.setdefault(key, value)
            return RenderPlan(scope, populated=populated)

        # AUTHORITATIVE
        if populated is None:
            raise PopulateRequired("an authoritative window re-runs populate on every change")
        members = dict(populated)
        if discovered:
            for key, value in discovered.items():
                members.setdefault(key, value)
        leaving = tuple(k for k in head if k not in members and k not in pages)
        if everything:
            scope = dict(members)
            for key, value in pages.items():
                scope.setdefault(key, value)
        else:
            scope = {k: v for k, v in dirty.keys.items() if k in members or k in pages}
            for key, value in members.items():
                if key not in head:
                    scope.setdefault(key, value)  # entered the result: render it
        return RenderPlan(scope, leaving, populated, members)

    def settle(self, plan: RenderPlan, rendered: Mapping[KeyText, object], pages: PageSet) -> None:
        """Move membership after ``plan`` rendered ``rendered`` (the visible
        views, by key text).

        `Keys`: nothing moves. Discovery: a rendered key that is not a member
        joins the head, a scoped key that did not render leaves head or page.
        Authoritative: the head becomes the plan's membership; a page key
        that did not render leaves its page.
        """
        rule = self.rule
        if rule is MembershipRule.FIXED:
            return
        if rule is MembershipRule.AUTHORITATIVE:
            if plan.head is None:
                raise PopulateRequired("settle an authoritative window with its own plan")
            self.head = dict(plan.head)
            for key in self.head:
                pages.discard(key)
            for key in plan.scope:
                if key not in rendered and key in pages:
                    pages.discard(key)
            return
        if plan.populated is not None:
            head: dict[KeyText, JsonValue] = {}
            for key, value in plan.populated.items():
                if key in rendered:
                    head[key] = value
                    pages.discard(key)
        else:
            head = self.head
        for key, value in plan.scope.items():
            if key in rendered:
                if key not in head and key not in pages:
                    head[key] = value
            else:
                head.pop(key, None)
                pages.discard(key)
        self.head = head

    def __contains__(self, key: object) -> bool:
        return key in self.head
