"""The release after a mass close frees what closed sessions left in reference cycles,
on either allocator (issue 11, item 5)."""

from __future__ import annotations

import gc
import weakref

from service_engine.db.pool import IdleConnections
from service_engine.memory import release_free_memory


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_the_release_frees_cyclic_garbage_whatever_the_allocator() -> None:
    """Objects that only reference each other are gone after `release_free_memory`,
    with automatic collection off (a tuned pod collects rarely)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        a, b = _Node(), _Node()
        a.peer, b.peer = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None  # a cycle: reference counting alone keeps it
        release_free_memory()
        assert gone() is None
    finally:
        if enabled:
            gc.enable()


def test_idle_connections_keep_what_a_window_needed_at_its_peak() -> None:
    """Nothing is decided inside a window; at its end the count to keep is
    the window's peak in use, and the next window starts from the count then."""
    idle = IdleConnections(window=10.0)
    assert idle.observe(0.0, 1) is None
    assert idle.observe(3.0, 7) is None
    assert idle.observe(9.9, 2) is None
    assert idle.observe(10.0, 2) == 7
    assert idle.observe(15.0, 1) is None
    assert idle.observe(20.0, 0) == 2
