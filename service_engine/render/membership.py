"""Membership: the head of one session's window, and what a pass renders of it.

`Membership` is pure bookkeeping over a population's `MembershipRule`:
which keys a snapshot loads (`snapshot_keys`), which keys one pass renders
for a `Dirty` change (`plan`, a `RenderPlan`), and how the head moves once
they rendered (`settle`). `session.Session` drives it and owns the pages.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..failures import EngineError
from ..impacts.model import JsonValue
from .deltas import KeyText
from .interest import Dirty
from .windows import Keys, MembershipRule, Population

__all__ = ["Membership", "PageSet", "PopulateRequired", "RenderPlan"]


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
