"""When a pod hands free memory back: `ReleaseAfterClose` over live session counts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import pytest

from service_engine.config import check_environment
from service_engine.errors import ConfigError
from service_engine.memory import (
    ALLOCATOR_ENV,
    RELEASE_MIN_CLOSED,
    ReleaseAfterClose,
    allocator_environment,
    mimalloc_library,
    on_pymalloc,
    release_free_memory,
    requested_allocator,
    run_on_allocator,
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


def test_a_burst_between_two_beats_releases_once_it_settled() -> None:
    """Sessions that opened and closed between two beats (the highest count
    since the last beat, ``highest``, not a count the beat saw) release once
    the count then stays put for a beat; a count back where it was with a
    burst in between has not settled."""
    policy = ReleaseAfterClose(100)
    seen = [policy.observe(live, highest)
            for live, highest in ((0, 0), (0, 1_000), (0, 0), (0, 0))]
    assert seen == [False, False, True, False]
    policy = ReleaseAfterClose(100)
    seen = [policy.observe(live, highest)
            for live, highest in ((0, 0), (0, 90), (0, 1_000), (400, 400), (400, 400), (400, 400))]
    assert seen == [False, False, False, False, True, False]


def test_a_partial_close_above_half_does_not_release() -> None:
    """A fall by more than ``min_closed`` that leaves over half the peak waits."""
    assert releases([10_000, 5_001, 5_001, 6_000, 3_000, 3_000]) == [3_000]


def test_the_default_bound() -> None:
    """The default asks for at least `RELEASE_MIN_CLOSED` closed sessions."""
    assert releases([RELEASE_MIN_CLOSED - 1, 0, 0], RELEASE_MIN_CLOSED) == []
    assert ReleaseAfterClose().min_closed == RELEASE_MIN_CLOSED
    policy = ReleaseAfterClose()
    assert [policy.observe(n) for n in (RELEASE_MIN_CLOSED, 0, 0)] == [False, False, True]


def test_a_release_is_followed_by_one_more() -> None:
    """With ``follow_up`` N, the N-th observation after a release for a fall
    releases once more (what closed connections freed after it), however the
    count moved, and only once."""
    policy = ReleaseAfterClose(100, follow_up=2)
    due = [(policy.observe(live), policy.due_in)
           for live in (10_000, 4_000, 4_000, 4_000, 4_000, 4_000, 4_000)]
    # due_in tells the two apart: non-zero right after a fall's release, zero after its follow-up.
    assert due == [(False, 0), (False, 0), (True, 2), (False, 1), (True, 0), (False, 0), (False, 0)]
    policy = ReleaseAfterClose(100, follow_up=2)
    moved = [policy.observe(live) for live in (10_000, 4_000, 4_000, 9_000, 12_000, 12_000)]
    assert moved == [False, False, True, False, True, False]


def test_release_free_memory_answers_without_raising() -> None:
    """On glibc it asks ``malloc_trim``; elsewhere it answers False, never raises."""
    assert release_free_memory() in (True, False)


class Executed(Exception):
    """What `run_on_allocator` would have executed."""

    def __init__(self, path: str, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(path)
        self.path, self.argv, self.env = path, argv, env


def capture(path: str, argv: list[str], env: dict[str, str]) -> NoReturn:
    raise Executed(path, argv, env)


def test_mimalloc_is_asked_for_unless_pymalloc_is_named() -> None:
    """Unset or empty means mimalloc; pymalloc keeps Python's own; any other
    value is a `ConfigError` naming the variable, and check-config reports it."""
    assert requested_allocator({}) == "mimalloc"
    assert requested_allocator({ALLOCATOR_ENV: ""}) == "mimalloc"
    assert requested_allocator({ALLOCATOR_ENV: "PyMalloc"}) == "pymalloc"
    with pytest.raises(ConfigError, match=ALLOCATOR_ENV):
        requested_allocator({ALLOCATOR_ENV: "jemalloc"})
    assert any(ALLOCATOR_ENV in p for p in check_environment({ALLOCATOR_ENV: "tcmalloc"}).problems)
    assert check_environment({ALLOCATOR_ENV: "pymalloc"}).ok


def test_the_environment_preloads_mimalloc_before_any_other_preload() -> None:
    """The library leads ``LD_PRELOAD`` (once), Python's objects go to the C
    allocator, a purge decommits, and an operator's own mimalloc settings win."""
    lib = Path("/opt/lib/libmimalloc.so")
    env = allocator_environment({"LD_PRELOAD": f"/x/other.so {lib}", "MIMALLOC_ALLOW_THP": "1"}, lib)
    assert env["LD_PRELOAD"] == f"{lib} /x/other.so"
    assert env["PYTHONMALLOC"] == "malloc"
    assert env["MIMALLOC_PURGE_DECOMMITS"] == "1"
    assert env["MIMALLOC_ALLOW_THP"] == "1"


def test_the_process_is_executed_again_on_mimalloc_with_its_own_arguments() -> None:
    """Asked for mimalloc on a process that is not on it, `run_on_allocator`
    executes the same interpreter with the same arguments, mimalloc preloaded
    (on Linux, where the preload exists; elsewhere it runs on, executing nothing)."""
    if not sys.platform.startswith("linux"):
        assert run_on_allocator({}, execv=capture) in ("pymalloc", "malloc")
        return
    library = mimalloc_library()
    assert library is not None, "cmeel-mimalloc is a dependency on Linux"
    with pytest.raises(Executed) as executed:
        run_on_allocator({}, execv=capture)
    assert executed.value.path == sys.executable
    assert executed.value.argv == [sys.executable, *sys.orig_argv[1:]]
    assert executed.value.env["LD_PRELOAD"].split()[0] == str(library)
    assert executed.value.env["PYTHONMALLOC"] == "malloc"


def test_pymalloc_named_runs_on_without_executing() -> None:
    """``SERVICE_ENGINE_ALLOCATOR=pymalloc``: nothing is executed."""
    assert run_on_allocator({ALLOCATOR_ENV: "pymalloc"}, execv=capture) in ("pymalloc", "malloc")


def test_the_executed_process_takes_the_preload_back_out() -> None:
    """In the executed process the preload and ``PYTHONMALLOC`` leave the
    environment (what it starts, an embedded Postgres, runs on its own
    allocator), the operator's other preloads stay, and nothing is executed again."""
    lib = "/opt/lib/libmimalloc.so"
    env = allocator_environment({"LD_PRELOAD": "/x/other.so"}, Path(lib))
    run_on_allocator(env, execv=capture)
    assert env["LD_PRELOAD"] == "/x/other.so"
    assert "PYTHONMALLOC" not in env
    assert not any(value == lib for value in env.values())


def test_which_allocator_the_objects_live_in() -> None:
    """pymalloc unless ``PYTHONMALLOC`` names the C allocator."""
    assert on_pymalloc({})
    assert on_pymalloc({"PYTHONMALLOC": "pymalloc"})
    assert on_pymalloc({"PYTHONMALLOC": "pymalloc_debug"})
    assert not on_pymalloc({"PYTHONMALLOC": "malloc"})
    assert not on_pymalloc({"PYTHONMALLOC": "malloc_debug"})
