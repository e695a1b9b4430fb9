"""The caller-side merge of replay, caught_up and live events."""

from __future__ import annotations

from service_engine.props import WatchMerge


def ev(nseq: int, key: str = "k") -> dict[str, object]:
    return {"namespace": "n", "key": key, "nseq": nseq}


def reply(events: list[dict[str, object]], nseq: int) -> dict[str, object]:
    return {
        "namespace": "n", "observed_nseq": nseq, "events": events, "live": True,
        "caught_up": {"event_type": "caught_up", "namespace": "n", "nseq": nseq},
    }


def test_replay_then_marker_then_live_with_overlap_discarded() -> None:
    """A watch yields the replay, the caught_up marker, then live events held meanwhile, dropping
    those the replay already covered."""
    merge = WatchMerge()
    assert merge.on_live(ev(2)) == []  # arrived before the reply: held
    assert merge.on_live(ev(4)) == []
    out = merge.on_reply(reply([ev(1), ev(2), ev(3)], 3))
    assert [e.get("nseq") for e in out] == [1, 2, 3, 3, 4]
    assert out[3]["event_type"] == "caught_up"
    assert merge.on_live(ev(3)) == []
    assert merge.on_live(ev(4)) == []  # duplicate of a held one
    assert merge.on_live(ev(5)) == [ev(5)]


def test_cursor_above_observed_replays_nothing_and_marks_observed() -> None:
    """A reply with nothing to replay yields only the caught_up marker at the observed nseq, then
    live events."""
    merge = WatchMerge()
    out = merge.on_reply(reply([], 3))
    assert out == [{"event_type": "caught_up", "namespace": "n", "nseq": 3}]
    assert merge.on_live(ev(4)) == [ev(4)]


def test_audit_reply_has_no_marker_and_uses_observed() -> None:
    """An audit reply yields its events without a marker, and live events up to its observed nseq
    are dropped."""
    merge = WatchMerge()
    out = merge.on_reply({"namespace": "n", "observed_nseq": 2, "events": [ev(1), ev(2)], "live": True})
    assert out == [ev(1), ev(2)]
    assert merge.on_live(ev(2)) == [] and merge.on_live(ev(3)) == [ev(3)]


def test_dedup_is_by_namespace_key_nseq() -> None:
    """A live event seen twice (same namespace, key and nseq) is yielded once."""
    merge = WatchMerge()
    merge.on_reply(reply([], 0))
    assert merge.on_live(ev(1, "a")) == [ev(1, "a")]
    assert merge.on_live(ev(1, "a")) == []
