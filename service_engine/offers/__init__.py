"""Published-language offers: a service's rows published to a KV bucket.

`model` declares an offer (`Offer`, `Published`) and keeps which nouns carry
one; `staging` writes the dirty marks a write transaction stages
(``service_engine.offer_dirty``). Both sit below the write pipeline. The
loops sit above it: `relay` (`KvDrainRelay`, the per-key watermark in
``service_engine.kv_relay_watermark``) and `drain` (the leader's drain of
the dirty keys). This package imports none of them, so the pipeline can
import the staging half alone.
"""
