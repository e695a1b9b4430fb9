"""The delta wire: Reset / Upsert / Remove on a contiguous per-session revision.

A subscriber holds a *window*: an ordered map from key to rendered view. The
engine keeps, per session, the window it last sent (``last_sent``) and
tells the subscriber how to move from one window to the next:

* `Reset` replaces the whole window (the snapshot at attach, a repair, a
  reconnect, or a change too large to diff);
* `Upsert` sets one key's view;
* `Remove` drops one key.

Every delta carries the session's next `Revision`: the first delta of a
session is revision 1 and each later one is exactly one more, so a
subscriber that sees a gap knows it missed something.

Keys are carried as their *canonical JSON text* (`KeyText`, the same text
`Impact.key_json` holds): it is the key's identity, it needs no encoding on
the wire, and `decode_key` turns it back into the value. Views compare by
value (``==``), so an unchanged view is never re-sent.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from ..failures import EngineError
from ..impacts.model import Cause, JsonValue

V = TypeVar("V")

KeyText: TypeAlias = str
"""A key's canonical JSON text (`service_engine.impacts.canonical_json`)."""

Revision: TypeAlias = int
"""A session's delta counter: 0 before the first delta, then 1, 2, 3, ..."""

# Distinguishes "no entry" from a view that happens to be None.
_MISSING: Any = object()


def decode_key(key: KeyText) -> JsonValue:
    """Return the key value whose canonical text is ``key`` (arrays as lists)."""
    value: JsonValue = json.loads(key)
    return value


@dataclass(frozen=True, slots=True)
class Reset(Generic[V]):
    """Replace the whole window with ``views`` (key text -> view, in window order).

    ``views`` is a fresh mapping owned by this delta; treat it as read-only.
    """

    revision: Revision
    views: Mapping[KeyText, V]
    cause: Cause | None = None


@dataclass(frozen=True, slots=True)
class Upsert(Generic[V]):
    """Set the view of ``key`` (insert it if the window lacks it)."""

    revision: Revision
    key: KeyText
    view: V
    cause: Cause | None = None


@dataclass(frozen=True, slots=True)
class Remove:
    """Drop ``key`` from the window: its row was deleted or is no longer
    visible to the session's principal (never because of a page bound)."""

    revision: Revision
    key: KeyText
    cause: Cause | None = None


_new = object.__new__
_SET_UPSERT: tuple[Any, ...] = tuple(
    getattr(Upsert, name).__set__ for name in ("revision", "key", "view", "cause")
)


def new_upsert(revision: Revision, key: KeyText, view: V, cause: Cause | None = None
               ) -> Upsert[V]:
    """``Upsert(revision, key, view, cause)``, built through its slots: a
    frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, and a render pass builds one per session per
    changed key. The same object in every way (equality, hash, repr)."""
    set_revision, set_key, set_view, set_cause = _SET_UPSERT
    delta: Upsert[V] = _new(Upsert)
    set_revision(delta, revision)
    set_key(delta, key)
    set_view(delta, view)
    set_cause(delta, cause)
    return delta


Delta: TypeAlias = Reset[V] | Upsert[V] | Remove
"""One message on a session's wire."""

Change: TypeAlias = Upsert[V] | Remove
"""A delta that moves one key."""


def renumbered(delta: Delta[V], revision: Revision) -> Delta[V]:
    """``delta`` carrying ``revision`` instead of its own (a stream numbers
    what its subscriber takes, so collapsed deltas leave no gap)."""
    if type(delta) is Upsert:
        return Upsert(revision, delta.key, delta.view, delta.cause)
    if type(delta) is Remove:
        return Remove(revision, delta.key, delta.cause)
    assert isinstance(delta, Reset)
    return Reset(revision, delta.views, delta.cause)


def diff_window(
    last_sent: Mapping[KeyText, V],
    rendered: Mapping[KeyText, V],
    *,
    revision: Revision,
    scope: Iterable[KeyText] | None = None,
) -> list[Change[V]]:
    """Return the fewest Upserts and Removes that turn ``last_sent`` into
    ``rendered``, numbered ``revision + 1, revision + 2, ...``.

    With ``scope=None`` ``rendered`` is the whole new window: keys of
    ``last_sent`` missing from it are Removed (first, in ``last_sent``
    order), then keys whose view is new or differs are Upserted (in
    ``rendered`` order).

    With a ``scope`` (the keys a render pass looked at, each once) only
    those keys are compared: a scoped key in ``rendered`` is Upserted if its
    view changed, a scoped key absent from ``rendered`` but present in
    ``last_sent`` is Removed, and every key outside the scope is left alone.
    Deltas follow ``scope`` order. This is the pass's hot path: its cost is
    linear in the scope, not in the window.

    Neither mapping is modified; apply the result with `apply_change` (or
    let `Session.render` do both).
    """
    out: list[Change[V]] = []
    rev = revision
    get = last_sent.get
    if scope is None:
        for key in last_sent:
            if key not in rendered:
                rev += 1
                out.append(Remove(rev, key))
        for key, view in rendered.items():
            old = get(key, _MISSING)
            # `is` first: an unchanged view object skips a deep __eq__.
            if old is view or (old is not _MISSING and old == view):
                continue
            rev += 1
            out.append(Upsert(rev, key, view))
        return out
    for key in scope:
        view = rendered.get(key, _MISSING)
        if view is _MISSING:
            if key in last_sent:
                rev += 1
                out.append(Remove(rev, key))
            continue
        old = get(key, _MISSING)
        if old is view or (old is not _MISSING and old == view):
            continue
        rev += 1
        out.append(Upsert(rev, key, view))
    return out


def apply_change(window: dict[KeyText, V], change: Change[V]) -> None:
    """Apply one Upsert or Remove to ``window`` in place (no revision check).

    An Upsert of a new key appends it at the end of the window's order.
    """
    if type(change) is Remove:
        window.pop(change.key, None)
    else:
        window[change.key] = change.view  # type: ignore[union-attr]


class RevisionGap(EngineError):
    """A delta did not carry the next revision, or removed a key the
    window does not hold: the replica has lost continuity."""


class WindowReplica(Generic[V]):
    """A subscriber-side window rebuilt from deltas, checking contiguity.

    Feed it every delta of one session in order with `apply`; it raises
    `RevisionGap` on a revision that is not exactly one more than the last,
    on a first delta that is not a Reset, or on a Remove of an absent key.
    The battery and the property tests compare `views` with the state the
    engine should have rendered.
    """

    __slots__ = ("revision", "views")

    def __init__(self) -> None:
        self.revision: Revision = 0
        self.views: dict[KeyText, V] = {}

    def apply(self, delta: Delta[V]) -> None:
        expected = self.revision + 1
        if delta.revision != expected:
            raise RevisionGap(f"expected revision {expected}, got {delta.revision}")
        if isinstance(delta, Reset):
            self.views = dict(delta.views)
        elif self.revision == 0:
            raise RevisionGap("the first delta of a session must be a Reset")
        elif isinstance(delta, Remove):
            if delta.key not in self.views:
                raise RevisionGap(f"Remove of {delta.key} which the window does not hold")
            del self.views[delta.key]
        else:
            self.views[delta.key] = delta.view
        self.revision = expected

    def apply_all(self, deltas: Iterable[Delta[V]]) -> None:
        for delta in deltas:
            self.apply(delta)

    def release(self, keys: Iterable[KeyText]) -> None:
        """Drop keys the engine released silently (a page past window_capacity)."""
        for key in keys:
            self.views.pop(key, None)
