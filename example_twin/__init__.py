"""The example twin: a separate service on the integration bus that closes
the reference service's cross-service cycle.

It is another service (``twin``, its own v5 service identity), not part of
``example_service``: it holds its own NATS connection, builds the
frontier envelope itself, and knows the card contract only as the JSON on
the wire (`example_twin.contract`). The reference service holds no raw NATS
client; only its engine does.

* ``python -m example_twin --cycle N`` drives N full cycles — command
  ``card.create`` → event ``card.created`` → command ``card.advance`` (from
  the created card's revision) and the twin's own ``review.approved`` event
  → events ``card.advanced`` and ``card.reviewed`` — prints a JSON summary
  and exits 0 when every cycle closed (an advance answered
  ``StaleRevision``, the review having landed first, is re-sent from the
  revision the answer names);
* ``python -m example_twin`` runs the reviewer: every ``card.created`` the
  service announces is answered with ``review.approved``, until SIGINT or
  SIGTERM;
* ``python -m example_twin --roster`` publishes the twin's roster (KV
  ``PUBLISHED_twin``, ``twin.person.<id>``), which the service mirrors into
  ``known_persons``; ``--boards`` prints the boards the service offers
  (KV ``PUBLISHED_example``, ``example.board.<id>``) — `example_twin.roster`.
"""

from .runner import CycleResult, Summary, Twin, TwinError

__all__ = ["CycleResult", "Summary", "Twin", "TwinError"]
