"""`EmbeddedInfra`: Postgres and NATS started and provisioned under one data folder."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from ..db.migrate import Migration
from .nats_server import EmbeddedNats, provision_buckets, provision_streams
from .postgres import EmbeddedPostgres, ProvisionedDatabase, provision_database


@dataclass
class EmbeddedInfra:
    """Postgres and NATS started and provisioned under one data folder."""

    postgres: EmbeddedPostgres
    nats: EmbeddedNats
    database: ProvisionedDatabase

    @classmethod
    async def start(
        cls,
        data_dir: Path,
        *,
        database: str = "service",
        extra_migrations: Iterable[Migration] = (),
        streams: dict[str, list[str]] | None = None,
        buckets: Iterable[str] = (),
        owner_setup: Callable[[asyncpg.Connection], Awaitable[object]] | None = None,
    ) -> EmbeddedInfra:
        postgres = EmbeddedPostgres(data_dir / "postgres")
        nats_server = EmbeddedNats(data_dir / "nats")

        def start_servers() -> None:
            postgres.start()
            try:
                nats_server.start()
            except BaseException:
                postgres.stop()
                raise

        async def stop_servers() -> None:
            await asyncio.to_thread(nats_server.stop)
            await asyncio.to_thread(postgres.stop)

        # A thread cannot be cancelled: a Ctrl-C while the servers start
        # lets them finish starting, then stops them, so none is left behind.
        starting = asyncio.ensure_future(asyncio.to_thread(start_servers))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await starting
            await stop_servers()
            raise
        try:
            provisioned = await provision_database(
                postgres, database, extra_migrations=list(extra_migrations),
                owner_setup=owner_setup,
            )
            await provision_streams(nats_server.url, streams)
            await provision_buckets(nats_server.url, buckets)
        except BaseException:
            await stop_servers()
            raise
        return cls(postgres, nats_server, provisioned)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.nats.stop)
        await asyncio.to_thread(self.postgres.stop)


