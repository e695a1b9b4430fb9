"""One subscriber's session: an explicit state machine over its window.

States (`SessionState`) and the transitions between them::

    ATTACHING --go_live--------> LIVE --resnapshot--> LIVE
        |                         |
        +--fail--> REPAIR_PENDING <--fail--+  (attempts < repair_attempts)
                      |    \\--repaired--> LIVE
                      +--fail (attempts exhausted)--> ENDED
    any state but ENDED --end--> ENDED

Any other transition raises `IllegalTransition`. The session owns:

* the contiguous **revision** (0 before anything is sent; each delta,
  Resets included, carries exactly the next one);
* **last_sent**: key text -> the view the subscriber holds, in window order;
* the window's membership (`membership.Membership`, the head) and its
  appended pages (`paging.Pages`);
* the **connect barrier**: from `Interest.watch` until the session is live
  and whenever a snapshot is in flight, changes routed to it are *held*
  (`hold`) rather than rendered, and replayed after the snapshot's Reset
  (`take_held`). A change already in the snapshot re-renders to an equal
  view and sends nothing; a change after it is sent once. Nothing between
  snapshot and live is lost or delivered twice;
* repair accounting: `fail` counts consecutive failures and ends the
  session after ``repair_attempts``; a repair is always a fresh snapshot
  (`repaired`), never a Reset rebuilt from the stale ``last_sent``, which
  `fail` discards.

The runtime's duties, in order, for a snapshot (attach, repair, reconnect):
`begin_snapshot` *before* reading anything; populate if
`Membership.populates`; load and render `snapshot_keys`; hand the visible
views to `go_live` / `repaired` / `resnapshot`, enqueue the Reset; then
replay `take_held` as a pass. For a render pass: `needs_populate`, `plan`,
load and render ``plan.scope``, `render`, enqueue the deltas.

A session's identity is `session_id`'s; the diff of one window and the
renders sessions share, `window_diff`'s. All methods are synchronous and
pure, so a call is atomic with respect to the event loop; the runtime's
per-session lock only needs to span the awaits between `open_page` and
`settle_page`, or a snapshot's reads.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from ..failures import ConfigError, EngineError
from ..impacts.model import Cause, JsonValue
from .cohort import CohortKey
from .deltas import Delta, KeyText, Reset, Revision, Upsert
from .interest import Dirty
from .membership import Membership, RenderPlan
from .paging import NoLiveSession, NotPageable, PageInterrupted, PageResult, Pages, PageTicket
from .session_id import SessionId
from .window_diff import SHARED_RENDERS, SharedRender, SharedWindow, diff_into, same_window
from .windows import MembershipRule, Population

__all__ = [
    "DEFAULT_BARRIER_CAPACITY",
    "IllegalTransition",
    "PrincipalChanged",
    "Session",
    "SessionState",
    "authorize_page",
]

P = TypeVar("P")
V = TypeVar("V")

DEFAULT_BARRIER_CAPACITY = 10_000
"""Held entries past which a barrier collapses to "everything changed"."""


class SessionState(enum.Enum):
    ATTACHING = "attaching"
    """Registered for interest, first snapshot not yet delivered."""
    LIVE = "live"
    """Rendering deltas."""
    REPAIR_PENDING = "repair_pending"
    """A render or snapshot failed; waiting for a fresh snapshot."""
    ENDED = "ended"
    """Terminal: unwatch it and drop it."""


_LIVE = SessionState.LIVE


class PrincipalChanged(EngineError):
    """A principal refresh returned a principal with another id: a refresh
    re-resolves the same principal's facts, it never swaps the principal."""


class IllegalTransition(EngineError):
    """A session was asked for a transition its state does not allow: a bug
    in the caller, never a condition to retry."""

    def __init__(self, session: SessionId, state: SessionState, transition: str) -> None:
        super().__init__(f"session {session}: {transition} is illegal in state {state.value}")
        self.session = session
        self.state = state
        self.transition = transition


class Session(Generic[P, V]):
    """The render state of one subscriber (see the module docstring).

    ``principal_key`` is the principal id's canonical text
    (`cohort.principal_key`); ``cohort`` is the projector's cohort for the
    principal, computed once per principal resolution. Times are monotonic
    seconds, supplied by the caller.
    """

    __slots__ = (
        "_held",
        "_shared",
        "_snapshotting",
        "_tickets",
        "attempts",
        "barrier_capacity",
        "cohort",
        "created_at",
        "end_reason",
        "failure",
        "id",
        "last_sent",
        "membership",
        "pages",
        "principal",
        "principal_key",
        "projector",
        "repair_attempts",
        "revision",
        "state",
        "touched_at",
    )

    def __init__(
        self,
        id: SessionId,
        projector: str,
        principal: P,
        principal_key: str,
        cohort: CohortKey,
        population: Population[Any],
        *,
        repair_attempts: int,
        barrier_capacity: int = DEFAULT_BARRIER_CAPACITY,
        now: float = 0.0,
    ) -> None:
        if repair_attempts < 1:
            raise ConfigError("repair_attempts must be positive")
        self.id = id
        self.projector = projector
        self.principal = principal
        self.principal_key = principal_key
        self.cohort = cohort
        self.membership = Membership(population)
        self.pages = Pages()
        self.state = SessionState.ATTACHING
        self.revision: Revision = 0
        self.last_sent: dict[KeyText, V] = {}
        self.attempts = 0
        self.repair_attempts = repair_attempts
        self.barrier_capacity = barrier_capacity
        self.failure: str | None = None
        self.end_reason: str | None = None
        self.created_at = now
        self.touched_at = now
        self._held: Dirty | None = None
        self._shared = False
        """``last_sent`` and the membership's head are shared with other
        sessions (`render_shared`): copy them before changing either."""
        self._snapshotting = False
        self._tickets: list[PageTicket] = []

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.projector} {self.state.value} rev={self.revision}>"

    # -- state --------------------------------------------------------------

    @property
    def live(self) -> bool:
        """Live and not re-snapshotting: a render pass may render it."""
        return self.state is _LIVE and not self._snapshotting

    @property
    def holding(self) -> bool:
        """Changes routed to it must be `hold`-ed, not rendered."""
        return self.state is not SessionState.ENDED and not self.live

    @property
    def ended(self) -> bool:
        return self.state is SessionState.ENDED

    @property
    def snapshotting(self) -> bool:
        return self._snapshotting

    def _illegal(self, transition: str) -> IllegalTransition:
        return IllegalTransition(self.id, self.state, transition)

    # -- the connect barrier ------------------------------------------------

    def hold(self, dirty: Dirty) -> None:
        """Hold a change routed to this session while it is not `live`.

        Held entries are bounded by ``barrier_capacity``: past it the barrier
        collapses to "everything changed", which the replay answers with a
        full re-render.
        """
        if not self.holding:
            raise self._illegal("hold")
        held = self._held
        if held is None:
            held = self._held = Dirty()
        held.merge(dirty)
        if held.size() > self.barrier_capacity:
            held.keys.clear()
            held.caused.clear()
            held.everything = True

    def take_held(self) -> Dirty | None:
        """Return and clear what the barrier held since the snapshot began.

        Call right after enqueueing the snapshot's Reset and replay it as a
        render pass for this session alone (`needs_populate`, `plan`,
        `render`).
        """
        if not self.live:
            raise self._illegal("take_held")
        held, self._held = self._held, None
        return held

    # -- snapshots ----------------------------------------------------------

    def begin_snapshot(self) -> None:
        """Mark a snapshot in flight. Call before populate or any load.

        What the barrier held until now is covered by the snapshot (those
        changes committed before its reads) and is dropped; from here until
        the snapshot completes, changes are held. Pages in flight are
        interrupted.
        """
        if self.state is SessionState.ENDED or self._snapshotting:
            raise self._illegal("begin_snapshot")
        self._snapshotting = True
        self._held = None
        self._interrupt_pages()

    def snapshot_keys(
        self, populated: Mapping[KeyText, JsonValue] | None
    ) -> dict[KeyText, JsonValue]:
        """The keys the snapshot loads and renders, in window order."""
        if not self._snapshotting:
            raise self._illegal("snapshot_keys")
        return self.membership.snapshot_keys(populated, self.pages)

    def go_live(
        self, populated: Mapping[KeyText, JsonValue] | None, rendered: Mapping[KeyText, V],
        shares: list[SharedWindow[V]] | None = None,
    ) -> Reset[V]:
        """ATTACHING -> LIVE with the first snapshot's visible views
        (``shares``: see `_complete`)."""
        return self._complete("go_live", SessionState.ATTACHING, populated, rendered, shares)

    def repaired(
        self, populated: Mapping[KeyText, JsonValue] | None, rendered: Mapping[KeyText, V],
        shares: list[SharedWindow[V]] | None = None,
    ) -> Reset[V]:
        """REPAIR_PENDING -> LIVE with a fresh snapshot from committed state."""
        return self._complete("repaired", SessionState.REPAIR_PENDING, populated, rendered,
                              shares)

    def resnapshot(
        self, populated: Mapping[KeyText, JsonValue] | None, rendered: Mapping[KeyText, V],
        shares: list[SharedWindow[V]] | None = None,
    ) -> Reset[V]:
        """LIVE -> LIVE: a Reset from committed state (reconnect, lane resume)."""
        return self._complete("resnapshot", SessionState.LIVE, populated, rendered, shares)

    def _complete(
        self,
        transition: str,
        source: SessionState,
        populated: Mapping[KeyText, JsonValue] | None,
        rendered: Mapping[KeyText, V],
        shares: list[SharedWindow[V]] | None = None,
    ) -> Reset[V]:
        """The snapshot's end. ``shares`` (one list per batch of snapshots)
        lets sessions completing with equal windows and heads hold one
        window and one head between them (copied before a session changes
        its own, as after `render_shared`); a session with pages holds its
        own."""
        if self.state is not source or not self._snapshotting:
            raise self._illegal(transition)
        membership = self.membership
        membership.settle_snapshot(populated, rendered, self.pages)
        if shares is None or len(self.pages):
            self.last_sent = dict(rendered)
        else:
            head = membership.head
            for share in shares:
                if same_window(share.last, rendered) and same_window(share.head, head):
                    self.last_sent = share.last
                    membership.head = share.head
                    self._shared = True
                    break
            else:
                self.last_sent = dict(rendered)
                if len(shares) < SHARED_RENDERS:
                    shares.append(SharedWindow(self.last_sent, head))
                    self._shared = True
        self.revision += 1
        self.state = SessionState.LIVE
        self._snapshotting = False
        self.attempts = 0
        self.failure = None
        return Reset(self.revision, dict(rendered))

    # -- a render pass ------------------------------------------------------

    def refreshed_by(self, dirty: Dirty) -> bool:
        """Whether ``dirty`` carries a facts change of this session's principal."""
        return self.principal_key in dirty.principals

    def needs_populate(self, dirty: Dirty) -> bool:
        """Whether `plan` needs populate's result for ``dirty``."""
        return self.membership.needs_populate(dirty, refreshed=self.refreshed_by(dirty))

    def plan(
        self,
        dirty: Dirty,
        populated: Mapping[KeyText, JsonValue] | None = None,
        discovered: Mapping[KeyText, JsonValue] | None = None,
    ) -> RenderPlan:
        """The keys to load and render for ``dirty`` (see `Membership.plan`)."""
        if not self.live:
            raise self._illegal("plan")
        return self.membership.plan(
            dirty,
            self.pages,
            refreshed=self.refreshed_by(dirty),
            populated=populated,
            discovered=discovered,
        )

    def render(
        self,
        plan: RenderPlan,
        rendered: Mapping[KeyText, V],
        *,
        threshold: int,
        caused: Sequence[tuple[KeyText, Cause]] = (),
    ) -> list[Delta[V]]:
        """Diff the pass's views against ``last_sent`` and return the deltas.

        ``rendered`` holds the view of every key of ``plan.scope`` whose row
        exists and is visible to the principal; a scoped key missing from it
        is Removed if it was sent. ``caused`` (a PerImpact projector's
        ``Dirty.caused``) first yields one delta per caused impact on a
        scoped key, carrying its cause, even when the view is unchanged; the
        rest is coalesced. When the deltas outnumber ``threshold`` the
        session sends one Reset of the whole new window instead.

        Updates ``last_sent``, the revision and the membership; returns the
        deltas to enqueue, in order.
        """
        if self.state is not _LIVE or self._snapshotting:
            raise self._illegal("render")
        if self._shared:
            self._own()
        last = self.last_sent
        out = diff_into(last, plan, rendered, caused, self.revision)
        self.membership.settle(plan, rendered, self.pages)
        if self._tickets:
            scope, leaving = plan.scope, plan.leaving
            for ticket in self._tickets:
                ticket.touched.update(scope)
                ticket.touched.update(leaving)
        if len(out) > threshold:
            self.revision += 1
            return [Reset(self.revision, dict(last))]
        self.revision += len(out)
        return out

    def render_shared(
        self,
        plan: RenderPlan,
        rendered: Mapping[KeyText, V],
        *,
        threshold: int,
        caused: Sequence[tuple[KeyText, Cause]] = (),
        renders: list[SharedRender[V]],
    ) -> list[Delta[V]]:
        """`render`, once for every session that holds an equal window.

        ``renders`` is the memo of one ``(plan, rendered, caused)``: the
        sessions of a pass's group that share the plan and the views. A
        session whose ``last_sent`` and head are those of a render in it
        (the same objects, or equal ones in the same order) takes that
        render's result: the
        new ``last_sent`` and head (shared, copied before any change of
        this session's own: `_own`), its revision moved by as many deltas,
        and the same delta objects (their revisions are the first
        session's; a stream numbers what its reader takes, so each reader
        still sees its own contiguous revisions). Otherwise it renders as
        `render` does, into a copy, and adds that render to the memo. A
        session with pages or a page in flight renders alone (`render`).
        """
        if self.state is not _LIVE or self._snapshotting:
            raise self._illegal("render")
        if self._tickets or self.pages._count:  # (its len, per session of a pass)
            return self.render(plan, rendered, threshold=threshold, caused=caused)
        last = self.last_sent
        membership = self.membership
        head = membership.head
        for entry in renders:
            # (Identity first, inline: a cohort's sessions mostly hold the very same.)
            if ((entry.old_last is last or same_window(entry.old_last, last))
                    and (entry.old_head is head or same_window(entry.old_head, head))):
                break
        else:
            if len(renders) >= SHARED_RENDERS:
                return self.render(plan, rendered, threshold=threshold, caused=caused)
            new_last = dict(last)
            out = diff_into(new_last, plan, rendered, caused, self.revision)
            membership.head = dict(head)
            membership.settle(plan, rendered, self.pages)
            entry = SharedRender(last, head, new_last, membership.head, out,
                                 len(out) > threshold)
            renders.append(entry)
        self.last_sent = entry.last
        membership.head = entry.head
        self._shared = True
        if entry.reset:
            self.revision += 1
            return [Reset(self.revision, dict(entry.last))]
        self.revision += len(entry.deltas)
        return entry.deltas

    def _own(self) -> None:
        """Copy ``last_sent`` and the head this session shares, before it
        changes them in place."""
        self.last_sent = dict(self.last_sent)
        self.membership.head = dict(self.membership.head)
        self._shared = False

    # -- the principal ------------------------------------------------------

    def refresh_principal(self, principal: P, principal_key: str, cohort: CohortKey) -> None:
        """Adopt a re-resolved principal (same id) and its cohort."""
        if self.state is SessionState.ENDED:
            raise self._illegal("refresh_principal")
        if principal_key != self.principal_key:
            raise PrincipalChanged(
                f"session {self.id}: a refreshed principal must keep the session's principal id"
            )
        self.principal = principal
        self.cohort = cohort

    # -- failure and the end ------------------------------------------------

    def fail(self, reason: str) -> SessionState:
        """A render, snapshot or repair failed: count it and drop ``last_sent``.

        Returns the new state: REPAIR_PENDING (repair with a fresh snapshot)
        or, on the ``repair_attempts``-th consecutive failure, ENDED.
        """
        if self.state is SessionState.ENDED:
            raise self._illegal("fail")
        self.attempts += 1
        self.failure = reason
        self._snapshotting = False
        # The next Reset must come from committed state, never from this.
        self.last_sent = {}
        self._interrupt_pages()
        if self.attempts >= self.repair_attempts:
            self._finish(f"{self.attempts} consecutive failures: {reason}")
        else:
            self.state = SessionState.REPAIR_PENDING
        return self.state

    def end(self, reason: str) -> None:
        """Any state but ENDED -> ENDED. Unwatch the session afterwards."""
        if self.state is SessionState.ENDED:
            raise self._illegal("end")
        self._finish(reason)

    def _finish(self, reason: str) -> None:
        self.state = SessionState.ENDED
        self.end_reason = reason
        self._snapshotting = False
        self._held = None
        self.last_sent = {}
        self._interrupt_pages()

    # -- expiry ---------------------------------------------------------------

    def touch(self, now: float) -> None:
        """Record subscriber activity (resets the ``session_ttl`` clock)."""
        self.touched_at = now

    def expiry(self, now: float, *, ttl: float, max_age: float) -> str | None:
        """Why the session must end at ``now``, or ``None``.

        ``"session_max_age"`` once it has lived ``max_age`` seconds (end it
        with the stream-closing signal: the client reconnects with a fresh
        passport); ``"session_ttl"`` once idle for ``ttl`` seconds.
        """
        if now - self.created_at >= max_age:
            return "session_max_age"
        if now - self.touched_at >= ttl:
            return "session_ttl"
        return None

    # -- paging ---------------------------------------------------------------

    def open_page(self, cursor: JsonValue) -> PageTicket:
        """Start a page: call before reading the page's rows.

        Raises `NotPageable` for a `Keys` window, `PageInterrupted` while a
        snapshot is in flight (run the page again after it), and
        `IllegalTransition` when the session is not live.
        """
        if self.state is not SessionState.LIVE:
            raise self._illegal("open_page")
        if self._snapshotting:
            raise PageInterrupted("the window is being re-snapshotted")
        if self.membership.rule is MembershipRule.FIXED:
            raise NotPageable("a Keys window holds fixed keys and has no pages")
        ticket = PageTicket(cursor)
        self._tickets.append(ticket)
        return ticket

    def settle_page(
        self,
        ticket: PageTicket,
        keys: Mapping[KeyText, JsonValue],
        rendered: Mapping[KeyText, V],
        *,
        capacity: int,
    ) -> PageResult[V]:
        """Append a rendered page behind the window and return its deltas.

        ``keys`` is populate's result for the page's cursor, in order;
        ``rendered`` the visible views among them. Keys already held, or
        looked at by a render pass since the ticket opened, are skipped (the
        pass's view is the committed one). The rest are appended as a page
        (releasing the oldest pages silently past ``capacity``) and
        delivered as Upserts on the contiguous revision, never a Reset.
        Raises `PageInterrupted` when the window was re-snapshotted, failed
        or ended meanwhile: run the page again.
        """
        if ticket.closed or ticket not in self._tickets:
            raise self._illegal("settle_page")
        ticket.closed = True
        self._tickets.remove(ticket)
        if ticket.interrupted:
            raise PageInterrupted("the window was reset while the page rendered")
        if not self.live:
            raise self._illegal("settle_page")
        if self._shared:
            self._own()
        last = self.last_sent
        head = self.membership.head
        touched = ticket.touched
        pages = self.pages
        fresh: dict[KeyText, JsonValue] = {}
        skipped: list[KeyText] = []
        for key, value in keys.items():
            if key not in rendered:
                continue
            if key in last or key in touched or key in head or key in pages:
                skipped.append(key)
            else:
                fresh[key] = value
        appended = pages.append(fresh, head_size=len(head), capacity=capacity)
        for key in appended.released:
            last.pop(key, None)  # released silently: no Remove
        rev = self.revision
        deltas: list[Upsert[V]] = []
        for key in appended.accepted:
            view = rendered[key]
            rev += 1
            deltas.append(Upsert(rev, key, view))
            last[key] = view
        self.revision = rev
        return PageResult(tuple(deltas), appended.released, tuple(skipped), appended.truncated)

    def _interrupt_pages(self) -> None:
        for ticket in self._tickets:
            ticket.interrupted = True


def authorize_page(session: Session[Any, Any] | None, principal_key: str) -> Session[Any, Any]:
    """Return ``session`` if it is live and owned by ``principal_key``.

    Raises `NoLiveSession` otherwise (unknown here, another principal's, or
    not live), with one message for every case.
    """
    if (
        session is None
        or session.state is not SessionState.LIVE
        or session.principal_key != principal_key
    ):
        raise NoLiveSession()
    return session
