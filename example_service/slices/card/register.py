"""The card slice registers its projector, its reactions, the resolver of
their senders, its cron and its scope (`CARD_ADVANCE`)."""

from __future__ import annotations

from service_engine import Engine

from ...kernel import ConfigurationError
from .domain import CARD_ADVANCE
from .reactions import digest_cron, reactions, sender_resolver
from .views import CardsView


def register(engine: Engine) -> None:
    service = engine.config.service
    if not service:
        raise ConfigurationError("the card slice needs EngineConfig.service: its events name it")
    engine.register_projector(CardsView())
    engine.register_cron(digest_cron(service))
    # The one resolver of the service's reaction senders: the card slice's
    # reactions are the ones that gate on who sent a message.
    engine.register_reaction_principal(sender_resolver(engine))
    engine.contribute_scopes([CARD_ADVANCE])
    for reaction in reactions(service):
        engine.register_reaction(reaction)
