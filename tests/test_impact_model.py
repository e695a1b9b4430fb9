"""The Impact model: validation, canonical identity, and the wire encoding."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service_engine.errors import FrameError
from service_engine.impacts import (
    PRINCIPAL_FACTS_NOUN,
    Cause,
    Impact,
    ImpactKind,
    InvalidImpact,
    JsonValue,
    canonical_json,
    decode_impact,
    encode_impact,
    impact_json,
)

# Escapes and multi-byte characters change the encoded length, so they are
# over-represented next to arbitrary text.
_tricky = st.text(alphabet=st.sampled_from('aZ"\\\n\x00é€😀|'), max_size=12)
_text = st.one_of(st.text(max_size=12), _tricky)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
json_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(_text, children, max_size=4),
    ),
    max_leaves=12,
)
nouns = st.text(min_size=1, max_size=16)
causes = st.builds(Cause, st.text(min_size=1, max_size=16), json_values)
impacts = st.one_of(
    st.builds(Impact.entity, nouns, json_values, st.none() | causes),
    st.builds(Impact.foreign, nouns, json_values),
    st.builds(Impact.reset, nouns),
    st.builds(Impact.principal_facts, json_values, st.lists(nouns, max_size=4)),
)


def _thaw(value: JsonValue) -> Any:
    """Decoded form with lists, as json.loads would produce it."""
    if isinstance(value, tuple):
        return [_thaw(item) for item in value]
    if isinstance(value, dict):
        return {name: _thaw(item) for name, item in value.items()}
    return value


# --- constructors and kinds -------------------------------------------------


def test_entity_constructor() -> None:
    """Impact.entity builds an entity impact with its noun, key, cause, no deps and the key's
    canonical JSON."""
    cause = Cause("card.moved", {"from": "todo", "to": "done"})
    impact = Impact.entity("card", 42, cause)
    assert impact.kind is ImpactKind.ENTITY
    assert (impact.noun, impact.key, impact.cause, impact.deps) == ("card", 42, cause, ())
    assert impact.key_json == "42"


def test_special_kinds() -> None:
    """principal_facts sorts and dedupes its nouns under the reserved noun; reset carries no key or
    cause; foreign carries its noun and key."""
    facts = Impact.principal_facts("user-1", ["board", "card", "board"])
    assert facts.kind is ImpactKind.PRINCIPAL_FACTS
    assert facts.noun == PRINCIPAL_FACTS_NOUN
    assert facts.key == "user-1"
    assert facts.deps == ("board", "card")  # sorted, unique
    reset = Impact.reset("card")
    assert (reset.kind, reset.noun, reset.key, reset.cause) == (
        ImpactKind.PROJECTOR_RESET,
        "card",
        None,
        None,
    )
    foreign = Impact.foreign("known_user", "u-9")
    assert (foreign.kind, foreign.noun, foreign.key) == (ImpactKind.FOREIGN, "known_user", "u-9")


def test_deps_are_a_set() -> None:
    """A principal-facts impact's nouns compare as a set (order and repeats do not matter)."""
    assert Impact.principal_facts(1, ["b", "a"]) == Impact.principal_facts(1, ("a", "b", "a"))


@pytest.mark.parametrize(
    "build",
    [
        lambda: Impact.entity("", 1),
        lambda: Impact.entity(1, 1),  # type: ignore[arg-type]
        lambda: Impact(ImpactKind.FOREIGN, "x", 1, Cause("c")),
        lambda: Impact(ImpactKind.PROJECTOR_RESET, "x", 1),
        lambda: Impact(ImpactKind.ENTITY, "x", 1, deps=["a"]),
        lambda: Impact(ImpactKind.PRINCIPAL_FACTS, "not_facts", 1),
        lambda: Impact.principal_facts(1, "card"),
        lambda: Impact.principal_facts(1, [""]),
        lambda: Impact("entity", "x", 1),  # type: ignore[arg-type]
        lambda: Impact.entity("x", float("nan")),
        lambda: Impact.entity("x", [float("inf")]),
        lambda: Cause(""),
        lambda: Cause("c", float("nan")),
    ],
)
def test_invalid_fields_raise_invalid_impact(build: Any) -> None:
    """An empty or non-string noun, a field a kind does not take, a wrong kind, a non-finite key or
    cause value, or an empty cause name raises InvalidImpact."""
    with pytest.raises(InvalidImpact):
        build()


def test_unencodable_key_raises_invalid_impact() -> None:
    """A key or cause data JSON cannot encode raises InvalidImpact naming which."""
    with pytest.raises(InvalidImpact, match="impact key"):
        Impact.entity("x", object())  # type: ignore[arg-type]
    with pytest.raises(InvalidImpact, match="cause data"):
        Cause("c", {1, 2})  # type: ignore[arg-type]


def test_values_are_frozen() -> None:
    """Impacts and causes are frozen."""
    impact = Impact.entity("card", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        impact.noun = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Cause("c").name = "d"  # type: ignore[misc]


# --- canonical identity -----------------------------------------------------


def test_dict_key_order_is_irrelevant() -> None:
    """Impacts differing only in dict order are equal, hash alike, encode alike and dedupe in a set."""
    one = Impact.entity("card", {"a": 1, "b": [1, 2]}, Cause("c", {"x": 1, "y": 2}))
    two = Impact.entity("card", {"b": [1, 2], "a": 1}, Cause("c", {"y": 2, "x": 1}))
    assert one == two
    assert hash(one) == hash(two)
    assert impact_json(one) == impact_json(two)
    assert len({one, two}) == 1


def test_lists_and_tuples_are_one_key() -> None:
    """A list key and the equal tuple key are one key, kept as tuples."""
    assert Impact.entity("n", [1, [2, 3]]) == Impact.entity("n", (1, (2, 3)))
    assert Impact.entity("n", [1, [2, 3]]).key == (1, (2, 3))


def test_json_distinct_values_are_distinct_keys() -> None:
    """1, 1.0, True, "1" and None are five distinct keys."""
    keys = [Impact.entity("n", value) for value in (1, 1.0, True, "1", None)]
    assert len(set(keys)) == 5


def test_subclassed_scalars_decode_to_plain_values() -> None:
    """A key holding an IntEnum equals the key with the plain int, and keeps a plain int."""
    class Color(enum.IntEnum):
        RED = 3

    impact = Impact.entity("n", {"c": Color.RED})
    assert impact == Impact.entity("n", {"c": 3})
    assert type(impact.key["c"]) is int  # type: ignore[index, call-overload]


def test_cause_hashes_with_unhashable_data() -> None:
    """A cause with list data is hashable, equal to its tuple spelling, and unequal for other data."""
    assert hash(Cause("c", {"a": [1]})) == hash(Cause("c", {"a": (1,)}))
    assert Cause("c", {"a": 1}) != Cause("c", {"a": 2})


@given(impacts)
def test_impact_json_is_the_canonical_text_of_encode_impact(impact: Impact) -> None:
    """impact_json is the canonical (sorted, compact) JSON of encode_impact (property test)."""
    text = impact_json(impact)
    assert text == canonical_json(encode_impact(impact))
    assert text == json.dumps(
        json.loads(text), separators=(",", ":"), sort_keys=True, ensure_ascii=False
    )


@given(impacts)
def test_wire_round_trip(impact: Impact) -> None:
    """Decoding an impact's wire form gives an equal impact with the same hash, key, cause, deps and
    text (property test)."""
    decoded = decode_impact(json.loads(impact_json(impact)))
    assert decoded == impact
    assert hash(decoded) == hash(impact)
    assert decoded.key == impact.key
    assert decoded.cause == impact.cause
    assert decoded.deps == impact.deps
    assert impact_json(decoded) == impact_json(impact)
    assert decode_impact(encode_impact(impact)) == impact


@given(nouns, json_values)
def test_key_survives_as_decoded_json(noun: str, key: JsonValue) -> None:
    """An impact's key, thawed, equals its canonical JSON decoded (property test)."""
    impact = Impact.entity(noun, key)
    assert _thaw(impact.key) == json.loads(canonical_json(key))


def test_encoding_is_compact() -> None:
    """The wire form uses one-letter fields and omits defaults."""
    assert impact_json(Impact.entity("card", 42)) == '{"k":42,"n":"card"}'
    assert impact_json(Impact.reset("card")) == '{"n":"card","t":"r"}'
    assert impact_json(Impact.entity("card", "é", Cause("card.moved"))) == (
        '{"c":"card.moved","k":"é","n":"card"}'
    )


# --- decoding malformed input -----------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [
        [],
        "card",
        {},
        {"n": ""},
        {"n": 3, "k": 1},
        {"n": "card", "k": 1, "z": 1},
        {"n": "card", "t": "x"},
        {"n": "card", "t": 1},
        {"n": "card", "t": "r", "k": 1},
        {"n": "card", "k": 1, "p": 1},
        {"n": "card", "k": 1, "c": ""},
        {"n": "card", "k": 1, "c": None},
        {"n": "card", "k": 1, "c": 5},
        {"n": "card", "t": "f", "k": 1, "c": "moved"},
        {"n": "card", "k": 1, "d": ["a"]},
        {"n": PRINCIPAL_FACTS_NOUN, "t": "p", "k": 1, "d": "a"},
        {"n": PRINCIPAL_FACTS_NOUN, "t": "p", "k": 1, "d": [1]},
        {"n": PRINCIPAL_FACTS_NOUN, "t": "p", "k": 1, "d": [{}]},
        {"n": "other", "t": "p", "k": 1},
        {"n": "card", "k": float("nan")},
    ],
)
def test_decode_malformed_raises_frame_error(obj: object) -> None:
    """Every malformed wire impact (wrong type, missing or extra field, a field its kind does not
    take, bad deps, a non-finite key) raises FrameError."""
    with pytest.raises(FrameError):
        decode_impact(obj)


@given(st.dictionaries(_text, _scalars, max_size=6) | json_values)
def test_a_cause_holds_what_its_text_decodes_to(data: JsonValue) -> None:
    """A cause's data (a flat object of scalars taken without the decode)
    is exactly what decoding its canonical text gives, keys in its order."""
    cause = Cause("c", data)
    decoded = json.loads(cause.data_json)
    assert _thaw(cause.data) == decoded
    if isinstance(decoded, dict):
        assert isinstance(cause.data, dict) and list(cause.data) == list(decoded)


def test_a_flat_cause_with_subclassed_scalars_holds_plain_values() -> None:
    """An enum member in a flat cause is held as its plain value."""

    class Color(enum.IntEnum):
        RED = 3

    cause = Cause("c", {"b": Color.RED, "a": True})
    assert cause.data == {"a": True, "b": 3}
    assert type(cause.data["b"]) is int
