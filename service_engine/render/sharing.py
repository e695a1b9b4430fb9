"""Shared views: a row projected once per view key, not once per session.

A projector that declares `Projector.view_key` says its ``project`` reads no
more of the principal than that key: two principals with equal view keys get
equal views of every row. `SharedViews` is the memo one load's rows are
projected through (a render pass's batch, a snapshot batch): the first
session of a view key projects a row, every later one of that key gets the
same object. Sessions then hold references to one immutable view instead of
equal copies, and a cohort of a thousand subscribers costs one projection.

The declaration is the author's promise, checked in debug as `cohort` is:
the first time a projected view is handed to a second session, that session
projects its own and the two must be equal. On a difference the memo stops
sharing (``shares`` turns False, ``mismatch`` says where) and every later
call projects per session; the runtime logs it and projects that
projector's views per session from then on.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

from ..failures import ConfigError
from .deltas import KeyText
from .projector import Projector

__all__ = ["HeldViews", "Interned", "InvalidViewKey", "SharedViews", "view_key_of"]

_MISSING: Any = object()


class InvalidViewKey(ConfigError):
    """A projector's ``view_key`` returned a value that cannot key a memo
    (it is not hashable)."""


def view_key_of(projector: Projector[Any, Any, Any, Any], principal: Any) -> Hashable | None:
    """The principal's view key for ``projector`` (None when it declares
    none); raises `InvalidViewKey` when the declared key is not hashable."""
    if type(projector).view_key is Projector.view_key:
        return None
    key = projector.view_key(principal)
    if key is None:
        return None
    try:
        hash(key)
    except TypeError:
        raise InvalidViewKey(
            f"projector {projector.NAME!r}: view_key returned an unhashable "
            f"{type(key).__name__}; return a tuple of hashable parts"
        ) from None
    return key


class Interned:
    """One object per distinct value the sessions hold (their view keys):
    a session's equal key is handed out as the first one, so a thousand
    sessions of one cohort hold one tuple (and the frozensets in it), not
    a thousand. Counted: a value goes when its last session releases it."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[Hashable, list[Any]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def take(self, value: Hashable | None) -> Hashable | None:
        """The held object equal to ``value`` (counted once more)."""
        if value is None:
            return None
        entry = self._held.get(value)
        if entry is None:
            self._held[value] = [value, 1]
            return value
        entry[1] += 1
        held: Hashable = entry[0]
        return held

    def release(self, value: Hashable | None) -> None:
        """A session let go of ``value`` (an object `take` handed out)."""
        if value is None:
            return
        entry = self._held.get(value)
        if entry is None or entry[0] is not value:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del self._held[value]


class HeldViews:
    """The views sessions of one projector hold, by (view key, key text),
    across loads: a load whose projection equals (``==``) the held view
    hands out the held object, so sessions that attached in different
    snapshot batches hold one view, not a copy per batch.

    Weak: an entry lives as long as some session (or delta) holds its view.
    A projector whose views cannot be weakly referenced (a tuple, a str)
    is not held (``weak`` turns False at its first view)."""

    __slots__ = ("table", "weak")

    def __init__(self) -> None:
        self.table: weakref.WeakValueDictionary[tuple[Hashable, KeyText], Any] = (
            weakref.WeakValueDictionary())
        self.weak = True

    def __len__(self) -> int:
        return len(self.table)

    def adopt(self, slot: tuple[Hashable, KeyText], view: Any) -> Any:
        """The held view equal to ``view`` under ``slot``, or ``view``
        (then held in its place)."""
        if not self.weak:
            return view
        table = self.table
        held = table.get(slot)
        if held is not None and (held is view or held == view):
            return held
        try:
            table[slot] = view
        except TypeError:
            self.weak = False  # not weakly referenceable: never held
        return view


class SharedViews:
    """The views of one load's rows, by (view key, key text).

    ``project`` is the projector's ``project(row, principal)``. ``check``:
    verify each shared view once against the second session's own
    projection (debug). ``shares`` False projects every call (no declared
    key, or sharing was turned off). ``held``: the projector's `HeldViews`
    (a fresh projection equal to a held view is handed out as the held one).
    """

    __slots__ = ("_checked", "_held", "_project", "_views", "check", "mismatch", "projections",
                 "shares")

    def __init__(
        self, project: Callable[[Any, Any], Any], *, check: bool, shares: bool = True,
        held: HeldViews | None = None,
    ) -> None:
        self._project = project
        self._views: dict[tuple[Hashable, KeyText], Any] = {}
        self._checked: set[tuple[Hashable, KeyText]] = set()
        self._held = held
        self.check = check
        self.shares = shares
        self.mismatch: str | None = None
        self.projections = 0
        """``project`` calls made (the shared ones once)."""

    def view(self, view_key: Hashable | None, text: KeyText, row: Any, principal: Any) -> Any:
        """The view of ``row`` (keyed ``text``) for ``principal``, whose view
        key is ``view_key``: projected once per key while sharing holds."""
        if view_key is None or not self.shares:
            self.projections += 1
            return self._project(row, principal)
        slot = (view_key, text)
        views = self._views
        found = views.get(slot, _MISSING)
        if found is _MISSING:
            self.projections += 1
            found = self._project(row, principal)
            held = self._held
            if held is not None:
                found = held.adopt(slot, found)
            views[slot] = found
            return found
        if self.check and slot not in self._checked:
            self._checked.add(slot)
            self.projections += 1
            own = self._project(row, principal)
            if own != found:
                self.shares = False
                self.mismatch = (
                    f"view_key {view_key!r}: two principals of that key got different "
                    f"views of {text}: {found!r} and {own!r}"
                )
                return own
        return found

    def verify(
        self, view_key: Hashable | None, rendered: dict[KeyText, Any], rows: dict[KeyText, Any],
        principal: Any,
    ) -> bool:
        """Check (in debug, once per view) that ``principal`` projects the
        views ``rendered`` holds, as another session of ``view_key`` did;
        False once sharing is off (project this session's own views)."""
        if not self.check:
            return self.shares
        for text in rendered:
            self.view(view_key, text, rows[text], principal)
            if not self.shares:
                return False
        return True
