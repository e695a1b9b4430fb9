"""The two NATS lanes: presence (lane B) and the accumulated lane with its
verified seal (lane A)."""

from __future__ import annotations
