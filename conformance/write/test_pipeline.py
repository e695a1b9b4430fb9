"""The write pipeline against real Postgres: locks, limits, gates, faults, outcomes.

Each test states the property it proves. The counter sample
(`sample_counter`) supplies the aggregates and handlers; impacts are
observed for real, on a dedicated LISTEN connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from service_engine import Database
from service_engine.clock import Timestamp
from service_engine.db.locks import aggregate_lock_key
from service_engine.embedded import ProvisionedDatabase
from service_engine.errors import ShuttingDown
from service_engine.gates import ActionName, Reason, affordances, check_gates_match_affordances
from service_engine.impacts import Cause, Impact
from service_engine.persistence import DomainEvent, erase, keys
from service_engine.pipeline import (
    DATABASE_FAULT_MESSAGE,
    DatabaseError,
    Mutation,
    MutationError,
    OneShot,
    OutboxRow,
    SecretSpent,
    Stage,
    Success,
)
from service_engine.testing.faults import InjectFault

from ..support.harness import owner_connection
from ..support.sample_counter import (
    ACTIONS,
    ADMIN,
    NOBODY,
    NOUN,
    STYLES,
    WRITER,
    CrudCounter,
    EdaCounter,
    Principal,
    SoftCounter,
    assign_group,
    create_counter,
    executor_for,
    freeze,
    import_counters,
    increment,
    invite,
    listen_impacts,
    redact_person,
)

IMPACTS_METRIC = "service_engine_impacts_committed_total"


@contextlib.asynccontextmanager
async def holding_advisory_lock(db: Database, store_type: str, key: object) -> AsyncIterator[None]:
    """Another session holds the pipeline's advisory lock on (store_type, key)."""
    conn = await db.connect_dedicated()
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", aggregate_lock_key(store_type, key))
        yield
    finally:
        await conn.close()


async def counter_state(db: Database, style: type[Any], key: str) -> Any:
    async with db.pool.acquire() as conn:
        counter = await style.Store.load(conn, key)
    return None if counter is None else counter.observed()


# -- locks ----------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
async def test_a_held_lock_past_lock_timeout_is_retryable(db: Database, style: type[Any]) -> None:
    """A command that waits on the aggregate's advisory lock past
    ``lock_timeout`` answers the retryable ``lock_timeout``; once the lock
    is released the same command succeeds."""
    executor = executor_for(db, lock_timeout=timedelta(milliseconds=200))
    await executor.ack(WRITER, create_counter, style, "held")
    async with holding_advisory_lock(db, style.Store.store_type, "held"):
        started = time.monotonic()
        outcome = await executor.ack(WRITER, increment, style, "held")
        waited = time.monotonic() - started
    assert isinstance(outcome, MutationError)
    assert (outcome.code, outcome.retryable) == ("lock_timeout", True)
    assert 0.15 < waited < 2.0
    assert await executor.ack(WRITER, increment, style, "held") == Success()
    assert (await counter_state(db, style, "held"))[1] == 1


async def test_a_held_row_lock_is_retryable_too(db: Database) -> None:
    """The store's ``SELECT ... FOR UPDATE`` runs under the same bound."""
    executor = executor_for(db, lock_timeout=timedelta(milliseconds=200))
    await executor.ack(WRITER, create_counter, CrudCounter, "row")
    async with db.pool.acquire() as other, other.transaction():
        await other.execute("SELECT 1 FROM sample_counter_crud WHERE id = 'row' FOR UPDATE")
        outcome = await executor.ack(WRITER, increment, CrudCounter, "row")
    assert isinstance(outcome, MutationError)
    assert (outcome.code, outcome.retryable) == ("lock_timeout", True)


async def test_the_lock_is_per_store_type_and_key(db: Database) -> None:
    """Holding (CrudCounter, "k") blocks nothing but that aggregate: the
    same key of another store type and another key of the same store
    proceed."""
    executor = executor_for(db, lock_timeout=timedelta(milliseconds=300))
    for style in (CrudCounter, SoftCounter):
        await executor.ack(WRITER, create_counter, style, "k")
    await executor.ack(WRITER, create_counter, CrudCounter, "k2")
    async with holding_advisory_lock(db, CrudCounter.Store.store_type, "k"):
        blocked = await executor.ack(WRITER, increment, CrudCounter, "k")
        other_style = await executor.ack(WRITER, increment, SoftCounter, "k")
        other_key = await executor.ack(WRITER, increment, CrudCounter, "k2")
    assert isinstance(blocked, MutationError) and blocked.code == "lock_timeout"
    assert other_style == other_key == Success()


# -- impacts ----------------------------------------------------------------------


async def test_one_commit_stages_one_group(db: Database) -> None:
    """Every impact of a commit (entity, caused, principal facts) travels as
    one framed group, sent only at commit, with one entity impact per
    ``(noun, key)``: a caused impact replaces the causeless one of its key."""
    executor = executor_for(db)

    async def several(cx: Mutation[Principal]) -> None:
        await create_counter(cx, CrudCounter, "g1")
        await create_counter(cx, CrudCounter, "g2")
        cx.impact_caused(NOUN, "g1", Cause("counter.touched", {"why": "test"}))
        cx.impact_principal_facts("alice", ["counter"])
        cx.impact(NOUN, "g2")  # a duplicate: staged once

    async with listen_impacts(db) as probe:
        assert await executor.ack(WRITER, several) == Success()
        impacts = await probe.next()
        await probe.assert_quiet()
    assert impacts == [
        Impact.entity(NOUN, "g2"),
        Impact.entity(NOUN, "g1", Cause("counter.touched", {"why": "test"})),
        Impact.principal_facts("alice", ["counter"]),
    ]
    assert len(probe.payloads) == 1


async def test_too_many_impacts_is_refused_naming_the_bulk_path(db: Database) -> None:
    """An ordinary transaction dirtying more than ``impacts_per_commit`` keys
    is refused, names the bulk path, and commits nothing."""
    executor = executor_for(db, impacts_per_commit=5)
    keys_ = [f"many-{i}" for i in range(6)]

    async def create_all(cx: Mutation[Principal]) -> None:
        for key in keys_:
            await create_counter(cx, CrudCounter, key)

    async with listen_impacts(db) as probe:
        outcome = await executor.ack(WRITER, create_all)
        await probe.assert_quiet()
    assert isinstance(outcome, MutationError)
    assert outcome.code == "too_many_impacts" and not outcome.retryable
    assert "impacts_per_commit=5" in outcome.message
    assert "Bulk.impact_all" in outcome.message and "ack_bulk" in outcome.message
    assert await db.pool.fetchval("SELECT count(*) FROM sample_counter_crud") == 0


async def test_bulk_impact_all_stages_one_reset(db: Database) -> None:
    """The bulk path writes every row and stages exactly one projector-reset
    impact for the noun, however many keys it touched."""
    executor = executor_for(db, impacts_per_commit=5)
    keys_ = [f"bulk-{i}" for i in range(20)]
    async with listen_impacts(db) as probe:
        assert await executor.ack_bulk(WRITER, import_counters, SoftCounter, keys_) == Success()
        impacts = await probe.next()
        await probe.assert_quiet()
    assert impacts == [Impact.reset(NOUN)]
    assert await db.pool.fetchval("SELECT count(*) FROM sample_counter_soft") == 20


async def test_impact_at_schedules_with_the_commit(db: Database) -> None:
    """A scheduled impact is written with the command, not notified now, and
    nothing is scheduled by a command that rolls back."""
    executor = executor_for(db)
    at = Timestamp.now() + timedelta(hours=1)

    async def deadline(cx: Mutation[Principal], fail: bool) -> None:
        cx.impact_at(at, NOUN, "d1", Cause("counter.deadline"))
        if fail:
            await increment(cx, CrudCounter, "missing")

    async with listen_impacts(db) as probe:
        assert await executor.ack(WRITER, deadline, True) != Success()
        assert await executor.ack(WRITER, deadline, False) == Success()
        await probe.assert_quiet()
    rows = await db.pool.fetch("SELECT due_at, impacts FROM service_engine.scheduled_impact")
    assert [(Timestamp(r["due_at"]), r["impacts"]) for r in rows] == [
        (at, [{"n": NOUN, "k": "d1", "c": "counter.deadline"}])
    ]


# -- gates and affordances ----------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
async def test_affordance_is_true_exactly_when_the_mutation_is_allowed(
    db: Database, style: type[Any]
) -> None:
    """For every action of the sample, every principal and every state, the
    affordance pass (over the render side's read) and the real mutation,
    run from the same state, agree: allowed, or refused with the same code."""
    executor = executor_for(db)
    checked = 0
    for frozen in (False, True):
        for principal in (NOBODY, WRITER, ADMIN):
            base = f"{int(frozen)}-{principal.id}"
            attempted: dict[ActionName, Reason | None] = {}
            offered = None
            for action, handler in ACTIONS.items():
                key = f"{base}-{action}"  # a fresh copy of the state per attempt
                await executor.ack(ADMIN, create_counter, style, key)
                if frozen:
                    await executor.ack(ADMIN, freeze, style, key)
                async with db.pool.acquire() as conn:
                    [counter] = await style.Store.read_many(conn, [key])
                offered = affordances(counter, principal)
                outcome = await executor.ack(principal, handler, style, key)
                assert isinstance(outcome, Success | MutationError)
                attempted[ActionName(action)] = (
                    None if isinstance(outcome, Success) else outcome.reason
                )
            assert offered is not None
            assert check_gates_match_affordances(offered, attempted) == []
            checked += len(attempted)
    assert checked == 2 * 3 * len(ACTIONS)


# -- constraints roll state and events back together --------------------------------


@pytest.mark.parametrize("style", [CrudCounter, SoftCounter])
@pytest.mark.parametrize(
    ("violation", "code"),
    [("unique", "unique_violation"), ("foreign_key", "foreign_key_violation"),
     ("check", "check_violation")],
)
async def test_a_constraint_violation_rolls_back_state_and_events(
    db: Database, style: type[Any], violation: str, code: str
) -> None:
    """A command that first writes the counter (row and, in soft EDA, a
    fact) and then hits a unique, FK or check violation leaves neither."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, style, "c1")
    await executor.ack(WRITER, create_counter, style, "c2")
    facts_before = await db.pool.fetchval("SELECT count(*) FROM sample_counter_soft_fact")

    async def write_then_violate(cx: Mutation[Principal]) -> None:
        await increment(cx, style, "c1", 5)
        if violation == "unique":
            await create_counter(cx, style, "c2")
        elif violation == "foreign_key":
            await assign_group(cx, style, "c1", "no-such-group")
        else:
            await increment(cx, style, "c2", 2_000_000)

    async with listen_impacts(db) as probe:
        outcome = await executor.ack(WRITER, write_then_violate)
        await probe.assert_quiet()
    assert isinstance(outcome, MutationError)
    assert (outcome.code, outcome.retryable) == (code, False)
    assert "sample_counter" not in outcome.message  # no schema detail on the wire
    assert await counter_state(db, style, "c1") == ("c1", 0, False, "alice")
    assert await db.pool.fetchval("SELECT count(*) FROM sample_counter_soft_fact") == facts_before


async def test_a_violation_rolls_back_full_eda_events_with_it(db: Database) -> None:
    """Events appended to the log in the same command roll back with a
    violation raised by another store."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, EdaCounter, "e1")
    await executor.ack(WRITER, create_counter, CrudCounter, "taken")

    async def append_then_violate(cx: Mutation[Principal]) -> None:
        await increment(cx, EdaCounter, "e1", 3)
        await create_counter(cx, CrudCounter, "taken")

    outcome = await executor.ack(WRITER, append_then_violate)
    assert isinstance(outcome, MutationError) and outcome.code == "unique_violation"
    assert await db.pool.fetchval(
        "SELECT max(seq) FROM service_engine.event_log WHERE noun = $1", EdaCounter.NOUN
    ) == 1
    assert await counter_state(db, EdaCounter, "e1") == ("e1", 0, False, "alice")


async def test_a_swallowed_database_error_still_fails_the_command(db: Database) -> None:
    """A handler that catches a database error and carries on cannot commit
    the broken transaction: the command fails with that error's code."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, CrudCounter, "s1")

    async def swallow(cx: Mutation[Principal]) -> None:
        await increment(cx, CrudCounter, "s1", 1)
        with contextlib.suppress(DatabaseError):
            await create_counter(cx, CrudCounter, "s1")

    outcome = await executor.ack(WRITER, swallow)
    assert isinstance(outcome, MutationError) and outcome.code == "unique_violation"
    assert (await counter_state(db, CrudCounter, "s1"))[1] == 0


# -- full EDA ---------------------------------------------------------------------


async def log_head(db: Database, key: str) -> int:
    return await db.pool.fetchval(  # type: ignore[no-any-return]
        "SELECT coalesce(max(seq), 0) FROM service_engine.event_log WHERE noun = $1 AND key = $2",
        EdaCounter.NOUN, json.dumps(key),
    )


async def snapshot_of(db: Database, key: str) -> tuple[int, dict[str, Any]] | None:
    row = await db.pool.fetchrow(
        "SELECT seq, state FROM service_engine.event_snapshot WHERE noun = $1 AND key = $2",
        EdaCounter.NOUN, json.dumps(key),
    )
    return None if row is None else (row["seq"], row["state"])


async def test_snapshot_lags_the_log_per_snapshot_every(db: Database) -> None:
    """The snapshot is rewritten only when an append crosses a multiple of
    SNAPSHOT_EVERY (3): it sits at the last crossed boundary, behind the log."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, EdaCounter, "lag")
    seen = []
    for _ in range(7):
        seen.append((await log_head(db, "lag"), await snapshot_of(db, "lag")))
        await executor.ack(WRITER, increment, EdaCounter, "lag")
    seen.append((await log_head(db, "lag"), await snapshot_of(db, "lag")))
    state = {"frozen": False, "last_actor": "alice"}
    assert seen == [
        (1, None), (2, None),
        (3, (3, {**state, "value": 2})), (4, (3, {**state, "value": 2})),
        (5, (3, {**state, "value": 2})),
        (6, (6, {**state, "value": 5})), (7, (6, {**state, "value": 5})),
        (8, (6, {**state, "value": 5})),
    ]

    async def burst(cx: Mutation[Principal]) -> None:  # 8 -> 12 crosses 9 and 12
        counter = await cx.load(EdaCounter, "lag")
        for _ in range(4):
            counter.increment(1, "bob")
        await cx.save(counter)

    assert await executor.ack(WRITER, burst) == Success()
    assert await log_head(db, "lag") == 12
    assert await snapshot_of(db, "lag") == (12, {"value": 11, "frozen": False, "last_actor": "bob"})
    assert await counter_state(db, EdaCounter, "lag") == ("lag", 11, False, "bob")


async def append_raw(db: Database, key: str, seq: int, event_type: str, version: int,
                     payload: dict[str, Any]) -> None:
    await db.pool.execute(
        "INSERT INTO service_engine.event_log (noun, key, seq, event_type, event_version, payload)"
        " VALUES ($1, $2, $3, $4, $5, $6)",
        EdaCounter.NOUN, json.dumps(key), seq, event_type, version, payload,
    )


async def test_an_old_event_version_is_upcast_on_read(db: Database) -> None:
    """A version-1 ``incremented`` (``{"n": ...}``) stays as written in the
    log and is read as version 2 (``{"by": ...}``)."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, EdaCounter, "old")
    await append_raw(db, "old", 2, "incremented", 1, {"n": 5, "actor": "legacy"})
    assert await counter_state(db, EdaCounter, "old") == ("old", 5, False, "legacy")
    assert await executor.ack(WRITER, increment, EdaCounter, "old", 2) == Success()
    assert await counter_state(db, EdaCounter, "old") == ("old", 7, False, "alice")
    stored = await db.pool.fetchrow(
        "SELECT event_version, payload FROM service_engine.event_log WHERE key = $1 AND seq = 2",
        json.dumps("old"),
    )
    assert stored is not None
    assert (stored["event_version"], stored["payload"]) == (1, {"n": 5, "actor": "legacy"})


@pytest.mark.parametrize(
    ("seq_offset", "event_type", "version", "payload", "problem"),
    [
        (1, "incremented", 2, {"by": -10, "actor": "x"}, "value -10 outside"),
        (2, "incremented", 2, {"by": 1, "actor": "x"}, "jumps from seq 1 to 3"),
        (1, "incremented", 3, {"by": 1, "actor": "x"}, "newer than this code"),
    ],
    ids=["check_hydrated", "gap", "future_version"],
)
async def test_a_failed_hydration_refuses_the_load(
    db: Database, caplog: pytest.LogCaptureFixture,
    seq_offset: int, event_type: str, version: int, payload: dict[str, Any], problem: str,
) -> None:
    """A log that does not rebuild (the aggregate's own check, a gap, an
    event newer than the code) refuses the load: the command is answered
    ``hydration_failed``, nothing is appended, the cause is logged."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, EdaCounter, "bad")
    await append_raw(db, "bad", 1 + seq_offset, event_type, version, payload)
    with caplog.at_level(logging.ERROR, logger="service_engine.pipeline"):
        outcome = await executor.ack(WRITER, increment, EdaCounter, "bad")
    assert isinstance(outcome, MutationError) and outcome.code == "hydration_failed"
    assert problem in caplog.text
    assert await log_head(db, "bad") == 1 + seq_offset


async def test_erase_leaves_no_residue_in_log_or_snapshot(db: Database) -> None:
    """Erasing a person rewrites their events in place and re-snapshots each
    touched aggregate from genesis: the person appears nowhere in the log or
    the snapshots, the aggregates still load, untouched ones are unchanged."""
    executor = executor_for(db)
    bob = Principal("bob", frozenset({"writer"}))
    await executor.ack(WRITER, create_counter, EdaCounter, "er1")
    for by in (1, 2):  # alice folds into the snapshot at seq 3
        await executor.ack(WRITER, increment, EdaCounter, "er1", by)
    await executor.ack(bob, increment, EdaCounter, "er1", 4)
    await executor.ack(bob, create_counter, EdaCounter, "er2")
    await executor.ack(bob, increment, EdaCounter, "er2", 1)
    snap_before = await snapshot_of(db, "er1")
    assert snap_before == (3, {"value": 3, "frozen": False, "last_actor": "alice"})
    er2_before = await db.pool.fetch(
        "SELECT seq, payload FROM service_engine.event_log WHERE key = $1 ORDER BY seq",
        json.dumps("er2"),
    )

    async with db.pool.acquire() as conn, conn.transaction():
        touched = await erase(conn, EdaCounter, redact_person, "alice")
    assert touched == ["er1"]

    log_text = await db.pool.fetchval(
        "SELECT string_agg(payload::text, ' ') FROM service_engine.event_log")
    snap_text = await db.pool.fetchval(
        "SELECT string_agg(state::text, ' ') FROM service_engine.event_snapshot")
    assert "alice" not in log_text and "alice" not in snap_text
    assert await snapshot_of(db, "er1") == (3, {"value": 3, "frozen": False, "last_actor": "erased"})
    assert await counter_state(db, EdaCounter, "er1") == ("er1", 7, False, "bob")
    assert await db.pool.fetch(
        "SELECT seq, payload FROM service_engine.event_log WHERE key = $1 ORDER BY seq",
        json.dumps("er2"),
    ) == er2_before
    async with db.pool.acquire() as conn, conn.transaction():
        assert await erase(conn, EdaCounter, redact_person, "alice") == []  # idempotent


async def test_keys_lists_a_nouns_aggregates(db: Database) -> None:
    """keys() lists a noun's aggregates in key order, paged by after/limit, and nothing for
    an unknown noun."""
    executor = executor_for(db)
    for key in ("b", "a", "c"):
        await executor.ack(WRITER, create_counter, EdaCounter, key)
        await executor.ack(WRITER, increment, EdaCounter, key)
    async with db.pool.acquire() as conn:
        assert await keys(conn, EdaCounter) == ["a", "b", "c"]
        assert await keys(conn, EdaCounter.NOUN, after="a", limit=1) == ["b"]
        assert await keys(conn, "no_such_noun") == []


# -- faults of the pipeline itself ----------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "sql", "cause"),
    [
        (Stage.BEGIN, None, "injected fault"),
        (Stage.FLUSH, None, "injected fault"),
        (Stage.COMMIT, "INSERT INTO sample_commit_fault DEFAULT VALUES", "injected commit fault"),
    ],
    ids=["begin", "flush", "commit"],
)
async def test_a_pipeline_fault_is_generic_on_the_wire_and_logged_with_its_cause(
    db: Database, caplog: pytest.LogCaptureFixture, stage: Stage, sql: str | None, cause: str
) -> None:
    """A real failure of BEGIN, the flush or COMMIT itself (the commit case
    fails inside COMMIT, on a deferred trigger) answers exactly
    ``mutation failed: database`` with no driver detail, logs the full chain
    at error naming the stage, and commits nothing."""
    base = executor_for(db)
    await base.ack(WRITER, create_counter, CrudCounter, "f1")
    fault = InjectFault(stage) if sql is None else InjectFault(stage, sql)
    executor = base.with_hook(fault)
    assert base.metrics is not None
    before = base.metrics.sample(IMPACTS_METRIC)
    with caplog.at_level(logging.ERROR, logger="service_engine.pipeline"):
        async with listen_impacts(db) as probe:
            outcome = await executor.ack(WRITER, increment, CrudCounter, "f1", 1)
            await probe.assert_quiet()
    assert fault.fired == 1
    assert outcome == MutationError("database", DATABASE_FAULT_MESSAGE, False)
    assert outcome.to_wire() == {
        "code": "database", "message": "mutation failed: database", "retryable": False,
    }
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert f"stage {stage.value}" in record.getMessage()
    assert record.exc_info is not None
    error = record.exc_info[1]
    assert isinstance(error, DatabaseError) and error.stage is stage
    assert isinstance(error.__cause__, asyncpg.RaiseError)
    assert cause in str(error.__cause__)
    assert cause in caplog.text  # the chain is in the log
    assert (await counter_state(db, CrudCounter, "f1"))[1] == 0
    assert base.metrics.sample(IMPACTS_METRIC) == before
    assert await executor.ack(WRITER, increment, CrudCounter, "f1", 1) == Success()


async def test_s134_impacts_are_counted_only_after_commit_returned(
    db: Database, database: ProvisionedDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """s134 (the write pipeline): the committed-impacts metric moves after
    COMMIT returned, never before it, and not at all for a mutation whose
    impacts were flushed but whose COMMIT itself failed (a deferred
    constraint trigger, no fault hook); that mutation delivers nothing."""
    executor = executor_for(db)
    metrics = executor.metrics
    assert metrics is not None
    await executor.ack(WRITER, create_counter, CrudCounter, "m1")
    after_create = metrics.sample(IMPACTS_METRIC)
    assert after_create == 1
    at_commit: list[float | None] = []

    async def observe(stage: Stage, conn: Any) -> None:
        if stage is Stage.COMMIT:
            at_commit.append(metrics.sample(IMPACTS_METRIC))

    async def two(cx: Mutation[Principal], by: int = 1) -> None:
        await increment(cx, CrudCounter, "m1", by)
        cx.impact(NOUN, "other")

    assert await executor.with_hook(observe).ack(WRITER, two) == Success()
    assert at_commit == [after_create]
    assert metrics.sample(IMPACTS_METRIC) == after_create + 2

    async with owner_connection(database) as owner:
        await owner.execute(
            """CREATE CONSTRAINT TRIGGER refuse_large AFTER UPDATE ON sample_counter_crud
                   DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.value >= 100)
                   EXECUTE FUNCTION sample_fail_at_commit()"""
        )
    with caplog.at_level(logging.ERROR, logger="service_engine.pipeline"):
        async with listen_impacts(db) as probe:
            outcome = await executor.ack(WRITER, two, 100)
            await probe.assert_quiet()
    assert outcome == MutationError("database", DATABASE_FAULT_MESSAGE, False)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None
    error = record.exc_info[1]
    assert isinstance(error, DatabaseError) and error.stage is Stage.COMMIT
    assert "injected commit fault" in str(error.__cause__)
    assert metrics.sample(IMPACTS_METRIC) == after_create + 2
    assert (await counter_state(db, CrudCounter, "m1"))[1] == 1


async def test_a_shutting_down_engine_answers_retryable(db: Database) -> None:
    """A command reaching an engine that is shutting down answers the retryable
    shutting_down and runs nothing."""
    def refuse() -> None:
        raise ShuttingDown("stopping")

    from dataclasses import replace

    executor = replace(executor_for(db), accepting=refuse)
    outcome = await executor.ack(WRITER, create_counter, CrudCounter, "late")
    assert isinstance(outcome, MutationError)
    assert (outcome.code, outcome.retryable) == ("shutting_down", True)
    assert await counter_state(db, CrudCounter, "late") is None


# -- outcomes: OneShot and the outbox seam ------------------------------------------


async def test_a_one_shot_secret_reaches_only_the_caller(db: Database) -> None:
    """The secret a mutation returns reaches its caller once; it is in no
    row, log, snapshot, outbox row or NOTIFY payload."""
    executor = executor_for(db)
    for style in STYLES:
        await executor.ack(WRITER, create_counter, style, "inv")
    async with listen_impacts(db) as probe:
        outcome = await executor.execute(WRITER, invite, SoftCounter, "inv")
        assert await probe.next() == [Impact.entity(NOUN, "inv")]
    assert isinstance(outcome, OneShot)
    assert "secret" in repr(outcome)
    token = outcome.reveal()
    assert isinstance(token, str) and len(token) >= 24
    assert token not in repr(outcome)
    with pytest.raises(SecretSpent):
        outcome.reveal()
    dump = await db.pool.fetchval(
        """SELECT concat_ws(' ',
             (SELECT string_agg(t::text, ' ') FROM sample_counter_invite t),
             (SELECT string_agg(t::text, ' ') FROM sample_counter_soft t),
             (SELECT string_agg(t::text, ' ') FROM sample_counter_soft_fact t),
             (SELECT string_agg(t::text, ' ') FROM service_engine.event_log t),
             (SELECT string_agg(t::text, ' ') FROM service_engine.integration_outbox t))"""
    )
    assert token not in dump
    assert all(token not in payload for payload in probe.payloads)


@pytest.mark.parametrize("channel", ["impact", "event", "outbox", "scheduled"])
async def test_a_one_shot_secret_cannot_enter_any_channel(db: Database, channel: str) -> None:
    """A handler that tries to put a OneShot into an impact cause, an event,
    an outbox row or a scheduled impact is refused (``TypeError``: it is
    not JSON) and its transaction rolls back."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, SoftCounter, "leak")
    secret = OneShot("s3cr3t")

    async def leak(cx: Mutation[Principal]) -> None:
        await increment(cx, SoftCounter, "leak", 1)
        data: Any = {"token": secret}
        if channel == "impact":
            cx.impact_caused(NOUN, "leak", Cause("leaked", data))
        elif channel == "event":
            DomainEvent("leaked", data)
        elif channel == "outbox":
            cx._stage_outbox(OutboxRow("integration.evt.sample.leaked", data))
        else:
            cx.impact_at(cx.now(), NOUN, "leak", Cause("leaked", data))

    with pytest.raises(TypeError, match="JSON"):
        await executor.ack(WRITER, leak)
    assert (await counter_state(db, SoftCounter, "leak"))[1] == 0
    assert not secret.spent


async def test_staged_outbox_rows_commit_with_the_command(db: Database) -> None:
    """The outbox seam: rows staged by a command are written in its
    transaction, PENDING, and vanish with a rollback."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, CrudCounter, "o1")

    async def emit(cx: Mutation[Principal], fail: bool) -> None:
        await increment(cx, CrudCounter, "o1")
        cx._stage_outbox(OutboxRow(
            "integration.evt.sample.counter.incremented.v1", {"key": "o1"},
            headers={"Br-Producer": "sample"}, producer="sample", seq_key="o1", seq=2,
        ))
        if fail:
            await create_counter(cx, CrudCounter, "o1")

    assert isinstance(await executor.ack(WRITER, emit, True), MutationError)
    assert await executor.ack(WRITER, emit, False) == Success()
    rows = await db.pool.fetch(
        "SELECT subject, payload, headers, producer, seq_key, seq, status"
        " FROM service_engine.integration_outbox"
    )
    assert [dict(r) for r in rows] == [{
        "subject": "integration.evt.sample.counter.incremented.v1", "payload": {"key": "o1"},
        "headers": {"Br-Producer": "sample"}, "producer": "sample", "seq_key": "o1", "seq": 2,
        "status": "PENDING",
    }]


async def test_concurrent_commands_on_distinct_keys_do_not_wait(db: Database) -> None:
    """Commands on distinct keys run side by side: eight commands, each
    holding its lock until all eight hold theirs at once, all succeed (run
    one after another, the first would never see the others arrive)."""
    executor = executor_for(db)
    for i in range(8):
        await executor.ack(WRITER, create_counter, CrudCounter, f"p{i}")
    inside: set[str] = set()
    all_inside = asyncio.Event()

    async def hold(cx: Mutation[Principal], key: str) -> None:
        await increment(cx, CrudCounter, key)
        inside.add(key)
        if len(inside) == 8:
            all_inside.set()
        await asyncio.wait_for(all_inside.wait(), 10)

    outcomes = await asyncio.gather(
        *(executor.ack(WRITER, hold, f"p{i}") for i in range(8))
    )
    assert outcomes == [Success()] * 8
    assert all_inside.is_set()
