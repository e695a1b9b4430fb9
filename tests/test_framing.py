"""NOTIFY framing: payload bounds, round trips, interleaving and torn groups."""

from __future__ import annotations

import contextlib
import itertools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service_engine.errors import CauseTooLarge, FrameError, TornGroup
from service_engine.impacts import (
    MAX_IMPACT_BYTES,
    MAX_PAYLOAD_BYTES,
    Cause,
    Impact,
    NotifyFrame,
    Reassembler,
    encode_group,
    impact_json,
    new_group_id,
    parse_frame,
)

_CHARS = 'aZ"\\\n\x00é€😀|'  # escapes and 2-, 3- and 4-byte characters
_text = st.one_of(st.text(max_size=12), st.text(alphabet=st.sampled_from(_CHARS), max_size=12))
_keys = st.one_of(
    st.integers(),
    _text,
    st.lists(st.one_of(st.integers(), _text), max_size=3),
    st.dictionaries(_text, st.one_of(st.none(), st.integers(), _text), max_size=3),
)
_nouns = st.text(min_size=1, max_size=12)
_causes = st.builds(Cause, st.sampled_from(["card.moved", "étiquette.posée"]), _keys)
impacts = st.one_of(
    st.builds(Impact.entity, _nouns, _keys, st.none() | _causes),
    st.builds(Impact.foreign, _nouns, _keys),
    st.builds(Impact.reset, _nouns),
    st.builds(Impact.principal_facts, _keys, st.lists(_nouns, max_size=3)),
)


@st.composite
def big_impacts(draw: st.DrawFn) -> Impact:
    """An impact whose key or cause is a long run of one (often multi-byte) character.

    Built from a couple of draws so hypothesis explores sizes up to the frame
    limit without generating kilobytes of choices.
    """
    char = draw(st.sampled_from(_CHARS))
    bytes_per = len(char.encode()) if char not in '"\\\n\x00' else 6
    run = char * draw(st.integers(0, (MAX_IMPACT_BYTES - 200) // bytes_per))
    tail = draw(_text)
    if draw(st.booleans()):
        return Impact.entity("noun", run + tail, Cause("c", tail))
    return Impact.entity("noun", tail, Cause("c", run))


@st.composite
def many_impacts(draw: st.DrawFn) -> list[Impact]:
    """Hundreds of impacts expanded from a few templates."""
    templates = draw(st.lists(st.one_of(impacts, big_impacts()), min_size=1, max_size=4))
    count = draw(st.integers(1, 600))
    out = []
    for i in range(count):
        template = templates[i % len(templates)]
        if template.kind.value == "entity":
            out.append(Impact.entity(template.noun, [template.key, i], template.cause))
        else:
            out.append(template)
    return out


groups = st.one_of(st.lists(impacts, max_size=40), st.lists(big_impacts(), max_size=6))
limits = st.one_of(st.just(MAX_PAYLOAD_BYTES), st.integers(128, MAX_PAYLOAD_BYTES))


def _size(payload: str) -> int:
    return len(payload.encode("utf-8"))


def _reassemble(payloads: list[str]) -> list[Impact]:
    reassembler = Reassembler()
    released = None
    for i, payload in enumerate(payloads):
        released = reassembler.feed(parse_frame(payload))
        assert (released is None) == (i < len(payloads) - 1)
    assert released is not None
    assert reassembler.incomplete() == 0
    return released


def _fits(impact: Impact, limit: int) -> bool:
    return _size(impact_json(impact)) <= limit - 52


# --- size bounds and packing ------------------------------------------------


def test_one_small_impact_is_one_small_frame() -> None:
    """One small impact encodes to one frame of under 200 bytes in the 1|group|index|count|[...]
    layout."""
    payloads = encode_group(new_group_id(), [Impact.entity("card", 42, Cause("card.moved"))])
    assert len(payloads) == 1
    assert _size(payloads[0]) < 200
    assert re.fullmatch(r"1\|[0-9a-f]{16}\|0\|1\|\[.*\]", payloads[0])


def test_no_impacts_no_frames() -> None:
    """An empty group encodes to no frames."""
    assert encode_group(new_group_id(), []) == []


def test_hundreds_of_impacts_span_several_frames() -> None:
    """500 wide impacts span several frames, each under the NOTIFY payload limit, and reassemble to
    the group in order."""
    group = [Impact.entity("card", f"card-{i:04}-" + "é" * 40) for i in range(500)]
    payloads = encode_group(new_group_id(), group)
    assert len(payloads) > 3
    assert all(_size(payload) < MAX_PAYLOAD_BYTES for payload in payloads)
    assert _reassemble(payloads) == group


@pytest.mark.slow
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(groups, limits)
def test_every_payload_is_below_the_limit_and_round_trips(group: list[Impact], limit: int) -> None:
    """For any group and limit, every payload is below the limit, an empty group gives no payload,
    and the payloads reassemble to the group (property test)."""
    group = [impact for impact in group if _fits(impact, limit)]
    payloads = encode_group("g", group, limit=limit)
    assert all(_size(payload) < limit for payload in payloads)
    assert (payloads == []) == (group == [])
    if group:
        assert _reassemble(payloads) == group


@pytest.mark.slow
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(many_impacts())
def test_many_impacts_stay_below_8000_bytes(group: list[Impact]) -> None:
    """Large groups stay below 8,000 bytes a payload and reassemble exactly (property test)."""
    payloads = encode_group(new_group_id(), group)
    assert all(_size(payload) < MAX_PAYLOAD_BYTES for payload in payloads)
    assert _reassemble(payloads) == group


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(groups, limits)
def test_packing_is_greedy(group: list[Impact], limit: int) -> None:
    """No frame could have taken the next frame's first impact as well."""
    group = [impact for impact in group if _fits(impact, limit)]
    payloads = encode_group("g", group, limit=limit)
    for payload, following in itertools.pairwise(payloads):
        first_next = parse_frame(following).impacts[0]
        assert _size(payload) + 1 + _size(impact_json(first_next)) >= limit


def test_the_largest_admitted_impact_fits_with_the_longest_group_id() -> None:
    """An impact of exactly the largest admitted size fits a frame beside the longest group id; one
    byte more raises CauseTooLarge."""
    overhead = len(impact_json(Impact.entity("n", "")))
    exact = Impact.entity("n", "a" * (MAX_IMPACT_BYTES - overhead))
    assert _size(impact_json(exact)) == MAX_IMPACT_BYTES
    group_id = "x" * 32
    small = [Impact.entity("n", i) for i in range(15)]
    payloads = encode_group(group_id, [*small, exact, *small])
    assert all(_size(payload) < MAX_PAYLOAD_BYTES for payload in payloads)
    assert _reassemble(payloads) == [*small, exact, *small]

    over = Impact.entity("n", "a" * (MAX_IMPACT_BYTES - overhead + 1))
    with pytest.raises(CauseTooLarge):
        encode_group(group_id, [over])


def _padded(size: int) -> Impact:
    """An impact whose text is exactly ``size`` UTF-8 bytes, mostly 2-byte characters."""
    pad = size - len(impact_json(Impact.entity("n", "")))
    impact = Impact.entity("n", "é" * (pad // 2) + "a" * (pad % 2))
    assert _size(impact_json(impact)) == size
    return impact


@pytest.mark.parametrize("limit", [128, 1001, MAX_PAYLOAD_BYTES])
@pytest.mark.parametrize("frames", [1, 9, 12])
def test_frames_fill_to_exactly_one_byte_below_the_limit(limit: int, frames: int) -> None:
    """Each frame is packed to limit - 1 bytes, header digits included, and no further."""
    count_digits = len(str(frames))
    group: list[Impact] = []
    for index in range(frames):
        header = len(f"1|g|{index}|") + count_digits + 1
        room = limit - 1 - header - 2
        first = (room - 1) // 2
        group += [_padded(first), _padded(room - 1 - first)]
    payloads = encode_group("g", group, limit=limit)
    assert [_size(payload) for payload in payloads] == [limit - 1] * frames
    assert _reassemble(payloads) == group

    # One byte more pushes an impact into a further frame (at 9 frames the
    # count then needs a second digit, which splits every frame).
    group[-1] = _padded(_size(impact_json(group[-1])) + 1)
    payloads = encode_group("g", group, limit=limit)
    assert len(payloads) == (2 * frames if frames == 9 else frames + 1)
    assert all(_size(payload) < limit for payload in payloads)


# --- oversize impacts -------------------------------------------------------


@pytest.mark.parametrize("data", ["x" * 8000, "é" * 4000, {"rows": list(range(3000))}])
def test_oversize_cause_raises(data: object) -> None:
    """An impact too large for a frame raises CauseTooLarge naming the cause, the limit, its size
    and the advice that bulk data rides the view."""
    impact = Impact.entity("card", 1, Cause("card.imported", data))  # type: ignore[arg-type]
    with pytest.raises(CauseTooLarge) as caught:
        encode_group(new_group_id(), [Impact.entity("card", 0), impact])
    message = str(caught.value)
    assert "card.imported" in message
    assert str(MAX_PAYLOAD_BYTES) in message
    assert str(_size(impact_json(impact))) in message
    assert "bulk data rides the view" in message


def test_oversize_key_without_cause_raises_the_same_error() -> None:
    """An oversize key with no cause raises the same CauseTooLarge, naming the key."""
    with pytest.raises(CauseTooLarge, match="key"):
        encode_group(new_group_id(), [Impact.entity("card", "k" * 9000)])


def test_bad_arguments_raise_value_error() -> None:
    """An empty, separator-holding, over-long or non-ASCII group id, a limit out of range, or a lone
    surrogate in a key raises ValueError."""
    impact = Impact.entity("card", 1)
    for group_id in ["", "a|b", "x" * 33, "é"]:
        with pytest.raises(ValueError):
            encode_group(group_id, [impact])
    for limit in [127, MAX_PAYLOAD_BYTES + 1]:
        with pytest.raises(ValueError):
            encode_group("g", [impact], limit=limit)
    with pytest.raises(ValueError, match="surrogate"):
        encode_group("g", [Impact.entity("card", "\ud800")])


# --- canonical encoding -----------------------------------------------------


def test_same_impacts_same_bytes() -> None:
    """Equal impacts encode to the same bytes whatever their dict order or list/tuple spelling."""
    one = [Impact.entity("card", {"a": 1, "b": "é"}, Cause("c", {"x": [1], "y": None}))]
    two = [Impact.entity("card", {"b": "é", "a": 1}, Cause("c", {"y": None, "x": (1,)}))]
    assert encode_group("g1", one) == encode_group("g1", two)


@pytest.mark.slow
@given(groups)
def test_encoding_is_deterministic(group: list[Impact]) -> None:
    """Re-encoding the impacts parsed from a group's frames gives the same payloads (property test)."""
    group = [impact for impact in group if _fits(impact, MAX_PAYLOAD_BYTES)]
    payloads = encode_group("g", group)
    rebuilt = [impact for payload in payloads for impact in parse_frame(payload).impacts]
    assert encode_group("g", rebuilt) == payloads


# --- parsing ----------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "hello",
        "1|g|0|1",
        '2|g|0|1|[{"n":"c"}]',
        '1||0|1|[{"n":"c"}]',
        '1|g h|0|1|[{"n":"c"}]',
        '1|g|1|1|[{"n":"c"}]',
        '1|g|0|0|[{"n":"c"}]',
        '1|g|00|2|[{"n":"c"}]',
        '1|g|-1|2|[{"n":"c"}]',
        '1|g|0|1234567|[{"n":"c"}]',
        "1|g|0|1|",
        "1|g|0|1|[]",
        "1|g|0|1|{}",
        "1|g|0|1|[1]",
        '1|g|0|1|[{"n":"c"}',
        '1|g|0|1|[{"n":"c","k":NaN}]',
        '1|g|0|1|[{"n":"c","q":1}]',
        "1|g|0|1|" + "[" * 100_000 + "]" * 100_000,
    ],
)
def test_malformed_payload_raises_frame_error(payload: str) -> None:
    """Every malformed payload (bad version, group id, index, count, body, nesting) raises
    FrameError."""
    with pytest.raises(FrameError):
        parse_frame(payload)


@given(st.text())
def test_parse_frame_raises_only_frame_error(payload: str) -> None:
    """parse_frame raises nothing but FrameError on any text (property test)."""
    with contextlib.suppress(FrameError):
        parse_frame(payload)


@given(st.lists(impacts, min_size=1, max_size=5), st.data())
def test_every_proper_prefix_of_a_frame_is_rejected(
    group: list[Impact], data: st.DataObject
) -> None:
    """Every proper prefix of a frame is rejected with FrameError (property test)."""
    (payload,) = encode_group("g", group)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(FrameError):
        parse_frame(payload[:cut])


def test_new_group_ids_are_short_and_unique() -> None:
    """New group ids are 16 hex digits and 1,000 of them are distinct."""
    ids = {new_group_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{16}", group_id) for group_id in ids)


# --- reassembly -------------------------------------------------------------


def _frames(group_id: str, group: list[Impact], limit: int = 256) -> list[NotifyFrame]:
    return [parse_frame(payload) for payload in encode_group(group_id, group, limit=limit)]


def _group(size: int, noun: str = "card") -> list[Impact]:
    return [Impact.entity(noun, f"key-{i}-" + "x" * 30) for i in range(size)]


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(impacts, min_size=1, max_size=25), min_size=1, max_size=6), st.data())
def test_interleaved_groups_reassemble(groups_: list[list[Impact]], data: st.DataObject) -> None:
    """Frames of several groups interleaved in any order reassemble each group once, whole, leaving
    nothing pending (property test)."""
    groups_ = [[impact for impact in group if _fits(impact, 256)] for group in groups_]
    groups_ = [group for group in groups_ if group]
    frames = {f"g{i}": _frames(f"g{i}", group) for i, group in enumerate(groups_)}
    tokens = [group_id for group_id, group_frames in frames.items() for _ in group_frames]
    order = data.draw(st.permutations(tokens))
    cursor = dict.fromkeys(frames, 0)
    reassembler = Reassembler()
    released: dict[str, list[Impact]] = {}
    for group_id in order:
        frame = frames[group_id][cursor[group_id]]
        cursor[group_id] += 1
        result = reassembler.feed(frame)
        if result is not None:
            assert group_id not in released
            released[group_id] = result
    assert released == {f"g{i}": group for i, group in enumerate(groups_)}
    assert reassembler.incomplete() == 0
    assert reassembler.reset() is False


@given(st.integers(2, 60), st.data())
def test_a_dropped_frame_is_detected(size: int, data: st.DataObject) -> None:
    """A dropped frame raises TornGroup once, the torn group's tail is dropped quietly, and the next
    group reassembles (property test)."""
    frames = _frames("torn", _group(size))
    if len(frames) < 2:
        return
    dropped = data.draw(st.integers(0, len(frames) - 2))
    reassembler = Reassembler()
    for frame in frames[:dropped]:
        assert reassembler.feed(frame) is None
    with pytest.raises(TornGroup):
        reassembler.feed(frames[dropped + 1])
    # The loss is reported once; the torn group's tail is dropped quietly.
    for frame in frames[dropped + 2 :]:
        assert reassembler.feed(frame) is None
    assert reassembler.incomplete() == 0
    whole = _group(3, "other")
    assert _feed_all(reassembler, _frames("next", whole)) == whole


def _feed_all(reassembler: Reassembler, frames: list[NotifyFrame]) -> list[Impact] | None:
    result = None
    for frame in frames:
        result = reassembler.feed(frame)
    return result


def test_duplicate_frame_is_torn() -> None:
    """A frame fed twice is a TornGroup naming the frame expected."""
    frames = _frames("g", _group(20))
    assert len(frames) > 2
    reassembler = Reassembler()
    reassembler.feed(frames[0])
    with pytest.raises(TornGroup, match="expected frame 1"):
        reassembler.feed(frames[0])


def test_count_mismatch_is_torn() -> None:
    """A frame whose count disagrees with its group's is a TornGroup."""
    frames = _frames("g", _group(20))
    reassembler = Reassembler()
    reassembler.feed(frames[0])
    second = frames[1]
    liar = NotifyFrame(second.group_id, second.index, second.count + 1, second.impacts)
    with pytest.raises(TornGroup):
        reassembler.feed(liar)


def test_reset_reports_an_incomplete_group() -> None:
    """reset reports whether a group was pending and forgets it; the discarded group's tail releases
    nothing."""
    frames = _frames("g", _group(20))
    reassembler = Reassembler()
    assert reassembler.reset() is False
    reassembler.feed(frames[0])
    assert reassembler.incomplete() == 1
    assert reassembler.reset() is True
    assert reassembler.incomplete() == 0
    assert reassembler.reset() is False
    # Should the discarded group's tail still arrive, its loss is already known.
    assert _feed_all(reassembler, frames[1:]) is None


def test_pending_groups_are_bounded() -> None:
    """Past max_pending groups in flight the oldest is torn (named) and dropped; the others
    complete; max_pending 0 is refused."""
    frames = {name: _frames(name, _group(10, name)) for name in ("a", "b", "c")}
    reassembler = Reassembler(max_pending=2)
    reassembler.feed(frames["a"][0])
    reassembler.feed(frames["b"][0])
    with pytest.raises(TornGroup, match="'a'"):
        reassembler.feed(frames["c"][0])
    assert reassembler.incomplete() == 2
    assert _feed_all(reassembler, frames["a"][1:]) is None
    assert _feed_all(reassembler, frames["b"][1:]) == _group(10, "b")
    assert _feed_all(reassembler, frames["c"][1:]) == _group(10, "c")
    with pytest.raises(ValueError):
        Reassembler(max_pending=0)


def test_single_frame_groups_pass_straight_through() -> None:
    """A one-frame group is released at once and leaves nothing pending."""
    reassembler = Reassembler(max_pending=1)
    for i in range(5):
        impact = Impact.entity("card", i)
        (frame,) = _frames(f"g{i}", [impact])
        assert reassembler.feed(frame) == [impact]
    assert reassembler.incomplete() == 0
