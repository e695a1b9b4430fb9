"""A one-shot pause of the offer drain (tests only).

`OneShotDrainPause` is a `DrainHook`: give it to
``Engine.set_offer_drain_hook`` (or ``OfferDrain(hook=...)``). The first
time the drain reaches ``point`` (default ``"revision_read"``: the batch's
bucket revisions are read and its row images not yet resolved) it sets
`reached` and waits until `release`; every later pass runs straight through.
A test freezes the leader exactly there, expires its lease or lets a write
land, then releases it (s188).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

__all__ = ["OneShotDrainPause"]


class OneShotDrainPause:
    def __init__(self, point: str = "revision_read", offer: str | None = None) -> None:
        self.point = point
        self.offer = offer
        self.reached = asyncio.Event()
        self.keys: list[str] = []
        self._released = asyncio.Event()
        self._fired = False

    def release(self) -> None:
        self._released.set()

    async def __call__(self, point: str, offer: str, keys: Sequence[str]) -> None:
        if self._fired or point != self.point or (self.offer not in (None, offer)):
            return
        self._fired = True
        self.keys = list(keys)
        self.reached.set()
        await self._released.wait()
