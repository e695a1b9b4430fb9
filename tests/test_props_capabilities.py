"""Pure capability policy: attested peers from Nats-Request-Info, capability
strings, verb rules, redaction, and the props public surface."""

from __future__ import annotations

import json

import pytest

import service_engine.props as props
from service_engine.props import (
    PeerIdentity,
    PropsError,
    StaticPolicy,
    all_caps,
    attested_peer,
    audit_cap,
    describe_cap,
    read_cap,
    secrets_cap,
    write_cap,
)
from service_engine.props.capabilities import redact, required_capability


def info(**fields: object) -> dict[str, str]:
    return {"Nats-Request-Info": json.dumps(fields)}


def test_attested_peer_reads_account_and_user() -> None:
    """An attested request's peer is the account and user nats-server wrote; the peer id is ACCOUNT
    or ACCOUNT/user."""
    assert attested_peer(info(acc="A", user="alice", rtt=5), "SVC") == PeerIdentity("A", "alice")
    assert attested_peer(info(acc="B"), "SVC") == PeerIdentity("B", None)
    assert PeerIdentity("B").peer_id == "B" and PeerIdentity("A", "alice").peer_id == "A/alice"


@pytest.mark.parametrize("headers", [
    {},
    {"Nats-Request-Info": "not json"},
    {"Nats-Request-Info": "[1]"},
    info(user="alice"),
    info(acc="SVC", user="root"),  # the service's own account: nothing rewrote it
    info(acc="A.B", user="x"),
    info(acc="A", user="a b"),
    info(acc="A", user=7),
])
def test_unattested_requests(headers: dict[str, str]) -> None:
    """A request without valid request info, from the service's own account, or with an invalid
    account or user is anonymous and unattested."""
    peer = attested_peer(headers, "SVC")
    assert not peer.attested and peer.peer_id == "anonymous"


def test_without_a_service_account_nothing_is_attested() -> None:
    """Without a service account nothing is attested."""
    assert not attested_peer(info(acc="A", user="alice"), None).attested


def test_peer_id_round_trip_and_refusal() -> None:
    """Peer ids parse back to their peers; an invalid one is a validation_error naming it."""
    for peer in (PeerIdentity("A", "alice"), PeerIdentity("B"), PeerIdentity.unattested()):
        assert PeerIdentity.parse_peer_id(peer.peer_id) == peer
    with pytest.raises(PropsError) as refused:
        PeerIdentity.parse_peer_id("A.x/bob")
    assert (refused.value.error_code, refused.value.message) == ("validation_error", "not a peer id: 'A.x/bob'")
    assert PeerIdentity.unattested() == PeerIdentity(None, None, attested=False)
    assert PeerIdentity.unattested().attested is False


def test_capability_strings() -> None:
    """Capability strings follow props.<verb>:<service>.<namespace>[:view|:secrets], and all_caps is
    the six of them."""
    cap = "demo.settings"
    assert read_cap(cap) == "props.read:demo.settings"
    assert write_cap(cap) == "props.write:demo.settings"
    assert describe_cap(cap, "public") == "props.describe:demo.settings:public"
    assert describe_cap(cap, "full") == "props.describe:demo.settings:full"
    assert audit_cap(cap) == "props.audit:demo.settings"
    assert secrets_cap(cap) == "props.read:demo.settings:secrets"
    assert all_caps(cap) == {
        read_cap(cap), write_cap(cap), describe_cap(cap, "public"), describe_cap(cap, "full"),
        audit_cap(cap), secrets_cap(cap),
    }


def test_verb_rules() -> None:
    """Each verb requires its capability (writes write, reads read, audit audit, describe by view);
    an unknown verb is a validation_error."""
    cap = "s.n"
    assert {v: required_capability(v, cap) for v in ("set", "delete", "get", "list", "watch", "audit.watch")} == {
        "set": write_cap(cap), "delete": write_cap(cap), "get": read_cap(cap), "list": read_cap(cap),
        "watch": read_cap(cap), "audit.watch": audit_cap(cap),
    }
    assert required_capability("describe", cap, "full") == describe_cap(cap, "full")
    assert required_capability("describe", cap) == describe_cap(cap, "public")
    with pytest.raises(PropsError) as unknown:
        required_capability("patch", cap)
    assert (unknown.value.error_code, unknown.value.message) == ("validation_error", "unknown verb 'patch'")


def test_static_policy_unions_account_and_user_grants() -> None:
    """A static policy grants a peer its account's and its user's capabilities together; the
    anonymous entry serves unattested peers."""
    policy = StaticPolicy({"A": {"x"}, "A/alice": {"y"}, "anonymous": {"z"}})
    assert policy.capabilities(PeerIdentity("A", "alice")) == {"x", "y"}
    assert policy.capabilities(PeerIdentity("A", "bob")) == {"x"}
    assert policy.capabilities(PeerIdentity.unattested()) == {"z"}
    assert policy.capabilities(PeerIdentity("A")) == {"x"}


def test_an_unattested_identity_gets_only_the_anonymous_grants() -> None:
    """Names the server did not vouch for never unlock that account's or
    user's grants, whatever they say."""
    policy = StaticPolicy({"A": {"x"}, "A/alice": {"y"}, "anonymous": {"z"}})
    assert policy.capabilities(PeerIdentity("A", "alice", attested=False)) == {"z"}
    assert policy.capabilities(PeerIdentity("A", None, attested=False)) == {"z"}


def test_redaction_nulls_secrets_and_keeps_missing_fields_missing() -> None:
    """Redaction nulls present secret fields without the secrets capability, adds none that are
    missing, and keeps them with it."""
    secret = frozenset({"token"})
    assert redact(secret, {"a": 1, "token": "t"}, False) == {"a": 1, "token": None}
    assert redact(secret, {"a": 1}, False) == {"a": 1}
    assert redact(secret, {"token": "t"}, True) == {"token": "t"}


def test_public_surface() -> None:
    """Every name props exports exists, listed once."""
    for name in props.__all__:
        assert getattr(props, name) is not None
    assert sorted(props.__all__) == sorted(set(props.__all__))
