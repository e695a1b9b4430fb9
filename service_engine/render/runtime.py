"""The render runtime: sessions over the LISTEN channel, loads via ``read_many``.

`RenderRuntime` owns the registered projectors, the live sessions and the
render loop. It drives the pure core (`Interest`, `Session`, `Membership`,
paging) with real reads:

* ``attach`` registers the session's interest *before* its snapshot (the
  connect barrier): what commits while the snapshot reads is held and
  replayed after the Reset, so nothing between snapshot and live is lost or
  delivered twice;
* the render loop drains every delivery the listener queued, folds them into
  one frame, loads each (projector, cohort)'s dirty rows **once** with
  ``read_many``, then projects, gates and diffs per session;
* a `Reconnected` from the transport re-snapshots every live session from
  committed state; a failed render or snapshot sends the session to repair,
  retried by the beat, and ends it after ``repair_attempts`` failures.

Every read is a plain read-only transaction: the render side never takes a
row lock (s130).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from ..config import EngineConfig
from ..db.pool import Database
from ..db.types import Conn
from ..errors import AttachError, AttachShuttingDown, DuplicateRegistration, EngineError
from ..impacts.model import JsonValue, canonical_json
from ..impacts.transport import Delivery, ImpactChannel
from ..view import (
    Projector,
    RlsApplier,
    Unrestricted,
    check_projector,
    check_window_spec,
    cohort_of,
    reset_threshold_for,
    route_of,
)
from .cohort import CohortKey, CohortMismatch, check_cohort, group_by_cohort, principal_key
from .deltas import Delta, KeyText, Reset
from .paging import NoLiveSession, PageInterrupted, PageResult
from .population import (
    Dirty,
    Interest,
    Keys,
    MembershipRule,
    RenderPlan,
    WindowSpec,
    keyed,
)
from .report import PassReport, PassTally
from .session import Session, SessionId, new_session_id, parse_session_id

_log = logging.getLogger(__name__)

V = TypeVar("V")

PrincipalRefresh = Callable[[Any], Awaitable[Any]]
"""Re-resolves a principal (same id) after a principal-facts impact."""


class UnknownProjectorName(AttachError):
    """An attach or fetch named a projector that is not registered."""


class SessionEnded(EngineError):
    """The session ended; ``reason`` says why (``session_max_age``, a
    failed principal refresh, repeated render failures, shutdown)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"session ended: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _End:
    reason: str


class SessionStream(Generic[V]):
    """A subscriber's side of one session: its deltas in revision order.

    Iterate it; iteration stops when the session ends (``end_reason`` says
    why). `aclose` detaches the session. Putting never blocks: past
    ``capacity`` undelivered deltas the backlog is dropped and the session
    re-snapshotted, so a slow subscriber gets a Reset, never a gap.
    """

    def __init__(self, session_id: SessionId, capacity: int, on_close: Callable[[], None]) -> None:
        self.id = session_id
        self.capacity = capacity
        self._queue: asyncio.Queue[Delta[V] | _End] = asyncio.Queue()
        self._on_close = on_close
        self.end_reason: str | None = None
        self.waiting = 0
        self.last_seen = time.monotonic()

    def _put(self, item: Delta[V] | _End) -> bool:
        """False when the backlog overflowed (the caller re-snapshots)."""
        if isinstance(item, _End):
            self._queue.put_nowait(item)
            return True
        if self._queue.qsize() >= self.capacity:
            while not self._queue.empty():
                self._queue.get_nowait()
            return False
        self._queue.put_nowait(item)
        return True

    def pending(self) -> int:
        return self._queue.qsize()

    def get_nowait(self) -> Delta[V] | None:
        """The next queued delta, or None (None also after the end)."""
        if self._queue.empty():
            return None
        item = self._queue.get_nowait()
        if isinstance(item, _End):
            self.end_reason = item.reason
            self._queue.put_nowait(item)
            return None
        return item

    async def next(self) -> Delta[V]:
        """The next delta; raises `SessionEnded` once the session ended."""
        self.waiting += 1
        try:
            item = await self._queue.get()
        finally:
            self.waiting -= 1
            self.last_seen = time.monotonic()
        if isinstance(item, _End):
            self.end_reason = item.reason
            self._queue.put_nowait(item)  # every later read sees the end too
            raise SessionEnded(item.reason)
        return item

    def __aiter__(self) -> AsyncIterator[Delta[V]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Delta[V]]:
        while True:
            try:
                yield await self.next()
            except SessionEnded:
                return

    async def aclose(self) -> None:
        self._on_close()


@dataclass(slots=True)
class _Attached:
    """The runtime's record of one session."""

    session: Session[Any, Any]
    projector: Projector[Any, Any, Any, Any]
    stream: SessionStream[Any]
    applier: RlsApplier[Any] | None
    gate: Callable[[Any], bool]
    memberships: frozenset[Hashable] | None
    """The principal's cohorts when the projector gates by its declared
    Visibility alone (the render pass then indexes rows by cohort)."""
    resync: bool = False


@dataclass(frozen=True, slots=True)
class _PopulateCx:
    principal: Any
    cursor: JsonValue
    cohorts: frozenset[Hashable] | None
    conn: Conn


class RenderRuntime:
    """Projectors, sessions and the render loop of one pod."""

    def __init__(
        self,
        db: Database,
        config: EngineConfig,
        channel: ImpactChannel,
        *,
        accepting: Callable[[], None] = lambda: None,
        debug: bool = __debug__,
    ) -> None:
        self._db = db
        self._config = config
        self._channel = channel
        self._accepting = accepting
        self._debug = debug
        self._projectors: dict[str, Projector[Any, Any, Any, Any]] = {}
        self._interest: Interest[Session[Any, Any]] = Interest()
        self._sessions: dict[SessionId, _Attached] = {}
        self._local: list[tuple[_Attached, Dirty]] = []
        self._wake = asyncio.Event()
        self._refresh: PrincipalRefresh | None = None
        # The cohort index of projectors gated by their declared Visibility
        # (see `_CohortIndex`), by projector name.
        self._indexes: dict[str, _CohortIndex] = {}
        self.last_report = PassReport()
        self.on_report: Callable[[PassReport], None] | None = None

    # -- registration -----------------------------------------------------

    def register_projector(self, projector: Projector[Any, Any, Any, Any]) -> None:
        """Register ``projector`` under its ``NAME`` (its noun binds to its
        store's key type through ``STORE.key_of``)."""
        check_projector(projector)
        if projector.NAME in self._projectors:
            raise DuplicateRegistration("projector", projector.NAME)
        self._interest.register(route_of(projector))
        self._projectors[projector.NAME] = projector
        if _indexable(projector):
            self._indexes[projector.NAME] = _CohortIndex()

    def register_principal_refresh(self, refresh: PrincipalRefresh) -> None:
        """How a principal is re-resolved after its facts changed. A refresh
        that raises ends that principal's sessions (fail-closed)."""
        if self._refresh is not None:
            raise DuplicateRegistration("principal refresh", "principal_refresh")
        self._refresh = refresh

    def projector(self, name: str) -> Projector[Any, Any, Any, Any]:
        try:
            return self._projectors[name]
        except KeyError:
            raise UnknownProjectorName(f"no projector named {name!r}") from None

    @property
    def sessions(self) -> Mapping[SessionId, _Attached]:
        return self._sessions

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
        RLS assertion does not fit the projector.
        """
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
        session: Session[Any, Any] = Session(
            sid, proj.NAME, principal, pkey, cohort_of(proj, principal), window.population,
            repair_attempts=self._config.repair_attempts, now=time.monotonic(),
        )
        stream: SessionStream[Any] = SessionStream(
            sid, max(1024, 2 * self._config.window_capacity), lambda: self.detach(sid, "closed")
        )
        rec = _Attached(
            session, proj, stream, applier, proj.render_gate(principal),
            _memberships(proj, principal),
        )
        self._sessions[sid] = rec
        population = window.population
        # The connect barrier: interest first, then the snapshot.
        keys = keyed(population.keys.values()) if isinstance(population, Keys) else None
        self._interest.watch(session, proj.NAME, pkey, None if keys is None else keys.keys())
        index = self._indexes.get(proj.NAME)
        if index is not None:
            index.join(rec)
        try:
            await self._snapshot(rec)
        except BaseException:
            self.detach(sid, "attach failed")
            raise
        return stream

    def detach(self, session_id: SessionId, reason: str) -> None:
        """End a session and stop routing to it (idempotent)."""
        rec = self._sessions.pop(session_id, None)
        if rec is None:
            return
        self._interest.unwatch(rec.session)
        index = self._indexes.get(rec.projector.NAME)
        if index is not None:
            index.leave(rec)
        if not rec.session.ended:
            rec.session.end(reason)
        rec.stream._put(_End(reason))

    def end_all(self, reason: str) -> None:
        for sid in list(self._sessions):
            self.detach(sid, reason)

    async def page(self, session_id: str, principal: Any, cursor: JsonValue) -> PageResult[Any]:
        """Append the page of older keys before ``cursor`` behind the live
        window, delivered as Upserts on the session's stream.

        Only a live session of this pod owned by ``principal`` may page:
        anything else is `NoLiveSession`, whatever the reason.
        """
        try:
            sid = parse_session_id(session_id)
        except AttachError:
            raise NoLiveSession() from None
        for _ in range(3):
            rec = self._sessions.get(sid)
            from .session import authorize_page

            session = authorize_page(rec.session if rec else None, principal_key(principal.id))
            assert rec is not None
            ticket = session.open_page(cursor)
            async with self._reading(rec.projector, session.principal, rec.applier) as conn:
                keys = await self._populate(conn, rec, cursor)
                rows = await self._load(conn, rec.projector, keys, PassTally())
            rendered = self._project(rec, rows, keys, PassTally())
            self._note_held(rec.projector, rows, rendered)
            try:
                result = session.settle_page(
                    ticket, keys, rendered, capacity=self._config.window_capacity
                )
            except PageInterrupted:
                continue
            for delta in result.deltas:
                self._emit(rec, delta)
            return result
        raise PageInterrupted("the window kept being re-snapshotted; try the page again")

    async def fetch(
        self, projector: str, key: JsonValue, principal: Any,
        applier: RlsApplier[Any] | None = None,
    ) -> Any | None:
        """The view of ``key`` for ``principal``, read exactly as a session
        renders it (same store, same RLS regime, same visibility), or None."""
        proj = self.projector(projector)
        self._check_applier(proj, applier)
        async with self._reading(proj, principal, applier) as conn:
            rows = await proj.STORE.read_many(conn, [key])
        gate = proj.render_gate(principal)
        for row in rows:
            if gate(row):
                return proj.project(row, principal)
        return None

    async def fetch_window(
        self, projector: str, query: Any, principal: Any,
        applier: RlsApplier[Any] | None = None,
    ) -> list[tuple[KeyText, Any]]:
        """The views populate lists for ``query``, in window order."""
        proj = self.projector(projector)
        self._check_applier(proj, applier)
        gate = proj.render_gate(principal)
        async with self._reading(proj, principal, applier) as conn:
            cx = _PopulateCx(principal, None, proj.VISIBILITY.window(principal), conn)
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
            from ..view import MissingRlsApplier

            raise MissingRlsApplier(f"projector {proj.NAME!r} renders under RLS: no applier")

    # -- reads --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _reading(
        self, proj: Projector[Any, Any, Any, Any], principal: Any,
        applier: RlsApplier[Any] | None,
    ) -> AsyncIterator[Conn]:
        # One read-only snapshot per read: populate and the load agree, and
        # no row lock is ever taken.
        async with self._db.pool.acquire() as conn, conn.transaction(
            isolation="repeatable_read", readonly=True
        ):
            if proj.RLS:
                assert applier is not None
                await applier.apply(conn, principal)
            yield conn

    async def _populate(
        self, conn: Conn, rec: _Attached, cursor: JsonValue
    ) -> dict[KeyText, JsonValue]:
        session = rec.session
        principal = session.principal
        cx = _PopulateCx(principal, cursor, rec.projector.VISIBILITY.window(principal), conn)
        return keyed(await rec.projector.populate(cx, session.membership.query))

    @staticmethod
    async def _load(
        conn: Conn, proj: Projector[Any, Any, Any, Any], keys: Mapping[KeyText, JsonValue],
        tally: PassTally,
    ) -> dict[KeyText, Any]:
        if not keys:
            return {}
        rows = await proj.STORE.read_many(conn, list(keys.values()))
        tally.loads += 1
        tally.rows += len(rows)
        key_of = proj.STORE.key_of
        return {canonical_json(key_of(row)): row for row in rows}

    @staticmethod
    def _project(
        rec: _Attached, rows: Mapping[KeyText, Any], scope: Mapping[KeyText, JsonValue],
        tally: PassTally,
    ) -> dict[KeyText, Any]:
        out: dict[KeyText, Any] = {}
        gate = rec.gate
        project = rec.projector.project
        principal = rec.session.principal
        for text in scope:
            row = rows.get(text)
            if row is not None and gate(row):
                out[text] = project(row, principal)
                tally.projections += 1
        return out

    @staticmethod
    def _project_visible(
        rec: _Attached, rows: Mapping[KeyText, Any], scope: Mapping[KeyText, JsonValue],
        visible: set[KeyText], tally: PassTally,
    ) -> dict[KeyText, Any]:
        project = rec.projector.project
        principal = rec.session.principal
        out = {text: project(rows[text], principal) for text in scope if text in visible}
        tally.projections += len(out)
        return out

    # -- snapshots ------------------------------------------------------------------

    async def _snapshot(self, rec: _Attached, tally: PassTally | None = None) -> None:
        """Reset ``rec`` from committed state (attach, repair or resnapshot)."""
        tally = tally or PassTally()
        session = rec.session
        state = session.state.value
        session.begin_snapshot()
        index = self._indexes.get(rec.projector.NAME)
        if index is not None:
            index.snapshotting.add(session)
        try:
            async with self._reading(rec.projector, session.principal, rec.applier) as conn:
                populated = (
                    await self._populate(conn, rec, None) if session.membership.populates else None
                )
                keys = session.snapshot_keys(populated)
                rows = await self._load(conn, rec.projector, keys, tally)
            rendered = self._project(rec, rows, keys, tally)
            self._note_held(rec.projector, rows, rendered)
        except Exception as exc:
            if index is not None:
                index.snapshotting.discard(session)
            if state == "attaching":
                raise
            self._failed(rec, f"snapshot failed: {type(exc).__name__}: {exc}", exc)
            tally.failures += 1
            return
        if index is not None:
            index.snapshotting.discard(session)
        if state == "attaching":
            reset: Reset[Any] = session.go_live(populated, rendered)
        elif state == "repair_pending":
            reset = session.repaired(populated, rendered)
        else:
            reset = session.resnapshot(populated, rendered)
        rec.resync = False
        self._emit(rec, reset)
        tally.deltas += 1
        tally.resets += 1
        held = session.take_held()
        if held is not None:
            self._local.append((rec, held))
            self._wake.set()

    def _note_held(
        self, proj: Projector[Any, Any, Any, Any], rows: Mapping[KeyText, Any],
        rendered: Mapping[KeyText, Any],
    ) -> None:
        index = self._indexes.get(proj.NAME)
        if index is not None:
            cohorts = proj.VISIBILITY.cohorts
            for key in rendered:
                index.held(key).update(cohorts(rows[key]))

    def _emit(self, rec: _Attached, delta: Delta[Any]) -> None:
        if not rec.stream._put(delta):
            # The subscriber fell too far behind: a Reset replaces the backlog.
            rec.resync = True
            self._wake.set()

    def _failed(self, rec: _Attached, reason: str, exc: BaseException | None = None) -> None:
        _log.warning("session %s: %s", rec.session.id, reason, exc_info=exc)
        state = rec.session.fail(reason)
        if state.value == "ended":
            self.detach(rec.session.id, rec.session.end_reason or reason)

    # -- the render loop ------------------------------------------------------------

    async def run(self) -> None:
        """The render worker: one pass per batch of deliveries."""
        channel = self._channel
        while True:
            if not len(channel) and not self._local and not self._needs_resync():
                self._wake.clear()
                waiter = asyncio.ensure_future(channel.wait())
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait({waiter, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                    woken.cancel()
            deliveries: list[Delivery] = []
            while (item := channel.get_nowait()) is not None:
                deliveries.append(item)
            await self.render_pass(deliveries)

    def _needs_resync(self) -> bool:
        return any(rec.resync for rec in self._sessions.values())

    async def render_pass(self, deliveries: Sequence[Delivery]) -> PassReport:
        """Render one frame: ``deliveries`` plus the replays queued by
        snapshots and any session whose subscriber fell behind."""
        started = time.perf_counter()
        tally = PassTally()
        frame = self._interest.route(deliveries)
        tally.impacts = frame.impacts
        local, self._local = self._local, []
        if frame.reconnected is not None:
            _log.info("impact continuity lost (%s): re-snapshotting sessions",
                      frame.reconnected.reason)
            for rec in list(self._sessions.values()):
                if rec.session.holding:
                    rec.session.hold(Dirty(everything=True))
                elif rec.session.live:
                    await self._snapshot(rec, tally)
            frame.projectors.clear()
            local = []
        for rec in [r for r in self._sessions.values() if r.resync and r.session.live]:
            await self._snapshot(rec, tally)
        if frame.principals:
            await self._refresh_principals(frame.principals)

        work: dict[str, dict[Session[Any, Any], Dirty]] = {}
        lean: dict[str, Dirty] = {}
        for name, dirty in frame.projectors.items():
            index = self._indexes.get(name)
            if index is not None and not dirty.everything:
                # Discovering sessions are found from the loaded rows' cohorts
                # (`_render_group`); only those that must populate, or hold
                # fixed keys, are named here.
                for session in index.snapshotting:
                    session.hold(dirty)
                explicit: set[Session[Any, Any]] = set()
                if dirty.principals:
                    explicit |= self._interest.principal_sessions(name, dirty.principals)
                if dirty.keys:
                    explicit |= self._interest.keyed_sessions(name, dirty.keys)
                    explicit |= index.authoritative
                    lean[name] = dirty
                for session in explicit:
                    if session.live and not session.holding:
                        _merge(work.setdefault(name, {}), session, dirty)
                continue
            for session in self._interest.sessions_for(name, dirty):
                if session.holding:
                    session.hold(dirty)
                elif session.live:
                    # The frame's Dirty is shared, never mutated: a second
                    # source for one session merges into a copy.
                    _merge(work.setdefault(name, {}), session, dirty)
        for rec, dirty in local:
            if rec.session.live and rec.session.id in self._sessions:
                _merge(work.setdefault(rec.projector.NAME, {}), rec.session, dirty)

        for name in {*work, *lean}:
            dirties = work.get(name, {})
            proj = self._projectors[name]
            threshold = reset_threshold_for(proj, self._config.reset_threshold)
            recs = [self._sessions[s.id] for s in dirties if s.id in self._sessions]
            groups = group_by_cohort(r.session for r in recs)
            if self._debug:
                # A cohort() that is not a pure function of the principal
                # would land a session in two cohorts: fail it, loudly.
                for cohort, group in groups.items():
                    for session in list(group):
                        try:
                            check_cohort(cohort, _recompute(proj, session.principal))
                        except CohortMismatch as exc:
                            _log.error("%s", exc)
                            group.remove(session)
                            tally.failures += 1
                            self._failed(self._sessions[session.id], str(exc))
            # Rows read without RLS are the same for every cohort: one load
            # serves the whole frame. Under RLS every cohort is one principal
            # and reads under its own context.
            batches = (
                [[self._sessions[s.id] for g in groups.values() for s in g]]
                if not proj.RLS
                else [[self._sessions[s.id] for s in g] for g in groups.values()]
            )
            for members in batches:
                if not members and name not in lean:
                    continue
                try:
                    await self._render_group(
                        proj, members, dirties, threshold, tally, lean.get(name)
                    )
                except Exception as exc:
                    tally.failures += len(members)
                    for rec in members:
                        if not rec.session.ended:
                            self._failed(rec, f"render failed: {type(exc).__name__}: {exc}", exc)
        report = PassReport(
            impacts=tally.impacts, loads=tally.loads, rows=tally.rows,
            projections=tally.projections, deltas=tally.deltas, resets=tally.resets,
            sessions=tally.sessions, failures=tally.failures,
            duration=time.perf_counter() - started,
        )
        self.last_report = report
        if self.on_report is not None:
            self.on_report(report)
        return report

    async def _render_group(
        self,
        proj: Projector[Any, Any, Any, Any],
        members: list[_Attached],
        dirties: Mapping[Session[Any, Any], Dirty],
        threshold: int,
        tally: PassTally,
        discover: Dirty | None = None,
    ) -> None:
        """Plan every member, load the union of their scopes once, then
        render per session. A session's own fault (its populate, projection
        or visibility) fails that session alone; a failed shared load fails
        the group.

        ``discover`` (indexed projectors) is the frame's change for the
        discovering sessions not named in ``members``: after the load they
        are found through the cohort index — the sessions whose memberships
        meet the rows' cohorts, now or when they last rendered them — so a
        frame costs what the change touches, not the number of sessions.
        """
        principal = members[0].session.principal if members else None
        applier = members[0].applier if members else None
        index = self._indexes.get(proj.NAME)
        planned: list[tuple[_Attached, RenderPlan | None]] = []
        async with self._reading(proj, principal, applier) as conn:
            union: dict[KeyText, JsonValue] = {}
            for rec in members:
                session = rec.session
                dirty = dirties[session]
                try:
                    populated = None
                    if session.needs_populate(dirty):
                        async with conn.transaction():  # a savepoint: isolates a failing populate
                            populated = await self._populate(conn, rec, None)
                    member_plan = session.plan(dirty, populated)
                except Exception as exc:
                    tally.failures += 1
                    self._failed(rec, f"populate failed: {type(exc).__name__}: {exc}", exc)
                    continue
                planned.append((rec, member_plan))
                union.update(member_plan.scope)
            if discover is not None:
                union.update(discover.keys)
            rows = await self._load(conn, proj, union, tally)
        if index is not None and discover is not None:
            named = {rec.session for rec in members}
            for session in index.candidates(proj, discover.keys, rows):
                if session not in named and session.live and not session.holding:
                    planned.append((self._sessions[session.id], None))
        by_cohort = _index_by_cohort(proj, rows) if index is not None else None
        visible_by: dict[frozenset[Hashable], set[KeyText]] = {}
        for rec, plan in planned:
            session = rec.session
            if not session.live:
                continue  # a snapshot began meanwhile: it covers this pass
            change = discover if plan is None else dirties[session]
            assert change is not None
            try:
                if by_cohort is not None and rec.memberships is not None:
                    visible = visible_by.get(rec.memberships)
                    if visible is None:
                        visible = visible_by[rec.memberships] = _visible(by_cohort, rec.memberships)
                    if plan is None:
                        relevant = _relevant(session, change.keys, visible)
                        if not relevant:
                            continue
                        plan = replace(session.plan(change), scope=relevant)
                    rendered = self._project_visible(rec, rows, plan.scope, visible, tally)
                else:
                    assert plan is not None
                    rendered = self._project(rec, rows, plan.scope, tally)
                deltas = session.render(plan, rendered, threshold=threshold, caused=change.caused)
            except Exception as exc:
                tally.failures += 1
                self._failed(rec, f"render failed: {type(exc).__name__}: {exc}", exc)
                continue
            tally.sessions += 1
            for delta in deltas:
                self._emit(rec, delta)
                tally.deltas += 1
                if isinstance(delta, Reset):
                    tally.resets += 1
        if index is not None:
            index.settle(proj, union, rows, discover.keys if discover is not None else {})

    async def _refresh_principals(self, principals: Mapping[str, JsonValue]) -> None:
        for rec in list(self._sessions.values()):
            session = rec.session
            if session.principal_key not in principals or session.ended:
                continue
            if self._refresh is None:
                continue
            try:
                principal = await self._refresh(session.principal)
            except Exception as exc:
                _log.warning("principal refresh failed; ending session %s", session.id,
                             exc_info=exc)
                self.detach(session.id, f"principal refresh failed: {exc}")
                continue
            session.refresh_principal(principal, session.principal_key,
                                      cohort_of(rec.projector, principal))
            rec.gate = rec.projector.render_gate(principal)
            index = self._indexes.get(rec.projector.NAME)
            if index is not None:
                index.leave(rec)
            rec.memberships = _memberships(rec.projector, principal)
            if index is not None:
                index.join(rec)

    # -- the beat ---------------------------------------------------------------------

    async def beat(self) -> None:
        """Repair sessions left repair_pending; end expired sessions."""
        now = time.monotonic()
        ttl = self._config.session_ttl.total_seconds()
        max_age = self._config.session_max_age.total_seconds()
        for rec in list(self._sessions.values()):
            session = rec.session
            # A subscriber waiting on the stream is active right now; an
            # abandoned stream ages from the last time one read it.
            session.touch(now if rec.stream.waiting else rec.stream.last_seen)
            reason = session.expiry(now, ttl=ttl, max_age=max_age)
            if reason is not None:
                self.detach(session.id, reason)
            elif session.state.value == "repair_pending" and not session.snapshotting:
                await self._snapshot(rec)


def _indexable(proj: Projector[Any, Any, Any, Any]) -> bool:
    """Rows read without RLS and gated by the declared cohorts alone."""
    return (
        not proj.RLS
        and type(proj).visible is Projector.visible
        and not isinstance(proj.VISIBILITY, Unrestricted)
    )


class _CohortIndex:
    """Which discovering sessions a changed row can concern.

    ``members`` maps each cohort to the discovering sessions whose principal
    belongs to it. ``held`` maps each key some session rendered to every
    cohort the row had when a session last rendered it — a superset of the
    cohorts through which any live session holds it — so the sessions that
    must see a change (it is visible to them now, or they hold it and must
    lose it) are exactly the members of the row's old and new cohorts.
    Sessions snapshotting, and authoritative ones (they re-populate on every
    change), are tracked apart.
    """

    __slots__ = ("authoritative", "held_cohorts", "members", "snapshotting")

    def __init__(self) -> None:
        self.members: dict[Hashable, set[Session[Any, Any]]] = {}
        self.held_cohorts: dict[KeyText, set[Hashable]] = {}
        self.snapshotting: set[Session[Any, Any]] = set()
        self.authoritative: set[Session[Any, Any]] = set()

    def join(self, rec: _Attached) -> None:
        rule = rec.session.membership.rule
        if rule is MembershipRule.AUTHORITATIVE:
            self.authoritative.add(rec.session)
        elif rule is MembershipRule.DISCOVERY and rec.memberships is not None:
            for cohort in rec.memberships:
                self.members.setdefault(cohort, set()).add(rec.session)

    def leave(self, rec: _Attached) -> None:
        self.authoritative.discard(rec.session)
        self.snapshotting.discard(rec.session)
        for cohort in rec.memberships or ():
            peers = self.members.get(cohort)
            if peers is not None:
                peers.discard(rec.session)
                if not peers:
                    del self.members[cohort]

    def held(self, key: KeyText) -> set[Hashable]:
        found = self.held_cohorts.get(key)
        if found is None:
            found = self.held_cohorts[key] = set()
        return found

    def candidates(
        self, proj: Projector[Any, Any, Any, Any], keys: Mapping[KeyText, JsonValue],
        rows: Mapping[KeyText, Any],
    ) -> set[Session[Any, Any]]:
        cohorts: set[Hashable] = set()
        for key in keys:
            before = self.held_cohorts.get(key)
            if before:
                cohorts |= before
            row = rows.get(key)
            if row is not None:
                cohorts.update(proj.VISIBILITY.cohorts(row))
        out: set[Session[Any, Any]] = set()
        for cohort in cohorts:
            peers = self.members.get(cohort)
            if peers:
                out |= peers
        return out

    def settle(
        self, proj: Projector[Any, Any, Any, Any], loaded: Mapping[KeyText, JsonValue],
        rows: Mapping[KeyText, Any], changed: Mapping[KeyText, JsonValue],
    ) -> None:
        """After a pass: a changed key was shown to every session that could
        hold it, so its cohorts are now the row's own; any other loaded row
        may have been rendered, so its cohorts are added."""
        cohorts_of = proj.VISIBILITY.cohorts
        for key in loaded:
            row = rows.get(key)
            if key in changed:
                if row is None:
                    self.held_cohorts.pop(key, None)
                else:
                    self.held_cohorts[key] = set(cohorts_of(row))
            elif row is not None:
                self.held(key).update(cohorts_of(row))


def _memberships(proj: Projector[Any, Any, Any, Any], principal: Any) -> frozenset[Hashable] | None:
    """The principal's cohorts, when visibility is exactly the declared
    cohort intersection (not overridden, not Unrestricted)."""
    if type(proj).visible is not Projector.visible or isinstance(proj.VISIBILITY, Unrestricted):
        return None
    return frozenset(proj.VISIBILITY.memberships(principal))


def _index_by_cohort(
    proj: Projector[Any, Any, Any, Any], rows: Mapping[KeyText, Any]
) -> dict[Hashable, list[KeyText]]:
    index: dict[Hashable, list[KeyText]] = {}
    cohorts = proj.VISIBILITY.cohorts
    for text, row in rows.items():
        for cohort in cohorts(row):
            index.setdefault(cohort, []).append(text)
    return index


def _visible(
    index: Mapping[Hashable, list[KeyText]], memberships: frozenset[Hashable]
) -> set[KeyText]:
    visible: set[KeyText] = set()
    for cohort in memberships:
        found = index.get(cohort)
        if found:
            visible.update(found)
    return visible


def _relevant(
    session: Session[Any, Any], keys: Mapping[KeyText, JsonValue], visible: set[KeyText]
) -> dict[KeyText, JsonValue]:
    """The dirty keys this session must render: visible to it, or held by it
    (a held key that is no longer visible is Removed)."""
    held = session.last_sent
    head = session.membership.head
    pages = session.pages
    if not visible and held.keys().isdisjoint(keys) and head.keys().isdisjoint(keys) and (
        not len(pages) or not any(k in pages for k in keys)
    ):
        return {}
    return {k: v for k, v in keys.items() if k in visible or k in held or k in head or k in pages}


def _recompute(proj: Projector[Any, Any, Any, Any], principal: Any) -> Callable[[], CohortKey]:
    return lambda: cohort_of(proj, principal)


def _merge(into: dict[Session[Any, Any], Dirty], session: Session[Any, Any], dirty: Dirty) -> None:
    mine = into.get(session)
    if mine is None:
        into[session] = dirty
        return
    merged = Dirty()
    merged.merge(mine)
    merged.merge(dirty)
    into[session] = merged
