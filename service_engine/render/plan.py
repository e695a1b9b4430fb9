"""Planning a render pass: which sessions need what, from one routed frame.

`plan_frame` is the pure step between routing and loading: given the
`RenderFrame` the impacts were folded into, the replays the snapshots
queued, the `Interest` table and the projectors' cohort indexes, it names,
per projector, the sessions that render and the change each renders
(`ProjectorWork`), and the changes a session not yet live must hold
instead (``holds``). It reads sessions' states and never changes them, so
the same inputs always plan the same pass. `batches` then splits one
projector's sessions into the groups that share one load; `latest_causes`
folds a PerImpact change to its latest cause per key when a pass is behind.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..impacts.model import Cause
from .cohort import CohortKey
from .cohort_index import CohortIndex
from .deltas import KeyText
from .interest import Dirty, Interest, RenderFrame
from .session import Session

__all__ = ["FramePlan", "ProjectorWork", "batches", "latest_causes", "plan_frame"]

S = TypeVar("S", bound=Hashable)

AnySession = Session[Any, Any]


@dataclass(slots=True)
class ProjectorWork:
    """One projector's share of a frame.

    ``dirties`` maps each session that renders to the change it renders (a
    session reached twice gets a merged copy; the frame's own `Dirty` is
    shared, never mutated). ``discover`` is set for a projector with a
    cohort index: the frame's change for its discovering sessions, which
    the pass finds from the loaded rows' cohorts instead of naming them here.
    """

    dirties: dict[AnySession, Dirty] = field(default_factory=dict)
    discover: Dirty | None = None


@dataclass(slots=True)
class FramePlan:
    """What one pass renders (``projectors``, in frame order) and what the
    sessions still attaching or snapshotting hold for their replay (``holds``)."""

    projectors: dict[str, ProjectorWork] = field(default_factory=dict)
    holds: list[tuple[AnySession, Dirty]] = field(default_factory=list)

    def work(self, projector: str) -> ProjectorWork:
        found = self.projectors.get(projector)
        if found is None:
            found = self.projectors[projector] = ProjectorWork()
        return found

    def render(self, session: AnySession, dirty: Dirty) -> None:
        """Plan ``session`` to render ``dirty`` (merged with what it already has)."""
        dirties = self.work(session.projector).dirties
        mine = dirties.get(session)
        if mine is None:
            dirties[session] = dirty
            return
        merged = Dirty()
        merged.merge(mine)
        merged.merge(dirty)
        dirties[session] = merged


def plan_frame(
    frame: RenderFrame,
    replays: Iterable[tuple[AnySession, Dirty]],
    interest: Interest[AnySession],
    indexes: Mapping[str, CohortIndex],
) -> FramePlan:
    """Plan the pass that renders ``frame`` and the snapshots' ``replays``.

    A frame that lost continuity plans nothing: every session is
    re-snapshotted, and the snapshots cover its changes and the replays.
    Otherwise each projector's dirty set goes to the sessions
    `Interest.sessions_for` names — held by a session not yet live, rendered
    by a live one — except on an indexed projector (see `ProjectorWork`),
    where only the sessions that must populate or hold fixed keys are named
    and the snapshotting ones hold. A replay renders its live session; on an
    indexed projector it also carries the frame's change, since naming the
    session takes it out of discovery (otherwise a key it holds that changed
    in this very frame would never be rendered to it).
    """
    plan = FramePlan()
    if frame.reconnected is not None:
        return plan
    for name, dirty in frame.projectors.items():
        index = indexes.get(name)
        if index is not None and not dirty.everything:
            _plan_indexed(plan, name, dirty, interest, index)
            continue
        for session in interest.sessions_for(name, dirty):
            if session.holding:
                plan.holds.append((session, dirty))
            elif session.live:
                plan.render(session, dirty)
    for session, dirty in replays:
        if not session.live:
            continue
        work = plan.projectors.get(session.projector)
        if work is not None and work.discover is not None and session not in work.dirties:
            # The pass's discovery step skips the sessions the plan names: a
            # replaying session renders the frame's change with its own.
            plan.render(session, work.discover)
        plan.render(session, dirty)
    return plan


def _plan_indexed(
    plan: FramePlan, name: str, dirty: Dirty, interest: Interest[AnySession], index: CohortIndex
) -> None:
    plan.holds.extend((session, dirty) for session in index.snapshotting)
    named: set[AnySession] = set()
    if dirty.principals:
        named |= interest.principal_sessions(name, dirty.principals)
    if dirty.keys:
        named |= interest.keyed_sessions(name, dirty.keys)
        named |= index.authoritative
        plan.work(name).discover = dirty
    for session in named:
        if session.live and not session.holding:
            plan.render(session, dirty)


def batches(rls: bool, groups: Mapping[CohortKey, list[S]]) -> list[list[S]]:
    """The sessions of one projector that share one load, from its cohort groups.

    Rows read without RLS are the same for every cohort: one load serves the
    whole frame (one batch, empty when only discovery renders). Under RLS
    every cohort is one principal and reads under its own context.
    """
    if not rls:
        return [[session for group in groups.values() for session in group]]
    return [list(group) for group in groups.values()]


def latest_causes(
    caused: Sequence[tuple[KeyText, Cause]],
) -> tuple[list[tuple[KeyText, Cause]], int]:
    """``caused`` with only the last cause of each key (in the order of
    those last causes), and how many earlier ones were folded away."""
    last: dict[KeyText, int] = {}
    for at, (key, _cause) in enumerate(caused):
        last[key] = at
    if len(last) == len(caused):
        return list(caused), 0
    kept = sorted(last.values())
    return [caused[at] for at in kept], len(caused) - len(kept)
