"""PassReport: what one render frame did, for metrics, logs and the battery.

The render loop keeps a `PassTally` while a frame runs and freezes it into
a `PassReport` when the frame ends. s164 reads ``loads`` directly: one load
per (projector, cohort) with dirty keys, however many sessions share it.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .deltas import Delta, Reset

__all__ = ["PassReport", "PassTally"]


@dataclass(frozen=True, slots=True)
class PassReport:
    """One render frame.

    ``impacts``: impacts drained; ``loads``: ``read_many`` calls; ``rows``:
    rows those loads returned; ``projections``: ``project`` calls;
    ``deltas``: deltas enqueued (a Reset counts as one); ``resets``: Resets
    among them; ``sessions``: sessions rendered; ``failures``: sessions
    whose render failed (and went to repair); ``duration``: seconds.

    Under overload: ``behind``: the pass folded PerImpact causes to the
    latest per key, ``coalesced`` of them; ``collapsed``: deltas a stream
    folded into an untaken one (its subscriber is behind); ``slices``: the
    bounded slices the pass ran in (it yielded the loop between them).
    """

    impacts: int = 0
    loads: int = 0
    rows: int = 0
    projections: int = 0
    deltas: int = 0
    resets: int = 0
    sessions: int = 0
    failures: int = 0
    duration: float = 0.0
    behind: bool = False
    coalesced: int = 0
    collapsed: int = 0
    slices: int = 1


class PassTally:
    """The mutable counters of a frame in progress."""

    __slots__ = (
        "behind",
        "coalesced",
        "collapsed",
        "deltas",
        "failures",
        "impacts",
        "loads",
        "projections",
        "resets",
        "rows",
        "sessions",
        "slices",
    )

    def __init__(self) -> None:
        self.impacts = 0
        self.loads = 0
        self.rows = 0
        self.projections = 0
        self.deltas = 0
        self.resets = 0
        self.sessions = 0
        self.failures = 0
        self.behind = False
        self.coalesced = 0
        self.collapsed = 0
        self.slices = 1

    def load(self, rows: int) -> None:
        """Count one ``read_many`` that returned ``rows`` rows."""
        self.loads += 1
        self.rows += rows

    def delivered(self, deltas: Iterable[Delta[Any]]) -> None:
        """Count one session's rendered deltas."""
        self.sessions += 1
        for delta in deltas:
            self.deltas += 1
            if isinstance(delta, Reset):
                self.resets += 1

    def freeze(self, duration: float) -> PassReport:
        return PassReport(
            impacts=self.impacts,
            loads=self.loads,
            rows=self.rows,
            projections=self.projections,
            deltas=self.deltas,
            resets=self.resets,
            sessions=self.sessions,
            failures=self.failures,
            duration=duration,
            behind=self.behind,
            coalesced=self.coalesced,
            collapsed=self.collapsed,
            slices=self.slices,
        )
