"""The nouns an engine's projectors watch, and the nouns each store's writes impact.

The engine keeps one `WatchedNouns` and fills it as projectors register:
each projector watches its ``NOUN`` (and its ``JOINS`` nouns), and binds its
``NOUN`` to its ``STORE``. A create, save or delete through a bound store
then stages the impact of each noun bound to it, without the handler naming
the noun; an impact staged by hand on a noun no registered projector watches
is refused (`UnwatchedNoun`), where the handler staged it, rather than
committed to re-render nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from .model import InvalidImpact

__all__ = ["UnwatchedNoun", "WatchedNouns"]


class UnwatchedNoun(InvalidImpact):
    """An impact names a noun no registered projector watches (a misspelt
    noun, or a projector nobody registered): it would re-render nothing.
    Raised where the handler stages it (``cx.impact``, ``cx.impact_caused``,
    ``cx.impact_at``, ``cx.impact_all``, or a ``cause=`` on a write through
    a store no registered projector reads), so nothing commits. A write
    through a store stages its own noun's impact and needs no ``cx.impact``.
    ``noun`` is the noun (the store's type, for a cause); ``watched`` the
    registered nouns."""

    def __init__(self, noun: str, watched: Iterable[str], *, store: bool = False) -> None:
        self.noun = noun
        self.watched = tuple(sorted(watched))
        known = ", ".join(map(repr, self.watched)) or "none"
        what = (
            f"a cause on a write through store {noun!r}, which no registered projector "
            "reads (so no impact carries it)" if store
            else f"impact on noun {noun!r}, which no registered projector watches"
        )
        super().__init__(f"{what} (watched nouns: {known})")


class WatchedNouns(set[str]):
    """The watched nouns (a set, as the principal-facts check reads it), and
    for each store the nouns of the projectors that read through it."""

    def __init__(self) -> None:
        super().__init__()
        self._by_store: dict[int, tuple[object, tuple[str, ...]]] = {}

    def watch(self, nouns: Iterable[str], *, store: object, noun: str) -> None:
        """A projector registered: it watches ``nouns`` and reads the keys of
        ``noun`` through ``store``."""
        self.update(nouns)
        _, bound = self._by_store.get(id(store), (store, ()))
        if noun not in bound:
            # The store is held with its id, so the id is never reused.
            self._by_store[id(store)] = (store, (*bound, noun))

    def of_store(self, store: object) -> tuple[str, ...]:
        """The nouns a write through ``store`` impacts (empty: none watched)."""
        held = self._by_store.get(id(store))
        return () if held is None else held[1]

    def tables(self) -> list[str]:
        """The tables of every store a registered projector reads through
        (a store's ``tables``, as `CrudStore` declares them)."""
        return [
            table for store, _ in self._by_store.values()
            for table in getattr(store, "tables", ())
        ]

    def check(self, noun: str) -> None:
        """Raise `UnwatchedNoun` unless a registered projector watches ``noun``."""
        if noun not in self:
            raise UnwatchedNoun(noun, self)
