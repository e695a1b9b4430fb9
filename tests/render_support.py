"""A synchronous model of the render loop over an in-memory table.

It drives the pure render core exactly as the I/O runtime will (watch,
begin_snapshot, populate, snapshot_keys, go_live, take_held; route,
sessions_for, needs_populate, plan, render), with a dict standing in for
Postgres, so tests can check that every window rebuilt from its deltas
equals the committed state filtered by visibility.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service_engine.impacts.model import Cause, Impact, JsonValue, canonical_json
from service_engine.render import (
    CohortKey,
    Delta,
    Dirty,
    Interest,
    Keys,
    KeyText,
    Population,
    Route,
    Session,
    SessionId,
    WindowReplica,
    keyed,
    principal_key,
)

NOUN = "card"
PROJECTOR = "cards"


@dataclass(frozen=True)
class Row:
    key: int
    cohort: str
    rank: int
    text: str = ""


@dataclass(frozen=True)
class Principal:
    id: str
    cohorts: frozenset[str]


@dataclass(frozen=True)
class RankQuery:
    """Rows ranked at least ``min_rank``; with ``before``, only those ranked
    below it (an older page), at most ``limit``."""

    min_rank: int = 0
    before: int | None = None
    limit: int | None = None


View = tuple[int, str, int]


def visible(row: Row, principal: Principal) -> bool:
    return row.cohort in principal.cohorts


def project(row: Row, principal: Principal) -> View:
    return (row.key, row.text, row.rank)


@dataclass
class Model:
    """The table, the principals, and the sessions with their replicas."""

    rows: dict[int, Row] = field(default_factory=dict)
    principals: dict[str, Principal] = field(default_factory=dict)
    threshold: int = 64
    capacity: int = 1000
    interest: Interest[Session[Principal, View]] = field(default_factory=Interest)
    replicas: dict[SessionId, WindowReplica[View]] = field(default_factory=dict)
    loads: int = 0
    emission: Callable[[Impact], Any] | None = None

    def __post_init__(self) -> None:
        self.interest.register(Route(PROJECTOR, {NOUN: None}, self.emission))

    # -- the "database" -------------------------------------------------------

    def populate(self, principal: Principal, query: RankQuery) -> dict[KeyText, JsonValue]:
        found = [
            row
            for row in self.rows.values()
            if visible(row, principal)
            and row.rank >= query.min_rank
            and (query.before is None or row.rank < query.before)
        ]
        found.sort(key=lambda row: (-row.rank, row.key))
        if query.limit is not None:
            found = found[: query.limit]
        return keyed(row.key for row in found)

    def render(self, session: Session[Principal, View], scope: Mapping[KeyText, JsonValue]) -> dict[KeyText, View]:
        self.loads += 1
        out: dict[KeyText, View] = {}
        principal = session.principal
        for text, key in scope.items():
            row = self.rows.get(key)  # type: ignore[arg-type]
            if row is not None and visible(row, principal):
                out[text] = project(row, principal)
        return out

    def write(self, row: Row, cause: Cause | None = None) -> list[Impact]:
        self.rows[row.key] = row
        return [Impact.entity(NOUN, row.key, cause)]

    def delete(self, key: int) -> list[Impact]:
        self.rows.pop(key, None)
        return [Impact.entity(NOUN, key)]

    def set_cohorts(self, principal_id: str, cohorts: frozenset[str]) -> list[Impact]:
        self.principals[principal_id] = Principal(principal_id, cohorts)
        return [Impact.principal_facts(principal_id, [NOUN])]

    # -- sessions ---------------------------------------------------------------

    def new_session(self, sid: str, principal_id: str, population: Population[Any]) -> Session[Principal, View]:
        principal = self.principals[principal_id]
        session: Session[Principal, View] = Session(
            SessionId(sid), PROJECTOR, principal, principal_key(principal_id),
            CohortKey.of_principal(principal_id), population, repair_attempts=3,
        )
        keys = population.keys if isinstance(population, Keys) else None
        self.interest.watch(session, PROJECTOR, session.principal_key, keys)
        self.replicas[session.id] = WindowReplica()
        return session

    def query_of(self, session: Session[Principal, View]) -> RankQuery:
        query = session.membership.query
        assert isinstance(query, RankQuery)
        return query

    def snapshot(self, session: Session[Principal, View], *, between: Callable[[], None] | None = None) -> None:
        """Attach (or repair, or resnapshot) ``session``; ``between`` runs
        writes after populate and before the load, like a concurrent writer."""
        session.begin_snapshot()
        populated = (
            self.populate(session.principal, self.query_of(session))
            if session.membership.populates else None
        )
        if between is not None:
            between()
        rendered = self.render(session, session.snapshot_keys(populated))
        if session.state.value == "attaching":
            reset = session.go_live(populated, rendered)
        elif session.state.value == "repair_pending":
            reset = session.repaired(populated, rendered)
        else:
            reset = session.resnapshot(populated, rendered)
        self.replicas[session.id].apply(reset)
        held = session.take_held()
        if held is not None:
            self.render_session(session, held)

    def render_session(self, session: Session[Principal, View], dirty: Dirty) -> list[Delta[View]]:
        populated = (
            self.populate(session.principal, self.query_of(session))
            if session.needs_populate(dirty) else None
        )
        plan = session.plan(dirty, populated)
        rendered = self.render(session, plan.scope)
        deltas = session.render(plan, rendered, threshold=self.threshold, caused=dirty.caused)
        self.replicas[session.id].apply_all(deltas)
        return deltas

    def deliver(self, *batches: list[Impact]) -> dict[SessionId, list[Delta[View]]]:
        """One render pass over ``batches`` (each one commit's impacts)."""
        frame = self.interest.route(list(batches))
        for session in list(self.interest.watched(PROJECTOR)):
            if session.principal_key in frame.principals:
                principal = self.principals[session.principal.id]
                session.refresh_principal(principal, session.principal_key, session.cohort)
        out: dict[SessionId, list[Delta[View]]] = {}
        for name, dirty in frame.projectors.items():
            for session in self.interest.sessions_for(name, dirty):
                if session.holding:
                    session.hold(dirty)
                else:
                    out[session.id] = self.render_session(session, dirty)
        return out

    # -- what a window should hold ---------------------------------------------

    def expected(self, session: Session[Principal, View], *, discovery_all: bool = True) -> dict[KeyText, View]:
        """The committed rows the session's window must show.

        `Keys`: the fixed keys that exist and are visible. A populated window
        whose populate lists every visible row (``discovery_all``): every
        visible row. An authoritative query: populate's result.
        """
        principal = self.principals[session.principal.id]
        population = session.membership.population
        if isinstance(population, Keys):
            candidates = [self.rows[k] for k in population.keys.values() if k in self.rows]  # type: ignore[index]
            return {canonical_json(r.key): project(r, principal) for r in candidates if visible(r, principal)}
        if session.membership.rule.value == "authoritative":
            keys = self.populate(principal, self.query_of(session))
        else:
            keys = keyed(r.key for r in self.rows.values() if visible(r, principal))
        return {text: project(self.rows[k], principal) for text, k in keys.items()}  # type: ignore[index]
