"""A live operation's frame: Strawberry's encoding of the ``next`` message, the plan's
shared serialisation spliced in (`live_ops.next_frame`), found for a cohort's delta
without building its member."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from graphql import OperationDefinitionNode, parse

from service_engine.graphql.delivery_plan import Encoded
from service_engine.graphql.subscriptions import LanesPaused
from service_engine.render.deltas import Remove, Reset, Upsert
from service_engine.server import delivery
from service_engine.server.live_op import next_frame, next_frame_head

from .test_delivery_plan import ALPHA, BETA, CAUSE, FULL, GRAPHQL_SCHEMA, THINGS

DELTAS: list[Any] = [
    Reset(1, {'"t1"': ALPHA, '"t2"': BETA}),
    Upsert(2, '"t1"', ALPHA, CAUSE),
    Upsert(3, '"t2"', BETA),
    Remove(4, '"t2"', CAUSE),
    Upsert(5, '"t1"', copy.deepcopy(ALPHA), CAUSE),
]


def _ids() -> Iterator[str]:
    yield from ("1", "op-1", "a\"b\\c", "\u00e9\u4e2d", "emoji \U0001f600", "\x00\n\t", "")


@pytest.mark.parametrize("op_id", list(_ids()))
@pytest.mark.parametrize("data", [
    Encoded(('{"things":{"revision":', ',"t":"\\u00e9\\"q\\""}}'), 17),
    Encoded(('{"things":{"lanes":["a"]}}',), None),
    Encoded(('{"a":', ',"b":', "}"), 5),
])
def test_the_frame_is_strawberrys_encoding_of_the_next_message(op_id: str, data: Encoded) -> None:
    """The frame text is json.dumps of {"id", "type": "next", "payload": {"data"}} with
    Strawberry's separators, for any operation id."""
    message = {"id": op_id, "type": "next", "payload": {"data": data.value()}}
    assert next_frame(next_frame_head(op_id), data) == json.dumps(
        message, separators=(",", ":"))


def test_a_cohorts_delta_is_found_without_building_its_member() -> None:
    """shared answers a delta whose fields another session's member carried (equal or the
    same objects; its chunks, framed at the delta's own revision), and nothing for a changed
    view or cause, a Reset or a lane notice."""
    document = parse(FULL)
    operation = document.definitions[0]
    assert isinstance(operation, OperationDefinitionNode)
    shared = delivery.plan_for(GRAPHQL_SCHEMA, operation, {}, {})
    assert shared is not None
    first = shared.encode(THINGS.message(Upsert(2, '"t1"', ALPHA, CAUSE)))
    later = Upsert(9, '"t1"', copy.deepcopy(ALPHA), CAUSE)
    hit = shared.shared(THINGS.upsert, later)
    assert hit is not None and hit.chunks is first.chunks
    head = next_frame_head("op")
    assert next_frame(head, hit, later.revision) == next_frame(
        head, shared.encode(THINGS.message(later)))
    changed = copy.deepcopy(ALPHA)
    changed.title = "other"
    assert shared.shared(THINGS.upsert, Upsert(10, '"t1"', changed, CAUSE)) is None
    assert shared.shared(THINGS.upsert, Upsert(10, '"t1"', ALPHA, None)) is None
    removed = shared.encode(THINGS.message(Remove(11, '"t1"', CAUSE)))
    hit = shared.shared(THINGS.remove, Remove(12, '"t1"', CAUSE))
    assert hit is not None and hit.chunks is removed.chunks
    reset = THINGS.message(Reset(1, {'"t1"': ALPHA}))
    shared.encode(reset)
    assert shared.shared(THINGS.reset, reset) is None  # a Reset's lists are the session's
    assert shared.shared(LanesPaused, LanesPaused(lanes=["x"])) is None


def test_a_reset_of_a_cohorts_window_is_serialised_once_and_framed_per_session() -> None:
    """encode_reset serialises a Reset once for every Reset carrying the same keys in the
    same order with the same (or equal) views, each session's frame still exactly its own
    (its revision, its operation id: what the plan gives that Reset alone); other keys, a
    changed view or another order are serialised anew."""
    document = parse(FULL)
    operation = document.definitions[0]
    assert isinstance(operation, OperationDefinitionNode)
    shared = delivery.plan_for(GRAPHQL_SCHEMA, operation, {}, {"reset-test": 1})
    assert shared is not None
    built: list[object] = []

    def message(reset: Any) -> object:
        built.append(reset)
        return THINGS.message(reset)

    def own(reset: Reset[Any], op_id: str) -> str:
        """The frame the plan gives this Reset by itself."""
        return next_frame(next_frame_head(op_id), shared.plan.encode(THINGS.message(reset)))

    first = Reset(1, {'"t1"': ALPHA, '"t2"': BETA})
    cohort = [first, Reset(1, {'"t1"': ALPHA, '"t2"': BETA}),
              Reset(7, dict(first.views)),
              Reset(2, {'"t1"': copy.deepcopy(ALPHA), '"t2"': copy.deepcopy(BETA)})]
    encoded = [shared.encode_reset(message, reset) for reset in cohort]
    assert built == [first] and all(e is encoded[0] for e in encoded)
    for reset in cohort:
        for op_id in ("1", "op-2"):
            data = shared.encode_reset(message, reset)
            assert next_frame(next_frame_head(op_id), data, reset.revision) == own(reset, op_id)
    changed = copy.deepcopy(BETA)
    changed.title = "Beta 2"
    others = [Reset(1, {'"t1"': ALPHA, '"t2"': changed}), Reset(1, {'"t2"': BETA, '"t1"': ALPHA}),
              Reset(1, {'"t1"': ALPHA}), Reset(1, {})]
    for reset in others:
        data = shared.encode_reset(message, reset)
        assert built[-1] is reset
        assert next_frame(next_frame_head("1"), data, reset.revision) == own(reset, "1")
    assert len(built) == 1 + len(others)
