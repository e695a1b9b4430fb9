"""Bounded, typed props replies over a real nats-server: a replay or a list
larger than the broker's max payload is refused with a typed error naming
the limit (never left unanswered), a refused or undeliverable watch leaves
no grant behind, non-finite numbers are the caller's validation_error on
both stores, and delete keeps its version fence under require_version."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from conformance.support.harness import wait_until
from conformance.support.props_support import SERVICE, PropsStack, props_stack
from service_engine.props import (
    Actor,
    FieldSpec,
    Namespace,
    PropsError,
    StaticPolicy,
    all_caps,
    now,
    open_watch,
)
from service_engine.props.handler import reply_limit

WIDE_FIELDS = tuple(f"a_rather_long_field_name_number_{n:03d}" for n in range(60))
WIDE = Namespace("wide", tuple(FieldSpec(name, "integer") for name in WIDE_FIELDS))
NUMBERS = Namespace("numbers", (FieldSpec("n", "number"), FieldSpec("meta", "object")))
FENCED = Namespace("fenced", (FieldSpec("title", "string"),), require_version=True, deletion="soft")
POLICY = StaticPolicy({"A/alice": all_caps("demo.wide") | all_caps("demo.numbers") | all_caps("demo.fenced")})
COMMITS = 600


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[PropsStack]:
    async with props_stack(tmp_path, [WIDE, NUMBERS, FENCED], POLICY) as s:
        yield s


async def fill_wide(stack: PropsStack) -> None:
    row = {name: n for n, name in enumerate(WIDE_FIELDS)}
    actor = Actor("A/alice", now())
    for n in range(COMMITS):
        await stack.store.set(WIDE, f"record-{n:04d}", row, merge=True, if_version=None, actor=actor)


@pytest.mark.parametrize("audit", [False, True])
async def test_large_replay_is_paged_or_refused_never_lost(stack: PropsStack, audit: bool) -> None:
    """A watch from 0 over 600 wide events (past the 1 MiB max payload) is
    answered at once with replay_window_exceeded naming the limit, and leaves
    no grant; oldest_nseq is where a replay fits: a watch from there replays
    every later event in order, marks the observed cursor and goes live. A
    list of the same records is a validation_error naming the limit."""
    await fill_wide(stack)
    alice = stack.clients["alice"]
    limit = reply_limit(alice.max_payload)
    with pytest.raises(PropsError) as refused:
        await open_watch(alice, SERVICE, "wide", audit=audit, request_timeout=10)
    error = refused.value
    assert (error.error_code, error.rc, error.extra["since_nseq"]) == ("replay_window_exceeded", 10, 0)
    assert f"{limit}-byte limit" in error.message
    assert stack.granter.grants == []
    oldest = int(error.extra["oldest_nseq"])
    assert 1 < oldest <= COMMITS
    watch = await open_watch(alice, SERVICE, "wide", since_nseq=oldest - 1, audit=audit, request_timeout=10)
    try:
        assert len(stack.granter.grants) == 1
        replayed = [int((await watch.next())["nseq"]) for _ in range(oldest, COMMITS + 1)]
        assert replayed == list(range(oldest, COMMITS + 1))
        if not audit:
            assert (await watch.next())["event_type"] == "caught_up"
        await stack.caller("alice").set("wide", {WIDE_FIELDS[0]: -1}, key="record-0000")
        assert int((await watch.next())["nseq"]) == COMMITS + 1
    finally:
        await watch.aclose()
    with pytest.raises(PropsError) as listed:
        await stack.caller("alice").request("list", "wide")
    assert (listed.value.error_code, listed.value.rc) == ("validation_error", 10)
    assert f"{limit}-byte limit" in listed.value.message


async def test_a_watch_whose_reply_cannot_be_sent_leaves_no_grant(stack: PropsStack) -> None:
    """A watch request without a reply subject gets its grant (the broker
    sees it) and then loses it: nobody could learn of the watch."""
    seen: list[str] = []

    async def tap(msg: Msg) -> None:
        seen.append(msg.subject)

    noded = stack.clients["noded"]
    subs = [await noded.subscribe(s, cb=tap) for s in ("noded.props.subscribe_grant", "noded.props.unsubscribe_grant")]
    await noded.flush()
    alice = stack.clients["alice"]
    await alice.request("noded.peers.register", b"", timeout=5)
    # A delivery listener, so the broker finds alice connected and grants.
    deliveries = await alice.subscribe("noded.deliver.A.alice.>", cb=_answer_probe(stack))
    await alice.flush()
    try:
        await alice.publish(f"{SERVICE}.props.watch", b"", headers={"namespace": "wide"})
        await wait_until(lambda: seen == ["noded.props.subscribe_grant", "noded.props.unsubscribe_grant"], timeout=10, what="grant then revoke")
        await wait_until(lambda: stack.granter.grants == [], timeout=5, what="grant removed")
    finally:
        await deliveries.unsubscribe()
        for sub in subs:
            await sub.unsubscribe()


def _answer_probe(stack: PropsStack) -> Any:
    async def answer(msg: Msg) -> None:
        if msg.reply:
            await stack.clients["alice"].publish(msg.reply, b"")

    return answer


@pytest.mark.parametrize("memory", [False, True])
async def test_non_finite_numbers_are_validation_errors(tmp_path: Path, memory: bool) -> None:
    """NaN, Infinity, -Infinity and 1e400 (a number JSON cannot hold) are the
    caller's validation_error rc 10 on the SQLite and the in-memory store
    alike, on a number field and inside an object; nothing is committed."""
    async with props_stack(tmp_path, [NUMBERS], POLICY, memory=memory) as stack:
        alice = stack.clients["alice"]
        for raw in (b"NaN", b"Infinity", b"-Infinity", b"1e400"):
            for body in (b'{"n": ' + raw + b"}", b'{"meta": {"x": [1, ' + raw + b"]}}"):
                msg = await alice.request(f"{SERVICE}.props.set", body, timeout=5, headers={"namespace": "numbers", "key": "k"})
                reply = json.loads(msg.data)
                assert (msg.headers or {})["rc"] == "10", (raw, reply)
                assert reply["error_code"] == "validation_error" and "non-finite" in reply["message"]
        assert await stack.store.cursor("numbers") == 0
        assert (await stack.caller("alice").set("numbers", {"n": 1.5e308}, key="k"))["version"] == 1


async def test_delete_requires_if_version_under_require_version(stack: PropsStack) -> None:
    """Under require_version a delete without if_version is refused (rc 10,
    the record stays), a stale one is version_mismatch, the current one deletes."""
    alice = stack.caller("alice")
    await alice.set("fenced", {"title": "t"}, key="k", if_version="0")
    with pytest.raises(PropsError) as unfenced:
        await alice.request("delete", "fenced", key="k")
    assert (unfenced.value.error_code, unfenced.value.rc) == ("validation_error", 10)
    assert "requires if_version" in unfenced.value.message
    with pytest.raises(PropsError) as stale:
        await alice.request("delete", "fenced", key="k", if_version="0")
    assert (stale.value.error_code, stale.value.extra) == ("version_mismatch", {"expected_version": 0, "current_version": 1})
    assert (await alice.get("fenced", key="k"))["version"] == 1
    deleted = await alice.request("delete", "fenced", key="k", if_version="1")
    assert (deleted["deleted"], deleted["tombstone_version"]) == (True, 2)


async def test_replay_window_exceeded_answers_rc_10_and_removes_the_grant(stack: PropsStack) -> None:
    """replay_window_exceeded answers rc 10 on the wire (and removes the grant)."""
    tiny = Namespace("tiny", (FieldSpec("n", "integer"),), retain_events=1)
    stack.service.handler.policy = StaticPolicy({"A/alice": all_caps("demo.tiny")})
    await stack.service.register(tiny)
    for n in range(3):
        await stack.caller("alice").set("tiny", {"n": n}, key="k")
    alice = stack.clients["alice"]
    await alice.request("noded.peers.register", b"", timeout=5)
    deliveries = await alice.subscribe("noded.deliver.A.alice.>", cb=_answer_probe(stack))
    try:
        msg = await alice.request(f"{SERVICE}.props.watch", b"", timeout=5, headers={"namespace": "tiny", "since_nseq": "0"})
        assert (msg.headers or {})["rc"] == "10"
        assert json.loads(msg.data)["error_code"] == "replay_window_exceeded"
        assert stack.granter.grants == []
    finally:
        await deliveries.unsubscribe()


async def test_only_the_topic_owner_removes_a_grant(stack: PropsStack) -> None:
    """The broker's unsubscribe_grant removes a grant only for the topic's
    owner: another account is auth_denied and the grant stays; an unknown
    subscription is not_found."""
    watch = await open_watch(stack.clients["alice"], SERVICE, "wide")
    try:
        ((subscription_id, *_),) = stack.granter.grants
        noded = stack.clients["noded"]
        for sid, code in ((subscription_id, "auth_denied"), ("sub_unknown", "not_found")):
            msg = await noded.request("noded.props.unsubscribe_grant", b"", timeout=5, headers={"subscription_id": sid})
            assert ((msg.headers or {})["rc"], json.loads(msg.data)["error_code"]) == ("10", code)
        assert [g[0] for g in stack.granter.grants] == [subscription_id]
        assert await stack.service.handler.granter.unsubscribe_grant(subscription_id) is True  # type: ignore[union-attr]
        assert stack.granter.grants == []
        assert await stack.service.handler.granter.unsubscribe_grant(subscription_id) is False  # type: ignore[union-attr]
    finally:
        await watch.aclose()
