"""The pure core of lane A: ChunkSeq bounds, keys as subject tokens, the
wire frame, the seal hash, the contiguous prefix, the seal plan and the
bounded fold cache."""

from __future__ import annotations

import hashlib

import pytest

from service_engine.lanes.accumulated.chunks import (
    HEADER_CHUNK_SEQ,
    MAX_CHUNK_SEQ,
    ChunkFrame,
    ChunkSeq,
    FoldCache,
    check_key,
    contiguous_prefix,
    encode_frame,
    parse_frame,
    plan_seal,
    seal_hash,
    stream_subject,
)
from service_engine.lanes.accumulated.errors import (
    ChunkSeqOutOfRange,
    InvalidChunkKey,
    SealChunkBeyondLastSeq,
    SealHashMismatch,
    SealTruncated,
)


def test_chunk_seq_is_bounded_to_the_bigint_range() -> None:
    """A ChunkSeq is an int in 0 .. 2**63-1 (not a bool, float or string), and parses only plain
    ASCII decimal text in that range."""
    assert ChunkSeq(0) == 0
    assert ChunkSeq(MAX_CHUNK_SEQ) == 2**63 - 1
    for bad in (2**63, -1, 2**64):
        with pytest.raises(ChunkSeqOutOfRange):
            ChunkSeq(bad)
    for wrong in (True, 1.0, "1", None):
        with pytest.raises(ChunkSeqOutOfRange):
            ChunkSeq(wrong)
    assert ChunkSeq.parse(" 42 ") == 42
    for text in ("-1", "1e3", "", "9223372036854775808", "\u0663"):
        with pytest.raises(ChunkSeqOutOfRange):
            ChunkSeq.parse(text)


def test_a_key_is_one_subject_token() -> None:
    """A chunk key is one subject token of at most 256 characters; the lane's subjects are
    stream.<service>.<key> and stream.<service>.>."""
    assert check_key("reply-1_ok") == "reply-1_ok"
    for bad in ("", "a.b", "a*", ">", "a b", "tab\t", 7, "x" * 257):
        with pytest.raises(InvalidChunkKey):
            check_key(bad)
    assert stream_subject("example") == "stream.example.>"
    assert stream_subject("example", "r1") == "stream.example.r1"


def test_a_frame_round_trips() -> None:
    """A chunk frame encodes to its subject, its sequence header and a dedup id, and parses back to
    the same frame."""
    frame = ChunkFrame("r1", ChunkSeq(3), b"\x00bytes", "reply")
    subject, headers, payload = encode_frame("example", frame)
    assert subject == "stream.example.r1"
    assert headers[HEADER_CHUNK_SEQ] == "3"
    assert headers["Nats-Msg-Id"]
    assert parse_frame("example", subject, headers, payload) == frame


@pytest.mark.parametrize(
    ("subject", "headers"),
    [
        ("stream.other.r1", {HEADER_CHUNK_SEQ: "0"}),
        ("stream.example.r1", {}),
        ("stream.example.r1", {HEADER_CHUNK_SEQ: "x"}),
        ("stream.example.a.b", {HEADER_CHUNK_SEQ: "0"}),
    ],
)
def test_a_frame_that_is_no_lane_frame_is_refused(subject: str, headers: dict[str, str]) -> None:
    """A frame of another service, without or with a bad sequence header, or with a key of two
    tokens is refused."""
    with pytest.raises((InvalidChunkKey, ChunkSeqOutOfRange)):
        parse_frame("example", subject, headers, b"")


def test_the_seal_hash_is_sha256_of_the_concatenation() -> None:
    """The seal hash is the SHA-256 of the chunks concatenated in order."""
    assert seal_hash([b"ab", b"c"]) == hashlib.sha256(b"abc").hexdigest()
    assert seal_hash([]) == hashlib.sha256(b"").hexdigest()


def test_the_contiguous_prefix_stops_at_the_first_gap() -> None:
    """The contiguous prefix counts sequences up to the first gap from the start given."""
    assert contiguous_prefix([]) == 0
    assert contiguous_prefix([0, 1, 2]) == 3
    assert contiguous_prefix([0, 2, 3]) == 1
    assert contiguous_prefix([1, 2]) == 0
    assert contiguous_prefix([3, 4, 6], start=3) == 5


ROWS = [(0, b"a"), (1, b"b"), (2, b"c")]


def test_plan_seal_full() -> None:
    """A full seal plans every chunk with its high water; a gap is SealTruncated naming the durable
    prefix, a wrong hash SealHashMismatch, a chunk past the last seq SealChunkBeyondLastSeq, a
    last seq out of range refused."""
    plan = plan_seal("acc", "k", ROWS, "seal", 2, seal_hash([b"a", b"b", b"c"]))
    assert plan.chunks == (b"a", b"b", b"c")
    assert plan.high_water == 3
    with pytest.raises(SealTruncated) as truncated:
        plan_seal("acc", "k", [(0, b"a"), (2, b"c")], "seal", 2, "h")
    assert truncated.value.durable_prefix == 1
    with pytest.raises(SealHashMismatch):
        plan_seal("acc", "k", ROWS, "seal", 2, seal_hash([b"x"]))
    with pytest.raises(SealChunkBeyondLastSeq) as beyond:
        plan_seal("acc", "k", ROWS, "seal", 1, seal_hash([b"a", b"b"]))
    assert beyond.value.beyond == 2
    with pytest.raises(ChunkSeqOutOfRange):
        plan_seal("acc", "k", ROWS, "seal", 2**63, "h")


def test_plan_seal_partial_and_current() -> None:
    """A partial seal takes the contiguous prefix up to its last seq (refusing chunks beyond it); a
    current seal takes the contiguous prefix as it stands."""
    gap = [(0, b"a"), (2, b"c")]
    partial = plan_seal("acc", "k", gap, "partial", 5)
    assert (partial.chunks, partial.high_water) == ((b"a",), 6)
    with pytest.raises(SealChunkBeyondLastSeq):
        plan_seal("acc", "k", gap, "partial", 1)
    current = plan_seal("acc", "k", gap, "current")
    assert (current.chunks, current.high_water) == ((b"a",), 3)
    assert plan_seal("acc", "k", [], "current").high_water == 0


def test_a_cancel_gesture_names_the_chunks_it_drops_beyond_a_gap() -> None:
    """A cancel folds the contiguous prefix; every durable chunk past the gap
    is named in ``dropped`` (never silently lost); a whole prefix drops none."""
    rows = [(0, b"a"), (2, b"c"), (3, b"d")]
    assert plan_seal("acc", "k", rows, "partial", 3).dropped == (2, 3)
    assert plan_seal("acc", "k", rows, "current").dropped == (2, 3)
    whole = [(0, b"a"), (1, b"b")]
    assert plan_seal("acc", "k", whole, "partial", 4).dropped == ()
    assert plan_seal("acc", "k", whole, "current").dropped == ()
    assert plan_seal("acc", "k", whole, "seal", 1, seal_hash([b"a", b"b"])).dropped == ()


def test_the_fold_cache_is_a_bounded_lru() -> None:
    """The fold cache is a bounded LRU handing out copies of its digests, ignores an entry shorter
    than the one held, forgets on invalidate, and refuses a size of 0."""
    cache: FoldCache[str] = FoldCache(2)
    digest = hashlib.sha256(b"a")
    cache.put("acc", "a", 1, "a", digest, b"a")
    cache.put("acc", "b", 1, "b", digest, b"b")
    assert cache.get("acc", "a") is not None  # a is now the most recent
    cache.put("acc", "c", 1, "c", digest, b"c")
    assert cache.get("acc", "b") is None
    assert len(cache) == 2
    entry = cache.get("acc", "a")
    assert entry is not None
    entry.digest.update(b"more")  # a copy: the cached digest is untouched
    again = cache.get("acc", "a")
    assert again is not None and again.digest.hexdigest() == digest.hexdigest()
    cache.put("acc", "a", 0, "", hashlib.sha256(), None)  # shorter: ignored
    assert cache.get("acc", "a").next_seq == 1  # type: ignore[union-attr]
    cache.invalidate("acc", "a")
    assert cache.get("acc", "a") is None
    with pytest.raises(ValueError):
        FoldCache(0)
