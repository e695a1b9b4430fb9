"""Collapse: a subscriber that falls behind reads its latest state on a
contiguous revision.

`Backlog` is the pure core of `SessionStream`: deltas put while the reader
does not take them collapse once ``behind`` wait (the latest Upsert/Remove of
a key replaces an earlier untaken one, an insert and its Remove vanish, a
Reset drops what waits before it), and `take` numbers what it hands out.
The properties: whatever is put and whenever it is taken, the reader's
revisions are contiguous from 1, its window ends equal to (and in the same
order as) the engine's, nothing collapses while the reader keeps up, and
what waits stays bounded by the keys it touches.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service_engine.impacts.model import Cause, canonical_json
from service_engine.render import Remove, Reset, Upsert, WindowReplica
from service_engine.render.deltas import Delta, renumbered
from service_engine.render.plan import latest_causes
from service_engine.render.session_id import new_session_id
from service_engine.render.stream import Backlog, SessionStream

_KEYS = [canonical_json(k) for k in range(6)]


class _Engine:
    """What a session would send: a valid delta sequence over a window."""

    def __init__(self) -> None:
        self.revision = 0
        self.window: dict[str, int] = {}

    def reset(self, views: dict[str, int]) -> Reset[int]:
        self.revision += 1
        self.window = dict(views)
        return Reset(self.revision, dict(views))

    def step(self, key: str, view: int | None) -> Delta[int] | None:
        if view is None:
            if key not in self.window:
                return None
            del self.window[key]
            self.revision += 1
            return Remove(self.revision, key)
        self.window[key] = view
        self.revision += 1
        return Upsert(self.revision, key, view)


# An operation: put a change of (key, view or None for a Remove), put a
# Reset of the engine's window with one key set, or let the reader take n.
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("change"), st.sampled_from(_KEYS), st.none() | st.integers(0, 9)),
        st.tuples(st.just("reset"), st.sampled_from(_KEYS), st.integers(0, 9)),
        st.tuples(st.just("take"), st.integers(0, 8), st.just(0)),
    ),
    max_size=80,
)


def _run(ops: list[tuple[str, Any, Any]], behind: int) -> tuple[_Engine, WindowReplica[int],
                                                                 Backlog[int], list[Delta[int]]]:
    engine = _Engine()
    backlog: Backlog[int] = Backlog(behind)
    replica: WindowReplica[int] = WindowReplica()
    taken: list[Delta[int]] = []
    backlog.put(engine.reset({}))

    def take(n: int) -> None:
        for _ in range(n):
            delta = backlog.take()
            if delta is None:
                return
            replica.apply(delta)  # raises RevisionGap on any discontinuity
            taken.append(delta)

    for op, key, value in ops:
        if op == "change":
            delta = engine.step(key, value)
            if delta is not None:
                backlog.put(delta)
        elif op == "reset":
            backlog.put(engine.reset({**engine.window, key: value}))
        else:
            take(key)
    take(10_000)
    return engine, replica, backlog, taken


@settings(max_examples=400, deadline=None)
@given(_ops, st.integers(0, 6))
def test_collapse_keeps_revisions_contiguous_and_ends_at_the_latest_state(
    ops: list[tuple[str, Any, Any]], behind: int
) -> None:
    """However deltas are put and taken, the reader's revisions run 1, 2, 3...
    and its window ends equal to the engine's, in the engine's order."""
    engine, replica, backlog, taken = _run(ops, behind)
    assert [d.revision for d in taken] == list(range(1, len(taken) + 1))
    assert replica.views == engine.window
    assert list(replica.views) == list(engine.window)
    assert len(backlog) == 0


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_a_reader_that_keeps_up_sees_every_delta_unchanged(ops: list[tuple[str, Any, Any]]) -> None:
    """Below ``behind`` nothing collapses: the reader takes exactly the
    deltas the engine sent, with their own revisions."""
    engine = _Engine()
    backlog: Backlog[int] = Backlog(10_000)
    sent: list[Delta[int]] = [engine.reset({})]
    backlog.put(sent[0])
    for op, key, value in ops:
        delta = engine.step(key, value) if op == "change" else (
            engine.reset({key: value}) if op == "reset" else None)
        if delta is not None:
            sent.append(delta)
            backlog.put(delta)
    taken = []
    while (d := backlog.take()) is not None:
        taken.append(d)
    assert taken == sent
    assert backlog.collapsed == 0


def test_untaken_upserts_of_one_key_collapse_to_the_latest() -> None:
    """Behind, 100 Upserts of one key wait as one, the latest, numbered
    one past the last revision taken."""
    engine = _Engine()
    backlog: Backlog[int] = Backlog(0)
    backlog.put(engine.reset({_KEYS[0]: 0}))
    assert backlog.take() == Reset(1, {_KEYS[0]: 0})
    for view in range(1, 101):
        backlog.put(engine.step(_KEYS[0], view))  # type: ignore[arg-type]
    assert len(backlog) == 1
    assert backlog.collapsed == 99
    assert backlog.take() == Upsert(2, _KEYS[0], 100)
    assert backlog.take() is None


def test_an_insert_and_its_remove_vanish_and_a_reset_drops_what_waits() -> None:
    """Behind: a key Removed, re-inserted and Removed again waits as its one
    Remove; a Reset put behind waiting deltas replaces them."""
    engine = _Engine()
    backlog: Backlog[int] = Backlog(0)
    backlog.put(engine.reset({_KEYS[0]: 0, _KEYS[1]: 0}))
    backlog.take()
    for delta in (engine.step(_KEYS[0], None), engine.step(_KEYS[0], 5),
                  engine.step(_KEYS[0], None)):
        assert delta is not None
        backlog.put(delta)
    assert len(backlog) == 1
    assert backlog.take() == Remove(2, _KEYS[0])
    for view in range(3):
        backlog.put(engine.step(_KEYS[2 + view], view))  # type: ignore[arg-type]
    backlog.put(engine.reset(engine.window))
    assert len(backlog) == 1
    taken = backlog.take()
    assert isinstance(taken, Reset) and taken.revision == 3
    assert dict(taken.views) == engine.window


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_KEYS), st.none() | st.integers(0, 9)), max_size=300))
def test_what_waits_is_bounded_by_the_keys_touched(changes: list[tuple[str, int | None]]) -> None:
    """A reader that never takes, once behind, holds at most three deltas
    per key (an unknown Upsert, its Remove, a re-insert) however many land."""
    engine = _Engine()
    backlog: Backlog[int] = Backlog(0)
    backlog.put(engine.reset({}))
    for key, view in changes:
        delta = engine.step(key, view)
        if delta is not None:
            backlog.put(delta)
    assert len(backlog) <= 1 + 3 * len(_KEYS)


def test_renumbered_keeps_everything_but_the_revision() -> None:
    """A renumbered delta is the same delta on another revision."""
    cause = Cause("card.moved", {"to": "done"})
    assert renumbered(Upsert(7, "k", 1, cause), 3) == Upsert(3, "k", 1, cause)
    assert renumbered(Remove(7, "k", cause), 3) == Remove(3, "k", cause)
    assert renumbered(Reset(7, {"k": 1}), 3) == Reset(3, {"k": 1})


def test_latest_causes_keeps_the_last_cause_of_each_key() -> None:
    """A behind pass folds a PerImpact change to one cause per key, the last,
    in the order of those last causes; nothing folds without repeats."""
    a1, b1, a2 = Cause("a", 1), Cause("b", 1), Cause("a", 2)
    assert latest_causes([("k1", a1), ("k2", b1), ("k1", a2)]) == ([("k2", b1), ("k1", a2)], 1)
    assert latest_causes([("k1", a1), ("k2", b1)]) == ([("k1", a1), ("k2", b1)], 0)
    assert latest_causes([]) == ([], 0)


def test_stream_wakes_its_reader_and_ends_after_what_it_holds() -> None:
    """The stream's reader wakes on a put, reads what was queued before the
    end, then stops; past capacity the backlog is dropped and nothing but
    a Reset is accepted until the resnapshot arrives."""

    async def scenario() -> None:
        closed: list[bool] = []
        stream: SessionStream[int] = SessionStream(new_session_id(), 4, lambda: closed.append(True),
                                                   behind=1_000)
        reader = asyncio.ensure_future(stream.next())
        await asyncio.sleep(0)
        assert stream.waiting == 1
        assert stream.put(Reset(1, {}))
        assert await asyncio.wait_for(reader, 1) == Reset(1, {})
        for rev in range(2, 6):
            assert stream.put(Upsert(rev, _KEYS[rev % 2], rev))
        assert not stream.put(Upsert(6, _KEYS[0], 6)), "past capacity"
        assert stream.pending() == 0
        assert not stream.put(Upsert(7, _KEYS[0], 7)), "dropped until the Reset"
        assert stream.put(Reset(8, {_KEYS[0]: 7}))
        stream.end("closed")
        got = [d async for d in stream]
        assert got == [Reset(2, {_KEYS[0]: 7})]
        assert stream.end_reason == "closed"
        assert stream.get_nowait() is None
        await stream.aclose()
        assert closed == [True]

    asyncio.run(scenario())


def test_a_reset_reaching_a_full_backlog_replaces_it() -> None:
    """A Reset put on a stream whose backlog is at capacity is accepted and
    replaces what waits (it carries the whole window): no resync, no gap."""

    async def scenario() -> None:
        stream: SessionStream[int] = SessionStream(new_session_id(), 4, lambda: None, behind=1_000)
        for rev in range(1, 5):
            assert stream.put(Upsert(rev, _KEYS[rev % 2], rev))
        assert stream.put(Reset(5, {_KEYS[0]: 5})), "a Reset is never refused"
        assert stream.put(Upsert(6, _KEYS[1], 6)), "not resyncing after it"
        stream.end("closed")
        got = [d async for d in stream]
        assert got == [Reset(1, {_KEYS[0]: 5}), Upsert(2, _KEYS[1], 6)]
        await stream.aclose()

    asyncio.run(scenario())
