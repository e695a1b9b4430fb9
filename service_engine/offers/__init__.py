"""Published-language offers: a service's rows published to a KV bucket.

`model` declares an offer (`Offer`, `Published`) and keeps which nouns carry
one; `staging` writes the dirty marks a write transaction stages
(``service_engine.offer_dirty``). Both sit below the write pipeline, which
imports the staging half alone. The loops sit above it: `relay`
(`KvDrainRelay`, `HostedKvRelay` over an author's `KvSource`, the per-key
watermark in ``service_engine.kv_relay_watermark``) and `drain` (the
leader's drain of the dirty keys).
"""

from __future__ import annotations

from .model import Offer, Published
from .relay import HostedKvRelay, KvDrainRelay, KvPut, KvRetract, KvSource

__all__ = ["HostedKvRelay", "KvDrainRelay", "KvPut", "KvRetract", "KvSource", "Offer", "Published"]
