"""The render loop: one pass per batch of deliveries keeps every session current.

`RenderRuntime` is the render worker over a `RenderRegistry` it holds
(``runtime.registry``: the projectors, the sessions and the reads that serve
them; attach, page and fetch are the registry's). `run`
drains what the listener queued into one frame and renders it with
`render_pass`, whose steps are, in order:

1. **route** the deliveries into a `RenderFrame` (`Interest.route`);
2. **recover**: a `Reconnected` re-snapshots every live session from
   committed state, a session whose subscriber fell behind is re-snapshotted,
   refreshed principals are adopted;
3. **plan** which sessions need what (`plan.plan_frame`, pure), and hold the
   changes of sessions not yet live;
4. **load** each batch of sessions sharing a load (one per projector, or one
   per cohort under RLS): populate where a plan needs it, one ``read_many``
   for the union of their scopes;
5. **render**: project, gate and diff per session, and enqueue the deltas;
6. **report** the frame as a `PassReport`.

Overload degrades, never stalls writers. The pass shares its event loop
with the pod's HTTP mutations and its subscribers' socket writes, so it runs
in *slices*: after ``SLICE_SESSIONS`` sessions given deltas or
``SLICE_SECONDS`` of work it yields the loop (``asyncio.sleep(0)``), and the
subscribers it woke and a mutation's next step run before its next slice.
A pass drains every delivery queued while the last one ran, so several
writes to one key render once. After a pass that is *behind* (it lasted
``BEHIND_SECONDS`` or more) the next pass, draining several commits, folds a
PerImpact projector's causes to the latest per key (`latest_causes`); when
a behind pass had to shed, the loop pauses ``BEHIND_PAUSE`` of its duration
before the next, leaving the loop to writers. A subscriber that falls behind gets collapsed deltas
(`SessionStream`) or, past its capacity, a Reset from committed state.

A failed render or snapshot sends the session to repair, retried by the beat,
and ends it after ``repair_attempts`` failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import EngineConfig
from ..db.pool import Database
from ..db.types import Conn
from ..impacts.model import Cause, Delivery, JsonValue
from ..impacts.transport import CHANNEL_OVERFLOW, ImpactChannel
from ..metrics import Metrics
from ..persistence.crud import CrudStore
from .cohort import CohortKey, CohortMismatch, check_cohort, group_by_cohort
from .cohort_index import index_by_cohort, relevant_keys, visible_keys
from .deltas import Delta, KeyText, Reset
from .interest import Dirty, RenderFrame
from .membership import RenderPlan
from .plan import FramePlan, batches, latest_causes, plan_frame
from .projector import Projector, cohort_of, reset_threshold_for
from .registry import AttachedSession, RenderRegistry
from .report import PassReport, PassTally
from .session import Session
from .sharing import SharedViews, view_key_of
from .window_diff import SharedRender

__all__ = ["BEHIND_SECONDS", "SLICE_SECONDS", "SLICE_SESSIONS", "RenderRuntime"]

_log = logging.getLogger(__name__)

SLICE_SESSIONS = 16
"""Sessions given deltas per slice of a pass: each wakes a subscriber whose
frame write runs when the slice yields, so this bounds the work the loop
runs before it polls sockets again (with ``SLICE_SECONDS``); each yield
costs a loop turn (a poll of every socket), so a slice is not one session."""
SLICE_SECONDS = 0.001
"""A slice's own time bound (sessions rendered with nothing to send)."""
BEHIND_SECONDS = 0.025
"""A pass that lasted this long is behind: the next pass folds causes to
the latest per key (when it drains several commits) and waits its turn."""
BEHIND_PAUSE = 1.0
"""After a pass that was behind and shed (a stream collapsed, or causes
folded), the render loop waits this fraction of the pass's duration before
the next one: when it cannot keep up, the render side (its subscribers'
frame writes included, which run between its slices) takes at most about
half the loop, the rest stays for mutations, and what commits meanwhile
coalesces into the next pass. A pass that keeps up never waits."""


class _Slice:
    """When a pass yields the loop (see the module)."""

    __slots__ = ("enabled", "sessions", "started", "yields")

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.started = time.perf_counter()
        self.sessions = 0
        self.yields = 0

    def due(self, delivered: bool) -> bool:
        """Count one session (given deltas or not); True when the slice is
        over and the pass must `pause` (synchronous: most sessions end no
        slice, and cost no coroutine)."""
        if not self.enabled:
            return False
        if delivered:
            self.sessions += 1
            if self.sessions >= SLICE_SESSIONS:
                return True
        return time.perf_counter() - self.started >= SLICE_SECONDS

    async def pause(self) -> None:
        """Yield the loop between two slices."""
        await asyncio.sleep(0)
        self.yields += 1
        self.sessions = 0
        self.started = time.perf_counter()

    async def tick(self, delivered: bool) -> None:
        if self.due(delivered):
            await self.pause()


@dataclass(slots=True)
class _Batch:
    """Sessions of one projector that share one load."""

    proj: Projector[Any, Any, Any, Any]
    members: list[AttachedSession]
    dirties: Mapping[Session[Any, Any], Dirty]
    discover: Dirty | None
    threshold: int
    pass_number: int
    """The pass's number (`RenderRegistry.planned`)."""
    behind: bool = False
    """The pass is behind: PerImpact causes fold to the latest per key."""


class _Group:
    """What the discovering sessions of one membership set and view key
    share in a pass: when they see every changed key, one plan and one map
    of views (``rendered`` None: they see part of it, each plans its own),
    and then the renders of the windows they hold (`Session.render_shared`:
    sessions holding equal windows are diffed once)."""

    __slots__ = ("plan", "rendered", "renders", "verified")

    def __init__(self, plan: RenderPlan | None) -> None:
        self.plan = plan
        self.rendered: dict[KeyText, Any] | None = None
        self.renders: list[SharedRender[Any]] = []
        self.verified = False


@dataclass(slots=True)
class _Loaded:
    """A batch after its load: each session's plan (``None``: a discovering
    session found through the cohort index), the keys loaded, the rows, and
    what the batch's sessions share: the projected views (`SharedViews`), the
    discovering sessions' plan and views per membership set and view key,
    the folded causes per change."""

    batch: _Batch
    planned: list[tuple[AttachedSession, RenderPlan | None]]
    loaded: dict[KeyText, JsonValue]
    rows: dict[KeyText, Any]
    by_cohort: dict[Hashable, list[KeyText]] | None
    views: SharedViews
    _visible: dict[frozenset[Hashable], set[KeyText]] = field(default_factory=dict)
    _groups: dict[tuple[frozenset[Hashable], Hashable], _Group] = field(default_factory=dict)
    _last_group: tuple[frozenset[Hashable], Hashable, _Group] | None = None
    _folded: dict[int, tuple[Dirty, list[tuple[KeyText, Cause]], int]] = field(
        default_factory=dict)
    delivered: int = 0
    """Deltas the batch enqueued (added to the metric once, not per session)."""

    def visible_to(self, memberships: frozenset[Hashable]) -> set[KeyText]:
        """The loaded keys a principal of ``memberships`` sees (computed once
        per distinct membership set)."""
        found = self._visible.get(memberships)
        if found is None:
            assert self.by_cohort is not None
            found = self._visible[memberships] = visible_keys(self.by_cohort, memberships)
        return found

    def group(
        self, rec: AttachedSession, change: Dirty, visible: set[KeyText]
    ) -> _Group:
        """The discovering sessions' share for ``rec``'s membership set and
        view key (``rec.memberships`` is set: the projector is indexed)."""
        memberships = rec.memberships
        assert memberships is not None
        view_key = rec.view_key
        last = self._last_group
        if last is not None and last[0] is memberships and last[1] is view_key:
            # Sessions hold interned membership sets and view keys: the
            # sessions of one cohort follow each other with the same ones.
            return last[2]
        slot = (memberships, view_key)
        found = self._groups.get(slot)
        if found is not None:
            self._last_group = (memberships, view_key, found)
        if found is None:
            keys = change.keys
            every = all(key in visible for key in keys)
            # A discovering window's plan for a change is the change itself
            # (`Membership.plan`): one plan serves every such session.
            found = self._groups[slot] = _Group(RenderPlan(keys) if every and keys else None)
            self._last_group = (memberships, view_key, found)
        return found

    def causes(self, change: Dirty) -> tuple[Sequence[tuple[KeyText, Cause]], int]:
        """``change.caused``, folded to the latest per key when the pass is
        behind (once per change, however many sessions render it), and how
        many causes that folded away."""
        caused = change.caused
        if not self.batch.behind or len(caused) < 2:
            return caused, 0
        found = self._folded.get(id(change))
        if found is None or found[0] is not change:
            latest, folded = latest_causes(caused)
            found = self._folded[id(change)] = (change, latest, folded)
        return found[1], found[2]


class RenderRuntime:
    """The render loop of one pod over its `registry`."""

    def __init__(
        self,
        db: Database,
        config: EngineConfig,
        channel: ImpactChannel,
        *,
        accepting: Callable[[], None] = lambda: None,
        debug: bool = __debug__,
        metrics: Metrics | None = None,
    ) -> None:
        self.registry = RenderRegistry(db, config, accepting=accepting, metrics=metrics)
        """The projectors, the sessions and their reads (attach, page, fetch)."""
        self._config = config
        self._metrics = metrics
        self._channel = channel
        self._debug = debug
        self.registry.debug_views = debug
        self.last_report = PassReport()
        self.on_report: Callable[[PassReport], None] | None = None
        self._behind = False
        """The last pass lasted `BEHIND_SECONDS` or more."""

    # -- the render loop ------------------------------------------------------------

    async def run(self) -> None:
        """The render worker: one pass per batch of deliveries."""
        channel = self._channel
        while True:
            if not len(channel) and not self.registry.replays and not self._needs_resync():
                self.registry.wake.clear()
                waiter = asyncio.ensure_future(channel.wait())
                woken = asyncio.ensure_future(self.registry.wake.wait())
                try:
                    await asyncio.wait({waiter, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                    woken.cancel()
            deliveries: list[Delivery] = []
            while (item := channel.get_nowait()) is not None:
                deliveries.append(item)
            report = await self.render_pass(deliveries)
            if self._behind and (report.collapsed or report.coalesced):
                # Its subscribers fell behind: leave the loop to the writers.
                await asyncio.sleep(report.duration * BEHIND_PAUSE)
            else:
                # A pass with nothing to read awaits nothing: never hold the
                # loop across passes.
                await asyncio.sleep(0)

    def _needs_resync(self) -> bool:
        # Only a live session is re-snapshotted by a pass (`_recover`); one
        # pending repair or mid-snapshot is the beat's or that snapshot's.
        return any(rec.resync and rec.session.live for rec in self.registry.sessions.values())

    async def render_pass(self, deliveries: Sequence[Delivery]) -> PassReport:
        """Render one frame: ``deliveries`` plus the replays queued by
        snapshots and any session whose subscriber fell behind."""
        started = time.perf_counter()
        tally = PassTally()
        shedding = self._config.render_shedding
        behind = shedding and self._behind and len(deliveries) > 1
        tally.behind = behind
        slicer = _Slice(shedding)
        frame = self._route(deliveries, tally)
        # Taken before recovery: a snapshot it takes queues its own replay
        # for the next pass.
        replays = self._take_replays()
        await self._recover(frame, tally)
        plan = plan_frame(frame, replays, self.registry.interest, self.registry.indexes)
        self._hold(plan)
        self.registry.planned += 1
        for batch in self._batches(plan, tally):
            batch.behind = behind
            with self._failing_together(batch, tally):
                loaded = await self._load_batch(batch, tally, slicer)
                await self._render_batch(loaded, tally, slicer)
        tally.slices = slicer.yields + 1
        return self._report(tally, started)

    # -- 1. route ---------------------------------------------------------------------

    def _route(self, deliveries: Sequence[Delivery], tally: PassTally) -> RenderFrame:
        frame = self.registry.interest.route(deliveries)
        tally.impacts = frame.impacts
        return frame

    def _take_replays(self) -> list[tuple[Session[Any, Any], Dirty]]:
        replays, self.registry.replays = self.registry.replays, []
        return [(rec.session, dirty) for rec, dirty in replays]

    # -- 2. recover -------------------------------------------------------------------

    async def _recover(self, frame: RenderFrame, tally: PassTally) -> None:
        """Re-snapshot what lost continuity; adopt refreshed principals."""
        if frame.reconnected is not None:
            _log.info("impact continuity lost (%s): re-snapshotting sessions",
                      frame.reconnected.reason)
            cause = "overflow" if frame.reconnected.reason == CHANNEL_OVERFLOW else "reconnect"
            live: list[AttachedSession] = []
            for rec in list(self.registry.sessions.values()):
                if rec.session.holding:
                    rec.session.hold(Dirty(everything=True))
                elif rec.session.live:
                    live.append(rec)
            await self.registry.snapshots.snapshot_all(live, tally, cause=cause)
        # Their subscribers fell behind and their streams overflowed.
        behind = [r for r in self.registry.sessions.values() if r.resync and r.session.live]
        if behind:
            await self.registry.snapshots.snapshot_all(behind, tally, cause="overflow")
        if frame.principals:
            await self._refresh_principals(frame.principals)

    async def _refresh_principals(self, principals: Mapping[str, JsonValue]) -> None:
        if self.registry.principal_refresh is None:
            return
        for rec in list(self.registry.sessions.values()):
            session = rec.session
            if session.principal_key not in principals or session.ended:
                continue
            try:
                principal = await self.registry.principal_refresh(session.principal)
                view_key = view_key_of(rec.projector, principal)
            except Exception as exc:
                _log.warning("principal refresh failed; ending session %s", session.id,
                             exc_info=exc)
                self.registry.detach(session.id, f"principal refresh failed: {exc}")
                continue
            session.refresh_principal(principal, session.principal_key,
                                      cohort_of(rec.projector, principal))
            self.registry.view_keys.release(rec.view_key)
            rec.view_key = self.registry.view_keys.take(view_key)
            index = self.registry.indexes.get(rec.projector.NAME)
            if index is not None:
                index.leave(session, rec.memberships)
            self.registry.gates.release(rec.projector, rec.memberships)
            rec.gate, rec.memberships = self.registry.gates.take(rec.projector, principal)
            if index is not None:
                index.join(session, rec.memberships)

    # -- 3. plan ----------------------------------------------------------------------

    @staticmethod
    def _hold(plan: FramePlan) -> None:
        for session, dirty in plan.holds:
            session.hold(dirty)

    def _batches(self, plan: FramePlan, tally: PassTally) -> Iterator[_Batch]:
        """Each projector's planned sessions, grouped into the batches that
        share one load (in debug, after the cohort purity check)."""
        for name, work in plan.projectors.items():
            proj = self.registry.projector(name)
            live = self.registry.sessions
            recs = {s: live[s.id] for s in work.dirties if s.id in live}
            groups = group_by_cohort(recs)
            if self._debug:
                self._fail_impure_cohorts(proj, groups, recs, tally)
            threshold = reset_threshold_for(proj, self._config.reset_threshold)
            for members in [[recs[s] for s in batch] for batch in batches(proj.RLS, groups)]:
                if members or work.discover is not None:
                    yield _Batch(
                        proj, members, work.dirties, work.discover, threshold, self.registry.planned
                    )

    def _fail_impure_cohorts(
        self, proj: Projector[Any, Any, Any, Any],
        groups: Mapping[CohortKey, list[Session[Any, Any]]],
        recs: Mapping[Session[Any, Any], AttachedSession], tally: PassTally,
    ) -> None:
        """A cohort() that is not a pure function of the principal would land
        a session in two cohorts: take it out of its group and fail it, loudly."""
        for cohort, group in groups.items():
            for session in list(group):
                mismatch = _cohort_mismatch(proj, cohort, session)
                if mismatch is not None:
                    _log.error("%s", mismatch)
                    group.remove(session)
                    tally.failures += 1
                    self.registry.failed(recs[session], str(mismatch))

    @contextlib.contextmanager
    def _failing_together(self, batch: _Batch, tally: PassTally) -> Iterator[None]:
        """A failure that is no one session's own (the shared load) fails the batch."""
        try:
            yield
        except Exception as exc:
            tally.failures += len(batch.members)
            for rec in batch.members:
                if not rec.session.ended:
                    self.registry.failed(rec, f"render failed: {type(exc).__name__}: {exc}", exc)

    # -- 4. load ----------------------------------------------------------------------

    async def _load_batch(self, batch: _Batch, tally: PassTally, slicer: _Slice) -> _Loaded:
        """Plan every member (populating where its plan needs it), load the
        union of their scopes once, and find the discovering sessions the
        change concerns through the cohort index — so a frame costs what the
        change touches, not the number of sessions. A member's own populate
        failure fails that member alone."""
        members = batch.members
        principal = members[0].session.principal if members else None
        applier = members[0].applier if members else None
        planned: list[tuple[AttachedSession, RenderPlan | None]] = []
        union: dict[KeyText, JsonValue] = {}
        dirties = batch.dirties
        if _one_statement_read(batch.proj) and not any(
            rec.session.needs_populate(dirties[rec.session]) for rec in members
        ):
            # The pass's whole read is the one read_many: its own snapshot.
            reading = self.registry.reading_one()
        else:
            reading = self.registry.reading(batch.proj, principal, applier)
        async with reading as conn:
            for rec in members:
                member_plan = await self._plan_member(conn, rec, batch.dirties[rec.session], tally)
                if member_plan is not None:
                    planned.append((rec, member_plan))
                    union.update(member_plan.scope)
                await slicer.tick(False)
            if batch.discover is not None:
                union.update(batch.discover.keys)
            rows = await self.registry.load(conn, batch.proj, union, tally)
        planned.extend((rec, None) for rec in self._discovered(batch, rows))
        indexed = batch.proj.NAME in self.registry.indexes
        by_cohort = index_by_cohort(batch.proj, rows) if indexed else None
        views = self.registry.shared_views(batch.proj)
        return _Loaded(batch, planned, union, rows, by_cohort, views)

    async def _plan_member(
        self, conn: Conn, rec: AttachedSession, dirty: Dirty, tally: PassTally
    ) -> RenderPlan | None:
        """The session's plan for ``dirty``; None when its populate failed
        (the session is failed alone)."""
        session = rec.session
        try:
            populated = None
            if session.needs_populate(dirty):
                async with conn.transaction():  # a savepoint: isolates a failing populate
                    populated = await self.registry.populate(conn, rec, None)
            return session.plan(dirty, populated)
        except Exception as exc:
            tally.failures += 1
            self.registry.failed(rec, f"populate failed: {type(exc).__name__}: {exc}", exc)
            return None

    def _discovered(self, batch: _Batch, rows: Mapping[KeyText, Any]) -> list[AttachedSession]:
        index = self.registry.indexes.get(batch.proj.NAME)
        if index is None or batch.discover is None:
            return []
        # A named session renders the frame's change through its own plan
        # (`plan_frame` gives a replaying one the frame's change too).
        named = {rec.session for rec in batch.members}
        sessions = self.registry.sessions
        # (A live session is never holding.)
        return [
            sessions[session.id]
            for session in index.candidates(batch.proj, batch.discover.keys, rows)
            if session.live and session not in named
        ]

    # -- 5. render --------------------------------------------------------------------

    async def _render_batch(self, loaded: _Loaded, tally: PassTally, slicer: _Slice) -> None:
        batch = loaded.batch
        render_member = self._render_member
        due = slicer.due
        for rec, plan in loaded.planned:
            # A session that ended or began a snapshot while the pass yielded
            # is skipped by _render_member's own check.
            if due(render_member(loaded, rec, plan, tally)):
                await slicer.pause()
        self.registry.settle_views(batch.proj, loaded.views, tally)
        if loaded.delivered:
            name = batch.proj.NAME
            self.registry.delivered[name] = self.registry.delivered.get(name, 0) + loaded.delivered
        index = self.registry.indexes.get(batch.proj.NAME)
        if index is not None:
            changed = batch.discover.keys if batch.discover is not None else {}
            index.settle(batch.proj, loaded.loaded, loaded.rows, changed)

    def _render_member(
        self, loaded: _Loaded, rec: AttachedSession, plan: RenderPlan | None, tally: PassTally
    ) -> bool:
        """Project, gate and diff one session; its own fault fails it alone.
        True when it was given deltas."""
        session = rec.session
        batch = loaded.batch
        if not session.live or rec.live_since >= batch.pass_number:
            # A snapshot began or completed while this pass loaded: it (and
            # its replay) covers the pass, whose rows may be older than it.
            return False
        change = batch.discover if plan is None else batch.dirties[session]
        assert change is not None
        caused: Sequence[tuple[KeyText, Cause]] = change.caused
        if batch.behind and len(caused) > 1:
            caused, folded = loaded.causes(change)
            tally.coalesced += folded
        try:
            projected = self._project_member(loaded, rec, plan, change)
            if projected is None:
                return False
            plan, rendered, renders = projected
            if renders is None:
                deltas = session.render(plan, rendered, threshold=batch.threshold, caused=caused)
            else:
                deltas = session.render_shared(
                    plan, rendered, threshold=batch.threshold, caused=caused, renders=renders)
        except Exception as exc:
            tally.failures += 1
            self.registry.failed(rec, f"render failed: {type(exc).__name__}: {exc}", exc)
            return False
        if deltas:
            self._deliver(loaded, rec, deltas, tally)
        else:
            tally.sessions += 1
        return bool(deltas)

    def _project_member(
        self, loaded: _Loaded, rec: AttachedSession, plan: RenderPlan | None, change: Dirty,
    ) -> tuple[RenderPlan, dict[KeyText, Any], list[SharedRender[Any]] | None] | None:
        """The session's plan, its visible views and, when they are its
        group's, the group's memo of renders; None when a discovering
        session turns out to hold and see none of the change. Discovering
        sessions of one membership set and view key that see the whole
        change share one plan and one map of views."""
        views = loaded.views
        if loaded.by_cohort is None or rec.memberships is None:
            assert plan is not None
            return plan, self.registry.project(rec, loaded.rows, plan.scope, views=views), None
        memberships = rec.memberships
        if plan is None:
            last = loaded._last_group
            if last is not None and last[0] is memberships and last[1] is rec.view_key:
                # The session before it was of the same group (a cohort's
                # sessions follow each other): its visible keys are not needed.
                group = last[2]
            else:
                group = loaded.group(rec, change, loaded.visible_to(memberships))
            plan = group.plan
            if plan is not None and rec.view_key is not None and views.shares:
                rendered = group.rendered
                if rendered is None:
                    rendered = group.rendered = self.registry.project_visible(
                        rec, loaded.rows, plan.scope, loaded.visible_to(memberships), views)
                    return plan, rendered, group.renders
                if group.verified or views.verify(
                    rec.view_key, rendered, loaded.rows, rec.session.principal
                ):
                    group.verified = True
                    return plan, rendered, group.renders
                # The view key was found wrong: this session projects its own.
        visible = loaded.visible_to(memberships)
        if plan is None:
            relevant = relevant_keys(rec.session, change.keys, visible)
            if not relevant:
                return None
            plan = RenderPlan(relevant)
        rendered = self.registry.project_visible(rec, loaded.rows, plan.scope, visible, views)
        return plan, rendered, None

    def _deliver(
        self, loaded: _Loaded, rec: AttachedSession, deltas: Sequence[Delta[Any]],
        tally: PassTally,
    ) -> None:
        stream = rec.stream
        backlog = stream._backlog
        collapsed = backlog.collapsed
        put = stream.put
        tally.sessions += 1
        tally.deltas += len(deltas)
        for delta in deltas:
            if put(delta):
                loaded.delivered += 1
            else:
                # The subscriber fell too far behind: a Reset replaces the backlog.
                rec.resync = True
                self.registry.wake.set()
            if type(delta) is Reset:
                # More keys changed than the reset threshold: one Reset instead.
                tally.resets += 1
                self.registry.count_reset(rec.projector.NAME, "threshold")
        if backlog.collapsed != collapsed:
            tally.collapsed += backlog.collapsed - collapsed

    # -- 6. report --------------------------------------------------------------------

    def _report(self, tally: PassTally, started: float) -> PassReport:
        report = tally.freeze(time.perf_counter() - started)
        self._behind = report.duration >= BEHIND_SECONDS
        self.last_report = report
        if self._metrics is not None:
            self._metrics.observe_render_pass(report.duration)
        self.registry.flush_metrics()
        if self.on_report is not None:
            self.on_report(report)
        return report

    # -- the beat ---------------------------------------------------------------------

    async def beat(self) -> None:
        """Repair sessions left repair_pending; end expired sessions."""
        self.registry.flush_metrics()  # what attach snapshots enqueued between passes
        now = time.monotonic()
        ttl = self._config.session_ttl.total_seconds()
        max_age = self._config.session_max_age.total_seconds()
        for rec in list(self.registry.sessions.values()):
            session = rec.session
            # A subscriber waiting on the stream is active right now; an
            # abandoned stream ages from the last time one read it.
            session.touch(now if rec.stream.waiting else rec.stream.last_seen)
            reason = session.expiry(now, ttl=ttl, max_age=max_age)
            if reason is not None:
                self.registry.detach(session.id, reason)
            elif session.state.value == "repair_pending" and not session.snapshotting:
                await self.registry.snapshots.snapshot(rec, tally=None)


def _one_statement_read(proj: Projector[Any, Any, Any, Any]) -> bool:
    """Whether a pass's load for ``proj`` is one statement when no member
    populates: no RLS setting to apply first, and the store's ``read_many``
    is `CrudStore`'s one batched query (a store of its own may issue
    several, which must share one snapshot)."""
    store = proj.STORE
    return (not proj.RLS and isinstance(store, CrudStore)
            and type(store).read_many is CrudStore.read_many)


def _cohort_mismatch(
    proj: Projector[Any, Any, Any, Any], cohort: CohortKey, session: Session[Any, Any]
) -> CohortMismatch | None:
    try:
        check_cohort(cohort, lambda: cohort_of(proj, session.principal))
    except CohortMismatch as exc:
        return exc
    return None
