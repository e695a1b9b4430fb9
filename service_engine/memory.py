"""Handing the heap back after sessions close (issue 11, item 5).

A burst of sessions grows the process's heap; when they close, their objects
are freed but the allocator keeps the pages. `ReleaseAfterClose` decides, from
the live session count the engine's beat observes, when enough sessions have
closed to be worth asking the C allocator to return its free pages
(`release_free_memory`: glibc's ``malloc_trim(0)``, after a collection of
what the sessions left in cycles).

What that returns depends on the allocator Python runs on. With its default
small-object allocator (pymalloc), memory comes back only in whole 1 MiB arenas,
and any block allocated during the burst that outlives it (the engine closes
the burst's pool connections and their statements first,
`Database.close_idle_connections`; long-lived state replaced while the
sessions were open remains) keeps its arena: little is returned. With
``PYTHONMALLOC=malloc`` every object lives in glibc's heap, where
``malloc_trim`` returns each free page (``bench/idle_return.py`` measures both;
``bench/README.md``, "Back to idle").

The policy is pure; only `release_free_memory` touches the C library.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["RELEASE_MIN_CLOSED", "ReleaseAfterClose", "on_pymalloc", "release_free_memory"]

RELEASE_MIN_CLOSED = 500
"""Sessions that must have closed since the peak before a release is asked."""


@dataclass(slots=True)
class ReleaseAfterClose:
    """When to release free memory: once the live sessions have fallen from
    their peak since the last release by at least ``min_closed`` and to at
    most half of it, and the fall has settled (the count did not move since
    the last observation). Feed it the live count (`observe`) on every beat."""

    min_closed: int = RELEASE_MIN_CLOSED
    peak: int = 0
    """The highest live count seen since the last release."""
    last: int = 0
    """The count at the last observation."""

    def observe(self, live: int) -> bool:
        """Record ``live``; True when a release is due now (the peak then
        restarts from ``live``)."""
        settled, self.last = live == self.last, live
        if live >= self.peak:
            self.peak = live
            return False
        if settled and self.peak - live >= self.min_closed and live * 2 <= self.peak:
            self.peak = live
            return True
        return False


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:  # the process's own symbols: the C library it runs on
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to ask
        return None
    return trim


def on_pymalloc(environ: Mapping[str, str] | None = None) -> bool:
    """Whether Python's objects live in pymalloc's arenas (the default), not
    in the C allocator's heap (``PYTHONMALLOC=malloc``)."""
    env = os.environ if environ is None else environ
    return env.get("PYTHONMALLOC", "").strip() not in {"malloc", "malloc_debug"}


def release_free_memory() -> bool:
    """Ask the C allocator to return its free pages to the OS; False where
    it cannot be asked (no glibc). Cyclic garbage is collected first: what
    closed sessions left in reference cycles is freed only by a full
    collection, and a tuned pod collects rarely. After 10,000 sessions
    closed it gave back 38 MB on pymalloc too (254.5 MB settled without,
    213.1 with, once the burst's pool connections were closed) for a stall
    of 0.3-2.0 s at load 9: the same work a later automatic full collection
    would do, at a moment chosen here (the sessions fell by half)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
