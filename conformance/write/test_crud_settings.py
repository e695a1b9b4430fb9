"""`CrudStore.settings`: the transaction-local settings a store's writes run
under (a row-level security policy's context), set by the pipeline in the
write's own round trip. The reference service's ``org_board`` is under FORCE
ROW LEVEL SECURITY, deny-when-unset: a create, a blind save and a delete of
its rows each take one round trip (the advisory lock, the settings, the
write) and land only under the org the settings name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from example_service.slices.board.domain import OrgBoard
from service_engine import CrudStore, Database, Mutation, MutationError, Success
from service_engine.embedded import ProvisionedDatabase

from ..support.harness import Statements, logged_pool, owner_connection
from ..support.sample_counter import (
    WRITER,
    CrudCounter,
    CrudCounterStore,
    create_counter,
    executor_for,
    increment,
)


@dataclass
class Misfiled(OrgBoard):
    """An org board whose store enters another org than the row's."""

    Store: ClassVar[Any]


class MisfiledStore(CrudStore[Misfiled, str]):
    TABLE = "org_board"
    AGGREGATE = Misfiled

    def settings(self, aggregate: Misfiled) -> Mapping[str, str]:
        return {"app.current_org_id": "elsewhere"}


Misfiled.Store = MisfiledStore()


class TaggedCounter(CrudCounter):
    """A counter whose every write runs under ``app.tag = 'on'``."""


class TaggedStore(CrudCounterStore):
    def settings(self, aggregate: CrudCounter) -> Mapping[str, str]:
        return {"app.tag": "on"}


TaggedCounter.Store = TaggedStore(TaggedCounter)


@pytest.fixture
async def logged_store(store: ProvisionedDatabase) -> AsyncIterator[tuple[Database, Statements]]:
    """The reference service's database with two boards (b-1, b-2) of org
    ``acme``, on a logged one-connection pool."""
    async with owner_connection(store) as conn:
        await conn.execute(
            "INSERT INTO board (id, org, title, owner) VALUES"
            " ('b-1', 'acme', 'one', 'ann'), ('b-2', 'acme', 'two', 'ann')"
        )
    async with logged_pool(store.app_url) as pair:
        yield pair


async def _org_rows(store: ProvisionedDatabase, org: str) -> dict[str, str]:
    async with owner_connection(store) as conn:
        await conn.execute("SELECT set_config('app.current_org_id', $1, false)", org)
        rows = await conn.fetch("SELECT id, title FROM org_board ORDER BY id")
    return {row["id"]: row["title"] for row in rows}


async def create(cx: Mutation[Any], board: OrgBoard) -> None:
    await cx.create(board)


async def save(cx: Mutation[Any], board: OrgBoard) -> None:
    await cx.save(board)


async def delete(cx: Mutation[Any], board: OrgBoard) -> None:
    await cx.delete(board)


async def test_each_write_rides_with_its_lock_and_settings_in_one_round_trip(
    store: ProvisionedDatabase, logged_store: tuple[Database, Statements],
) -> None:
    """A blind save and a delete of an ``org_board`` row are each one round
    trip (BEGIN, the advisory lock, the store's ``set_config``, the write) and
    COMMIT's; a create waits for COMMIT's and is one round trip in all; each
    lands under the row's org, which alone sees it."""
    db, statements = logged_store
    executor = executor_for(db)
    steps = [(create, OrgBoard("b-1", "acme", "one")), (save, OrgBoard("b-1", "acme", "uno")),
             (create, OrgBoard("b-2", "acme", "two")), (delete, OrgBoard("b-2", "acme", ""))]
    verbs = ["INSERT INTO", "UPDATE", "INSERT INTO", "DELETE FROM"]
    for (handler, board), verb in zip(steps, verbs, strict=True):
        statements.take()
        assert await executor.ack(WRITER, handler, board) == Success(), handler
        sent = statements.take_own()
        if verb == "INSERT INTO":
            assert len(sent) == 1 and "; COMMIT; " in sent[0], sent
        else:
            assert len(sent) == 2 and sent[1].startswith("COMMIT;"), sent
        batch = sent[0].split("; ")
        assert batch[0].startswith("BEGIN") and batch[2].startswith("SELECT pg_advisory_xact_lock")
        assert batch[3] == "SELECT set_config($m0$app.current_org_id$m0$, $m0$acme$m0$, true)"
        assert batch[4].startswith(f'{verb} "org_board"'), batch
    assert await _org_rows(store, "acme") == {"b-1": "uno"}
    assert await _org_rows(store, "") == {}


async def test_a_write_the_policy_refuses_or_cannot_see_commits_nothing(
    store: ProvisionedDatabase, logged_store: tuple[Database, Statements],
) -> None:
    """Settings naming another org than the row's: the INSERT is refused by
    the policy (a typed, non-retryable error), and a save or delete of a
    row the policy hides (or that does not exist) is ``not_found``; none of
    them commits anything."""
    db, _ = logged_store
    executor = executor_for(db)
    assert await executor.ack(WRITER, create, OrgBoard("b-1", "acme", "one")) == Success()
    refused = await executor.ack(WRITER, create, Misfiled("b-2", "acme", "two"))
    assert isinstance(refused, MutationError) and not refused.retryable, refused
    for handler, board in [(save, Misfiled("b-1", "acme", "moved")),
                           (delete, Misfiled("b-1", "acme", "")),
                           (save, OrgBoard("b-2", "acme", "none")),
                           (delete, OrgBoard("b-2", "acme", ""))]:
        outcome = await executor.ack(WRITER, handler, board)
        assert isinstance(outcome, MutationError) and outcome.code == "not_found", outcome
    assert await _org_rows(store, "acme") == {"b-1": "one"}
    assert await _org_rows(store, "elsewhere") == {}


async def bump_then_read(cx: Mutation[Any], key: str, other: str) -> None:
    """A pinned row's save, then a statement with parameters: the save goes alone first."""
    counter = await cx.load(TaggedCounter, key)
    counter.increment(1, cx.principal.id)
    await cx.save(counter)
    await cx.load_optional(TaggedCounter, other)


async def test_a_pinned_rows_save_runs_under_the_settings_wherever_it_rides(
    database: ProvisionedDatabase, db: Database,
) -> None:
    """A table that admits a write only under a setting (a check on
    ``current_setting``): a store naming it in ``settings`` creates, saves a
    row it loaded (the UPDATE riding with COMMIT) and saves it before a
    later statement with parameters (the UPDATE alone), each under the
    setting; a store without it is refused, so the check is real."""
    async with owner_connection(database) as conn:
        await conn.execute("ALTER TABLE sample_counter_crud ADD CONSTRAINT tagged"
                           " CHECK (coalesce(current_setting('app.tag', true), '') = 'on') NOT VALID")
    executor = executor_for(db)
    refused = await executor.ack(WRITER, create_counter, CrudCounter, "plain")
    assert isinstance(refused, MutationError), refused
    assert await executor.ack(WRITER, create_counter, TaggedCounter, "t1") == Success()
    assert await executor.ack(WRITER, increment, TaggedCounter, "t1") == Success()
    assert await executor.ack(WRITER, bump_then_read, "t1", "t2") == Success()
    assert await db.pool.fetchval("SELECT value FROM sample_counter_crud WHERE id = 't1'") == 2
