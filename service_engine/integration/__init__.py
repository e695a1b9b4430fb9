"""Integration over NATS JetStream."""

from .nats import Nats, open_nats

__all__ = ["Nats", "open_nats"]
