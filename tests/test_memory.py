"""When a pod hands free memory back: `ReleaseAfterClose` over live session counts."""

from __future__ import annotations

from service_engine.memory import (
    RELEASE_MIN_CLOSED,
    ReleaseAfterClose,
    on_pymalloc,
    release_free_memory,
)


def releases(counts: list[int], min_closed: int = 100) -> list[int]:
    policy = ReleaseAfterClose(min_closed)
    return [live for live in counts if policy.observe(live)]


def test_a_mass_close_releases_once_it_settled() -> None:
    """10,000 sessions closing over a few beats release once, on the first
    beat the count did not move, and not again while it stays down."""
    assert releases([0, 5_000, 10_000, 9_000, 6_000, 4_000, 1_000, 0, 0, 0, 0]) == [0]
    assert releases([10_000, 4_000, 4_000, 4_000]) == [4_000]


def test_a_release_restarts_the_peak_from_what_is_left() -> None:
    """After a release the count may fall further: the next release needs
    another settled fall by half from there (and at least ``min_closed``)."""
    assert releases([10_000, 4_000, 4_000, 1_900, 1_900]) == [4_000, 1_900]
    assert releases([10_000, 4_000, 4_000, 3_000, 3_000]) == [4_000]  # over half of 4,000


def test_small_churn_never_releases() -> None:
    """Fewer than ``min_closed`` sessions closing never release, even when all close."""
    assert releases([0, 99, 0, 0, 99, 0, 0], min_closed=100) == []
    assert releases([0, 150, 40, 40], min_closed=100) == [40]


def test_a_partial_close_above_half_does_not_release() -> None:
    """A fall by more than ``min_closed`` that leaves over half the peak waits."""
    assert releases([10_000, 5_001, 5_001, 6_000, 3_000, 3_000]) == [3_000]


def test_the_default_bound() -> None:
    """The default asks for at least `RELEASE_MIN_CLOSED` closed sessions."""
    assert releases([RELEASE_MIN_CLOSED - 1, 0, 0], RELEASE_MIN_CLOSED) == []
    assert ReleaseAfterClose().min_closed == RELEASE_MIN_CLOSED
    policy = ReleaseAfterClose()
    assert [policy.observe(n) for n in (RELEASE_MIN_CLOSED, 0, 0)] == [False, False, True]


def test_release_free_memory_answers_without_raising() -> None:
    """On glibc it asks ``malloc_trim``; elsewhere it answers False, never raises."""
    assert release_free_memory() in (True, False)


def test_which_allocator_the_objects_live_in() -> None:
    """pymalloc unless ``PYTHONMALLOC`` names the C allocator."""
    assert on_pymalloc({})
    assert on_pymalloc({"PYTHONMALLOC": "pymalloc"})
    assert on_pymalloc({"PYTHONMALLOC": "pymalloc_debug"})
    assert not on_pymalloc({"PYTHONMALLOC": "malloc"})
    assert not on_pymalloc({"PYTHONMALLOC": "malloc_debug"})
