"""What one render pass sends one window: `diff_into` (the deltas that turn
what the subscriber holds into the pass's views), and the window and render
shared by the sessions of a cohort that hold equal ones (`SharedWindow`,
`SharedRender`, at most `SHARED_RENDERS` per group). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from ..impacts.model import Cause, JsonValue
from .deltas import Delta, KeyText, Remove, Revision, new_upsert
from .membership import RenderPlan

__all__ = ["SHARED_RENDERS", "SharedRender", "SharedWindow", "diff_into", "same_window"]

V = TypeVar("V")

_MISSING: Any = object()

SHARED_RENDERS = 4
"""Distinct windows one group's memo holds (`Session.render_shared`); the
sessions of a cohort that hold yet another render alone."""


def diff_into(
    last: dict[KeyText, V],
    plan: RenderPlan,
    rendered: Mapping[KeyText, V],
    caused: Sequence[tuple[KeyText, Cause]],
    revision: Revision,
) -> list[Delta[V]]:
    """The deltas that turn ``last`` into the pass's views (`Session.render`),
    numbered from ``revision`` + 1, applied to ``last`` as it goes.

    ``caused`` first yields one delta per caused impact on a scoped key,
    carrying its cause, even when the view is unchanged; the rest is
    `diff_window(last, rendered, scope=plan.scope)` in one walk of the scope
    (no diff and second apply loop: this runs per window per frame; tests
    pin it to diff_window), then the plan's leaving keys are Removed.
    """
    rev = revision
    out: list[Delta[V]] = []
    scope = plan.scope
    get = rendered.get
    for key, cause in caused:
        if key not in scope:
            continue
        view = get(key, _MISSING)
        if view is not _MISSING:
            rev += 1
            out.append(new_upsert(rev, key, view, cause))
            last[key] = view
        elif key in last:
            rev += 1
            out.append(Remove(rev, key, cause))
            del last[key]
    sent = last.get
    for key in scope:
        view = get(key, _MISSING)
        if view is _MISSING:
            if key in last:
                rev += 1
                out.append(Remove(rev, key))
                del last[key]
            continue
        old = sent(key, _MISSING)
        if old is view or (old is not _MISSING and old == view):
            continue
        rev += 1
        out.append(new_upsert(rev, key, view))
        last[key] = view
    leaving = plan.leaving
    if leaving:
        for key in leaving:
            if key in last:
                rev += 1
                out.append(Remove(rev, key))
                del last[key]
    return out


def same_window(a: Mapping[KeyText, Any], b: Mapping[KeyText, Any]) -> bool:
    """The same object, or equal items in the same (window) order."""
    return a is b or (a == b and list(a) == list(b))


class SharedWindow(Generic[V]):
    """A window and head held by the sessions that completed a batch of
    snapshots with equal ones (`Session.go_live`'s ``shares``)."""

    __slots__ = ("head", "last")

    def __init__(self, last: dict[KeyText, V], head: dict[KeyText, JsonValue]) -> None:
        self.last = last
        self.head = head


class SharedRender(Generic[V]):
    """One render of a window, shared by the sessions that held it
    (`Session.render_shared`): the window before (``old_last``, ``old_head``)
    and after (``last``, ``head``), the deltas, and whether it came out as
    a Reset (more deltas than the threshold)."""

    __slots__ = ("deltas", "head", "last", "old_head", "old_last", "reset")

    def __init__(
        self,
        old_last: dict[KeyText, V],
        old_head: dict[KeyText, JsonValue],
        last: dict[KeyText, V],
        head: dict[KeyText, JsonValue],
        deltas: list[Delta[V]],
        reset: bool,
    ) -> None:
        self.old_last = old_last
        self.old_head = old_head
        self.last = last
        self.head = head
        self.deltas = deltas
        self.reset = reset

