"""The roster slice registers its live view and the roster mirror (which an
engine without NATS does not run: ``known_persons`` stays as it is)."""

from __future__ import annotations

from service_engine import Engine

from .domain import ROSTER
from .views import PeopleView


def register(engine: Engine) -> None:
    engine.register_projector(PeopleView())
    engine.register_mirror(ROSTER)
