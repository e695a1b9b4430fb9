"""Operator reads the ops page (`service_engine.server.ops_page`) and the CLI
share: the outbox backlog, the dead letters waiting, rates over time."""

from __future__ import annotations

from .history import RateHistory
from .queries import OutboxStatus, dead_letters_waiting, outbox_status

__all__ = [
    "OutboxStatus",
    "RateHistory",
    "dead_letters_waiting",
    "outbox_status",
]
