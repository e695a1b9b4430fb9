"""The release after a mass close frees what closed sessions left in reference cycles,
on either allocator (issue 11, item 5)."""

from __future__ import annotations

import gc
import weakref

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
