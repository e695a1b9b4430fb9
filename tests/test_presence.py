"""Presence's pure core: keys, values, the TTL header, the bucket rules, the
decoding of the bucket's stream, the fold, and the lane-notice gate."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from service_engine.errors import ConfigError
from service_engine.lanes.notices import LaneGate, LaneNotice
from service_engine.lanes.presence.model import (
    BucketFacts,
    InvalidPresenceKey,
    InvalidPresenceValue,
    PresenceBucketNoMarkers,
    PresenceBucketNoMsgTtl,
    PresenceBucketNoTtl,
    PresenceBucketRefused,
    PresenceBucketTtlTooShort,
    PresenceChange,
    PresenceEntry,
    PresenceFold,
    PresenceProjector,
    bucket_key,
    check_bucket,
    check_lane_name,
    check_presence_key,
    check_ttl,
    classify,
    encode_value,
    split_bucket_key,
    ttl_header,
)
from service_engine.render import Unrestricted

GOOD = BucketFacts("EPHEMERAL_x", max_age=600.0, marker_ttl=60.0, allow_msg_ttl=True)


# -- keys, values, ttl --------------------------------------------------------------------


@pytest.mark.parametrize("key", ["a", "room-1.alice", "a.b.c", "x_y=z/w", "A9"])
def test_subject_token_keys_are_accepted(key: str) -> None:
    """Keys made of subject tokens joined by dots are accepted as presence keys."""
    assert check_presence_key(key) == key


@pytest.mark.parametrize("key", ["", "a b", "a..b", ".a", "a.", "a.*", "a.>", "é", 7, None])
def test_keys_the_bucket_cannot_carry_are_refused(key: object) -> None:
    """Keys the bucket cannot carry (empty, spaces, empty tokens, wildcards, non-ASCII, non-strings)
    are refused with InvalidPresenceKey."""
    with pytest.raises(InvalidPresenceKey):
        check_presence_key(key)


def test_a_lane_name_is_one_token_and_keys_live_under_it() -> None:
    """A lane name is one token; a bucket key is lane.key and splits back to both (a bare lane is no
    key)."""
    assert check_lane_name("typing") == "typing"
    with pytest.raises(InvalidPresenceKey):
        check_lane_name("a.b")
    assert bucket_key("typing", "r1.alice") == "typing.r1.alice"
    assert split_bucket_key("typing.r1.alice") == ("typing", "r1.alice")
    assert split_bucket_key("typing") is None


def test_values_are_canonical_json_and_never_null() -> None:
    """Presence values encode as canonical JSON; null, NaN and values JSON cannot encode are
    refused."""
    assert encode_value({"b": 1, "a": [True]}) == b'{"a":[true],"b":1}'
    with pytest.raises(InvalidPresenceValue):
        encode_value(None)
    with pytest.raises(InvalidPresenceValue):
        encode_value(float("nan"))
    with pytest.raises(InvalidPresenceValue):
        encode_value({"x": object()})  # type: ignore[dict-item]


def test_the_ttl_header_counts_whole_seconds_rounded_up() -> None:
    """The Nats-TTL header counts whole seconds rounded up; a TTL under one second or not a
    timedelta is refused."""
    assert ttl_header(timedelta(seconds=1)) == "1s"
    assert ttl_header(timedelta(milliseconds=1500)) == "2s"
    assert ttl_header(timedelta(minutes=2)) == "120s"
    with pytest.raises(ConfigError):
        check_ttl(timedelta(milliseconds=500))
    with pytest.raises(ConfigError):
        check_ttl(5)


# -- the bucket's rules -------------------------------------------------------------------


def test_a_bucket_with_ttl_markers_and_message_ttl_covering_every_lane_binds() -> None:
    """A bucket with per-message TTLs, markers and a max age covering every lane's TTL binds."""
    check_bucket(GOOD, [timedelta(seconds=5), timedelta(seconds=600)])
    check_bucket(GOOD, [])


@pytest.mark.parametrize(
    ("facts", "error"),
    [
        (BucketFacts("b", 0.0, 60.0, True), PresenceBucketNoTtl),
        (BucketFacts("b", 600.0, 60.0, False), PresenceBucketNoMsgTtl),
        (BucketFacts("b", 600.0, None, True), PresenceBucketNoMarkers),
        (BucketFacts("b", 600.0, 0.0, True), PresenceBucketNoMarkers),
        (BucketFacts("b", 10.0, 60.0, True), PresenceBucketTtlTooShort),
    ],
)
def test_each_bucket_rule_is_its_own_typed_refusal(
    facts: BucketFacts, error: type[PresenceBucketRefused]
) -> None:
    """Each broken bucket rule (no max age, no message TTL, no markers, a TTL too short for a lane)
    is its own typed refusal naming the problem."""
    with pytest.raises(error) as refused:
        check_bucket(facts, [timedelta(seconds=30)])
    assert refused.value.reason == "presence_bucket"
    assert refused.value.problem in str(refused.value)


# -- decoding the bucket's stream --------------------------------------------------------------


def test_a_put_decodes_to_its_lane_key_and_value() -> None:
    """A put in the bucket decodes to its lane, key, revision and value."""
    change = classify("typing.r1.alice", 7, {"Nats-TTL": "5s"}, b'{"who":"alice"}')
    assert change == PresenceChange("typing", "r1.alice", 7, {"who": "alice"})


@pytest.mark.parametrize(
    "headers",
    [{"KV-Operation": "DEL"}, {"KV-Operation": "PURGE"},
     {"Nats-Marker-Reason": "MaxAge", "Nats-TTL": "5s", "Nats-Rollup": "sub"}],
)
def test_a_delete_a_purge_and_an_expiry_marker_are_the_key_gone(headers: dict[str, str]) -> None:
    """A delete, a purge and an expiry marker all decode to the key gone (value None)."""
    assert classify("typing.r1.alice", 9, headers, b"") == PresenceChange(
        "typing", "r1.alice", 9, None
    )


def test_foreign_messages_are_ignored() -> None:
    """A subject outside any lane or a body that is not JSON is ignored."""
    assert classify("nolane", 1, None, b"{}") is None
    assert classify("typing.k", 1, None, b"not json") is None


# -- the fold ------------------------------------------------------------------------------


def test_the_fold_keeps_the_latest_revision_per_key() -> None:
    """The fold keeps the latest revision of each key, ignores older ones, and drops a key when it
    is gone."""
    fold = PresenceFold()
    assert fold.apply(PresenceChange("t", "k", 2, {"n": 2}))
    assert not fold.apply(PresenceChange("t", "k", 1, {"n": 1})), "an older revision won"
    assert fold.entries["k"] == PresenceEntry("k", {"n": 2}, 2)
    assert fold.apply(PresenceChange("t", "k", 3, None))
    assert "k" not in fold.entries
    assert not fold.apply(PresenceChange("t", "gone", 4, None))


def test_a_reseed_replaces_the_fold_and_names_what_changed() -> None:
    """A reseed replaces the fold with the bucket's current values and names the keys that expired,
    changed or appeared."""
    fold = PresenceFold()
    fold.apply(PresenceChange("t", "stays", 1, {"a": 1}))
    fold.apply(PresenceChange("t", "expired", 2, {"b": 1}))
    fold.apply(PresenceChange("t", "moved", 3, {"c": 1}))
    changed = fold.reseed({
        "stays": PresenceEntry("stays", {"a": 1}, 1),
        "moved": PresenceEntry("moved", {"c": 2}, 9),
        "new": PresenceEntry("new", {"d": 1}, 10),
    })
    assert changed == {"expired", "moved", "new"}
    assert set(fold.entries) == {"stays", "moved", "new"}


class _Lane(PresenceProjector[object, Any, str]):
    NAME = "lane"
    VISIBILITY = Unrestricted()

    def select(self, entry: PresenceEntry, query: str) -> bool:
        return entry.key.startswith(query)

    def project(self, row: PresenceEntry, principal: object) -> object:
        return row.value


class _Other(_Lane):
    NAME = "other"


def test_each_presence_projector_instance_has_its_own_fold_and_noun() -> None:
    """Each presence projector class has its own noun, and each instance its own fold, read by key."""
    assert _Lane.NOUN == "presence.lane" and _Other.NOUN == "presence.other"
    lane, other, second = _Lane(), _Other(), _Lane()
    assert len({id(lane.STORE), id(other.STORE), id(second.STORE)}) == 3
    lane.STORE.fold.apply(PresenceChange("lane", "r1.a", 1, {"x": 1}))
    lane.STORE.fold.apply(PresenceChange("lane", "r2.b", 2, {"x": 2}))
    rows = asyncio.run(lane.STORE.read_many(None, ["r1.a", "missing", 3]))
    assert rows == [PresenceEntry("r1.a", {"x": 1}, 1)]
    assert other.STORE.fold.entries == {} and second.STORE.fold.entries == {}


# -- the lane-notice gate -----------------------------------------------------------------------


def test_the_gate_sends_one_notice_per_transition() -> None:
    """The lane gate sends one notice per pause or resume transition, naming the lanes, and nothing
    while the state holds."""
    gate = LaneGate()
    assert gate.observe(False, ["presence"]) is None
    assert gate.observe(True, ["presence", "accumulated"]) == LaneNotice(
        True, ("accumulated", "presence")
    )
    assert gate.observe(True, ["presence"]) is None
    assert gate.observe(False, ["presence"]) == LaneNotice(False, ("presence",))
    assert gate.observe(False, ["presence"]) is None


def test_no_lane_no_notice_and_a_notice_narrows_to_a_subscriber() -> None:
    """No lanes, no notice; a notice narrows to the lanes a subscriber reads, or to nothing."""
    assert LaneGate().observe(True, []) is None
    notice = LaneNotice.pause(["presence", "accumulated"])
    assert notice.only({"presence"}) == LaneNotice(True, ("presence",))
    assert notice.only({"other"}) is None
