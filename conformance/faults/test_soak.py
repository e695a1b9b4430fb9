"""The soak scenario, short: the reference service keeps every promise at
once under a mixed load while NATS, the listener, a pod and a subscriber
fail, each kind of fault more than once (`conformance.support.soak`;
``bench/soak.py`` runs the same harness at scale)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service_engine.embedded import (
    ProvisionedDatabase,
)

from ..support.soak import FAULT_KINDS, SoakConfig, run_soak

# The run takes 2.5 min on a quiet machine and up to 5 min beside the
# parallel battery (each pod restart then takes a minute to come back UP);
# its own waits are bounded. RUN_BOUND ends a run that overruns inside the
# event loop, so the run's own teardown stops every pod and nats-server it
# spawned; pytest-timeout's bound, past it, only stops a hang in that
# teardown (its timeout does not unwind the run's coroutine).
RUN_BOUND = 420.0
pytestmark = [pytest.mark.soak, pytest.mark.timeout(RUN_BOUND + 60)]

CONFIG = SoakConfig(pods=2, sessions=60, cohorts=6, rate=20, seconds=30, faults=2, burst=40,
                    verbose=True)


async def test_soak_every_promise_holds_under_repeated_faults(
    store: ProvisionedDatabase, tmp_path: Path
) -> None:
    """Two pods on one Postgres and one NATS, 60 sessions over 6 cohorts and
    a mixed load at 20 ops/s, with nats-server SIGKILLed, the LISTEN backends
    terminated, a pod SIGKILLed, a burst past the listener channel and a
    stalled subscriber, each twice: every session's window rebuilt from its
    deltas equals a fresh query as its passport, revisions contiguous or
    repaired by a Reset; every committed outbox row is in the stream exactly
    once and none is left pending; every acknowledged command's card, claim
    and fact exist exactly once; only the injected poison is dead-lettered,
    once each; readiness was DOWN (nats_unreachable) through each NATS
    outage past the grace and never inside it, UP after each fault, and UP
    outside them."""
    async with asyncio.timeout(RUN_BOUND):
        report = await run_soak(CONFIG, store, tmp_path)
    print(report.render())
    kinds = [f.kind for f in report.faults]
    assert all(kinds.count(k) >= CONFIG.faults for k in FAULT_KINDS), kinds
    assert report.violations == [], report.render()
