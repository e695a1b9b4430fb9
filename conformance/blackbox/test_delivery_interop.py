"""A standard client receives, byte for byte, what graphql-core's own
execution of every event sent before the delivery plan became the one path.

The reference service (one pod, as served: the delivery plan, a document's
second subscribe a task-free live operation, `service_engine.server.live_ops`)
and a standard graphql-transport-ws client (the ``websockets`` library)
subscribe with the same documents (``__typename``, aliases, inline and named
fragments, variables in ``@include`` / ``@skip``, the RLS-read projector, a
window of one that drops a key, a document that fails validation, one past
the socket's subscription bound, one the client completes, a presence
lane's notices); after each step, every operation's frames must be the same
text the pod executing every event through graphql-core sent for that step
on 6265370, when three delivery paths ran side by side and agreed
(``delivery_transcripts.json``). Each document is subscribed twice: the
first runs through Strawberry, the second is a live operation, and both
receive the same frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection

from service_engine.embedded import EmbeddedNats

from .harness import (
    ADMIN,
    ARCHIVE,
    BOARDS_SUBSCRIPTION,
    DELETE,
    ORG_BOARDS_SUBSCRIPTION,
    RENAME,
    GqlSocket,
    Pod,
    Pods,
    create_board,
)

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

ALIASED = """subscription { mine: boards(limit: 50) {
  kind: __typename
  ... on BoardsUpsert { rev: revision k: key v: view { t: title id archived a: affordances { allowed action } } why: cause { name } }
  ... on BoardsReset { n: revision keys views { id } }
  ... on BoardsRemove { r: revision key }
} }"""

FRAGMENTS = """
fragment View on BoardView { id title ...Owner affordances { ...Aff } }
fragment Owner on BoardView { owner member org }
fragment Aff on Affordance { action allowed reason }
fragment Tag on BoardsMessage { __typename }
subscription Live($withTitle: Boolean!, $noKey: Boolean!) { boards {
  ...Tag
  ... on BoardsUpsert { revision key @skip(if: $noKey) view { ...View title @include(if: $withTitle) } }
  ... on BoardsReset { revision views { ...View } }
} }
"""

DOCUMENTS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "full": (BOARDS_SUBSCRIPTION, None),
    "aliased": (ALIASED, None),
    "fragments": (FRAGMENTS, {"withTitle": True, "noKey": True}),
    "org": (ORG_BOARDS_SUBSCRIPTION, None),
}

WINDOW_OF_ONE = """subscription { boards(limit: 1) { __typename
  ... on BoardsReset { revision keys }
  ... on BoardsUpsert { revision key view { title } }
  ... on BoardsRemove { revision key cause { name } }
} }"""

INVALID = "subscription { boards { __typename ... on BoardsUpsert { nope } } }"

COMPLETED = "subscription { boards { __typename ... on BoardsUpsert { revision key } } }"

TYPING = """subscription($id: ID!) { replyTyping(id: $id) { __typename
  ... on ReplyTypingReset { revision keys views { replyId person } }
  ... on ReplyTypingUpsert { revision key view { replyId person } }
  ... on ReplyTypingRemove { revision key }
  ... on LanesPaused { lanes }
  ... on LanesResumed { lanes }
} }"""

TYPING_OPS = ("typing", "typing-again")
"""The presence subscription's first and second subscribe (ids)."""

START_REPLY = "mutation($id: ID) { startReply(id: $id) { success error { code message } } }"
SET_TYPING = "mutation($id: ID!) { replyTyping(id: $id) { success error { code } } }"

AGAIN = "-again"
"""The id suffix of a document's second subscribe (a live operation where served so)."""

MAX_SUBSCRIPTIONS = 2 * len(DOCUMENTS) + 3
"""The socket bound on every pod: the documents twice, the window of one and
the completed one twice fit (the invalid one is refused, never live); one
more does not."""

VARIANTS: dict[str, dict[str, str]] = {"served": {}}
"""The pods compared (each step's frames the same on every one): the one as served."""

TRANSCRIPTS: dict[str, list[dict[str, list[str]]]] = json.loads(
    Path(__file__).with_name("delivery_transcripts.json").read_text())
"""Per test, each step's frames by operation from graphql-core's execution of
every event (6265370, where it agreed with the planned paths)."""

QUIET = 0.5
"""How long a socket must stay quiet for a write's frames to count as all in."""


async def _drain(ws: ClientConnection, into: dict[str, list[str]]) -> None:
    """Every frame that arrives until the socket is quiet, by operation id."""
    while True:
        try:
            raw = await asyncio.wait_for(ws.recv(), QUIET)
        except TimeoutError:
            return
        assert isinstance(raw, str)
        into[json.loads(raw)["id"]].append(raw)


class _Sockets:
    """One socket per variant, every step's frames compared across them."""

    def __init__(self, sockets: dict[str, GqlSocket], test: str) -> None:
        self.sockets = sockets
        self.expected = TRANSCRIPTS[test]
        """The test's transcript: each step is waited for until every
        operation holds at least the frames it names there."""
        self.frames: dict[str, dict[str, list[str]]] = {
            name: defaultdict(list) for name in sockets}
        self.steps: list[dict[str, list[str]]] = []
        """Each settled step's frames by operation (as ``seen`` read them)."""

    async def send(self, message: dict[str, Any]) -> None:
        for ws in self.sockets.values():
            await ws.send(message)

    async def subscribe(self, op_id: str, query: str, variables: dict[str, Any] | None) -> None:
        for ws in self.sockets.values():
            await ws.subscribe(op_id, query, variables)

    async def settle(
        self, until: Callable[[dict[str, list[str]]], bool] | None = None,
        bound: float = 30.0, seen: Callable[[list[str]], list[str]] | None = None,
    ) -> dict[str, list[str]]:
        """Drain every socket until it is quiet, holds at least as many
        frames per operation as the transcript's step (as ``seen`` reads
        them, when given) and ``until`` holds of each one's frames; every
        socket's frames must then be the same. A pod that is slower to
        answer (a loaded machine, a NATS reconnect) is waited for, within
        ``bound``; what arrives past the step's count still shows in the
        comparison with the transcript."""
        deadline = asyncio.get_running_loop().time() + bound
        step = self.expected[min(len(self.steps), len(self.expected) - 1)]

        def counted(got: dict[str, list[str]]) -> bool:
            return all(len(seen(got[op]) if seen is not None else got[op]) >= len(want)
                       for op, want in step.items())
        while True:
            for name, ws in self.sockets.items():
                await _drain(ws.ws, self.frames[name])
            compared = [
                {op: seen(got) if seen is not None else got for op, got in ops.items()}
                for ops in self.frames.values()
            ]
            first, *rest = compared
            done = all(counted(got) and (until is None or until(got))
                       for got in self.frames.values())
            if (done and all(other == first for other in rest)) or (
                asyncio.get_running_loop().time() > deadline
            ):
                break
        for other in rest:
            assert other == first, "\n".join(
                f"{name} {op}: {frame}" for name, ops in self.frames.items()
                for op, got in ops.items() for frame in got)
        self.steps.append({op: list(got) for op, got in first.items()})
        return next(iter(self.frames.values()))

    def assert_as_executed(self) -> None:
        """Every settled step's frames are what graphql-core's execution sent."""
        expected = self.expected
        assert len(self.steps) == len(expected)
        for n, (got, want) in enumerate(zip(self.steps, expected, strict=True)):
            assert got == want, (n, got, want)


@contextlib.asynccontextmanager
async def _variants(pods: Pods, env: dict[str, str], test: str
                    ) -> AsyncIterator[tuple[list[Pod], _Sockets]]:
    spawned = [await pods.spawn(name, env={**env, **extra}) for name, extra in VARIANTS.items()]
    async with contextlib.AsyncExitStack() as stack:
        sockets = {pod.name: await stack.enter_async_context(pod.socket(ADMIN))
                   for pod in spawned}
        for ws in sockets.values():
            await ws.init()
        yield spawned, _Sockets(sockets, test)


async def test_planned_delivery_sends_the_bytes_graphql_core_executed(pods: Pods) -> None:
    """Each step's frames, per operation, are the text graphql-core's execution of every
    event sent (a document's second subscribe a live operation): Resets, Upserts, a Remove
    from a delete and one from a window of one, a validation error, the socket bound's
    refusal, and nothing more for an operation the client completed (the live one too)."""
    env = {"SERVICE_ENGINE_WS_MAX_SUBSCRIPTIONS_PER_SOCKET": str(MAX_SUBSCRIPTIONS)}
    async with _variants(pods, env, "planned") as ((direct,), on):
        for op_id, (query, variables) in DOCUMENTS.items():
            await on.subscribe(op_id, query, variables)
        await on.subscribe("one", WINDOW_OF_ONE, None)
        await on.subscribe("invalid", INVALID, None)
        await on.settle()  # the invalid one is refused, and no longer counts
        await on.subscribe("completed", COMPLETED, None)
        await on.settle()  # every document has run once: known where live operations serve
        for op_id, (query, variables) in DOCUMENTS.items():
            await on.subscribe(op_id + AGAIN, query, variables)
        await on.subscribe("completed" + AGAIN, COMPLETED, None)
        frames = await on.settle()
        assert set(frames) == {*DOCUMENTS, "one", "invalid", "completed",
                               *(op + AGAIN for op in [*DOCUMENTS, "completed"])}
        assert json.loads(frames["invalid"][0])["type"] == "error"
        await on.subscribe("over", COMPLETED, None)
        frames = await on.settle()
        assert "too_many_subscriptions" in frames["over"][0], frames["over"]
        await create_board(direct, "b-interop", "Interop \u00e9 \"quoted\"")
        await on.settle()
        await direct.gql(RENAME, {"id": "b-interop", "title": "renamed"}, ADMIN)
        await on.settle()
        await on.send({"id": "completed", "type": "complete"})
        await on.send({"id": "completed" + AGAIN, "type": "complete"})
        await direct.gql(ARCHIVE, {"id": "b-interop"}, ADMIN)
        await on.settle()
        await create_board(direct, "b-interop-2", "second")
        await on.settle()
        await direct.gql(DELETE, {"id": "b-interop"}, ADMIN)
        frames = await on.settle()
        on.assert_as_executed()
    # Every live operation received its Reset and at least one change; the completed ones
    # nothing after their complete; both windows saw a Remove; a document's second
    # subscribe (no change came between the two) received what its first did.
    live = {*DOCUMENTS, "one", *(op + AGAIN for op in DOCUMENTS)}
    assert all(len(frames[op]) >= 2 for op in live), frames
    assert len(frames["completed"]) == 3, frames["completed"]  # Reset, create, rename
    assert len(frames["completed" + AGAIN]) == 3, frames["completed" + AGAIN]
    for op in [*DOCUMENTS, "completed"]:
        again = [f.replace(f'{{"id":"{op + AGAIN}"', f'{{"id":"{op}"', 1)
                 for f in frames[op + AGAIN]]
        assert again == frames[op], op
    assert any('"BoardsRemove"' in f for f in frames["one"]), frames["one"]
    assert any('"BoardsRemove"' in f for f in frames["full"]), frames["full"]


async def test_lane_notices_are_the_bytes_graphql_core_executed(
    pods: Pods, nats_server: EmbeddedNats
) -> None:
    """A presence lane's subscription (subscribed twice: the second a live operation):
    its Reset, a typist's Upsert, the LanesPaused past nats_grace while NATS is away and
    the LanesResumed and Reset on its return are the text graphql-core's execution sent.
    Across the outage the watcher re-seeds on its own clock (it may send one more Reset of
    the same state, so its later revisions are one higher): there the frames are compared
    with the revision read out and a repeated frame once."""
    env = {"SERVICE_ENGINE_NATS_GRACE": "0.5"}
    async with _variants(pods, env, "lanes") as ((direct, *_others), on):
        started = await direct.gql(START_REPLY, {"id": "r-interop"}, ADMIN)
        assert started["startReply"]["success"], started
        await on.subscribe("typing", TYPING, {"id": "r-interop"})
        await on.settle()
        # The second subscribe of the document: a live operation where served so.
        await on.subscribe(TYPING_OPS[1], TYPING, {"id": "r-interop"})
        await on.settle()
        typed = await direct.gql(SET_TYPING, {"id": "r-interop"}, ADMIN)
        assert typed["replyTyping"]["success"], typed
        await on.settle()
        await asyncio.to_thread(nats_server.stop)
        try:
            await on.settle(until=lambda got: all(
                _after(got[op], "LanesPaused") for op in TYPING_OPS))
        finally:
            await asyncio.to_thread(nats_server.start)
        frames = await on.settle(
            until=lambda got: all(
                _after(got[op], "LanesResumed", "ReplyTypingReset") for op in TYPING_OPS),
            seen=_once_without_revision)
        on.assert_as_executed()
    for op in TYPING_OPS:
        kinds = _kinds(frames[op])
        assert kinds[0] == "ReplyTypingReset" and "ReplyTypingUpsert" in kinds, kinds
        assert _after(frames[op], "LanesPaused", "LanesResumed", "ReplyTypingReset"), kinds


_REVISION = re.compile(r'"revision":\d+')



def _once_without_revision(frames: list[str]) -> list[str]:
    """The frames with their revision read out, a frame repeating the one before dropped."""
    out: list[str] = []
    for frame in frames:
        text = _REVISION.sub('"revision":_', frame)
        if not out or out[-1] != text:
            out.append(text)
    return out


def _kinds(frames: list[str]) -> list[str]:
    return [json.loads(f)["payload"]["data"]["replyTyping"]["__typename"] for f in frames]


def _after(frames: list[str], *kinds: str) -> bool:
    """Whether ``kinds`` arrived in this order (others may come between)."""
    seen = iter(_kinds(frames))
    return all(kind in seen for kind in kinds)
