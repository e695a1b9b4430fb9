"""The engine's secure-by-default pooled Postgres connect.

A pooled connection is reset when it is released (asyncpg's reset query:
``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``), one round
trip of its own. `Database.commit` sends that reset in COMMIT's round trip
instead and marks the connection, so its release skips the query: every
release still starts the next user from a reset session. A connection
taken with `Database.plain` (statements that leave no session state, such
as a principal fact's one SELECT) is marked the same way when its block
ends cleanly: there is nothing for the reset to undo.

A task that holds a pooled connection for code it does not own (the write
pipeline around a handler, a render read around a projector's hooks) is
marked as holding it (`Database.hold`): every engine entry that takes a
connection from the same pool (`Database.acquire`, `plain`, `fetch`,
`connection`) refuses that task at once with `NestedConnectionError`
rather than wait for a second connection while holding the first, the
wait that stops a pod whose every connection is so held. The mark names
the task: a task started inside the block copies the mark with its
context but is not the holder. The pipeline's acquire and the accumulated
lane's are bounded by ``lock_timeout``, so a path the mark does not cover
fails there as a `DatabaseError` instead of hanging. The reads a burst of
sockets queues (a principal fact's read at each ``connection_init``, an
attach's snapshot, a render pass) wait as long as the pool makes them, as
the handshake itself queues (``ws_max_handshakes``): with a
``lock_timeout`` bound a 10,000-socket burst was refused most of its
facts reads and some attaches. `plain` and `fetch` take a ``bound`` when
given one.

Every connection the engine takes through `Database` (the pipeline's,
`connection`, `plain`, `fetch`) first passes its `ConnectionQueue`: one
slot per pool connection, waiters served strictly first come, first
served, a released slot handed to the oldest waiter directly. A burst of
writers past what the pool serves waits there, parked on one future each,
instead of racing for every released connection behind the pool (a newly
arrived request taking the connection a woken waiter was about to get,
that waiter sent to the back: the tail of the answer times grows with the
writers). The queue is bounded (``max_queue`` waiters): past it a request
is refused at once with `PoolQueueFull` (a retryable `TimeoutError`),
so the time a request waits is bounded by the queue in front of it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Collection
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, TypeAlias

import asyncpg

from ..failures import DatabaseUrlRefused, NestedConnectionError
from ..resources import AsyncResource
from .errors import Stage, translating
from .tls import trusted_hosts_from_env, validate_database_tls

_log = logging.getLogger(__name__)

CLOSE_WITHIN = 10.0
"""Seconds `Database.aclose` waits for held connections to be released."""

Holder: TypeAlias = tuple[object, object]
"""Who holds a pooled connection: (the holding task, the asyncpg pool)."""

_HOLDER: ContextVar[Holder | None] = ContextVar("service_engine_pool_holder", default=None)


def holds(holder: Holder | None, task: object, pool: object) -> bool:
    """Whether the mark ``holder`` says ``task`` holds a connection of
    ``pool``: the same task (not one started inside the holder's block,
    which copied the mark with its context) and the same pool."""
    return holder is not None and holder[1] is pool and holder[0] is task


async def _init_connection(conn: asyncpg.Connection) -> None:
    for type_name in ("json", "jsonb"):
        await conn.set_type_codec(
            type_name,
            encoder=lambda v: json.dumps(v, separators=(",", ":")),
            decoder=json.loads,
            schema="pg_catalog",
        )


class PooledConnection(asyncpg.Connection):
    """A pool connection whose release reset may already have been sent.

    `Database.commit` marks it once COMMIT and the reset query returned in
    one round trip; the pool's `_reset_on_release` then skips the query for
    that one release. Anything else (a failed COMMIT, a rollback, a render
    read) leaves it unmarked and is reset as asyncpg always does.
    """

    __slots__ = ("_session_reset",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session_reset = False

    def _mark_session_reset(self) -> None:
        self._session_reset = True


async def _reset_on_release(conn: asyncpg.Connection) -> None:
    """The pool's release reset (after asyncpg's own rollback of an open
    transaction and removal of listeners): the reset query, unless it rode
    with the COMMIT that ended the connection's last use."""
    if isinstance(conn, PooledConnection) and conn._session_reset:
        conn._session_reset = False
        if not conn.is_in_transaction():
            return
    query = conn.get_reset_query()
    if query:
        await conn.execute(query)


_CLOSE_IDLE_BOUND = 1.0
"""Seconds `Database.close_idle_connections` waits for an idle connection
(the pool hands one over at once unless a ``setup`` hook runs first)."""

DEFAULT_MAX_QUEUE = 1024
"""Waiters `ConnectionQueue` holds before it refuses (`PoolQueueFull`)."""


READ_RESERVE = 5
"""One pool connection in this many is kept from the write pipeline
(`Database.acquire` with ``write=True``) for reads: the principal's facts,
the render side, a read after a commit."""


def write_slots(max_size: int) -> int:
    """Transactions of the write pipeline one pool of ``max_size`` runs at
    once: all but one connection in `READ_RESERVE` (at least one)."""
    return max(1, max_size - max_size // READ_RESERVE)


class PoolQueueFull(TimeoutError):
    """The pool's queue holds ``max_queue`` waiters already: refused at once,
    retryable (a mutation answers the retryable ``database`` error)."""


class ConnectionQueue:
    """The first-come, first-served queue in front of a pool's connections.

    ``slots`` requests hold a slot at once (the pool's ``max_size``); a
    request past them waits, in arrival order, for one to be released
    (`leave`), which hands the slot to the oldest live waiter without
    freeing it in between (no newcomer takes it first). At most
    ``max_queue`` wait; one more is refused with `PoolQueueFull`. A wait
    bounded by ``bound`` seconds raises `TimeoutError` once it passes.
    """

    __slots__ = ("_free", "_max_queue", "_waiters")

    def __init__(self, slots: int, max_queue: int = DEFAULT_MAX_QUEUE) -> None:
        self._free = slots
        self._max_queue = max_queue
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Requests waiting now (a cancelled one is dropped as it is met)."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def enter(self, bound: float | None) -> None:
        """Take a slot (at once when one is free and nobody waits)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        if len(self._waiters) >= self._max_queue and self.waiting >= self._max_queue:
            raise PoolQueueFull(
                f"the pool's queue holds max_queue={self._max_queue} waiters; retry later"
            )
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        timer = None if bound is None else loop.call_later(bound, _expire, waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.leave()  # handed a slot as it was cancelled: pass it on
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def leave(self) -> None:
        """Release a slot: to the oldest waiter still waiting, else free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no pool connection within the bound"))


class Database(AsyncResource):
    """A connection pool plus the URL to open dedicated connections.

    The pool serves the write pipeline and render reads; a dedicated
    connection (`connect_dedicated`) serves work that must own a session,
    such as the LISTEN connection.
    """

    def __init__(
        self, pool: asyncpg.Pool, url: str, *, max_queue: int = DEFAULT_MAX_QUEUE
    ) -> None:
        self.pool = pool
        self._url = url
        self._max_queue = max_queue
        self._queue: ConnectionQueue | None = None
        self._writes: ConnectionQueue | None = None

    @property
    def queue(self) -> ConnectionQueue:
        """The `ConnectionQueue` in front of the pool (one slot per connection)."""
        if self._queue is None:
            self._queue = ConnectionQueue(self.pool.get_max_size(), self._max_queue)
        return self._queue

    @property
    def writes(self) -> ConnectionQueue:
        """The admission queue of the write pipeline, in front of `queue`:
        `write_slots` transactions hold a connection at once, and writers
        past them wait here, in arrival order, holding nothing. So a pool
        saturated with writers still hands a read its connection at once
        (the reserve), and a writer past saturation waits in one queue, not
        behind the reads it would delay."""
        if self._writes is None:
            self._writes = ConnectionQueue(write_slots(self.pool.get_max_size()), self._max_queue)
        return self._writes

    @property
    def waiting(self) -> int:
        """Requests waiting for a connection now: writers at `writes` and
        everyone at `queue`."""
        return self.writes.waiting + self.queue.waiting

    def refuse_nested(self, entry: str) -> None:
        """Raise `NestedConnectionError` (naming ``entry``) when the current
        task holds a connection of this pool (`hold`): one ContextVar read
        and, only while some task holds, an identity compare."""
        holder = _HOLDER.get()
        if holder is not None and holds(holder, asyncio.current_task(), self.pool):
            raise NestedConnectionError(entry)

    def hold(self) -> Token[Holder | None]:
        """Mark the current task as holding a connection of this pool until
        `unhold` with the token (in a ``finally``: error paths too)."""
        return _HOLDER.set((asyncio.current_task(), self.pool))

    @staticmethod
    def unhold(token: Token[Holder | None]) -> None:
        _HOLDER.reset(token)

    async def connect_dedicated(self) -> asyncpg.Connection:
        """A fresh connection outside the pool; the caller closes it."""
        conn = await asyncpg.connect(self._url)
        await _init_connection(conn)
        return conn

    async def acquire(self, bound: float, *, write: bool = False) -> Any:
        """A pooled connection within ``bound`` seconds (release it with
        `release`, passing the same ``bound`` and ``write``), after its turn
        in the `ConnectionQueue` (the bound covers both); ``write`` (the
        write pipeline's transaction) takes its turn at `writes` first,
        within the same bound. The pool's wait runs
        under an `asyncio.timeout` (a timer, no task of its own), so an
        idle connection is handed over at once and a pool that makes the
        caller wait (no idle connection, a ``setup`` hook still running, a
        connection to reopen) raises `TimeoutError` once the bound passed.
        Raises `NestedConnectionError` for a task holding one of this pool."""
        self.refuse_nested("Database.acquire")
        if not write:
            return await self._take(bound)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await self.writes.enter(bound)
        try:
            return await self._take(max(0.001, bound - (loop.time() - began)))
        except BaseException:
            self.writes.leave()
            raise

    async def _take(self, bound: float | None) -> Any:
        """`acquire` without the check (``bound`` None: wait as long as it
        takes): the queue's turn, then the pool's connection."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        await self.queue.enter(bound)
        try:
            if bound is None:
                return await self.pool.acquire()
            async with asyncio.timeout(max(0.001, bound - (loop.time() - began))):
                return await self.pool.acquire()
        except BaseException:
            self.queue.leave()
            raise

    async def release(self, conn: Any, bound: float | None = None, *, write: bool = False) -> None:
        """Hand back a connection `acquire` gave (the pool resets it, within
        ``bound`` seconds when given) and its queue slot (to the oldest
        waiter), and its `writes` slot when it was acquired to ``write``."""
        try:
            await self.pool.release(conn, timeout=bound)
        finally:
            self.queue.leave()
            if write:
                self.writes.leave()

    async def commit(self, conn: Any, *, before: str = "") -> None:
        """COMMIT ``conn``'s open transaction with the pool's release reset
        in the same round trip, and mark it so its release sends no reset.
        ``before`` (statements without parameters, every value a literal)
        runs first in that round trip, inside the transaction: a failure
        there aborts it and COMMIT never runs.

        A failed COMMIT raises the driver error with nothing marked: the
        statements after it never ran and the release resets as usual. Call
        it as the connection's last statement before its release: the reset
        has already run. Any other connection (a dedicated LISTEN or lease
        connection, whose session state must survive) gets a bare COMMIT.
        """
        mark = getattr(conn, "_mark_session_reset", None)  # a pooled one, or its proxy
        reset = conn.get_reset_query() if mark is not None else ""
        prefix = f"{before}; " if before else ""
        await conn.execute(f"{prefix}COMMIT; {reset}" if reset else f"{prefix}COMMIT")
        if mark is not None and reset:
            mark()

    @contextlib.asynccontextmanager
    async def connection(self, entry: str, bound: float | None = None) -> AsyncIterator[Any]:
        """A pooled connection for the block, within ``bound`` seconds (None:
        as long as the pool makes it wait), released with the pool's reset;
        the task holds it (`hold`) while the block runs. ``entry`` names the
        caller in the `NestedConnectionError` a holding task gets."""
        self.refuse_nested(entry)
        conn = await self._take(bound)
        token = _HOLDER.set((asyncio.current_task(), self.pool))
        try:
            yield conn
        finally:
            _HOLDER.reset(token)
            await self.release(conn, bound)

    @contextlib.asynccontextmanager
    async def plain(self, bound: float | None = None) -> AsyncIterator[Any]:
        """A pooled connection for statements that leave no session state
        behind, released without the reset query (its own round trip);
        refused to a holder as `connection` is, and taken within ``bound``
        seconds when given (None: as long as the pool makes it wait).

        For autocommit reads and writes (and a transaction the block
        commits or rolls back itself) that issue no ``SET`` (``SET LOCAL``
        and ``set_config(..., true)`` end with their transaction), no
        ``LISTEN``, no session advisory lock and no ``DECLARE``: what the
        reset would undo. A block that raises, or leaves a transaction
        open, is reset on release as usual.
        """
        self.refuse_nested("Database.plain")
        conn = await self._take(bound)
        token = _HOLDER.set((asyncio.current_task(), self.pool))
        try:
            yield conn
            mark = getattr(conn, "_mark_session_reset", None)  # a pooled one, or its proxy
            if mark is not None and not conn.is_in_transaction():
                mark()
        finally:
            _HOLDER.reset(token)
            await self.release(conn, bound)

    async def fetch(self, query: str, *args: Any, bound: float | None = None) -> list[Any]:
        """One statement's rows on a `plain` connection (no release reset),
        taken within ``bound`` seconds when given. A driver error (a
        bounded acquire's timeout included) raises the `DatabaseError` of
        stage ``read``."""
        self.refuse_nested("Database.fetch")
        with translating(Stage.READ):
            async with self.plain(bound) as conn:
                rows: list[Any] = await conn.fetch(query, *args)
                return rows

    async def close_idle_connections(self) -> int:
        """Close every pool connection not in use now; how many were closed.

        For a pod gone idle after a burst (`ReleaseAfterClose`): the
        connections the burst opened, and the statements it prepared on
        any connection (asyncpg's per-connection cache), stay in the heap
        among the burst's freed memory and keep its pages mapped; closed,
        they free them. The pool reopens its floor (``min_size``) at once,
        in a task of its own, and a connection prepares its statements
        again on first use. A connection in use is left alone.
        """
        return await self._close_idle(self.pool.get_idle_size())

    async def close_idle_above(self, keep: int) -> int:
        """Close idle pool connections while more than ``keep`` are open
        (never one in use, never below the pool's floor); how many were
        closed. `IdleConnections` says when and how many to keep."""
        keep = max(keep, self.pool.get_min_size())
        return await self._close_idle(min(self.pool.get_idle_size(), self.pool.get_size() - keep))

    async def _close_idle(self, count: int) -> int:
        """Close up to ``count`` idle connections: each taken from the pool
        (which hands out an open idle one first, at once) and terminated;
        the pool takes its slot back as closed. Stops early once none is
        idle (a concurrent request took one)."""
        closed = 0
        while closed < count and self.pool.get_idle_size() > 0:
            try:
                async with asyncio.timeout(_CLOSE_IDLE_BOUND):
                    conn = await self.pool.acquire()
            except TimeoutError:
                break
            conn.terminate()
            await self.pool.release(conn)  # already returned as closed: nothing to do
            closed += 1
        return closed

    def in_use(self) -> int:
        """Pool connections in use now."""
        return self.pool.get_size() - self.pool.get_idle_size()

    async def aclose(self, within: float = CLOSE_WITHIN) -> None:
        """Close every connection once it is released, waiting at most
        ``within`` seconds; past that, the connections still held are
        terminated (asyncpg's `Pool.close` bounded by `asyncio.wait_for`, as
        its documentation advises) and a warning names how many there were:
        a close never hangs on a connection a task forgot."""
        held = self.pool.get_size() - self.pool.get_idle_size()
        try:
            await asyncio.wait_for(self.pool.close(), within)
        except TimeoutError:
            _log.warning(
                "closing the pool: %d connection(s) still held after %.0fs were terminated",
                held, within,
            )


IDLE_CONNECTION_WINDOW = 300.0
"""Seconds after which pool connections the pod did not need are closed
(asyncpg's own idle lifetime, which the pool no longer arms per release)."""


@dataclass
class IdleConnections:
    """When to close the pool connections a pod no longer needs: at the end
    of each ``window`` seconds, keep as many as were in use at once at the
    peak of that window (`observe` returns that count; None in between).
    Feed it the in-use count on every beat. Pure: the engine's beat closes
    (`Database.close_idle_above`)."""

    window: float = IDLE_CONNECTION_WINDOW
    started: float | None = None
    peak: int = 0

    def observe(self, now: float, in_use: int) -> int | None:
        if self.started is None:
            self.started, self.peak = now, in_use
            return None
        self.peak = max(self.peak, in_use)
        if now - self.started < self.window:
            return None
        keep, self.started, self.peak = self.peak, now, in_use
        return keep



async def connect_pool(
    url: str,
    *,
    trusted_hosts: Collection[str] | None = None,
    min_size: int = 1,
    max_size: int = 10,
    max_queue: int = DEFAULT_MAX_QUEUE,
    **pool_options: Any,
) -> Database:
    """Validate ``url`` (`validate_database_tls`) and open a pool over it,
    with a `ConnectionQueue` of ``max_queue`` waiters in front of it.

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
    pool_options.setdefault("connection_class", PooledConnection)
    # No timer per connection release (asyncpg's idle-connection expiry,
    # re-armed on every release and left cancelled in the loop's heap for
    # 300 s) and no re-preparing of every cached statement each 300 s:
    # connections above the floor are closed when the pod goes idle
    # (`Database.close_idle_connections`), statements leave the cache by
    # its size bound (``statement_cache_size``).
    pool_options.setdefault("max_inactive_connection_lifetime", 0)
    pool_options.setdefault("max_cached_statement_lifetime", 0)
    pool_options.setdefault("reset", _reset_on_release)
    pool = await asyncpg.create_pool(
        url, min_size=min_size, max_size=max_size, init=_init_connection, **pool_options
    )
    return Database(pool, url, max_queue=max_queue)
