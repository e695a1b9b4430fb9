"""The roster as the twin publishes it: one person per key
``twin.person.<id>`` in the ``PUBLISHED_twin`` bucket (JSON). The twin owns
this language; the service keeps its own copy of the wire, no code."""

from __future__ import annotations

from typing import ClassVar

from service_engine.offers import Published

ROSTER_BUCKET = "PUBLISHED_twin"


class PersonPublished(Published):
    BUCKET: ClassVar[str] = ROSTER_BUCKET
    PREFIX: ClassVar[str] = "twin.person"

    id: str
    name: str
    org: str
