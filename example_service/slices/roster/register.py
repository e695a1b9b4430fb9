"""The roster slice registers its live view and (on an engine with NATS)
the roster mirror."""

from __future__ import annotations

from service_engine import Engine

from .domain import ROSTER
from .views import PeopleView


def register(engine: Engine) -> None:
    engine.register_projector(PeopleView())
    if engine.nats is not None:  # without a broker known_persons stays as it is
        engine.register_mirror(ROSTER)
