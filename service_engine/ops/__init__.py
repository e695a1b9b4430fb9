"""The ops page (``/ops``) and the operator reads it shares with the CLI."""

from __future__ import annotations

from .history import RateHistory
from .queries import OutboxStatus, dead_letters_waiting, outbox_status
from .routes import DEFAULT_OPS_ROLE, ops_routes

__all__ = [
    "DEFAULT_OPS_ROLE",
    "OutboxStatus",
    "RateHistory",
    "dead_letters_waiting",
    "ops_routes",
    "outbox_status",
]
