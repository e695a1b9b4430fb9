"""Watch and audit.watch end to end over a real nats-server: the grant
through the development granter, replay, the caught_up marker, live
delivery through the broker with overlap discarded, and every refusal."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conformance.support.harness import wait_until
from conformance.support.props_support import SERVICE, PropsStack, props_stack
from service_engine.props import (
    Actor,
    FieldSpec,
    GrantOutcome,
    Namespace,
    PropsError,
    StaticPolicy,
    all_caps,
    open_sqlite_store,
    open_watch,
    read_cap,
)
from service_engine.props.records import now

SETTINGS = Namespace("settings", (FieldSpec("title", "string"), FieldSpec("api_key", "string", secret=True)))
OTHER = Namespace("other", (FieldSpec("n", "integer"),))
TINY = Namespace("tiny", (FieldSpec("n", "integer"),), retain_events=2)
POLICY = StaticPolicy({
    "A/alice": all_caps("demo.settings") | all_caps("demo.other") | all_caps("demo.tiny"),
    "B/bob": {read_cap("demo.settings")},
})
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[PropsStack]:
    async with props_stack(tmp_path, [SETTINGS, OTHER, TINY], POLICY) as s:
        yield s


async def commit(stack: PropsStack, n: int, namespace: str = "settings") -> None:
    alice = stack.caller("alice")
    for i in range(n):
        body = {"n": i} if namespace != "settings" else {"title": f"t{i}"}
        await alice.set(namespace, body, key=f"k{i}")


async def test_watch_replays_marks_and_goes_live(stack: PropsStack) -> None:
    """Replay holds since < nseq <= observed, then caught_up at the observed
    cursor, then live events delivered by the broker, each once."""
    await commit(stack, 3)
    watch = await open_watch(stack.clients["alice"], SERVICE, "settings", since_nseq=1)
    try:
        assert watch.reply["live"] is True and watch.reply["observed_nseq"] == 3
        assert [(await watch.next())["nseq"] for _ in range(2)] == [2, 3]
        assert await watch.next() == {"event_type": "caught_up", "namespace": "settings", "nseq": 3}
        await stack.caller("alice").set("settings", {"title": "live"}, key="k9", cause="c-9")
        live = await watch.next()
        assert (live["nseq"], live["key"], live["kind"], live["cause"], live["actor"]) == (4, "k9", "created", "c-9", "A/alice")
        assert set(live) == {"namespace", "key", "kind", "verb", "nseq", "version", "audit_epoch", "actor", "ts", "fields_changed", "cause"}
        assert TS.match(live["ts"])
        with pytest.raises(TimeoutError):
            await watch.next(0.2)
    finally:
        await watch.aclose()


async def test_overlap_between_grant_and_cursor_is_delivered_once(stack: PropsStack) -> None:
    """A commit after the grant but before the cursor is captured is both
    replayed and delivered live; the watcher keeps it once."""
    await commit(stack, 1)
    granter = stack.service.handler.granter
    assert granter is not None
    grant = granter.subscribe_grant
    published = asyncio.Event()

    async def grant_then_commit(topic: str, target_peer: str, namespace: str) -> GrantOutcome:
        outcome = await grant(topic, target_peer, namespace)
        await stack.caller("alice").set("settings", {"title": "in the window"}, key="w")
        await wait_until(lambda: stack.service._cursors["settings"] >= 2, timeout=5, what="published")
        published.set()
        return outcome

    granter.subscribe_grant = grant_then_commit  # type: ignore[method-assign]
    watch = await open_watch(stack.clients["alice"], SERVICE, "settings")
    try:
        assert published.is_set()
        seen = [await watch.next() for _ in range(3)]
        assert [e.get("nseq") for e in seen] == [1, 2, 2] and seen[2]["event_type"] == "caught_up"
        await wait_until(lambda: 2 in watch.delivered, timeout=5, what="live overlap delivered")
        await stack.caller("alice").set("settings", {"title": "after"}, key="a")
        assert (await watch.next())["nseq"] == 3
        with pytest.raises(TimeoutError):
            await watch.next(0.2)
    finally:
        await watch.aclose()


async def test_caller_cursor_above_observed(stack: PropsStack) -> None:
    """A caller cursor above the observed one replays nothing and caught_up
    still carries the observed cursor."""
    await commit(stack, 2)
    watch = await open_watch(stack.clients["alice"], SERVICE, "settings", since_nseq=50)
    try:
        assert watch.reply["events"] == [] and watch.reply["observed_nseq"] == 2
        assert await watch.next() == {"event_type": "caught_up", "namespace": "settings", "nseq": 2}
        await commit(stack, 1)
        assert (await watch.next())["nseq"] == 3
    finally:
        await watch.aclose()


async def test_namespace_filter_and_no_values_on_topics(stack: PropsStack) -> None:
    """The broker delivers only the granted namespace; records-changed bodies
    carry neither values nor secret field names nor a digest."""
    watch = await open_watch(stack.clients["alice"], SERVICE, "settings")
    try:
        assert (await watch.next())["event_type"] == "caught_up"
        await commit(stack, 1, "other")
        await stack.caller("alice").set("settings", {"api_key": "hunter2"}, key="s")
        event = await watch.next()
        assert (event["namespace"], event["secret_fields_changed_count"]) == ("settings", 1)
        text = json.dumps(event)
        assert "hunter2" not in text and "api_key" not in text and "digest" not in text
        with pytest.raises(TimeoutError):
            await watch.next(0.2)
    finally:
        await watch.aclose()


async def test_audit_watch_digests_recompute_independently(stack: PropsStack, tmp_path: Path) -> None:
    """audit.watch replays audit bodies (no caught_up field) whose digest is
    HMAC-SHA256 over canonical JSON and the nseq under the namespace key, then
    goes live on the audit topic."""
    await stack.caller("alice").set("settings", {"title": "é", "api_key": "k"}, key="a")
    await stack.caller("alice").request("delete", "settings", key="a")
    watch = await open_watch(stack.clients["alice"], SERVICE, "settings", audit=True)
    try:
        assert "caught_up" not in watch.reply
        created, deleted = await watch.next(), await watch.next()
        assert set(created) == {"namespace", "key", "verb", "version", "nseq", "audit_epoch", "actor", "at", "audit_digest", "fields_changed"}
        with sqlite3.connect(tmp_path / "props.db") as conn:
            key = bytes(conn.execute("SELECT audit_key FROM __props_audit_keys WHERE namespace = 'settings'").fetchone()[0])
        payload = json.dumps({"title": "é", "api_key": "k"}, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert created["audit_digest"] == hmac.new(key, payload + (1).to_bytes(8, "big"), hashlib.sha256).hexdigest()
        assert deleted["audit_digest"] == hmac.new(key, b"null" + (2).to_bytes(8, "big"), hashlib.sha256).hexdigest()
        assert TS.match(created["at"])
        await commit(stack, 1)
        live = await watch.next()
        assert live["nseq"] == 3 and "audit_digest" in live and "kind" not in live
    finally:
        await watch.aclose()


async def test_audit_requires_audit_capability_independently(stack: PropsStack) -> None:
    """bob reads settings but may not audit.watch them."""
    with pytest.raises(PropsError) as caught:
        await open_watch(stack.clients["bob"], SERVICE, "settings", audit=True)
    assert caught.value.error_code == "auth_denied"
    watch = await open_watch(stack.clients["bob"], SERVICE, "settings")
    await watch.aclose()


async def test_direct_subscription_to_reserved_topics_is_refused(stack: PropsStack) -> None:
    """The broker refuses topic.subscribe for the reserved topics, and a
    plain subscription from a caller's account receives nothing."""
    reply = await stack.clients["alice"].request("noded.topic.subscribe", b"", timeout=5, headers={"topic": "demo.props.records.changed"})
    assert (reply.headers or {})["rc"] == "10" and json.loads(reply.data)["error_code"] == "auth_denied"
    got: asyncio.Queue[Any] = asyncio.Queue()
    subs = [await stack.clients["alice"].subscribe(t, cb=got.put) for t in ("demo.props.records.changed", "demo.props.audit")]
    await stack.clients["alice"].flush()
    await commit(stack, 1)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(got.get(), 0.3)
    for sub in subs:
        await sub.unsubscribe()


async def test_grant_refused_for_an_unconnected_target_is_grant_failed(stack: PropsStack) -> None:
    """A registered peer with no delivery listener is not connected: the
    broker refuses, and the service answers grant_failed without detail."""
    bob = stack.clients["bob"]
    for registered in (False, True):
        if registered:
            await bob.request("noded.peers.register", b"", timeout=5)
        msg = await bob.request("demo.props.watch", b"", timeout=5, headers={"namespace": "settings"})
        body = json.loads(msg.data)
        assert (msg.headers or {})["rc"] == "10"
        assert body == {"error_code": "grant_failed", "message": body["message"]}
        assert "not_connected" not in body["message"] and "B/bob" not in body["message"]


async def test_replay_window_exceeded_on_the_wire(stack: PropsStack) -> None:
    """A cursor older than the retained history is refused with since_nseq
    and oldest_nseq."""
    await commit(stack, 5, "tiny")
    with pytest.raises(PropsError) as caught:
        await open_watch(stack.clients["alice"], SERVICE, "tiny", since_nseq=1)
    assert (caught.value.error_code, caught.value.extra) == ("replay_window_exceeded", {"since_nseq": 1, "oldest_nseq": 4})


async def test_missing_granter_is_unavailable(tmp_path: Path) -> None:
    """With no broker answering the grant verb, watch answers unavailable (rc 20)."""
    async with props_stack(tmp_path, [SETTINGS], POLICY, granter=False) as stack:
        msg = await stack.clients["alice"].request("demo.props.watch", b"", timeout=5, headers={"namespace": "settings"})
        assert (msg.headers or {})["rc"] == "20"
        assert json.loads(msg.data)["error_code"] == "unavailable"


async def test_dispatcher_starts_at_the_current_cursor(tmp_path: Path) -> None:
    """History committed before the service started is replayed by watch but
    never published live; commits after start are."""
    store = await open_sqlite_store(tmp_path / "props.db")
    await store.register(SETTINGS)
    for n in range(2):
        await store.set(SETTINGS, f"old{n}", {"title": "old"}, merge=True, if_version=None, actor=Actor("A/alice", now()))
    await store.aclose()
    async with props_stack(tmp_path, [SETTINGS], POLICY) as stack:
        watch = await open_watch(stack.clients["alice"], SERVICE, "settings")
        try:
            assert [(await watch.next()).get("nseq") for _ in range(3)] == [1, 2, 2]
            await commit(stack, 1)
            assert (await watch.next())["nseq"] == 3
            assert watch.delivered == [3]
        finally:
            await watch.aclose()


async def test_publication_is_best_effort(stack: PropsStack, caplog: pytest.LogCaptureFixture) -> None:
    """A publication that fails is logged and the dispatcher's cursor still
    advances; the commit stands and watch recovers it."""
    await stack.clients["svc"].close()
    await stack.store.set(SETTINGS, "k", {"title": "t"}, merge=True, if_version=None, actor=Actor("A/alice", now()))
    await wait_until(lambda: stack.service._cursors["settings"] == 1, timeout=5, what="cursor advanced")
    assert any("publication" in r.getMessage() for r in caplog.records)
    assert (await stack.store.get("settings", "k")).record is not None
