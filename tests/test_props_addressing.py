"""Pure parsing of props commands: every refusal of the Addressing paragraph."""

from __future__ import annotations

import pytest

from service_engine.props import PropsError, parse_command
from service_engine.props.addressing import resolve_key
from service_engine.props.schema import FieldSpec, Namespace

SVC = "demo"


def refusal(verb: str, headers: dict[str, str], body: bytes = b"") -> PropsError:
    with pytest.raises(PropsError) as caught:
        parse_command(SVC, f"{SVC}.props.{verb}", headers, body)
    return caught.value


def test_set_parses_namespace_key_fence_cause_and_merge() -> None:
    """A set's headers parse to namespace, key, version fence, cause and merge (true/patch merge,
    false/replace replace, merge by default), its body to the fields."""
    cmd = parse_command(
        SVC, "demo.props.set",
        {"namespace": "cfg", "key": "a", "if_version": "0", "cause": "c-1", "merge": "replace"},
        b'{"x": 1}',
    )
    assert (cmd.verb, cmd.namespace, cmd.key, cmd.if_version, cmd.cause, cmd.merge) == (
        "set", "cfg", "a", 0, "c-1", False,
    )
    assert cmd.fields == {"x": 1}
    for raw, merge in (("true", True), ("patch", True), ("false", False), ("replace", False)):
        assert parse_command(SVC, "demo.props.set", {"namespace": "n", "merge": raw}, b"{}").merge is merge
    assert parse_command(SVC, "demo.props.set", {"namespace": "n"}, b"{}").merge is True


def test_empty_key_is_no_key() -> None:
    """An empty key header means no key."""
    assert parse_command(SVC, "demo.props.get", {"namespace": "n", "key": ""}, b"").key is None


def test_audit_watch_suffix_and_since_nseq() -> None:
    """The audit.watch suffix parses as its own verb with since_nseq; a watch without since_nseq
    starts at 0."""
    cmd = parse_command(SVC, "demo.props.audit.watch", {"namespace": "n", "since_nseq": "7"}, b"")
    assert (cmd.verb, cmd.since_nseq) == ("audit.watch", 7)
    assert parse_command(SVC, "demo.props.watch", {"namespace": "n"}, b"").since_nseq == 0


def test_set_refuses_path_as_flat_path_mutation_deferred() -> None:
    """A set addressed by path is refused as flat_path_mutation_deferred."""
    err = refusal("set", {"namespace": "n", "path": "a.b"}, b"{}")
    assert err.error_code == "validation_error"
    assert err.message.startswith("flat_path_mutation_deferred")


@pytest.mark.parametrize("verb", ["delete", "get", "list", "describe", "watch", "audit.watch"])
def test_other_verbs_refuse_path_as_mixed_addressing(verb: str) -> None:
    """Every other verb addressed by path is refused as mixed addressing."""
    err = refusal(verb, {"namespace": "n", "path": "a.b"})
    assert err.error_code == "validation_error"
    assert err.message.startswith("mixed addressing")


@pytest.mark.parametrize("verb", ["set", "delete", "get"])
@pytest.mark.parametrize("value", ["", "a.b"])
def test_field_path_refused_even_when_empty(verb: str, value: str) -> None:
    """A field_path header, even empty, is refused as field_path_deferred on set, delete and get."""
    err = refusal(verb, {"namespace": "n", "key": "k", "field_path": value}, b"{}")
    assert (err.error_code, err.message.split(":")[0]) == ("validation_error", "field_path_deferred")


def test_get_refuses_a_body() -> None:
    """A get with a body is refused as get_projection_deferred."""
    err = refusal("get", {"namespace": "n"}, b'{"fields": ["a"]}')
    assert err.message.startswith("get_projection_deferred")


@pytest.mark.parametrize("option", ["cursor", "limit", "order_by", "filter", "fields"])
def test_list_refuses_options(option: str) -> None:
    """A list with a cursor, limit, order, filter or field selection is refused as
    list_option_deferred."""
    err = refusal("list", {"namespace": "n", option: "1"})
    assert (err.error_code, err.message.split(":")[0]) == ("validation_error", "list_option_deferred")


def test_list_refuses_a_body() -> None:
    """A list with a body is refused as list_option_deferred."""
    assert refusal("list", {"namespace": "n"}, b"{}").message.startswith("list_option_deferred")


@pytest.mark.parametrize("body", [b" ", b"\n", b"\t \r\n"])
def test_a_whitespace_only_body_is_a_non_empty_body(body: bytes) -> None:
    """The contract refuses "any non-empty body" on get and list: whitespace included."""
    assert refusal("get", {"namespace": "n"}, body).message.startswith("get_projection_deferred")
    assert refusal("list", {"namespace": "n"}, body).message.startswith("list_option_deferred")
    assert parse_command(SVC, "demo.props.get", {"namespace": "n"}, b"").verb == "get"
    assert parse_command(SVC, "demo.props.list", {"namespace": "n"}, b"").verb == "list"


@pytest.mark.parametrize("raw", ["-1", "1.0", "x", " 1", "18446744073709551616", "\u0661"])
def test_if_version_is_a_decimal_u64(raw: str) -> None:
    """if_version and since_nseq accept only plain decimal u64 (no sign, fraction, space, overflow
    or non-ASCII digit)."""
    assert refusal("set", {"namespace": "n", "if_version": raw}, b"{}").error_code == "validation_error"
    assert refusal("watch", {"namespace": "n", "since_nseq": raw}).error_code == "validation_error"


def test_u64_max_accepted() -> None:
    """The largest u64 is accepted as a version fence."""
    cmd = parse_command(SVC, "demo.props.set", {"namespace": "n", "if_version": str(2**64 - 1)}, b"{}")
    assert cmd.if_version == 2**64 - 1


@pytest.mark.parametrize("body", [b"", b"[]", b"1", b"not json", b'"s"'])
def test_set_body_must_be_a_json_object(body: bytes) -> None:
    """A set body that is empty, not JSON or not an object is a validation_error."""
    assert refusal("set", {"namespace": "n"}, body).error_code == "validation_error"


def test_lifecycle_is_reserved_in_a_set_body() -> None:
    """_lifecycle in a set body is refused, naming it."""
    assert "_lifecycle" in refusal("set", {"namespace": "n"}, b'{"_lifecycle": "active"}').message


def test_namespace_header_is_required() -> None:
    """A missing or empty namespace header is a validation_error."""
    assert refusal("get", {}).error_code == "validation_error"
    assert refusal("get", {"namespace": ""}).error_code == "validation_error"


def test_bad_merge_and_view_values() -> None:
    """An unknown merge or view value is a validation_error."""
    assert refusal("set", {"namespace": "n", "merge": "yes"}, b"{}").error_code == "validation_error"
    assert refusal("describe", {"namespace": "n", "view": "secret"}).error_code == "validation_error"


def test_unknown_suffix() -> None:
    """A subject suffix naming no verb is refused with PropsError."""
    with pytest.raises(PropsError):
        parse_command(SVC, "demo.props.records.changed", {"namespace": "n"}, b"")


def test_key_resolution_for_singletons_and_collections() -> None:
    """A singleton resolves no key or its canonical key to the canonical key and refuses another; a
    collection requires a key."""
    single = Namespace("cfg", (FieldSpec("a", "string"),), cardinality="singleton", canonical_key="current")
    coll = Namespace("items", (FieldSpec("a", "string"),))
    assert resolve_key(single, None) == "current"
    assert resolve_key(single, "current") == "current"
    with pytest.raises(PropsError):
        resolve_key(single, "other")
    assert resolve_key(coll, "k") == "k"
    with pytest.raises(PropsError):
        resolve_key(coll, None)
