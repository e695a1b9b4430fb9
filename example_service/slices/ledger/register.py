"""The ledger slice registers its projector."""

from __future__ import annotations

from service_engine import Engine

from .views import LedgersView


def register(engine: Engine) -> None:
    engine.register_projector(LedgersView())
