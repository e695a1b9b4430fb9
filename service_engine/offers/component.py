"""The offers component: the registered offers' drain and the hosted kv relays.

`Offers` is what `Engine` composes for publishing: with a NATS connection
every registered offer joins one leader drain (bound when `Engine.run`
starts, a supervised worker from then on) and every kv relay is bound at
`run` and drained on the beat; without NATS an offer is validated and
logged as unpublished, so a slice registers it the same way everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ..beat.component import BeatStep
from ..db.pool import Database
from ..failures import ConfigError, DuplicateRegistration, EngineError
from ..messaging.nats import Nats
from ..metrics import Metrics
from ..readiness import ReadinessHandle
from ..supervisor import Worker
from .drain import DrainHook, OfferDrain, OfferDrainBounds
from .model import Offer, register_offer_type
from .relay import HostedKvRelay, KvSource

__all__ = ["Offers"]

_log = logging.getLogger(__name__)


class Offers:
    """The offers and kv relays of one pod."""

    def __init__(
        self,
        db: Database,
        nats: Nats | None,
        readiness: ReadinessHandle,
        metrics: Metrics,
        *,
        holder: str,
        lease: timedelta,
        bounds: OfferDrainBounds,
    ) -> None:
        self._db = db
        self._nats = nats
        self._readiness = readiness
        self._metrics = metrics
        self._holder = holder
        self._lease = lease
        self._bounds = bounds
        self._started = False
        self.drain: OfferDrain | None = None
        """The leader drain of the registered offers (after `register_offer`)."""
        self.kv_relays: dict[str, HostedKvRelay] = {}

    def register_offer(self, offer: Offer[Any, Any, Any]) -> None:
        """Publish ``offer``'s noun to its bucket from `run` on: every write of
        ``offer.ROW`` stages its dirty key, and the pod holding the offer's
        lease drains it. On an engine without NATS the offer is validated and
        logged as unpublished. Raises `DeclarationError` for a malformed
        offer, `DuplicateRegistration` for a name already registered,
        `ConfigError` after `run` started."""
        if self._started:
            raise ConfigError("register offers before run()")
        offer.validate()
        if self._nats is None:
            _log.info("offer %s is not published: the engine has no NATS connection", offer.NAME)
            return
        if self.drain is None:
            self.drain = OfferDrain(
                self._db, self._nats, self._holder, self._bounds, metrics=self._metrics
            )
        if offer.NAME in {o.NAME for o in self.drain.offers}:
            raise DuplicateRegistration("offer", offer.NAME)
        register_offer_type(offer)
        self.drain.add(offer)

    def register_kv_relay(
        self, name: str, bucket: str, source: KvSource, *, batch: int = 256
    ) -> HostedKvRelay:
        """Publish ``source``'s changes into ``bucket`` monotonically by key
        and version from `run` on (watermarks under ``name``): `run` binds
        the bucket (absent: `BucketMissing`, readiness DOWN); on every beat
        the pod holding the ``kv_relay:{name}`` lease publishes up to
        ``batch`` pending changes. Raises `DuplicateRegistration` for a name
        already registered, `ConfigError` without NATS, after `run` started
        or for a source without ``pending`` / ``published``."""
        if self._nats is None:
            raise ConfigError(f"kv relay {name!r} needs NATS")
        if self._started:
            raise ConfigError(f"kv relay {name!r}: register kv relays before run()")
        if not name:
            raise ConfigError("a kv relay needs a name (its watermarks' key)")
        if name in self.kv_relays:
            raise DuplicateRegistration("kv relay", name)
        hosted = HostedKvRelay(
            self._db, self._nats, name, bucket, source,
            holder=self._holder, lease=self._lease, batch=batch,
        )
        self.kv_relays[name] = hosted
        return hosted

    def kv_relay(self, name: str) -> HostedKvRelay:
        """The hosted relay ``name`` (its `HostedKvRelay.relay` once bound)."""
        try:
            return self.kv_relays[name]
        except KeyError:
            raise ConfigError(f"no kv relay named {name!r} is registered") from None

    def set_drain_hook(self, hook: DrainHook | None) -> None:
        """The offer-drain pause seam (tests only; after `register_offer`)."""
        if self.drain is not None:
            self.drain.hook = hook

    async def start(self) -> None:
        """Bind every offer's bucket and every relay's (an absent one fails
        loud, naming it, with readiness DOWN)."""
        self._started = True
        if self.drain is not None:
            await self._bind("offer_boot", self.drain.bind)
        for hosted in self.kv_relays.values():
            await self._bind("kv_relay_boot", hosted.bind)

    async def _bind(self, reason: str, bind: Any) -> None:
        try:
            await bind()
        except EngineError as exc:
            self._readiness.set_down(reason, f"{type(exc).__name__}: {exc}")
            raise

    def tasks(self) -> Mapping[str, Worker]:
        return {"offers": self.drain.run} if self.drain is not None and self._started else {}

    def beat_steps(self) -> Mapping[str, BeatStep]:
        if not self._started:
            return {}
        return {f"kv_relay:{name}": hosted.beat for name, hosted in self.kv_relays.items()}

    async def aclose(self) -> None:
        if self.drain is not None:
            await self.drain.aclose()
        for hosted in self.kv_relays.values():
            await hosted.aclose()
