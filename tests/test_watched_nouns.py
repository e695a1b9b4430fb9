"""`WatchedNouns`: which nouns the registered projectors watch, which nouns a
write through each store impacts, and which tables those stores use."""

from __future__ import annotations

import pytest

from service_engine.errors import InvalidImpact, UnwatchedNoun
from service_engine.impacts.watched import WatchedNouns


class _Store:
    def __init__(self, *tables: str) -> None:
        self.tables = tables


def test_a_projector_binds_its_noun_to_its_store() -> None:
    """Each store impacts the nouns of the projectors reading through it
    (once each); an unbound store impacts none; the set holds every watched
    noun, joins included."""
    watched = WatchedNouns()
    notes, boards, other = _Store("note"), _Store("board", "board_fact"), _Store("x")
    watched.watch(["note"], store=notes, noun="note")
    watched.watch(["note"], store=notes, noun="note")
    watched.watch(["board", "member"], store=boards, noun="board")
    watched.watch(["org_board"], store=boards, noun="org_board")
    assert watched.of_store(notes) == ("note",)
    assert watched.of_store(boards) == ("board", "org_board")
    assert watched.of_store(other) == ()
    assert set(watched) == {"note", "board", "member", "org_board"}
    assert watched.tables() == ["note", "board", "board_fact"]


def test_an_unwatched_noun_is_refused_naming_the_watched_ones() -> None:
    """`check` refuses a noun no projector watches with `UnwatchedNoun` (an
    `InvalidImpact`), naming it and the watched nouns."""
    watched = WatchedNouns()
    watched.watch(["note"], store=_Store("note"), noun="note")
    watched.check("note")
    with pytest.raises(UnwatchedNoun) as refused:
        watched.check("notes")
    assert isinstance(refused.value, InvalidImpact)
    assert refused.value.watched == ("note",)
    assert str(refused.value) == (
        "impact on noun 'notes', which no registered projector watches (watched nouns: 'note')"
    )
