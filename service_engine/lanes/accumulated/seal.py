"""The verified seal, inside the caller's transaction (``cx.seal`` and friends).

`seal_in` takes the key's lane lock exclusively (waiting under the
transaction's ``lock_timeout``), so every chunk write that committed before
it is visible and every later one meets the marker. It then refuses or
plans the seal (`chunks.plan_seal`), writes the marker at the high water,
deletes the key's chunks and returns the folded state with the plan. A
cancel gesture's plan names in ``dropped`` every durable chunk past a gap
(deleted with the rest: the key is sealed, no fold reaches them), so the
caller is told what was discarded. A refusal raises before anything is
written: the transaction stays usable.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from ...db.types import Conn
from .accumulator import Accumulator, lane_lock_key, read_seal
from .chunks import Gesture, SealPlan, check_key, plan_seal
from .errors import AlreadySealed

__all__ = ["seal_in"]

S = TypeVar("S")

_log = logging.getLogger(__name__)


async def seal_in(
    conn: Conn,
    accumulator: Accumulator[S],
    key: str,
    gesture: Gesture,
    last_seq: int | None = None,
    expected_hash: str | None = None,
) -> tuple[S, SealPlan]:
    """Seal ``key`` in the open transaction on ``conn``; see `plan_seal`
    for the refusals, plus `AlreadySealed` for a key with a marker."""
    check_key(key)
    name = accumulator.name
    await conn.execute("SELECT pg_advisory_xact_lock($1)", lane_lock_key(name, key))
    sealed = await read_seal(conn, name, key)
    if sealed is not None:
        raise AlreadySealed(name, key, sealed)
    rows: list[Any] = list(
        await conn.fetch(
            "SELECT seq, chunk FROM service_engine.accumulator_chunk "
            "WHERE accumulator = $1 AND key = $2 ORDER BY seq",
            name, key,
        )
    )
    plan = plan_seal(
        name, key, [(int(r["seq"]), bytes(r["chunk"])) for r in rows],
        gesture, last_seq, expected_hash,
    )
    state = accumulator.fold_all(plan.chunks)
    if plan.dropped:
        _log.warning(
            "%s of %s/%s drops %d durable chunk(s) past the gap at %d: seqs %s",
            gesture, name, key, len(plan.dropped), len(plan.chunks), list(plan.dropped)[:20],
        )
    await conn.execute(
        "INSERT INTO service_engine.accumulator_seal (accumulator, key, high_water, hash, gesture) "
        "VALUES ($1, $2, $3, $4, $5)",
        name, key, plan.high_water, plan.hash, gesture,
    )
    await conn.execute(
        "DELETE FROM service_engine.accumulator_chunk WHERE accumulator = $1 AND key = $2",
        name, key,
    )
    return state, plan
