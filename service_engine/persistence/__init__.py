"""Persistence: one protocol, three styles (CRUD, soft EDA, full EDA).

`base` holds the `Persistence` protocol and the `Aggregate` naming its
store; `crud` and `soft_eda` are helpers that write a table store's SQL;
`full_eda` is the event-sourcing kit over the engine's own log tables.
"""

from __future__ import annotations

from .base import (
    Aggregate,
    DomainEvent,
    HydrationFailed,
    NotFound,
    Persistence,
    RecordsEvents,
    Style,
    store_of,
)
from .crud import CrudStore
from .full_eda import EventSourced, FullEda, Redactor, erase, keys
from .soft_eda import SoftEdaStore

__all__ = [
    "Aggregate",
    "CrudStore",
    "DomainEvent",
    "EventSourced",
    "FullEda",
    "HydrationFailed",
    "NotFound",
    "Persistence",
    "RecordsEvents",
    "Redactor",
    "SoftEdaStore",
    "Style",
    "erase",
    "keys",
    "store_of",
]
