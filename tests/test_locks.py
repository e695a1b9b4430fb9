"""Advisory-lock keys: FNV-1a vectors, injective framing, no collisions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service_engine.db.locks import (
    AGGREGATE_LOCK_DOMAIN,
    SCHEMA_VERSION_LOCK_DOMAIN,
    advisory_key,
    aggregate_lock_key,
    fnv1a_64,
    lock_key_bytes,
    named_lock_key,
)

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1

parts_st = st.lists(st.one_of(st.text(), st.binary()), max_size=5)
json_keys = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


def _as_bytes(part: str | bytes) -> bytes:
    return part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part


def _unframe(data: bytes) -> list[bytes]:
    """Inverse of the framing: its existence is what makes it injective."""
    fields: list[bytes] = []
    at = 0
    while at < len(data):
        length = int.from_bytes(data[at : at + 8], "big")
        at += 8
        fields.append(data[at : at + length])
        at += length
    assert at == len(data)
    return fields


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0xCBF29CE484222325),
        (b"a", 0xAF63DC4C8601EC8C),
        (b"b", 0xAF63DF4C8601F1A5),
        (b"foobar", 0x85944171F73967E8),
        (b"\x00", 0xAF63BD4C8601B7DF),
    ],
)
def test_fnv1a_64_vectors(data: bytes, expected: int) -> None:
    """fnv1a_64 gives the published FNV-1a 64-bit test vectors."""
    assert fnv1a_64(data) == expected


def test_concatenation_cannot_collide() -> None:
    """Moving bytes between the domain and the parts, or between parts, changes the framing and the
    key."""
    assert lock_key_bytes("d", "ab", "c") != lock_key_bytes("d", "a", "bc")
    assert lock_key_bytes("d", "abc") != lock_key_bytes("d", "ab", "c")
    assert lock_key_bytes("d", "", "x") != lock_key_bytes("d", "x", "")
    assert lock_key_bytes("da", "b") != lock_key_bytes("d", "ab")
    assert advisory_key("d", "ab", "c") != advisory_key("d", "a", "bc")


@given(st.text(), parts_st)
def test_framing_round_trips(domain: str, parts: list[str | bytes]) -> None:
    """A lock key's framing unframes back to its domain and parts (property test)."""
    framed = lock_key_bytes(domain, *parts)
    assert _unframe(framed) == [_as_bytes(domain), *map(_as_bytes, parts)]


@given(st.text(), parts_st, st.text(), parts_st)
def test_framing_is_injective(
    domain_a: str, parts_a: list[str | bytes], domain_b: str, parts_b: list[str | bytes]
) -> None:
    """Two framings are equal exactly when their domains and parts are equal (property test)."""
    fields_a = [_as_bytes(domain_a), *map(_as_bytes, parts_a)]
    fields_b = [_as_bytes(domain_b), *map(_as_bytes, parts_b)]
    same_input = lock_key_bytes(domain_a, *parts_a) == lock_key_bytes(domain_b, *parts_b)
    assert same_input == (fields_a == fields_b)


@given(st.lists(st.text(max_size=4), min_size=1, max_size=4))
def test_every_split_of_one_string_frames_differently(pieces: list[str]) -> None:
    """Splitting one string into parts differently never frames the same (property test)."""
    joined = "".join(pieces)
    splits = {tuple(pieces), (joined,)}
    framings = {lock_key_bytes("d", *split) for split in splits}
    assert len(framings) == len(splits)


@given(st.text(), parts_st)
def test_key_is_a_signed_bigint(domain: str, parts: list[str | bytes]) -> None:
    """An advisory key is a signed 64-bit integer whose unsigned value is the FNV-1a hash of the
    framing (property test)."""
    key = advisory_key(domain, *parts)
    assert BIGINT_MIN <= key <= BIGINT_MAX
    assert key % 2**64 == fnv1a_64(lock_key_bytes(domain, *parts))


def test_key_reaches_both_signs() -> None:
    """Advisory keys take negative and non-negative values."""
    keys = [advisory_key("d", str(i)) for i in range(64)]
    assert any(key < 0 for key in keys)
    assert any(key >= 0 for key in keys)


def test_corpus_of_store_types_and_keys_never_collides() -> None:
    """Over 3,000 (store type, key) pairs of varied JSON keys give as many distinct aggregate lock
    keys."""
    store_types = [f"shop.stores.Store{i}" for i in range(12)] + ["a.B", "a.Bc", "ab.C"]
    keys: list[object] = []
    keys += list(range(-60, 60))
    keys += [str(i) for i in range(60)]
    keys += [f"order-{i}" for i in range(40)]
    keys += [[i, j] for i, j in itertools.product(range(6), range(6))]
    keys += [{"tenant": t, "id": i} for t, i in itertools.product("abc", range(10))]
    keys += [None, True, False, 0.5, "", [], {}, "ü", "\u00e9t\u00e9"]
    pairs = [(store, key) for store in store_types for key in keys]
    lock_keys = {aggregate_lock_key(store, key) for store, key in pairs}
    assert len(pairs) > 3000
    assert len(lock_keys) == len(pairs)


@given(st.text(min_size=1), st.text(min_size=1), json_keys)
def test_two_store_types_with_one_key_do_not_collide(
    store_a: str, store_b: str, key: object
) -> None:
    """One key under two store types gives two lock keys (property test)."""
    if store_a != store_b:
        assert aggregate_lock_key(store_a, key) != aggregate_lock_key(store_b, key)


@given(st.text(min_size=1), json_keys)
def test_aggregate_key_is_deterministic_and_in_range(store: str, key: object) -> None:
    """An aggregate lock key is the same on every call and a signed bigint (property test)."""
    lock = aggregate_lock_key(store, key)
    assert lock == aggregate_lock_key(store, key)
    assert BIGINT_MIN <= lock <= BIGINT_MAX


def test_aggregate_key_is_canonical_json() -> None:
    """The aggregate key hashes the key's canonical JSON: dict order does not matter, type and list
    order do."""
    store = "shop.OrderStore"
    assert aggregate_lock_key(store, {"a": 1, "b": 2}) == aggregate_lock_key(
        store, {"b": 2, "a": 1}
    )
    assert aggregate_lock_key(store, 1) != aggregate_lock_key(store, "1")
    assert aggregate_lock_key(store, [1, 2]) != aggregate_lock_key(store, [2, 1])
    assert aggregate_lock_key(store, "é") == advisory_key(AGGREGATE_LOCK_DOMAIN, store, '"é"')


def test_aggregate_key_accepts_the_store_class() -> None:
    """Passing the store class gives the key of its qualified name."""
    class OrderStore:
        pass

    name = f"{__name__}.{OrderStore.__qualname__}"
    assert aggregate_lock_key(OrderStore, "k") == aggregate_lock_key(name, "k")


def test_aggregate_key_refuses_a_non_json_key() -> None:
    """A key that is not JSON is refused with TypeError."""
    with pytest.raises(TypeError):
        aggregate_lock_key("shop.OrderStore", object())


def test_domains_separate_locks() -> None:
    """One name under two lock domains gives two keys; a named key is the advisory key of its domain
    and name."""
    assert named_lock_key(SCHEMA_VERSION_LOCK_DOMAIN, "orders") != named_lock_key(
        AGGREGATE_LOCK_DOMAIN, "orders"
    )
    assert named_lock_key(SCHEMA_VERSION_LOCK_DOMAIN, "orders") == advisory_key(
        SCHEMA_VERSION_LOCK_DOMAIN, "orders"
    )


def test_lone_surrogates_hash_without_error() -> None:
    """Lone surrogates hash without error, and distinct ones to distinct keys."""
    assert advisory_key("d", "\ud800") != advisory_key("d", "\udc00")
    aggregate_lock_key("shop.OrderStore", "\ud800")


# Keys as released before the prefix state was cached: a changed value is two
# versions of the engine taking different locks for one aggregate (no mutual
# exclusion during a rolling deploy), so these are pinned, not recomputed.
@pytest.mark.parametrize(
    ("domain", "parts", "expected"),
    [
        (AGGREGATE_LOCK_DOMAIN, ("conformance.sample_orders.OrderStore", '"ord-1"'), -143001534726193166),
        (SCHEMA_VERSION_LOCK_DOMAIN, ("orders",), 3387684852228229077),
        ("service_engine.migrate", ("schema",), -3580731682659871893),
        ("service_engine.cron", ("nightly", "2026-12-01T00:00:00+00:00"), 7782806563560156164),
        ("d", (), -1873074982799675262),
        ("d", (b"\x00\xff", "\u00e9\ud800"), 1245103311739672089),
    ],
)
def test_keys_keep_their_released_values(
    domain: str, parts: tuple[str | bytes, ...], expected: int
) -> None:
    """Advisory keys keep the values released (a changed key would let old and new pods miss each
    other's locks), cached prefix or not."""
    assert advisory_key(domain, *parts) == expected
    assert advisory_key(domain, *parts) == expected  # the cached prefix gives the same


def test_aggregate_and_named_keys_keep_their_released_values() -> None:
    """Aggregate and named lock keys keep their released values."""
    assert aggregate_lock_key("example_service.cards.CardStore", {"id": 7, "org": "o1"}) == 4035160833349734300
    assert named_lock_key(SCHEMA_VERSION_LOCK_DOMAIN, "cards") == 816059784976448964


def _reference_key(domain: str, *parts: str | bytes) -> int:
    """The definition: FNV-1a over the whole framing, read as a signed bigint."""
    h = fnv1a_64(lock_key_bytes(domain, *parts))
    return h - 2**64 if h >= 2**63 else h


@given(st.text(max_size=20), parts_st)
def test_key_equals_the_hash_of_the_whole_framing(domain: str, parts: list[str | bytes]) -> None:
    """The advisory key (cached prefix, folded four bytes a step) equals the byte-by-byte hash of
    the whole framing (property test)."""
    assert advisory_key(domain, *parts) == _reference_key(domain, *parts)


def _fnv1a_64_byte_by_byte(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & ((1 << 64) - 1)
    return h


@given(st.binary(max_size=70))
def test_fnv1a_64_four_bytes_a_step_equals_the_byte_by_byte_fold(data: bytes) -> None:
    """The unrolled fold (masked once per four bytes) is FNV-1a exactly,
    whatever the length's remainder."""
    assert fnv1a_64(data) == _fnv1a_64_byte_by_byte(data)
