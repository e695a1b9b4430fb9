"""service-engine: personalised live views of Postgres state and one
exactly-once write and integration pipeline for Python microservices.

The public surface is this package and a short list of public
sub-packages; a service imports nothing else (the reference service is held
to it by ``tests/test_example_service_surface.py``). Every other module is
the engine's own and may move between releases.

* ``service_engine``: what a service author writes every day: the engine
  and its configuration, the stores and aggregates, the write contexts
  (`Mutation`, `Reaction`, `Bulk`, `Erase`), projectors, windows, cohorts
  and visibility, gates, the integration envelope, the boot functions;
* ``service_engine.errors``: every exception the engine raises (none is
  exported here);
* ``service_engine.graphql``: the GraphQL author's kit (`compose_service`,
  `subscription_union` and its live fields, `MutationResult` / `Refusal`,
  `GraphQLContext`), kept apart so the engine imports no Strawberry until a
  service serves GraphQL;
* ``service_engine.server``: what serves it (`graphql_app`, the passport,
  the subscription socket, the ops page, `run_with`, `run_pods`);
* ``service_engine.integration``: the integration loops' declarations
  beyond the envelope (dispositions, crons, declared sequences, subjects,
  publish outcomes, dead letters, the outbox row);
* ``service_engine.lanes``: the presence lane and the accumulated lane
  with its seal;
* ``service_engine.blobs``: blob kinds and the object store;
* ``service_engine.offers``: published languages (offers, KV relays);
* ``service_engine.mirrors``: other services' published languages mirrored;
* ``service_engine.erasure``: a person's erasure;
* ``service_engine.scopes``: scope manifests declared to Identity;
* ``service_engine.persistence``: the persistence kit's helpers beyond the
  styles exported here (the full-EDA log's ``keys``, ``erase``, ``Redactor``);
* ``service_engine.commands``: the declarative command layer on the write
  pipeline (entities, workflows, commands checked at registration, typed
  outcomes, idempotency keys, unique keys, delete and row policies);
* ``service_engine.props``: the service property contract over NATS (verbs,
  capabilities, the SQLite and in-memory stores, watch, the logging bridge);
* ``service_engine.embedded``: embedded Postgres and NATS for a development
  machine and tests (the ``embedded`` extra); never in production.

``service_engine.testing`` is test support for the engine's own batteries,
not part of the surface.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .clock import Clock, Timestamp
    from .config import EngineConfig
    from .db import Database, connect_pool, service_migrations
    from .db.types import Conn
    from .engine import Engine
    from .erasure import Erasable, Erase
    from .gates import ActionName, Affordances, Gate, Reason, affordances, gated
    from .impacts import Cause, Impact
    from .integration import (
        Actor,
        EventMetadata,
        InboundReaction,
        IntegrationCommand,
        IntegrationEvent,
        Nats,
        open_nats,
    )
    from .memory import run_on_allocator
    from .persistence import (
        Aggregate,
        CrudStore,
        DomainEvent,
        EventSourced,
        FullEda,
        RecordsEvents,
        SoftEdaStore,
    )
    from .pipeline import (
        Bulk,
        Mutation,
        MutationError,
        MutationExecutor,
        OneShot,
        Reaction,
        Success,
    )
    from .principal_facts import PrincipalFactBatchLoader, PrincipalFactLoader
    from .readiness import ReadinessHandle
    from .render import CohortKey, Keys, Ordered, Query
    from .render.projector import (
        Coalesced,
        PerImpact,
        Populate,
        Projector,
        RlsApplier,
        Unrestricted,
        Visibility,
    )
    from .render.table_window import TableWindow
    from .render.windows import Emission, WindowSpec

_EXPORTS: dict[str, str] = {
    "ActionName": ".gates",
    "Actor": ".integration",
    "Affordances": ".gates",
    "Aggregate": ".persistence",
    "Bulk": ".pipeline",
    "Cause": ".impacts",
    "Clock": ".clock",
    "Coalesced": ".render.projector",
    "CohortKey": ".render",
    "Conn": ".db.types",
    "CrudStore": ".persistence",
    "Database": ".db",
    "DomainEvent": ".persistence",
    "Emission": ".render.windows",
    "Engine": ".engine",
    "EngineConfig": ".config",
    "Erasable": ".erasure",
    "Erase": ".erasure",
    "EventMetadata": ".integration",
    "EventSourced": ".persistence",
    "FullEda": ".persistence",
    "Gate": ".gates",
    "Impact": ".impacts",
    "InboundReaction": ".integration",
    "IntegrationCommand": ".integration",
    "IntegrationEvent": ".integration",
    "Keys": ".render",
    "Mutation": ".pipeline",
    "MutationError": ".pipeline",
    "MutationExecutor": ".pipeline",
    "Nats": ".integration",
    "OneShot": ".pipeline",
    "Ordered": ".render",
    "PerImpact": ".render.projector",
    "Populate": ".render.projector",
    "PrincipalFactBatchLoader": ".principal_facts",
    "PrincipalFactLoader": ".principal_facts",
    "Projector": ".render.projector",
    "Query": ".render",
    "Reaction": ".pipeline",
    "ReadinessHandle": ".readiness",
    "Reason": ".gates",
    "RecordsEvents": ".persistence",
    "RlsApplier": ".render.projector",
    "SoftEdaStore": ".persistence",
    "Success": ".pipeline",
    "TableWindow": ".render.table_window",
    "Timestamp": ".clock",
    "Unrestricted": ".render.projector",
    "Visibility": ".render.projector",
    "WindowSpec": ".render.windows",
    "affordances": ".gates",
    "connect_pool": ".db",
    "gated": ".gates",
    "open_nats": ".integration",
    "run_on_allocator": ".memory",
    "service_migrations": ".db",
}
"""Each exported name and the module defining it: a name is imported on
first use (PEP 562), so ``import service_engine``, the operator CLI and a
pod's re-execution on its allocator load only what they touch. The
``TYPE_CHECKING`` imports above state the same list for type checkers and
editors; ``tests/test_import_cost.py`` keeps the two in step."""


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ActionName",
    "Actor",
    "Affordances",
    "Aggregate",
    "Bulk",
    "Cause",
    "Clock",
    "Coalesced",
    "CohortKey",
    "Conn",
    "CrudStore",
    "Database",
    "DomainEvent",
    "Emission",
    "Engine",
    "EngineConfig",
    "Erasable",
    "Erase",
    "EventMetadata",
    "EventSourced",
    "FullEda",
    "Gate",
    "Impact",
    "InboundReaction",
    "IntegrationCommand",
    "IntegrationEvent",
    "Keys",
    "Mutation",
    "MutationError",
    "MutationExecutor",
    "Nats",
    "OneShot",
    "Ordered",
    "PerImpact",
    "Populate",
    "PrincipalFactBatchLoader",
    "PrincipalFactLoader",
    "Projector",
    "Query",
    "Reaction",
    "ReadinessHandle",
    "Reason",
    "RecordsEvents",
    "RlsApplier",
    "SoftEdaStore",
    "Success",
    "TableWindow",
    "Timestamp",
    "Unrestricted",
    "Visibility",
    "WindowSpec",
    "affordances",
    "connect_pool",
    "gated",
    "open_nats",
    "run_on_allocator",
    "service_migrations",
]
