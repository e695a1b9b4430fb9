"""The ops page's rates: counters sampled over the last minutes, turned
into per-second rates. Pure: the caller feeds samples with their time."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

__all__ = ["RateHistory"]


@dataclass
class RateHistory:
    """Samples of named counters, at most one per ``step`` seconds, kept for
    ``window`` seconds."""

    window: float = 600.0
    step: float = 5.0
    _samples: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def observe(self, now: float, counters: dict[str, float]) -> bool:
        """Record ``counters`` at ``now`` unless the last sample is newer than
        ``step``; True when recorded."""
        if self._samples and now - self._samples[-1][0] < self.step:
            return False
        self._samples.append((now, dict(counters)))
        while self._samples and now - self._samples[0][0] > self.window:
            self._samples.popleft()
        return True

    def rates(self) -> dict[str, list[tuple[float, float]]]:
        """Per counter, ``(time, per-second rate since the previous sample)``.

        A counter that went down (its process restarted) counts from zero.
        """
        out: dict[str, list[tuple[float, float]]] = {}
        for (t0, before), (t1, after) in itertools.pairwise(self._samples):
            elapsed = t1 - t0
            if elapsed <= 0:
                continue
            for name, value in after.items():
                previous = before.get(name, 0.0)
                grown = value - previous if value >= previous else value
                out.setdefault(name, []).append((t1, grown / elapsed))
        return out
