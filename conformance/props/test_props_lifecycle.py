"""Record lifecycle over a real nats-server on the SQLite store: saga writes
commit provisioning before completion, soft delete keeps the tombstone
version to recreate against, reconciliation alone raises the audit epoch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from conformance.support.props_support import SERVICE, PropsStack, props_stack
from service_engine.props import (
    FieldSpec,
    Namespace,
    PropsError,
    SagaOutcome,
    StaticPolicy,
    all_caps,
    open_watch,
)


class Step:
    """The saga step's two signals, made anew on each test's event loop."""

    started: asyncio.Event
    release: asyncio.Event


async def provision(key: str, fields: Mapping[str, Any]) -> SagaOutcome:
    Step.started.set()
    await asyncio.wait_for(Step.release.wait(), 5)
    return SagaOutcome("failed", "no capacity") if fields.get("size") == "huge" else SagaOutcome("active")


MACHINES = Namespace("machines", (FieldSpec("size", "string"),), saga=provision)
TENANTS = Namespace("tenants", (FieldSpec("plan", "string"),), deletion="soft", require_version=True)
POLICY = StaticPolicy({"A/alice": all_caps("demo.machines") | all_caps("demo.tenants")})


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[PropsStack]:
    Step.started, Step.release = asyncio.Event(), asyncio.Event()
    async with props_stack(tmp_path, [MACHINES, TENANTS], POLICY) as s:
        yield s


async def test_saga_commits_provisioning_before_completion(stack: PropsStack) -> None:
    """While the saga step runs, the provisioning commit is already readable
    (lifecycle provisioning); the reply then carries both commits."""
    alice = stack.caller("alice")
    pending = asyncio.ensure_future(alice.set("machines", {"size": "huge"}, key="m1"))
    await asyncio.wait_for(Step.started.wait(), 5)
    snap = await stack.store.get("machines", "m1")
    assert snap.record is not None and snap.record.lifecycle == "provisioning" and snap.nseq == 1
    Step.release.set()
    reply = await pending
    assert reply == {
        "namespace": "machines", "key": "m1", "set_version": 1, "set_nseq": 1,
        "complete_version": 2, "complete_nseq": 2, "lifecycle": "failed", "created": True,
        "reason": "no capacity",
    }
    watch = await open_watch(stack.clients["alice"], SERVICE, "machines")
    try:
        created, completed = await watch.next(), await watch.next()
        assert (created["kind"], "lifecycle" in created) == ("created", False)
        assert (completed["kind"], completed["lifecycle"], completed["reason"]) == ("completed", "failed", "no capacity")
    finally:
        await watch.aclose()


async def test_soft_delete_tombstone_over_the_wire(stack: PropsStack) -> None:
    """A require_version namespace with soft delete: the fence is required,
    the tombstone keeps its version, recreation fences against it."""
    alice = stack.caller("alice")
    with pytest.raises(PropsError) as unfenced:
        await alice.set("tenants", {"plan": "free"}, key="t")
    assert unfenced.value.error_code == "validation_error"
    await alice.set("tenants", {"plan": "free"}, key="t", if_version="0")
    deleted = await alice.request("delete", "tenants", key="t", if_version="1")
    assert deleted["tombstone_version"] == 2
    with pytest.raises(PropsError) as gone:
        await alice.get("tenants", key="t")
    assert gone.value.error_code == "not_found"
    again = await alice.set("tenants", {"plan": "pro"}, key="t", if_version="2")
    assert (again["version"], again["created"]) == (3, True)


async def test_reconciliation_alone_raises_the_audit_epoch(stack: PropsStack) -> None:
    """The owner's reconciliation is a reconciled event with the next audit
    epoch; writes keep the epoch they find."""
    alice = stack.caller("alice")
    await alice.set("tenants", {"plan": "free"}, key="t", if_version="0")
    await stack.service.handler.reconcile("tenants", "t", {"plan": "pro"})
    await alice.set("tenants", {"plan": "team"}, key="t", if_version="2")
    watch = await open_watch(stack.clients["alice"], SERVICE, "tenants")
    try:
        events = [await watch.next() for _ in range(3)]
        assert [(e["kind"], e["audit_epoch"], e["actor"]) for e in events] == [
            ("created", 0, "A/alice"), ("reconciled", 1, "demo"), ("updated", 1, "A/alice"),
        ]
    finally:
        await watch.aclose()
