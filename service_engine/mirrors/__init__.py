"""Mirrors: other services' published languages mirrored into ``known_*``.

`declaration` holds `Mirror` (what is consumed, how it is keyed and
projected), `Merged` and `Shadow` (a pod's typed copy of one consumed
prefix); `projection` the write side a projector calls (`Known`,
`KnownScope`, `Projection`), which stages the impacts of what it changed.
Both sit below the write pipeline. `worker` is the supervised loop (boot
read, watch, leader-gated projection, reconcile); this package imports
none of it.
"""

from __future__ import annotations

from .declaration import Merged, Mirror, Shadow
from .projection import Known, KnownScope, Projection

__all__ = ["Known", "KnownScope", "Merged", "Mirror", "Projection", "Shadow"]
