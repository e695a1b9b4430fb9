"""NOTIFY framing: one commit's impacts as one group of NOTIFY payloads.

Postgres refuses a NOTIFY payload of 8000 bytes or more, so the impacts of one
commit are packed into the fewest frames that each stay strictly below that
limit, and reassembled on the listening side.

Wire format of one frame (a UTF-8 ``str``)::

    1|<group id>|<index>|<count>|[<impact>,<impact>,...]

``1`` is the format version; the group id is 1-32 characters of
``[0-9A-Za-z_-]`` (`new_group_id` makes one); ``index`` (0-based) and
``count`` are decimal without leading zeros; the body is a JSON array of
canonical impact texts (see `service_engine.impacts.model`), never empty. A
commit staging one small impact sends one frame of a few dozen bytes, e.g.
``1|9f86d081884c7d65|0|1|[{"k":42,"n":"card"}]``.

Any impact of at most `MAX_IMPACT_BYTES` fits a frame wherever it falls in a
group; a larger one raises `CauseTooLarge` from `encode_group` inside the
write transaction, which then fails closed. That holds for an impact without
a cause too (an absurdly large key): the same error class, so the write path
has one "this impact cannot ride NOTIFY" failure to handle, and its message
says whether the key or the cause is to blame.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from service_engine.failures import CauseTooLarge, ConfigError, FrameError, TornGroup
from service_engine.impacts.model import Impact, InvalidImpact, decode_impact, impact_json

MAX_PAYLOAD_BYTES = 8000
"""Postgres's NOTIFY limit: every payload is strictly shorter than this, in UTF-8 bytes."""

FRAME_VERSION = "1"
MAX_GROUP_ID_LENGTH = 32
MAX_FRAMES = 999_999
"""Frames one group may span: bounds the header's digits (far above any real commit)."""

DEFAULT_MAX_PENDING = 1024
"""How many incomplete groups a `Reassembler` holds before it reports a loss."""

# The largest header any frame can have: version, the longest group id, and
# six-digit index and count, with their four separators.
_WORST_HEADER = len(FRAME_VERSION) + 1 + MAX_GROUP_ID_LENGTH + 1 + 6 + 1 + 6 + 1
_BRACKETS = 2

MAX_IMPACT_BYTES = MAX_PAYLOAD_BYTES - 1 - _WORST_HEADER - _BRACKETS
"""The largest impact text (UTF-8 bytes) that `encode_group` accepts."""

_MIN_LIMIT = 128
_GROUP_ID = re.compile(rf"[0-9A-Za-z_-]{{1,{MAX_GROUP_ID_LENGTH}}}")
_UINT = re.compile(r"0|[1-9][0-9]{0,5}")


def new_group_id() -> str:
    """Return a fresh group id (16 hex characters, 64 random bits).

    Use one per commit: Postgres folds identical payloads sent by one
    transaction, and the reassembler keys groups on this id.
    """
    return secrets.token_hex(8)


def _utf8_len(text: str) -> int:
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidImpact("impact contains a lone surrogate and cannot be sent as UTF-8") from exc


def _too_large(position: int, impact: Impact, size: int, max_bytes: int, limit: int) -> Exception:
    key_bytes = _utf8_len(impact.key_json)
    if impact.cause is None:
        blame = (
            f"its key alone is {key_bytes} bytes; a key identifies a row, bulk data rides the view"
        )
    else:
        cause_bytes = _utf8_len(impact.cause.data_json)
        blame = (
            f"its cause {impact.cause.name!r} carries {cause_bytes} bytes of data and its key "
            f"{key_bytes}; a cause is a small fact, bulk data rides the view"
        )
    return CauseTooLarge(
        f"impact {position} ({impact.kind.value} on {impact.noun!r}) encodes to {size} bytes, "
        f"over the {max_bytes} bytes one NOTIFY frame admits (payloads stay below {limit} "
        f"bytes): {blame}"
    )


def _pack(sizes: list[int], base_room: int) -> list[int]:
    """Greedily split ``sizes`` into frames; return each frame's end offset.

    ``base_room`` is the byte budget for the impacts and their commas of a
    frame whose index has no digits; each index digit costs one byte.
    Greedy order-preserving packing gives the fewest frames for a budget that
    depends only on the frame's position.
    """
    ends: list[int] = []
    total = len(sizes)
    start = 0
    index = 0
    while start < total:
        room = base_room - len(str(index))
        used = sizes[start]
        end = start + 1
        while end < total:
            grown = used + 1 + sizes[end]
            if grown > room:
                break
            used = grown
            end += 1
        ends.append(end)
        start = end
        index += 1
    return ends


def encode_group(
    group_id: str, impacts: Sequence[Impact], *, limit: int = MAX_PAYLOAD_BYTES
) -> list[str]:
    """Frame the impacts of one commit as NOTIFY payloads, in order.

    Returns the fewest payloads that fit, each strictly shorter than
    ``limit`` UTF-8 bytes (default and maximum `MAX_PAYLOAD_BYTES`; a smaller
    limit is for tests); send all of them from the same transaction, in list
    order. No impacts, no payloads.

    Raises `CauseTooLarge` when one impact alone cannot fit a frame (its text
    exceeds ``limit - 52`` bytes, `MAX_IMPACT_BYTES` at the default limit);
    let it fail the transaction. Raises `ConfigError` for a malformed group id
    or limit, `InvalidImpact` for an impact containing a lone surrogate.
    """
    if type(group_id) is not str or not _GROUP_ID.fullmatch(group_id):
        raise ConfigError(
            f"group id must be 1-{MAX_GROUP_ID_LENGTH} characters of [0-9A-Za-z_-], "
            f"got {group_id!r}"
        )
    if not _MIN_LIMIT <= limit <= MAX_PAYLOAD_BYTES:
        raise ConfigError(f"limit must be within {_MIN_LIMIT}..{MAX_PAYLOAD_BYTES}, got {limit}")
    if not impacts:
        return []
    # Each impact is encoded exactly once; packing works on byte lengths.
    texts = [impact_json(impact) for impact in impacts]
    sizes = [_utf8_len(text) for text in texts]
    max_bytes = limit - 1 - _WORST_HEADER - _BRACKETS
    for position, size in enumerate(sizes):
        if size > max_bytes:
            raise _too_large(position, impacts[position], size, max_bytes, limit)

    prefix = f"{FRAME_VERSION}|{group_id}|"
    # The header carries the count, which is known only after packing: guess
    # its digits, pack, and widen the guess if the count came out longer.
    count_digits = 1
    while True:
        base_room = limit - 1 - len(prefix) - 1 - count_digits - 1 - _BRACKETS
        ends = _pack(sizes, base_room)
        if len(str(len(ends))) <= count_digits:
            break
        count_digits += 1
    count = len(ends)
    if count > MAX_FRAMES:
        raise ValueError(f"a group spans at most {MAX_FRAMES} frames, this one needs {count}")

    frames: list[str] = []
    start = 0
    for index, end in enumerate(ends):
        frames.append(f"{prefix}{index}|{count}|[" + ",".join(texts[start:end]) + "]")
        start = end
    return frames


@dataclass(frozen=True, slots=True)
class NotifyFrame:
    """One parsed NOTIFY payload: part ``index`` (0-based) of ``count`` of a group."""

    group_id: str
    index: int
    count: int
    impacts: tuple[Impact, ...]


def _reject_constant(name: str) -> object:
    raise ValueError(f"non-finite number {name}")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def parse_frame(payload: str) -> NotifyFrame:
    """Parse one NOTIFY payload written by `encode_group`.

    Raises `FrameError` saying what is wrong when the payload is not a frame
    this engine wrote; the listener treats that as a loss of continuity.
    """
    parts = payload.split("|", 4)
    if len(parts) != 5:
        raise FrameError(f"not a frame (expected 5 '|'-separated parts): {payload[:60]!r}")
    version, group_id, index_text, count_text, body = parts
    if version != FRAME_VERSION:
        raise FrameError(f"unknown frame version {version[:20]!r}")
    if not _GROUP_ID.fullmatch(group_id):
        raise FrameError(f"malformed group id {group_id[:40]!r}")
    if not _UINT.fullmatch(index_text) or not _UINT.fullmatch(count_text):
        raise FrameError(f"malformed frame index/count {index_text[:10]!r}/{count_text[:10]!r}")
    index = int(index_text)
    count = int(count_text)
    if index >= count:
        raise FrameError(f"frame index {index} is not below its count {count}")
    try:
        items = _DECODER.decode(body)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"frame body of group {group_id!r} is not valid JSON: {exc}") from exc
    if not isinstance(items, list) or not items:
        raise FrameError(f"frame body of group {group_id!r} is not a non-empty JSON array")
    return NotifyFrame(group_id, index, count, tuple(decode_impact(item) for item in items))


class _Partial:
    __slots__ = ("count", "impacts", "next_index")

    def __init__(self, frame: NotifyFrame) -> None:
        self.count = frame.count
        self.next_index = 1
        self.impacts = list(frame.impacts)


class Reassembler:
    """Rebuilds whole groups from a stream of frames, detecting lost frames.

    Frames of concurrent commits may interleave, but one group's frames
    arrive in index order (one transaction sends them). Feed every parsed
    frame to `feed`; it returns a group's impacts, in their original order,
    when its last frame arrives, and ``None`` while the group is incomplete.

    A lost frame surfaces as `TornGroup` from `feed`: a frame whose index or
    count does not continue its group, a group whose first frame never came,
    or more than ``max_pending`` incomplete groups at once (the oldest is
    dropped to bound memory). Treat it as a loss of continuity (emit
    Reconnected). The reassembler stays usable: the torn group is discarded,
    other groups are kept, and the torn group's later frames are dropped
    silently because its loss was already reported.

    Call `reset` when the listening connection is replaced; it reports
    whether an incomplete group was lost.
    """

    __slots__ = ("_abandoned", "_max_pending", "_pending")

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        if max_pending < 1:
            raise ConfigError(f"max_pending must be at least 1, got {max_pending}")
        self._max_pending = max_pending
        self._pending: dict[str, _Partial] = {}
        # Groups already reported lost whose tail may still arrive; an
        # insertion-ordered dict used as a bounded set.
        self._abandoned: dict[str, None] = {}

    def feed(self, frame: NotifyFrame) -> list[Impact] | None:
        """Add one frame; return its group's impacts once the group is whole.

        Raises `TornGroup` when continuity was lost (see the class docstring).
        """
        group_id = frame.group_id
        partial = self._pending.get(group_id)
        if partial is None:
            if group_id in self._abandoned:
                if frame.index == frame.count - 1:
                    del self._abandoned[group_id]
                return None
            if frame.index != 0:
                self._abandon(group_id, frame)
                raise TornGroup(
                    f"group {group_id!r}: frame {frame.index} of {frame.count} arrived "
                    f"without the frames before it"
                )
            if frame.count == 1:
                return list(frame.impacts)
            self._pending[group_id] = _Partial(frame)
            if len(self._pending) > self._max_pending:
                evicted_id = next(iter(self._pending))
                evicted = self._pending.pop(evicted_id)
                self._abandon(evicted_id)
                raise TornGroup(
                    f"more than {self._max_pending} framed groups incomplete: dropped group "
                    f"{evicted_id!r} after {evicted.next_index} of {evicted.count} frames"
                )
            return None
        if frame.index != partial.next_index or frame.count != partial.count:
            del self._pending[group_id]
            self._abandon(group_id, frame)
            raise TornGroup(
                f"group {group_id!r}: expected frame {partial.next_index} of {partial.count}, "
                f"got frame {frame.index} of {frame.count}"
            )
        partial.impacts.extend(frame.impacts)
        partial.next_index += 1
        if partial.next_index == partial.count:
            del self._pending[group_id]
            return partial.impacts
        return None

    def incomplete(self) -> int:
        """Return how many groups have started and not yet completed."""
        return len(self._pending)

    def reset(self) -> bool:
        """Discard every incomplete group; return True if one was discarded (a loss)."""
        lost = bool(self._pending)
        for group_id in self._pending:
            self._abandon(group_id)
        self._pending.clear()
        return lost

    def _abandon(self, group_id: str, last_seen: NotifyFrame | None = None) -> None:
        if last_seen is not None and last_seen.index >= last_seen.count - 1:
            return  # nothing more of this group can follow
        self._abandoned[group_id] = None
        if len(self._abandoned) > self._max_pending:
            del self._abandoned[next(iter(self._abandoned))]
