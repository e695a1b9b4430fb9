"""The roster slice: a KV mirror of the twin's roster into ``known_persons``
and a live view over it (its ``people`` query and subscription fields
derived from the projector).

The pod holding the mirror's lease projects; every pod keeps a shadow and
reports ready only once the roster was read and projected (an empty roster
holds it DOWN, keeping ``known_persons``); an engine without NATS does not
run the mirror (``known_persons`` stays as it is). Remove it by deleting
this folder and its line in ``slices/__init__.py``.
"""

from service_engine.graphql import SliceFragment

from .domain import ROSTER
from .views import PeopleView

SLICE = SliceFragment("roster", projectors=[PeopleView()], mirrors=[ROSTER])

__all__ = ["SLICE"]
