"""The X-Passport format: what parses, what is refused, and how."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service_engine.errors import EngineError
from service_engine.server.passport import (
    MAX_PASSPORT_BYTES,
    OrgMember,
    Passport,
    PassportError,
    PassportMalformed,
    PassportMissing,
    PassportRefused,
    parse_passport,
    resolve_principal,
)


def b64(document: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()


def test_base64url_and_plain_json_read_the_same_passport() -> None:
    """A passport header reads the same as base64url or plain JSON: subject, actor, org, roles in
    order, delegation."""
    document = {"sub": "u-1", "actor": "agent-7", "org": "acme", "roles": ["member", "admin"],
                "kind": "person"}
    from_b64 = parse_passport(b64(document))
    from_json = parse_passport(json.dumps(document))
    assert from_b64 == from_json
    assert from_b64.sub == "u-1" and from_b64.actor == "agent-7" and from_b64.org == "acme"
    assert from_b64.roles == ("member", "admin")
    assert from_b64.has_role("admin") and not from_b64.has_role("owner")
    assert from_b64.delegated


def test_padded_base64url_is_accepted() -> None:
    """Padded base64url is accepted."""
    padded = base64.urlsafe_b64encode(json.dumps({"sub": "u1"}).encode()).decode()
    assert padded.endswith("=")
    assert parse_passport(padded).sub == "u1"


def test_defaults_fill_optional_members() -> None:
    """Missing members default: the actor to the subject (not delegated), no org, no roles, kind
    person."""
    passport = parse_passport('{"sub": "svc-billing", "kind": "service"}')
    assert passport.actor == "svc-billing"
    assert not passport.delegated
    assert passport.org is None
    assert passport.roles == ()
    assert passport.kind == "service"
    assert parse_passport('{"sub": "u"}').kind == "person"


def test_unknown_members_are_kept_as_claims_read_only() -> None:
    """Unknown members are kept as read-only claims."""
    passport = parse_passport('{"sub": "u", "tier": "gold", "seats": 3}')
    assert dict(passport.claims) == {"tier": "gold", "seats": 3}
    with pytest.raises(TypeError):
        passport.claims["tier"] = "silver"  # type: ignore[index]


def test_duplicate_roles_are_collapsed_in_order() -> None:
    """Duplicate roles collapse, first order kept."""
    assert parse_passport('{"sub": "u", "roles": ["a", "b", "a"]}').roles == ("a", "b")


@pytest.mark.parametrize("value", [None, "", "   ", "\t"])
def test_absent_or_blank_header_is_missing(value: str | None) -> None:
    """An absent or blank header is PassportMissing (code passport_missing) naming X-Passport."""
    with pytest.raises(PassportMissing) as refused:
        parse_passport(value)
    assert refused.value.code == "passport_missing"
    assert "X-Passport" in str(refused.value)


MALFORMED = {
    "not base64url": "not*base64!",
    "base64url of non-JSON": base64.urlsafe_b64encode(b"hello").decode(),
    "base64url of non-UTF-8": base64.urlsafe_b64encode(b"\xff\xfe{").decode(),
    "broken JSON": '{"sub": ',
    "a JSON array": b64(["sub", "u"]),
    "a JSON string": b64("u"),
    "a duplicate member": '{"sub": "u", "sub": "admin"}',
    "a non-finite number": '{"sub": "u", "score": NaN}',
    "no sub": '{"org": "acme"}',
    "an empty sub": '{"sub": ""}',
    "a blank sub": '{"sub": "   "}',
    "a numeric sub": '{"sub": 42}',
    "an empty actor": '{"sub": "u", "actor": ""}',
    "an empty org": '{"sub": "u", "org": ""}',
    "a numeric org": '{"sub": "u", "org": 7}',
    "roles as a string": '{"sub": "u", "roles": "admin"}',
    "a numeric role": '{"sub": "u", "roles": [1]}',
    "an empty role": '{"sub": "u", "roles": [""]}',
    "an unknown kind": '{"sub": "u", "kind": "robot"}',
    "a list kind": '{"sub": "u", "kind": ["person"]}',
    "version 2": '{"v": 2, "sub": "u"}',
    "version true": '{"v": true, "sub": "u"}',
    "an oversized value": json.dumps({"sub": "u", "pad": "x" * MAX_PASSPORT_BYTES}),
}


@pytest.mark.parametrize("value", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_values_are_refused_typed(value: str) -> None:
    """Every malformed value is PassportMalformed (code passport_malformed), a PassportError and an
    EngineError."""
    with pytest.raises(PassportMalformed) as refused:
        parse_passport(value)
    assert refused.value.code == "passport_malformed"
    assert isinstance(refused.value, PassportError)
    assert isinstance(refused.value, EngineError)


def test_a_refusal_never_echoes_the_value() -> None:
    """A refusal never echoes the header's value."""
    secret = "s3cr3t-subject-name"
    for value in (
        json.dumps({"sub": secret, "roles": secret}),
        json.dumps({"sub": secret, "sub2": 1, "kind": secret}),
        secret + "*",
    ):
        with pytest.raises(PassportMalformed) as refused:
            parse_passport(value)
        assert secret not in str(refused.value)


def test_refusals_carry_their_code_as_graphql_extensions() -> None:
    """Each passport refusal carries its code as GraphQL extensions."""
    for error in (PassportMissing("x"), PassportMalformed("x"), PassportRefused("x")):
        assert error.extensions == {"code": error.code}
    assert {PassportMissing.code, PassportMalformed.code, PassportRefused.code} == {
        "passport_missing", "passport_malformed", "passport_refused",
    }


def test_a_passport_built_in_code_is_validated() -> None:
    """A passport built in code is validated like a parsed one: empty subject, unknown kind and
    reserved claim names are refused."""
    with pytest.raises(PassportMalformed):
        Passport(sub="")
    with pytest.raises(PassportMalformed):
        Passport(sub="u", kind="robot")  # type: ignore[arg-type]
    with pytest.raises(PassportMalformed, match="reserved"):
        Passport(sub="u", claims={"sub": "admin"})


_names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40
).filter(lambda s: s.strip() != "")


@given(
    sub=_names,
    actor=st.one_of(st.just(""), _names),
    org=st.one_of(st.none(), _names),
    roles=st.lists(_names, max_size=5, unique=True),
    kind=st.sampled_from(["person", "service"]),
    claims=st.dictionaries(
        st.text(min_size=1, max_size=10).filter(
            lambda k: k not in {"v", "sub", "actor", "org", "roles", "kind"}
        ),
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
        max_size=3,
    ),
)
def test_to_header_round_trips(
    sub: str, actor: str, org: str | None, roles: list[str], kind: str, claims: dict[str, object]
) -> None:
    """to_header gives an ASCII header without padding that parses back to the same passport and
    claims (property test)."""
    passport = Passport(sub=sub, actor=actor, org=org, roles=tuple(roles), kind=kind,  # type: ignore[arg-type]
                        claims=claims)  # type: ignore[arg-type]
    header = passport.to_header()
    assert header.isascii() and "=" not in header
    assert parse_passport(header) == passport
    assert dict(parse_passport(header).claims) == claims


async def test_resolve_principal_accepts_plain_and_coroutine_resolvers() -> None:
    """resolve_principal awaits coroutine resolvers and calls plain ones alike, and lets a
    PassportRefused through."""
    passport = parse_passport('{"sub": "u", "org": "acme"}')

    def plain(p: Passport) -> tuple[str, str | None]:
        return (p.sub, p.org)

    async def coroutine(p: Passport) -> tuple[str, str | None]:
        return (p.sub, p.org)

    assert await resolve_principal(plain, passport) == ("u", "acme")
    assert await resolve_principal(coroutine, passport) == ("u", "acme")

    async def refusing(p: Passport) -> str:
        raise PassportRefused(f"kind {p.kind} is not served here")

    with pytest.raises(PassportRefused):
        await resolve_principal(refusing, passport)


def test_the_default_principal_is_the_subject_in_its_org() -> None:
    """`OrgMember.of` keeps the subject, the org and the roles."""
    passport = parse_passport('{"sub": "alice", "org": "acme", "roles": ["admin"]}')
    assert OrgMember.of(passport) == OrgMember("alice", "acme", ("admin",))


def test_the_default_principal_refuses_a_passport_without_an_org() -> None:
    """A passport naming no org is a typed refusal (``passport_refused``),
    which the edge logs as one line, never as a fault."""
    with pytest.raises(PassportRefused) as refused:
        OrgMember.of(parse_passport('{"sub": "nobody"}'))
    assert refused.value.code == "passport_refused"


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 2), st.just(""), st.just(" "), _names,
    st.sampled_from(["person", "service", "robot"]),
    st.lists(st.one_of(_names, _names, st.just(""), st.integers()), max_size=3),
)
_members = st.tuples(
    st.one_of(_names, _names, _names, _values),
    st.dictionaries(st.sampled_from(["v", "actor", "org", "roles", "kind", "team", "tier"]),
                    _values, max_size=4),
).map(lambda pair: {"sub": pair[0], **pair[1]})


@settings(max_examples=300)
@given(document=_members)
def test_a_parsed_passport_is_one_the_constructor_accepts(document: dict[str, object]) -> None:
    """Whatever JSON object a header carries, the parse either refuses it
    (PassportMalformed) or gives the passport `Passport`'s validating
    constructor builds from the same members, equal and alike in its types
    (property test: the parse does not validate twice, so it must never build
    what the constructor would refuse)."""
    try:
        parsed = parse_passport(json.dumps(document))
    except PassportMalformed:
        return
    built = Passport(
        sub=parsed.sub, actor=parsed.actor, org=parsed.org, roles=parsed.roles,
        kind=parsed.kind, claims=dict(parsed.claims))
    assert parsed == built and type(parsed.roles) is tuple
    assert dict(parsed.claims) == {k: v for k, v in document.items()
                                   if k in ("team", "tier")} == dict(built.claims)
    assert parsed.actor == (document.get("actor") or document["sub"])
    assert parsed.roles == tuple(dict.fromkeys(document.get("roles") or ()))  # type: ignore[call-overload]
