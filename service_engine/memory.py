"""Handing the heap back after sessions close (issue 11, item 5).

A burst of sessions grows the process's heap; when they close, their objects
are freed but the allocator keeps the pages. `ReleaseAfterClose` decides, from
the live session count the engine's beat observes, when enough sessions have
closed to be worth asking the C allocator to return its free pages
(`release_free_memory`: mimalloc's ``mi_collect(true)``, else glibc's
``malloc_trim(0)``, after a collection of what the sessions left in cycles).

What that returns depends on the allocator Python runs on. With its default
small-object allocator (pymalloc), memory comes back only in whole 1 MiB arenas,
and any block allocated during the burst that outlives it (the engine closes
the burst's pool connections and their statements first,
`Database.close_idle_connections`; long-lived state replaced while the
sessions were open remains) keeps its arena: little is returned. With
``PYTHONMALLOC=malloc`` every object lives in glibc's heap, where
``malloc_trim`` returns each free page (``bench/idle_return.py`` measures both;
``bench/README.md``, "Back to idle").

The allocator is chosen when the interpreter starts, so a service's entry
point asks for it first thing: `run_on_allocator` re-executes the process on
mimalloc (``SERVICE_ENGINE_ALLOCATOR``, default ``mimalloc``; ``pymalloc``
keeps Python's own), preloaded from the ``cmeel-mimalloc`` wheel with
``PYTHONMALLOC=malloc``. mimalloc hands a free 64 KiB page back to the OS
(purged after its delay, or at once by the release's ``mi_collect``), so a
block that outlives a burst pins a page, not a 1 MiB arena; and its small
allocations cost no more CPU than pymalloc's (``bench/README.md``, "Back to
idle on mimalloc").

The policy is pure; only `release_free_memory` and `run_on_allocator` touch
the C library and the process.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import importlib.metadata
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

from .failures import ConfigError

__all__ = [
    "ALLOCATOR_ENV",
    "RELEASE_FOLLOW_UP",
    "RELEASE_MIN_CLOSED",
    "Allocator",
    "ReleaseAfterClose",
    "active_allocator",
    "allocator_environment",
    "mimalloc_library",
    "on_pymalloc",
    "release_free_memory",
    "requested_allocator",
    "run_on_allocator",
]

Allocator = Literal["mimalloc", "pymalloc"]
ALLOCATOR_ENV = "SERVICE_ENGINE_ALLOCATOR"
"""Which allocator `run_on_allocator` runs the process on: ``mimalloc``
(the default) or ``pymalloc`` (Python's own, as without the call)."""
_ON_MIMALLOC = "SERVICE_ENGINE_ON_MIMALLOC"
"""Set by `run_on_allocator` for the process it executes: that process pops
it with the preload, so the programs it starts run on their own allocator."""
_MIMALLOC_DEFAULTS = {
    # A purge hands pages back (MADV_DONTNEED: RSS falls), not MADV_FREE,
    # which the kernel reclaims only under memory pressure.
    "MIMALLOC_PURGE_DECOMMITS": "1",
    # Pages purged one by one, not in the 2 MiB granules of huge pages.
    "MIMALLOC_ALLOW_THP": "0",
}

RELEASE_MIN_CLOSED = 500
"""Sessions that must have closed since the peak before a release is asked."""
RELEASE_FOLLOW_UP = 5
"""Beats after a release at which the engine releases once more: a closed
connection's last callbacks (its transport's, its timers') free what they
hold over the loop turns after the release."""


@dataclass(slots=True)
class ReleaseAfterClose:
    """When to release free memory: once the live sessions have fallen from
    their peak since the last release by at least ``min_closed`` and to at
    most half of it, and the fall has settled (the count did not move since
    the last observation); and again ``follow_up`` observations after such a
    release (0: never), for what the closed connections freed in their last
    callbacks after it. Feed it the live count (`observe`) on every beat,
    with the highest count since the last beat: a burst that opened and
    closed between two beats counts too."""

    min_closed: int = RELEASE_MIN_CLOSED
    peak: int = 0
    """The highest live count seen since the last release."""
    last: int = 0
    """The count at the last observation."""
    follow_up: int = 0
    """Observations after a release at which one more is due (0: none)."""
    due_in: int = 0
    """Observations left until the follow-up release (0: none pending): right
    after `observe` answered True, non-zero for a fall, zero for a follow-up."""

    def observe(self, live: int, highest: int = 0) -> bool:
        """Record ``live`` (and ``highest``, the most sessions live at once
        since the last observation, when known); True when a release is due
        now (after a release for a fall, the peak restarts from ``live``)."""
        settled, self.last = live == self.last and highest <= live, live
        if highest > self.peak:
            self.peak = highest
        follow_up = False
        if self.due_in:
            self.due_in -= 1
            follow_up = self.due_in == 0
        if live >= self.peak:
            self.peak = live
            return follow_up
        if settled and self.peak - live >= self.min_closed and live * 2 <= self.peak:
            self.peak = live
            self.due_in = self.follow_up
            return True
        return follow_up


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:  # the process's own symbols: the C library it runs on
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to ask
        return None
    return trim


@functools.cache
def _mimalloc_collect() -> Callable[[bool], None] | None:
    """mimalloc's ``mi_collect`` when the process runs on it (preloaded)."""
    try:
        collect = ctypes.CDLL(None).mi_collect
    except (OSError, AttributeError):
        return None
    collect.argtypes = [ctypes.c_bool]
    collect.restype = None
    return collect


_STARTED_WITH = {"PYTHONMALLOC": os.environ.get("PYTHONMALLOC", "")}
"""``PYTHONMALLOC`` as the interpreter read it (`run_on_allocator` takes it
out of the environment of an executed process, which still runs on it)."""


def on_pymalloc(environ: Mapping[str, str] | None = None) -> bool:
    """Whether Python's objects live in pymalloc's arenas (the default), not
    in the C allocator's heap (``PYTHONMALLOC=malloc``, mimalloc's included);
    ``environ`` (default: what this interpreter started with) says which."""
    if environ is None and _mimalloc_collect() is not None:
        return False
    env = _STARTED_WITH if environ is None else environ
    return env.get("PYTHONMALLOC", "").strip() not in {"malloc", "malloc_debug"}


def active_allocator() -> Allocator | Literal["malloc"]:
    """The allocator Python's objects live on in this process."""
    if _mimalloc_collect() is not None:
        return "mimalloc"
    return "pymalloc" if on_pymalloc() else "malloc"


def mimalloc_library() -> Path | None:
    """The shared library of the ``cmeel-mimalloc`` wheel, if installed."""
    try:
        files = importlib.metadata.files("cmeel-mimalloc") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    libraries = sorted((f for f in files if f.name.startswith("libmimalloc.so")),
                       key=lambda f: len(f.name))
    for file in libraries:
        path = Path(str(file.locate()))
        if path.is_file():
            return path
    return None


def requested_allocator(environ: Mapping[str, str]) -> Allocator:
    """The allocator ``SERVICE_ENGINE_ALLOCATOR`` names (``mimalloc`` when
    unset); `ConfigError` for any other value."""
    raw = environ.get(ALLOCATOR_ENV, "mimalloc").strip().lower() or "mimalloc"
    if raw not in ("mimalloc", "pymalloc"):
        raise ConfigError(f"{ALLOCATOR_ENV}={raw!r}: expected mimalloc or pymalloc")
    return raw  # type: ignore[return-value]


def allocator_environment(environ: Mapping[str, str], library: Path) -> dict[str, str]:
    """The environment that runs a Python process on mimalloc from
    ``library``: preloaded, with Python's objects on the C allocator."""
    env = dict(environ)
    preload = env.get("LD_PRELOAD", "").split()
    env["LD_PRELOAD"] = " ".join([str(library), *(p for p in preload if p != str(library))])
    env["PYTHONMALLOC"] = "malloc"
    for name, value in _MIMALLOC_DEFAULTS.items():
        env.setdefault(name, value)
    env[_ON_MIMALLOC] = str(library)
    return env


def run_on_allocator(environ: MutableMapping[str, str] | None = None,
                     execv: Callable[[str, list[str], dict[str, str]], NoReturn] = os.execve,
                     ) -> Allocator | Literal["malloc"]:
    """Call first in a service's entry point, before it starts anything
    (the executed process imports the package again: ~1 s of start-up):
    runs this process on the allocator
    ``SERVICE_ENGINE_ALLOCATOR`` asks for (``mimalloc`` by default) and
    returns it. For mimalloc the process is executed again (same pid, same
    arguments) with the ``cmeel-mimalloc`` wheel's library preloaded; the
    executed process takes the preload back out of its environment, so what
    it starts (an embedded Postgres, NATS) runs on its own allocator. Where
    the library or the platform's loader is missing, it stays on Python's
    own and says so in the answer. A value other than ``mimalloc`` or
    ``pymalloc`` raises `ConfigError`."""
    env = os.environ if environ is None else environ
    wanted = requested_allocator(env)
    if env.get(_ON_MIMALLOC):
        preloaded = env.pop(_ON_MIMALLOC)
        kept = [p for p in env.get("LD_PRELOAD", "").split() if p != preloaded]
        if kept:
            env["LD_PRELOAD"] = " ".join(kept)
        else:
            env.pop("LD_PRELOAD", None)
        env.pop("PYTHONMALLOC", None)
        return active_allocator()
    on_linux = sys.platform.startswith("linux")
    if wanted == "pymalloc" or _mimalloc_collect() is not None or not on_linux:
        return active_allocator()
    library = mimalloc_library()
    if library is None:
        return active_allocator()
    sys.stdout.flush()
    sys.stderr.flush()
    execv(sys.executable, [sys.executable, *sys.orig_argv[1:]], allocator_environment(env, library))


def release_free_memory() -> bool:
    """Ask the C allocator to return its free pages to the OS (mimalloc's
    ``mi_collect(true)`` when the process runs on it, else glibc's
    ``malloc_trim(0)``); False where it cannot be asked. Cyclic garbage is collected first: what
    closed sessions left in reference cycles is freed only by a full
    collection, and a tuned pod collects rarely. After 10,000 sessions
    closed it gave back 38 MB on pymalloc too (254.5 MB settled without,
    213.1 with, once the burst's pool connections were closed) for a stall
    of 0.3-2.0 s at load 9: the same work a later automatic full collection
    would do, at a moment chosen here (the sessions fell by half)."""
    gc.collect()
    collect = _mimalloc_collect()
    if collect is not None:  # every free page purged now, not after its delay
        collect(True)
        return True
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
