"""The cohort index: which discovering sessions a changed row can concern.

A projector whose rows are read without RLS and gated by its declared
`Visibility` alone (`indexable`) keeps one `CohortIndex`. A frame then
costs what the change touches, not the number of sessions: the render pass
loads the changed rows once, and finds the sessions that must render them
from the rows' cohorts (`CohortIndex.candidates`) instead of visiting every
discovering session.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from ..impacts.model import JsonValue
from .deltas import KeyText
from .projector import Projector, Unrestricted, Visibility
from .session import Session
from .windows import MembershipRule

__all__ = [
    "CohortIndex",
    "SharedGates",
    "index_by_cohort",
    "indexable",
    "memberships_of",
    "relevant_keys",
    "visible_keys",
]


def indexable(proj: Projector[Any, Any, Any, Any]) -> bool:
    """Rows read without RLS and gated by the declared cohorts alone."""
    return (
        not proj.RLS
        and type(proj).visible is Projector.visible
        and not isinstance(proj.VISIBILITY, Unrestricted)
    )


def memberships_of(
    proj: Projector[Any, Any, Any, Any], principal: Any
) -> frozenset[Hashable] | None:
    """The principal's cohorts, when visibility is exactly the declared
    cohort intersection (not overridden, not Unrestricted)."""
    if type(proj).visible is not Projector.visible or isinstance(proj.VISIBILITY, Unrestricted):
        return None
    return frozenset(proj.VISIBILITY.memberships(principal))


class SharedGates:
    """One gate and one memberships set per distinct set of cohorts, shared
    by the sessions whose principals belong to exactly those cohorts (a
    session holds references, not a closure and two frozensets of its own).

    Only for a projector gated by its declared cohorts alone (`memberships_of`
    is not None, its `Visibility` keeps the cohort gate and the projector
    keeps `Projector.render_gate`): that gate reads
    nothing of the principal but its memberships. Any other projector's gate
    is the principal's own (`Projector.render_gate`). Counted: an entry goes
    when its last session is released."""

    __slots__ = ("_shared",)

    def __init__(self) -> None:
        self._shared: dict[tuple[str, frozenset[Hashable]], list[Any]] = {}

    def take(
        self, proj: Projector[Any, Any, Any, Any], principal: Any
    ) -> tuple[Callable[[Any], bool], frozenset[Hashable] | None]:
        """``principal``'s gate and memberships for ``proj`` (release them
        with `release` when the session ends or adopts another principal)."""
        memberships = memberships_of(proj, principal)
        if (
            memberships is None
            or type(proj.VISIBILITY).gate is not Visibility.gate
            or type(proj).render_gate is not Projector.render_gate
        ):
            return proj.render_gate(principal), memberships
        slot = (proj.NAME, memberships)
        entry = self._shared.get(slot)
        if entry is None:
            entry = self._shared[slot] = [proj.render_gate(principal), memberships, 0]
        entry[2] += 1
        return entry[0], entry[1]

    def release(
        self, proj: Projector[Any, Any, Any, Any], memberships: frozenset[Hashable] | None
    ) -> None:
        """One session taken with `take` let go of ``memberships``' entry."""
        if memberships is None:
            return
        slot = (proj.NAME, memberships)
        entry = self._shared.get(slot)
        if entry is None or entry[1] is not memberships:
            return
        entry[2] -= 1
        if entry[2] <= 0:
            del self._shared[slot]

    def __len__(self) -> int:
        return len(self._shared)


class CohortIndex:
    """Which discovering sessions a changed row can concern.

    ``members`` maps each cohort to the discovering sessions whose principal
    belongs to it. ``held_cohorts`` maps each key some session rendered to
    every cohort the row had when a session last rendered it — a superset of
    the cohorts through which any live session holds it — so the sessions
    that must see a change (it is visible to them now, or they hold it and
    must lose it) are exactly the members of the row's old and new cohorts.
    Sessions snapshotting, and authoritative ones (they re-populate on every
    change), are tracked apart.
    """

    __slots__ = ("authoritative", "held_cohorts", "members", "snapshotting")

    def __init__(self) -> None:
        self.members: dict[Hashable, set[Session[Any, Any]]] = {}
        self.held_cohorts: dict[KeyText, set[Hashable]] = {}
        self.snapshotting: set[Session[Any, Any]] = set()
        self.authoritative: set[Session[Any, Any]] = set()

    def join(self, session: Session[Any, Any], memberships: frozenset[Hashable] | None) -> None:
        """File ``session`` under its principal's ``memberships``."""
        rule = session.membership.rule
        if rule is MembershipRule.AUTHORITATIVE:
            self.authoritative.add(session)
        elif rule is MembershipRule.DISCOVERY and memberships is not None:
            for cohort in memberships:
                self.members.setdefault(cohort, set()).add(session)

    def leave(self, session: Session[Any, Any], memberships: frozenset[Hashable] | None) -> None:
        """Forget ``session`` (filed under ``memberships``)."""
        self.authoritative.discard(session)
        self.snapshotting.discard(session)
        for cohort in memberships or ():
            peers = self.members.get(cohort)
            if peers is not None:
                peers.discard(session)
                if not peers:
                    del self.members[cohort]

    def held(self, key: KeyText) -> set[Hashable]:
        found = self.held_cohorts.get(key)
        if found is None:
            found = self.held_cohorts[key] = set()
        return found

    def note_rendered(
        self, proj: Projector[Any, Any, Any, Any], rows: Mapping[KeyText, Any],
        rendered: Mapping[KeyText, Any],
    ) -> None:
        """A snapshot or page rendered ``rendered``: remember the rows' cohorts."""
        cohorts = proj.VISIBILITY.cohorts
        for key in rendered:
            self.held(key).update(cohorts(rows[key]))

    def candidates(
        self, proj: Projector[Any, Any, Any, Any], keys: Mapping[KeyText, JsonValue],
        rows: Mapping[KeyText, Any],
    ) -> set[Session[Any, Any]]:
        """The discovering sessions a change of ``keys`` (loaded as ``rows``)
        can concern: the members of the rows' old and new cohorts."""
        cohorts: set[Hashable] = set()
        for key in keys:
            before = self.held_cohorts.get(key)
            if before:
                cohorts |= before
            row = rows.get(key)
            if row is not None:
                cohorts.update(proj.VISIBILITY.cohorts(row))
        out: set[Session[Any, Any]] = set()
        for cohort in cohorts:
            peers = self.members.get(cohort)
            if peers:
                out |= peers
        return out

    def settle(
        self, proj: Projector[Any, Any, Any, Any], loaded: Mapping[KeyText, JsonValue],
        rows: Mapping[KeyText, Any], changed: Mapping[KeyText, JsonValue],
    ) -> None:
        """After a pass: a changed key was shown to every session that could
        hold it, so its cohorts are now the row's own; any other loaded row
        may have been rendered, so its cohorts are added."""
        cohorts_of = proj.VISIBILITY.cohorts
        for key in loaded:
            row = rows.get(key)
            if key in changed:
                if row is None:
                    self.held_cohorts.pop(key, None)
                else:
                    self.held_cohorts[key] = set(cohorts_of(row))
            elif row is not None:
                self.held(key).update(cohorts_of(row))


def index_by_cohort(
    proj: Projector[Any, Any, Any, Any], rows: Mapping[KeyText, Any]
) -> dict[Hashable, list[KeyText]]:
    """The loaded rows' keys by each cohort they belong to."""
    index: dict[Hashable, list[KeyText]] = {}
    cohorts = proj.VISIBILITY.cohorts
    for text, row in rows.items():
        for cohort in cohorts(row):
            index.setdefault(cohort, []).append(text)
    return index


def visible_keys(
    index: Mapping[Hashable, list[KeyText]], memberships: frozenset[Hashable]
) -> set[KeyText]:
    """The keys of `index_by_cohort` a principal of ``memberships`` sees."""
    visible: set[KeyText] = set()
    for cohort in memberships:
        found = index.get(cohort)
        if found:
            visible.update(found)
    return visible


def relevant_keys(
    session: Session[Any, Any], keys: Mapping[KeyText, JsonValue], visible: set[KeyText]
) -> dict[KeyText, JsonValue]:
    """The dirty keys this session must render: visible to it, or held by it
    (a held key that is no longer visible is Removed)."""
    held = session.last_sent
    head = session.membership.head
    pages = session.pages
    if not visible and held.keys().isdisjoint(keys) and head.keys().isdisjoint(keys) and (
        not len(pages) or not any(k in pages for k in keys)
    ):
        return {}
    return {k: v for k, v in keys.items() if k in visible or k in held or k in head or k in pages}
