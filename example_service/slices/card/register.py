"""What the card slice registers beyond its declared data: its reactions
and its cron (both name the engine's service) and the resolver of their
senders (it loads their facts through the engine); and its erasure (the
person's name on cards and their facts)."""

from __future__ import annotations

from service_engine import Engine, Erase

from ...kernel import ConfigurationError
from .domain import NOUN
from .reactions import digest_cron, reactions, sender_resolver


def register(engine: Engine) -> None:
    service = engine.config.service
    if not service:
        raise ConfigurationError("the card slice needs EngineConfig.service: its events name it")
    engine.register_cron(digest_cron(service))
    # The one resolver of the service's reaction senders: the card slice's
    # reactions are the ones that gate on who sent a message.
    engine.register_reaction_principal(sender_resolver(engine))
    for reaction in reactions(service):
        engine.register_reaction(reaction)


ERASED = "erased"
"""What an erased person's name is replaced with on a card and its facts."""


class CardErasure:
    """Erasable (soft EDA): a card belongs to its org, so it stays; the
    person's name leaves its state row (``owner``, ``reviewed_by``, the
    version bumped so a stale write conflicts) and its facts (``by``).
    Each touched card's views re-render."""

    async def erase(self, cx: Erase, person: str) -> None:
        rows = await cx.fetch(
            "SELECT id FROM card WHERE owner = $1 OR reviewed_by = $1"
            " UNION SELECT card_id FROM card_fact WHERE payload->>'by' = $1", person,
        )
        await cx.execute(
            "UPDATE card SET owner = CASE WHEN owner = $1 THEN $2 ELSE owner END,"
            " reviewed_by = CASE WHEN reviewed_by = $1 THEN $2 ELSE reviewed_by END,"
            " version = version + 1 WHERE owner = $1 OR reviewed_by = $1", person, ERASED,
        )
        await cx.execute(
            "UPDATE card_fact SET payload = jsonb_set(payload, '{by}', to_jsonb($2::text))"
            " WHERE payload->>'by' = $1", person, ERASED,
        )
        for row in rows:
            cx.impact(NOUN, str(row["id"]))
