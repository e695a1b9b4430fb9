"""The reply slice registers its accumulator, its projectors (the typing
lane with its ttl) and its reaction."""

from __future__ import annotations

from datetime import timedelta

from service_engine import Engine

from ...kernel import ConfigurationError
from .domain import REPLY_TEXT
from .reactions import reactions
from .views import RepliesView, TypingProjector

TYPING_TTL = timedelta(seconds=10)
"""How long a typing mark lasts without a repeat."""


def register(engine: Engine) -> None:
    if not engine.config.service:
        raise ConfigurationError(
            "the reply slice needs EngineConfig.service: its chunks ride STREAMING_{service}"
        )
    engine.register_accumulator(REPLY_TEXT)
    engine.register_projector(RepliesView())
    engine.register_presence(TypingProjector(), TYPING_TTL)
    for reaction in reactions():
        engine.register_reaction(reaction)
