"""Test harness: real servers, isolated per test, and bounded waits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import asyncpg

from service_engine import Database, Engine, EngineConfig, ReadinessHandle, connect_pool
from service_engine.embedded import ProvisionedDatabase
from service_engine.errors import WorkerStopped
from service_engine.impacts.transport import PgListenNotify

T_co = TypeVar("T_co", covariant=True)


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll ``predicate`` until it holds; fail the test past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


class Gets(Protocol[T_co]):
    """Anything with an awaitable ``get()``: an ``asyncio.Queue``, the
    listener's bounded channel."""

    def get(self) -> Awaitable[T_co]: ...


async def assert_nothing(queue: Gets[object], within: float = 0.2) -> None:
    """Assert no item arrives on ``queue`` within the bound."""
    try:
        item = await asyncio.wait_for(queue.get(), within)
    except TimeoutError:
        return
    raise AssertionError(f"expected nothing, got {item!r}")


async def assert_never(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    within: float = 0.2,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Assert ``predicate`` never holds while polled for ``within`` seconds:
    a bounded absence where there is no queue to watch."""
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            raise AssertionError(f"{what} held within {within}s")
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(interval)


def fast_engine_config(service: str | None, **overrides: Any) -> EngineConfig:
    """Small bounds, so beats, redeliveries and restarts happen within a test."""
    values: dict[str, Any] = {
        "service": service,
        "beat_interval": timedelta(milliseconds=50),
        "lease": timedelta(seconds=1),
        "ack_wait": timedelta(seconds=2),
        "publish_ack_timeout": timedelta(milliseconds=500),
        "inbound_restart_backoff": timedelta(milliseconds=50),
        "inbound_restart_backoff_cap": timedelta(milliseconds=200),
    }
    values.update(overrides)
    return EngineConfig(**values)


@contextlib.asynccontextmanager
async def engine_running(
    config: EngineConfig, db: Database, *projectors: Any, nats: Any = None, bound: float = 10
) -> AsyncIterator[Engine]:
    """An engine of ``config`` on ``db`` (and ``nats``, a connection, when
    given) with ``projectors`` registered, running and UP; shut down and
    awaited (within ``bound`` seconds) after."""
    engine = await Engine.boot(config, db, nats, ReadinessHandle())
    for projector in projectors:
        engine.register_projector(projector)
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: engine.readiness.is_up, what="engine UP")
        yield engine
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, bound)


class Statements:
    """Every statement a pool's connection sends, in order (the driver's
    query logger; install it with ``connect_pool(..., setup=statements.setup)``)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, record: Any) -> None:
        self.sent.append(" ".join(str(record.query).split()))

    async def setup(self, conn: Any) -> None:
        conn.add_query_logger(self)

    def take(self) -> list[str]:
        """What was sent since the last take."""
        sent, self.sent = self.sent, []
        return sent

    def take_own(self) -> list[str]:
        """What was sent since the last take, without the driver's one-time
        type introspection of a connection (its ``typeinfo_tree`` query and
        the ``jit`` setting it turns off and back on around it)."""
        return [s for s in self.take() if not any(m in s for m in _INTROSPECTION)]


_INTROSPECTION = ("typeinfo_tree", "current_setting('jit')", "set_config('jit'")


@contextlib.asynccontextmanager
async def logged_pool(url: str, *, max_size: int = 1) -> AsyncIterator[tuple[Database, Statements]]:
    """A pool of at most ``max_size`` connections whose every statement is
    recorded (`Statements`), closed on exit."""
    statements = Statements()
    db = await connect_pool(url, min_size=1, max_size=max_size, setup=statements.setup)
    try:
        yield db, statements
    finally:
        await db.aclose()


@contextlib.asynccontextmanager
async def owner_connection(database: ProvisionedDatabase) -> AsyncIterator[asyncpg.Connection[Any]]:
    """One plain connection to ``database`` as its owner (past RLS and the app
    role's grants: to seed rows, read what was committed, or change the
    schema under a test), closed on exit."""
    conn: asyncpg.Connection[Any] = await asyncpg.connect(database.owner_url)
    try:
        yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def listener_running(
    listener: PgListenNotify, *, started_within: float = 10.0
) -> AsyncIterator[PgListenNotify]:
    """``listener`` run in a task of its own, entered once it listens (within
    ``started_within`` seconds); the task is cancelled and awaited on exit."""
    task = asyncio.create_task(listener.run())
    try:
        await asyncio.wait_for(listener.started.wait(), started_within)
        yield listener
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
