"""The render registry: projectors, live sessions, and the attach / fetch / page API.

`RenderRegistry` owns the registered projectors and the sessions of one pod,
and serves what a subscriber or resolver asks for:

* ``attach`` registers the session's interest *before* its snapshot (the
  connect barrier): what commits while the snapshot reads is held and
  replayed after the Reset, so nothing between snapshot and live is lost or
  delivered twice;
* ``page`` appends an older page behind a live window (Upserts on the
  session's stream); ``fetch`` / ``fetch_window`` read views exactly as a
  session renders them.

Every read is a plain read-only transaction (the render side never takes a
row lock, s130), and every driver error on it leaves as a
`service_engine.db.errors.DatabaseError` (stage ``read``). The render loop
that keeps sessions current is `service_engine.render.runtime.RenderRuntime`,
built on this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..config import EngineConfig
from ..db.errors import Stage, translating
from ..db.pool import Database
from ..db.types import Conn
from ..failures import (
    AttachError,
    AttachShuttingDown,
    ConfigError,
    DuplicateRegistration,
    EngineError,
)
from ..impacts.model import JsonValue, canonical_json
from ..impacts.watched import WatchedNouns
from ..logs import in_session
from ..metrics import Metrics
from .attached import (
    AttachBatches,
    AttachedSession,
    PopulateCx,
    UnknownProjectorName,
    populate_slots,
    window_of,
)
from .cohort import principal_key
from .cohort_index import CohortIndex, SharedGates, indexable
from .deltas import Delta, KeyText
from .interest import Dirty, Interest
from .paging import NoLiveSession, PageInterrupted, PageResult
from .projector import (
    MissingRlsApplier,
    Projector,
    RlsApplier,
    check_projector,
    check_window_spec,
    cohort_of,
    route_of,
)
from .report import PassTally
from .session import Session, authorize_page
from .session_id import SessionId, new_session_id, parse_session_id
from .sharing import HeldViews, Interned, SharedViews, view_key_of
from .snapshots import Snapshots
from .stream import SessionStream
from .windows import Keys, WindowSpec, keyed

__all__ = ["AttachedSession", "PrincipalRefresh", "RenderRegistry", "UnknownProjectorName"]

_log = logging.getLogger(__name__)

PrincipalRefresh = Callable[[Any], Awaitable[Any]]
"""Re-resolves a principal (same id) after a principal-facts impact."""


class _Detach:
    """A stream's close: detach its session (``"closed"``). One slotted
    object, where a ``functools.partial`` of the bound ``detach`` holds a
    partial, its arguments tuple, keywords dict and a bound method (~260
    bytes a session)."""

    __slots__ = ("registry", "session_id")

    def __init__(self, registry: RenderRegistry, session_id: SessionId) -> None:
        self.registry = registry
        self.session_id = session_id

    def __call__(self) -> None:
        self.registry.detach(self.session_id, "closed")


class _Attached:
    """`RenderRegistry.attach_soon`'s end: the first snapshot's future done."""

    __slots__ = ("done", "rec", "registry")

    def __init__(
        self, registry: RenderRegistry, rec: AttachedSession,
        done: Callable[[SessionStream[Any] | Exception], None],
    ) -> None:
        self.registry = registry
        self.rec = rec
        self.done = done

    def __call__(self, ready: asyncio.Future[None]) -> None:
        registry = self.registry
        if ready.cancelled():
            registry.detach(self.rec.session.id, "attach failed")
            return
        error = ready.exception()
        if error is not None:
            registry.detach(self.rec.session.id, "attach failed")
            self.done(error if isinstance(error, Exception) else AttachShuttingDown(
                "the attach was interrupted"))
            return
        self.done(registry._opened(self.rec))


class RenderRegistry:
    """Projectors and sessions of one pod, and the reads that serve them."""

    def __init__(
        self,
        db: Database,
        config: EngineConfig,
        *,
        accepting: Callable[[], None] = lambda: None,
        metrics: Metrics | None = None,
    ) -> None:
        self._db = db
        self._config = config
        self._accepting = accepting
        self._metrics = metrics
        # Sessions attached and deltas enqueued, by projector; the deltas are
        # counted here and added to the metric once per pass (`flush_metrics`).
        self._live_by_projector: dict[str, int] = {}
        self.delivered: dict[str, int] = {}
        self._projectors: dict[str, Projector[Any, Any, Any, Any]] = {}
        self.interest: Interest[Session[Any, Any]] = Interest()
        self._sessions: dict[SessionId, AttachedSession] = {}
        self._peak = 0
        """The most sessions attached at once since `take_peak`."""
        # What snapshots held while they read, replayed by the next pass.
        self.replays: list[tuple[AttachedSession, Dirty]] = []
        self.planned = 0
        """How many render passes have planned so far."""
        self.wake = asyncio.Event()
        self.principal_refresh: PrincipalRefresh | None = None
        # The cohort index of projectors gated by their declared Visibility
        # (see `CohortIndex`), by projector name.
        self.indexes: dict[str, CohortIndex] = {}
        self.snapshots = Snapshots(self)
        """Each session's snapshot from committed state, alone or batched."""
        self.attach_batches = AttachBatches(
            begin=self.snapshots.begin, read=self.snapshots.read_attach_batch,
            alone=lambda rec: self.snapshots.snapshot(rec, begun=True),
        )
        """Attaches waiting for their first snapshot, read in batches."""
        # Projectors whose declared view key was found not to determine the
        # view (see `SharedViews`): their views are projected per session.
        self._unshared: set[str] = set()
        self._held_views: dict[str, HeldViews] = {}
        self.gates = SharedGates()
        self.view_keys = Interned()
        """Per projector, the views its sessions hold (`HeldViews`)."""
        self.debug_views = __debug__
        """Check a shared view against a second session's own projection."""
        self.nouns = WatchedNouns()
        """The nouns the registered projectors read, and the stores they read
        through (a write through one stages its projectors' nouns)."""

    # -- registration -----------------------------------------------------

    def register_projector(self, projector: Projector[Any, Any, Any, Any]) -> None:
        """Register ``projector`` under its ``NAME`` (its noun binds to its
        store's key type through ``STORE.key_of``)."""
        check_projector(projector)
        if projector.NAME in self._projectors:
            raise DuplicateRegistration("projector", projector.NAME)
        route = route_of(projector)
        self.interest.register(route)
        self.nouns.watch(route.nouns, store=projector.STORE, noun=projector.NOUN)
        self._projectors[projector.NAME] = projector
        if indexable(projector):
            self.indexes[projector.NAME] = CohortIndex()

    def register_principal_refresh(self, refresh: PrincipalRefresh) -> None:
        """How a principal is re-resolved after its facts changed. A refresh
        that raises ends that principal's sessions (fail-closed)."""
        if self.principal_refresh is not None:
            raise DuplicateRegistration("principal refresh", "principal_refresh")
        self.principal_refresh = refresh

    def projector(self, name: str) -> Projector[Any, Any, Any, Any]:
        try:
            return self._projectors[name]
        except KeyError:
            known = ", ".join(map(repr, self.projector_names)) or "none"
            raise UnknownProjectorName(
                f"no projector named {name!r} (registered projectors: {known})"
            ) from None

    @property
    def projector_names(self) -> tuple[str, ...]:
        """The names of the registered projectors, sorted."""
        return tuple(sorted(self._projectors))

    @property
    def sessions(self) -> Mapping[SessionId, AttachedSession]:
        return self._sessions

    def take_peak(self) -> int:
        """The most sessions attached at once since the last call (a burst
        that came and went between two beats included); from now, the
        sessions attached now."""
        peak, self._peak = self._peak, len(self._sessions)
        return peak

    # -- attach, detach, page, fetch ---------------------------------------------

    async def attach(
        self,
        principal: Any,
        projector: str,
        window: WindowSpec[Any],
        *,
        session_id: str | None = None,
        applier: RlsApplier[Any] | None = None,
    ) -> SessionStream[Any]:
        """Open a live session: the first delta is a Reset of the window.

        ``session_id`` (a client-supplied id) correlates the subscription
        with later page requests. Raises `AttachShuttingDown` once shutdown
        began, `RlsRegimeMismatch` / `MissingRlsApplier` when the window's
        RLS assertion does not fit the projector, and a `DatabaseError` when
        the snapshot's read fails.
        """
        rec = self._open(principal, projector, window, session_id, applier)
        try:
            if rec.projector.RLS:
                # Its reads run under this principal's RLS context: alone.
                await self.snapshots.snapshot(rec)
            else:
                await self.attach_batches.join(rec)
        except BaseException:
            self.detach(rec.session.id, "attach failed")
            raise
        return self._opened(rec)

    def attach_soon(
        self,
        principal: Any,
        projector: str,
        window: WindowSpec[Any],
        done: Callable[[SessionStream[Any] | Exception], None],
        *,
        session_id: str | None = None,
        applier: RlsApplier[Any] | None = None,
    ) -> asyncio.Future[None]:
        """`attach` without a task of the caller's: ``done`` is called (from
        a loop callback) with the session's stream once its Reset is queued,
        or with the error refusing it (the session detached). What `attach`
        raises before any read is raised here. Cancel the returned future to
        give the attach up: the session is detached and ``done`` is not
        called."""
        rec = self._open(principal, projector, window, session_id, applier)
        ready: asyncio.Future[None]
        if rec.projector.RLS:
            # Its reads run under this principal's RLS context: alone.
            ready = asyncio.get_running_loop().create_task(self.snapshots.snapshot(rec))
        else:
            ready = self.attach_batches.join(rec)
        ready.add_done_callback(_Attached(self, rec, done))
        return ready

    def _open(
        self,
        principal: Any,
        projector: str,
        window: WindowSpec[Any],
        session_id: str | None,
        applier: RlsApplier[Any] | None,
    ) -> AttachedSession:
        """An attach's session, registered and watching (its interest
        before its snapshot: the connect barrier's first step)."""
        try:
            self._accepting()
        except EngineError as exc:
            raise AttachShuttingDown(str(exc)) from exc
        proj = self.projector(projector)
        check_window_spec(proj, window, applier)
        sid = new_session_id() if session_id is None else parse_session_id(session_id)
        if sid in self._sessions:
            raise AttachError(f"session {sid} is already attached")
        pkey = principal_key(principal.id)
        view_key = self.view_keys.take(view_key_of(proj, principal))
        session: Session[Any, Any] = Session(
            sid, proj.NAME, principal, pkey, cohort_of(proj, principal), window.population,
            repair_attempts=self._config.repair_attempts, now=time.monotonic(),
        )
        stream: SessionStream[Any] = SessionStream(
            sid, max(1024, 2 * self._config.window_capacity),
            _Detach(self, sid),
        )
        gate, memberships = self.gates.take(proj, principal)
        rec = AttachedSession(
            session, proj, stream, applier, gate, memberships, view_key=view_key,
        )
        sessions = self._sessions
        sessions[sid] = rec
        if len(sessions) > self._peak:
            self._peak = len(sessions)
        self._count_live(proj.NAME, 1)
        population = window.population
        # The connect barrier: interest first, then the snapshot.
        keys = keyed(population.keys.values()) if isinstance(population, Keys) else None
        self.interest.watch(session, proj.NAME, pkey, None if keys is None else keys.keys())
        index = self.indexes.get(proj.NAME)
        if index is not None:
            index.join(session, rec.memberships)
        return rec

    def _opened(self, rec: AttachedSession) -> SessionStream[Any]:
        """An attach's first snapshot completed: its stream."""
        stream = rec.stream
        if not self._config.render_shedding:
            stream.collapse_after(None)
        return stream

    def detach(self, session_id: SessionId, reason: str) -> None:
        """End a session and stop routing to it (idempotent)."""
        rec = self._sessions.pop(session_id, None)
        if rec is None:
            return
        self._count_live(rec.projector.NAME, -1)
        self.interest.unwatch(rec.session)
        index = self.indexes.get(rec.projector.NAME)
        if index is not None:
            index.leave(rec.session, rec.memberships)
        self.gates.release(rec.projector, rec.memberships)
        self.view_keys.release(rec.view_key)
        if not rec.session.ended:
            rec.session.end(reason)
        rec.stream.end(reason)
        if not self._sessions:
            self._back_to_idle()

    def _back_to_idle(self) -> None:
        """The last session ended: rebuild what grew with the sessions (a
        dict or set keeps its largest table when emptied), so a pod whose
        sessions all closed holds these at their idle size. The cohort
        indexes are emptied in place (a pass in flight may still settle
        into them: what it adds is a superset, as the index allows)."""
        self._sessions = {}
        self.gates = SharedGates()
        self.view_keys = Interned()
        self.attach_batches.shrink()
        interest: Interest[Session[Any, Any]] = Interest()
        for name in self._projectors:
            interest.register(self.interest.route_of(name))
        self.interest = interest
        for index in self.indexes.values():
            index.members = {}
            index.held_cohorts = {}
            index.snapshotting = set()
            index.authoritative = set()

    def end_all(self, reason: str) -> None:
        for sid in list(self._sessions):
            self.detach(sid, reason)

    async def page(self, session_id: str, principal: Any, cursor: JsonValue) -> PageResult[Any]:
        """Append the page of older keys before ``cursor`` behind the live
        window, delivered as Upserts on the session's stream.

        Only a live session of this pod owned by ``principal`` may page:
        anything else is `NoLiveSession`, whatever the reason. A failed read
        raises a `DatabaseError`.
        """
        try:
            sid = parse_session_id(session_id)
        except AttachError:
            raise NoLiveSession() from None
        for _ in range(3):
            rec = self._sessions.get(sid)
            session = authorize_page(rec.session if rec else None, principal_key(principal.id))
            assert rec is not None
            ticket = session.open_page(cursor)
            async with self.reading(rec.projector, session.principal, rec.applier) as conn:
                keys = await self.populate(conn, rec, cursor)
                rows = await self.load(conn, rec.projector, keys, PassTally())
            rendered = self.project(rec, rows, keys, PassTally())
            self.note_rendered(rec.projector, rows, rendered)
            try:
                result = session.settle_page(
                    ticket, keys, rendered, capacity=self._config.window_capacity
                )
            except PageInterrupted:
                continue
            for delta in result.deltas:
                self.emit(rec, delta)
            return result
        raise PageInterrupted("the window kept being re-snapshotted; try the page again")

    async def fetch(
        self, projector: str, key: JsonValue, principal: Any,
        applier: RlsApplier[Any] | None = None,
    ) -> Any | None:
        """The view of ``key`` for ``principal``, read exactly as a session
        renders it (same store, same RLS regime, same visibility), or None.
        A failed read raises a `DatabaseError`."""
        row = await self.fetch_row(projector, key, principal, applier)
        return None if row is None else self.projector(projector).project(row, principal)

    async def fetch_row(
        self, projector: str, key: JsonValue, principal: Any,
        applier: RlsApplier[Any] | None = None,
    ) -> Any | None:
        """The row behind `fetch`'s view (the same read and gate), or None
        when ``principal`` does not see it: the blob download's gate."""
        proj = self.projector(projector)
        self._check_applier(proj, applier)
        async with self.reading(proj, principal, applier) as conn:
            rows = await proj.STORE.read_many(conn, [key])
        gate = proj.render_gate(principal)
        return next((row for row in rows if gate(row)), None)

    async def fetch_window(
        self, projector: str, query: Any, principal: Any,
        applier: RlsApplier[Any] | None = None,
    ) -> list[tuple[KeyText, Any]]:
        """The views populate lists for ``query``, in window order. A failed
        read raises a `DatabaseError`."""
        proj = self.projector(projector)
        self._check_applier(proj, applier)
        gate = proj.render_gate(principal)
        async with self.reading(proj, principal, applier) as conn:
            cx = PopulateCx(principal, None, proj.VISIBILITY.window(principal), conn)
            keys = keyed(await proj.populate(cx, query))
            rows = await proj.STORE.read_many(conn, list(keys.values()))
        by_key = {canonical_json(proj.STORE.key_of(row)): row for row in rows}
        return [
            (text, proj.project(by_key[text], principal))
            for text in keys if text in by_key and gate(by_key[text])
        ]

    @staticmethod
    def _check_applier(proj: Projector[Any, Any, Any, Any], applier: object) -> None:
        if proj.RLS and applier is None:
            raise MissingRlsApplier(f"projector {proj.NAME!r} renders under RLS: no applier")

    # -- reads --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reading(
        self, proj: Projector[Any, Any, Any, Any], principal: Any,
        applier: RlsApplier[Any] | None,
    ) -> AsyncIterator[Conn]:
        # One read-only snapshot per read: populate and the load agree, and
        # no row lock is ever taken. The translation spans acquire, BEGIN,
        # the block (populate's own SQL included) and COMMIT. The acquire is
        # refused to a task already holding a connection of the pool (a
        # handler's fetch); the read's own hooks (the applier, populate, the
        # store's reads) run holding this one: they are refused a second. It
        # is not time-bounded: an attach burst queues for the pool (a
        # lock_timeout bound refused attaches of a 10,000-socket burst).
        with translating(Stage.READ):
            async with self._db.connection(
                "a render read (fetch, fetch_window, page, download)"
            ) as conn, conn.transaction(isolation="repeatable_read", readonly=True):
                if proj.RLS:
                    assert applier is not None
                    await applier.apply(conn, principal)
                yield conn

    @contextlib.asynccontextmanager
    async def reading_one(self) -> AsyncIterator[Conn]:
        """A connection for a read that is one statement (`one_statement`):
        that statement is its own snapshot, so no transaction (no BEGIN,
        no COMMIT) and no release reset (`Database.plain`): the acquire and
        the statement's round trip. Driver errors translate as `reading`'s."""
        with translating(Stage.READ):
            async with self._db.plain() as conn:
                yield conn

    async def populate(
        self, conn: Conn, rec: AttachedSession, cursor: JsonValue
    ) -> dict[KeyText, JsonValue]:
        session = rec.session
        principal = session.principal
        cx = PopulateCx(principal, cursor, rec.projector.VISIBILITY.window(principal), conn)
        return keyed(await rec.projector.populate(cx, session.membership.query))

    async def populate_many(
        self, conn: Conn, proj: Projector[Any, Any, Any, Any], recs: Sequence[AttachedSession]
    ) -> list[dict[KeyText, JsonValue] | None]:
        """Each session's head window (None for a `Keys` window, which has no
        populate), read by one `Projector.populate_many` call. Sessions of
        one cohort with the same memberships and window query see the same
        rows: their window is asked for once."""
        sessions, slots = populate_slots(recs)
        asks = [(PopulateCx(rec.session.principal, None, window_of(rec), conn),
                 rec.session.membership.query) for rec in sessions]
        if not asks:
            return [None] * len(recs)
        lists = await proj.populate_many(asks)
        if len(lists) != len(asks):
            raise ConfigError(
                f"projector {proj.NAME!r}: populate_many listed {len(lists)} windows "
                f"for the {len(asks)} it was asked for"
            )
        windows = [keyed(keys) for keys in lists]
        return [None if slot is None else windows[slot] for slot in slots]

    @staticmethod
    async def load(
        conn: Conn, proj: Projector[Any, Any, Any, Any], keys: Mapping[KeyText, JsonValue],
        tally: PassTally,
    ) -> dict[KeyText, Any]:
        if not keys:
            return {}
        rows = await proj.STORE.read_many(conn, list(keys.values()))
        tally.load(len(rows))
        key_of = proj.STORE.key_of
        return {canonical_json(key_of(row)): row for row in rows}

    @staticmethod
    def project(
        rec: AttachedSession, rows: Mapping[KeyText, Any], scope: Mapping[KeyText, JsonValue],
        tally: PassTally | None = None, views: SharedViews | None = None,
    ) -> dict[KeyText, Any]:
        """The session's visible views of ``scope``: through ``views`` (the
        load's shared projections, which count them) when given, else each
        projected here and counted in ``tally``."""
        out: dict[KeyText, Any] = {}
        gate = rec.gate
        principal = rec.session.principal
        if views is None:
            assert tally is not None
            project = rec.projector.project
            for text in scope:
                row = rows.get(text)
                if row is not None and gate(row):
                    out[text] = project(row, principal)
                    tally.projections += 1
            return out
        view = views.view
        view_key = rec.view_key
        for text in scope:
            row = rows.get(text)
            if row is not None and gate(row):
                out[text] = view(view_key, text, row, principal)
        return out

    @staticmethod
    def project_visible(
        rec: AttachedSession, rows: Mapping[KeyText, Any], scope: Mapping[KeyText, JsonValue],
        visible: set[KeyText], views: SharedViews,
    ) -> dict[KeyText, Any]:
        view = views.view
        view_key = rec.view_key
        principal = rec.session.principal
        return {
            text: view(view_key, text, rows[text], principal) for text in scope if text in visible
        }

    def shared_views(self, proj: Projector[Any, Any, Any, Any]) -> SharedViews:
        """The memo one load's projections go through (see `SharedViews`)."""
        held = self._held_views.get(proj.NAME)
        if held is None:
            held = self._held_views[proj.NAME] = HeldViews()
        return SharedViews(
            proj.project, check=self.debug_views, shares=proj.NAME not in self._unshared,
            held=held,
        )

    def settle_views(
        self, proj: Projector[Any, Any, Any, Any], views: SharedViews, tally: PassTally
    ) -> None:
        """Count the load's projections; a view key found wrong turns its
        projector's sharing off for good, loudly."""
        tally.projections += views.projections
        if views.mismatch is not None and proj.NAME not in self._unshared:
            self._unshared.add(proj.NAME)
            _log.error("projector %s: view_key does not determine the view (%s); "
                       "projecting its views per session from now on", proj.NAME, views.mismatch)

    def note_rendered(
        self, proj: Projector[Any, Any, Any, Any], rows: Mapping[KeyText, Any],
        rendered: Mapping[KeyText, Any],
    ) -> None:
        index = self.indexes.get(proj.NAME)
        if index is not None:
            index.note_rendered(proj, rows, rendered)

    def emit(self, rec: AttachedSession, delta: Delta[Any]) -> None:
        if not rec.stream.put(delta):
            # The subscriber fell too far behind: a Reset replaces the backlog.
            rec.resync = True
            self.wake.set()
            return
        name = rec.projector.NAME
        self.delivered[name] = self.delivered.get(name, 0) + 1

    # -- metrics --------------------------------------------------------------------

    def _count_live(self, projector: str, change: int) -> None:
        count = self._live_by_projector.get(projector, 0) + change
        self._live_by_projector[projector] = count
        if self._metrics is not None:
            self._metrics.set_live_sessions(projector, count)

    def count_reset(self, projector: str, cause: str) -> None:
        """Count one reset of a live session of ``projector`` for ``cause``."""
        if self._metrics is not None:
            self._metrics.add_resets(projector, cause)

    def flush_metrics(self) -> None:
        """Add the deltas enqueued since the last flush to the metric."""
        delivered, self.delivered = self.delivered, {}
        if self._metrics is not None:
            for projector, count in delivered.items():
                self._metrics.add_deltas_delivered(projector, count)

    def failed(self, rec: AttachedSession, reason: str, exc: BaseException | None = None) -> None:
        with in_session(str(rec.session.id)):
            _log.warning("session %s: %s", rec.session.id, reason, exc_info=exc)
        state = rec.session.fail(reason)
        if state.value == "ended":
            self.detach(rec.session.id, rec.session.end_reason or reason)

