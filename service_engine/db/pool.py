"""The engine's secure-by-default pooled Postgres connect."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import asyncpg

from ..errors import DatabaseUrlRefused
from ..resources import AsyncResource
from .tls import trusted_hosts_from_env, validate_database_tls


async def _init_connection(conn: asyncpg.Connection) -> None:
    for type_name in ("json", "jsonb"):
        await conn.set_type_codec(
            type_name,
            encoder=lambda v: json.dumps(v, separators=(",", ":")),
            decoder=json.loads,
            schema="pg_catalog",
        )


class Database(AsyncResource):
    """A connection pool plus the URL to open dedicated connections.

    The pool serves the write pipeline and render reads; a dedicated
    connection (`connect_dedicated`) serves work that must own a session,
    such as the LISTEN connection.
    """

    def __init__(self, pool: asyncpg.Pool, url: str) -> None:
        self.pool = pool
        self._url = url

    async def connect_dedicated(self) -> asyncpg.Connection:
        """A fresh connection outside the pool; the caller closes it."""
        conn = await asyncpg.connect(self._url)
        await _init_connection(conn)
        return conn

    async def aclose(self) -> None:
        await self.pool.close()



async def connect_pool(
    url: str,
    *,
    trusted_hosts: Collection[str] | None = None,
    min_size: int = 1,
    max_size: int = 10,
    **pool_options: Any,
) -> Database:
    """Validate ``url`` (`validate_database_tls`) and open a pool over it.

    ``trusted_hosts`` defaults to ``TRUSTED_NETWORK_HOSTS`` from the
    environment: the explicit per-host opt-out of the TLS requirement.
    """
    hosts = trusted_hosts_from_env() if trusted_hosts is None else trusted_hosts
    validate_database_tls(url, hosts)
    overrides = sorted({"host", "hostaddr", "port", "dsn"} & pool_options.keys())
    if overrides:
        # The URL is what was validated: a keyword override would connect
        # somewhere else, unchecked.
        raise DatabaseUrlRefused("host_override", f"connection keywords {overrides} are refused")
    pool = await asyncpg.create_pool(
        url, min_size=min_size, max_size=max_size, init=_init_connection, **pool_options
    )
    return Database(pool, url)
