"""The roster slice: a KV mirror of the twin's roster into ``known_persons``
and a live view over it.

The pod holding the mirror's lease projects; every pod keeps a shadow and
reports ready only once the roster was read and projected (an empty roster
holds it DOWN, keeping ``known_persons``). Remove it by deleting this folder
and its line in ``slices/__init__.py``.
"""

from service_engine.graphql import SliceFragment

from .graphql import TYPES, RosterQuery, RosterSubscription
from .register import register

SLICE = SliceFragment(
    "roster",
    query=RosterQuery,
    subscription=RosterSubscription,
    types=TYPES,
    register=register,
)

__all__ = ["SLICE"]
