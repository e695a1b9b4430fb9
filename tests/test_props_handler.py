"""Every verb through the transport-free handler on the in-memory store:
reply shapes, the capability and redaction matrix, describe views, sagas,
grants and the replay window."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from service_engine.props import (
    Actor,
    FieldSpec,
    Granted,
    GranterMissing,
    GrantOutcome,
    GrantRefused,
    MemoryStore,
    Namespace,
    PeerIdentity,
    PropsError,
    PropsHandler,
    Reply,
    SagaOutcome,
    StaticPolicy,
    Validator,
    all_caps,
    audit_cap,
    describe_cap,
    now,
    parse_command,
    read_cap,
    secrets_cap,
    write_cap,
)
from service_engine.props.handler import fitting_start

SVC = "demo"
CAP = "demo.settings"


def short(value: Any) -> str | None:
    return None if len(value) <= 8 else "too long"


SETTINGS = Namespace(
    "settings",
    (
        FieldSpec("title", "string", default="untitled", help="shown to people", validators=(Validator("max8", short),)),
        FieldSpec("api_key", "string", secret=True, validators=(Validator("vault_format_v2", short, secret=True),)),
        FieldSpec("legacy", "integer", until="2"),
        FieldSpec("color", "string", validators=(Validator("internal_rule", short, secret=True),), since="2"),
    ),
    primary_key_field="title",
    schema_version="3",
)
PREFS = Namespace("prefs", (FieldSpec("theme", "string"),), cardinality="singleton", canonical_key="current")
LOCKED = Namespace("locked", (FieldSpec("a", "string"),), schema_public="deny")


async def provision(key: str, fields: Mapping[str, Any]) -> SagaOutcome:
    if fields.get("size") == "huge":
        return SagaOutcome("failed", "no capacity")
    return SagaOutcome("active")


SAGA = Namespace("machines", (FieldSpec("size", "string"),), saga=provision)

ALICE = PeerIdentity("A", "alice")
PEERS = {
    "reader": {read_cap(CAP)},
    "writer": {write_cap(CAP)},
    "auditor": {audit_cap(CAP)},
    "public_describer": {describe_cap(CAP, "public")},
    "full_describer": {describe_cap(CAP, "full")},
    "secrets": {read_cap(CAP), secrets_cap(CAP)},
}


class FakeGranter:
    def __init__(self, outcome: GrantOutcome, *, confirms: bool = True) -> None:
        self.outcome = outcome
        self.confirms = confirms
        self.calls: list[tuple[str, str, str]] = []
        self.revoked: list[str] = []

    async def subscribe_grant(self, topic: str, target_peer: str, namespace: str) -> GrantOutcome:
        self.calls.append((topic, target_peer, namespace))
        return self.outcome

    async def unsubscribe_grant(self, subscription_id: str) -> bool:
        self.revoked.append(subscription_id)
        return self.confirms


def policy() -> StaticPolicy:
    grants: dict[str, set[str]] = {f"P/{name}": caps for name, caps in PEERS.items()}
    everything: set[str] = set()
    for ns in ("settings", "prefs", "locked", "machines"):
        everything |= all_caps(f"demo.{ns}")
    grants["A/alice"] = everything
    return StaticPolicy(grants)


@pytest.fixture
async def handler() -> PropsHandler:
    h = PropsHandler(SVC, MemoryStore(), policy(), FakeGranter(Granted("sub_1", "settings")))
    for ns in (SETTINGS, PREFS, LOCKED, SAGA):
        await h.register(ns)
    return h


async def call(h: PropsHandler, verb: str, headers: dict[str, str], body: bytes = b"", peer: PeerIdentity = ALICE, live: bool = True) -> dict[str, Any]:
    return await h.command(parse_command(SVC, f"{SVC}.props.{verb}", headers, body), peer, live=live)


async def test_set_simple_reply_shape_and_warnings(handler: PropsHandler) -> None:
    """A first set answers version 1, nseq 1, created; a second set is not created, bumps the
    version, and warns about a field past its schema version."""
    reply = await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"title": "t"}')
    assert reply == {"namespace": "settings", "key": "k", "version": 1, "nseq": 1, "created": True}
    warned = await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"legacy": 1}')
    assert warned["created"] is False and warned["version"] == 2
    assert warned["warnings"] and "legacy" in warned["warnings"][0]


async def test_saga_reply_shape(handler: PropsHandler) -> None:
    """A saga namespace's set answers both the provisioning and the completion versions and nseqs, a
    failed step answers lifecycle failed with its reason, and replay shows created then completed
    for each."""
    ok = await call(handler, "set", {"namespace": "machines", "key": "m1"}, b'{"size": "small"}')
    assert ok == {
        "namespace": "machines", "key": "m1", "set_version": 1, "set_nseq": 1,
        "complete_version": 2, "complete_nseq": 2, "lifecycle": "active", "created": True,
    }
    failed = await call(handler, "set", {"namespace": "machines", "key": "m2"}, b'{"size": "huge"}')
    assert (failed["lifecycle"], failed["reason"], failed["set_nseq"], failed["complete_nseq"]) == ("failed", "no capacity", 3, 4)
    replay = await call(handler, "watch", {"namespace": "machines"}, live=False)
    kinds = [(e["kind"], e.get("lifecycle")) for e in replay["events"]]
    assert kinds == [("created", None), ("completed", "active"), ("created", None), ("completed", "failed")]
    assert replay["events"][3]["reason"] == "no capacity"


async def test_delete_reply_shape_and_collection_only(handler: PropsHandler) -> None:
    """A delete answers deleted with its tombstone version and nseq; a delete on a singleton
    namespace is a validation_error."""
    await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"title": "t"}')
    assert await call(handler, "delete", {"namespace": "settings", "key": "k", "cause": "cleanup"}) == {
        "namespace": "settings", "key": "k", "deleted": True, "tombstone_version": 2, "nseq": 2,
    }
    await call(handler, "set", {"namespace": "prefs"}, b'{"theme": "dark"}')
    with pytest.raises(PropsError) as caught:
        await call(handler, "delete", {"namespace": "prefs"})
    assert caught.value.error_code == "validation_error"


async def test_get_reply_uses_the_canonical_key_and_observed_cursor(handler: PropsHandler) -> None:
    """A singleton's get answers the canonical key "current" with version, nseq and fields; a get of
    a missing key is not_found."""
    await call(handler, "set", {"namespace": "prefs", "key": ""}, b'{"theme": "dark"}')
    await call(handler, "set", {"namespace": "settings", "key": "x"}, b'{"title": "t"}')
    assert await call(handler, "get", {"namespace": "prefs"}) == {
        "namespace": "prefs", "key": "current", "version": 1, "nseq": 1, "fields": {"theme": "dark"},
    }
    with pytest.raises(PropsError) as missing:
        await call(handler, "get", {"namespace": "settings", "key": "nope"})
    assert missing.value.error_code == "not_found"


async def test_list_reply_shape(handler: PropsHandler) -> None:
    """A list answers the namespace's records in key order with the observed nseq and no next
    cursor."""
    await call(handler, "set", {"namespace": "settings", "key": "b"}, b'{"title": "tb"}')
    await call(handler, "set", {"namespace": "settings", "key": "a"}, b'{"title": "ta"}')
    assert await call(handler, "list", {"namespace": "settings"}) == {
        "namespace": "settings", "nseq": 2, "next_cursor": None,
        "records": [{"key": "a", "version": 1, "fields": {"title": "ta"}}, {"key": "b", "version": 1, "fields": {"title": "tb"}}],
    }


async def test_secret_fields_are_nulled_without_the_secrets_capability(handler: PropsHandler) -> None:
    """A secret field reads as null in get and list for a peer without the secrets capability, and
    in clear for one with it."""
    await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"title": "t", "api_key": "s3cr3t"}')
    reader = PeerIdentity("P", "reader")
    secrets = PeerIdentity("P", "secrets")
    assert (await call(handler, "get", {"namespace": "settings", "key": "k"}, peer=reader))["fields"] == {"title": "t", "api_key": None}
    assert (await call(handler, "list", {"namespace": "settings"}, peer=reader))["records"][0]["fields"]["api_key"] is None
    assert (await call(handler, "get", {"namespace": "settings", "key": "k"}, peer=secrets))["fields"]["api_key"] == "s3cr3t"


async def test_describe_views(handler: PropsHandler) -> None:
    """The public describe lists the non-secret fields with their metadata (defaults, validators,
    since/until) and no secret name or validator; the full view adds the secret field."""
    public = await call(handler, "describe", {"namespace": "settings"})
    assert set(public) == {"namespace", "schema_version", "cardinality", "fields", "primary_key_field"}
    assert (public["schema_version"], public["cardinality"], public["primary_key_field"]) == ("3", "collection", "title")
    names = [f["name"] for f in public["fields"]]
    assert names == ["title", "legacy", "color"]
    title = public["fields"][0]
    assert title == {"name": "title", "type": "string", "secret": False, "default": "untitled", "validators": ["max8"], "help": "shown to people"}
    color = public["fields"][2]
    assert color["validators"] == ["redacted"] and color["since"] == "2"
    assert public["fields"][1]["until"] == "2"
    assert "vault_format_v2" not in str(public) and "api_key" not in str(public)
    full = await call(handler, "describe", {"namespace": "settings", "view": "full"})
    assert [f["name"] for f in full["fields"]] == ["title", "api_key", "legacy", "color"]
    assert full["fields"][1]["validators"] == ["vault_format_v2"] and full["fields"][1]["secret"] is True
    assert "primary_key_field" not in await call(handler, "describe", {"namespace": "prefs"})


async def test_public_describe_never_names_a_secret_primary_key_field() -> None:
    """Public describe omits secret fields, so it omits a secret
    primary_key_field too; full describe names it."""
    vault = Namespace("vault", (FieldSpec("token", "string", secret=True), FieldSpec("label", "string")), primary_key_field="token")
    h = PropsHandler(SVC, MemoryStore(), StaticPolicy({"A/alice": all_caps("demo.vault")}))
    await h.register(vault)
    public = await call(h, "describe", {"namespace": "vault"})
    assert "primary_key_field" not in public and "token" not in str(public)
    assert (await call(h, "describe", {"namespace": "vault", "view": "full"}))["primary_key_field"] == "token"


async def test_schema_public_deny_refuses_public_describe(handler: PropsHandler) -> None:
    """A namespace whose schema denies public describe refuses it with auth_denied and still answers
    the full view."""
    with pytest.raises(PropsError) as caught:
        await call(handler, "describe", {"namespace": "locked"})
    assert caught.value.error_code == "auth_denied"
    assert (await call(handler, "describe", {"namespace": "locked", "view": "full"}))["namespace"] == "locked"


VERB_REQUESTS: list[tuple[str, dict[str, str], bytes]] = [
    ("set", {"namespace": "settings", "key": "k"}, b'{"title": "t"}'),
    ("delete", {"namespace": "settings", "key": "k"}, b""),
    ("get", {"namespace": "settings", "key": "k"}, b""),
    ("list", {"namespace": "settings"}, b""),
    ("describe", {"namespace": "settings"}, b""),
    ("describe", {"namespace": "settings", "view": "full"}, b""),
    ("watch", {"namespace": "settings"}, b""),
    ("audit.watch", {"namespace": "settings"}, b""),
]
ALLOWED = {
    "reader": {"get", "list", "watch"},
    "secrets": {"get", "list", "watch"},
    "writer": {"set", "delete"},
    "auditor": {"audit.watch"},
    "public_describer": {"describe"},
    "full_describer": {"describe:full"},
}


@pytest.mark.parametrize("peer_name", sorted(PEERS))
async def test_capability_matrix(handler: PropsHandler, peer_name: str) -> None:
    """Each peer is allowed exactly the verbs its capabilities grant and refused every other with
    auth_denied."""
    peer = PeerIdentity("P", peer_name)
    for verb, headers, body in VERB_REQUESTS:
        label = "describe:full" if headers.get("view") == "full" else verb
        await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"title": "t"}')
        try:
            await call(handler, verb, headers, body, peer=peer)
            allowed = True
        except PropsError as exc:
            assert exc.error_code == "auth_denied", (peer_name, label, exc)
            allowed = False
        assert allowed == (label in ALLOWED[peer_name]), (peer_name, label)


async def test_unattested_and_unknown_peers_hold_nothing(handler: PropsHandler) -> None:
    """An unattested peer and a peer with no policy entry are refused auth_denied."""
    for peer in (PeerIdentity.unattested(), PeerIdentity("Z", "zed")):
        with pytest.raises(PropsError) as caught:
            await call(handler, "get", {"namespace": "settings", "key": "k"}, peer=peer)
        assert caught.value.error_code == "auth_denied"


async def test_capability_check_precedes_namespace_lookup(handler: PropsHandler) -> None:
    """Without the capability a request for an unknown namespace is auth_denied (its existence is
    not revealed); with it, not_found."""
    with pytest.raises(PropsError) as denied:
        await call(handler, "get", {"namespace": "ghost", "key": "k"}, peer=PeerIdentity("P", "reader"))
    assert denied.value.error_code == "auth_denied"
    granted = PropsHandler(SVC, MemoryStore(), StaticPolicy({"A/alice": all_caps("demo.ghost")}))
    with pytest.raises(PropsError) as missing:
        await call(granted, "get", {"namespace": "ghost", "key": "k"})
    assert missing.value.error_code == "not_found"


async def test_watch_reply_shapes_and_grant_arguments(handler: PropsHandler) -> None:
    """A live watch replays events after since_nseq, carries the caught_up marker and asks the
    granter for the records subject; audit.watch asks for the audit subject and answers events
    with their audit digest."""
    for n in range(3):
        await call(handler, "set", {"namespace": "settings", "key": f"k{n}"}, b'{"title": "t"}')
    reply = await call(handler, "watch", {"namespace": "settings", "since_nseq": "1"})
    assert set(reply) == {"namespace", "observed_nseq", "events", "live", "caught_up"}
    assert reply["live"] is True and reply["observed_nseq"] == 3
    assert [e["nseq"] for e in reply["events"]] == [2, 3]
    assert reply["caught_up"] == {"event_type": "caught_up", "namespace": "settings", "nseq": 3}
    granter = handler.granter
    assert isinstance(granter, FakeGranter)
    assert granter.calls[-1] == ("demo.props.records.changed", "A/alice", "settings")
    audit = await call(handler, "audit.watch", {"namespace": "settings"})
    assert set(audit) == {"namespace", "observed_nseq", "events", "live"}
    assert granter.calls[-1][0] == "demo.props.audit"
    assert all("audit_digest" in e and "kind" not in e for e in audit["events"])


async def test_caller_cursor_above_observed(handler: PropsHandler) -> None:
    """A since_nseq above the observed cursor replays nothing and reports caught up at the observed
    nseq."""
    await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"title": "t"}')
    reply = await call(handler, "watch", {"namespace": "settings", "since_nseq": "99"})
    assert reply["events"] == [] and reply["caught_up"]["nseq"] == 1 and reply["observed_nseq"] == 1


async def test_replay_only_is_for_unit_tests(handler: PropsHandler) -> None:
    """A replay-only watch answers live false and asks the granter for nothing."""
    reply = await call(handler, "watch", {"namespace": "settings"}, live=False)
    assert reply["live"] is False
    granter = handler.granter
    assert isinstance(granter, FakeGranter) and granter.calls == []


async def test_grant_failures(handler: PropsHandler) -> None:
    """A refused grant answers grant_failed rc 10 without the broker's route detail; a missing
    granter or no granter answers unavailable rc 20."""
    handler.granter = FakeGranter(GrantRefused("target_peer_not_connected", "A/alice via route r-17 to leaf x"))
    with pytest.raises(PropsError) as refused:
        await call(handler, "watch", {"namespace": "settings"})
    assert (refused.value.error_code, refused.value.rc) == ("grant_failed", 10)
    assert "r-17" not in refused.value.message and "target_peer" not in refused.value.message
    handler.granter = FakeGranter(GranterMissing("NoRespondersError"))
    with pytest.raises(PropsError) as missing:
        await call(handler, "audit.watch", {"namespace": "settings"})
    assert (missing.value.error_code, missing.value.rc) == ("unavailable", 20)
    handler.granter = None
    with pytest.raises(PropsError) as none:
        await call(handler, "watch", {"namespace": "settings"})
    assert none.value.error_code == "unavailable"


async def test_replay_window_exceeded() -> None:
    """A watch from before the retained events is replay_window_exceeded naming since_nseq and
    oldest_nseq; one from within the window replays what is kept."""
    h = PropsHandler(SVC, MemoryStore(), StaticPolicy({"A/alice": all_caps("demo.tiny")}), FakeGranter(Granted("s", "tiny")))
    await h.register(Namespace("tiny", (FieldSpec("n", "integer"),), retain_events=2))
    for n in range(5):
        await call(h, "set", {"namespace": "tiny", "key": "k"}, f'{{"n": {n}}}'.encode())
    with pytest.raises(PropsError) as caught:
        await call(h, "watch", {"namespace": "tiny", "since_nseq": "1"})
    assert caught.value.body() == {
        "error_code": "replay_window_exceeded", "message": caught.value.message, "since_nseq": 1, "oldest_nseq": 4,
    }
    assert [e["nseq"] for e in (await call(h, "watch", {"namespace": "tiny", "since_nseq": "3"}))["events"]] == [4, 5]


async def test_handle_answers_every_failure_with_a_body(handler: PropsHandler) -> None:
    """A failing request answers its rc and an error body with exactly error_code and message; a
    successful one rc 0 and no error."""
    reply = await handler.handle("demo.props.get", {"namespace": "settings", "key": "k", "field_path": ""}, b"", ALICE)
    assert (reply.rc, reply.body["error_code"]) == (10, "validation_error")
    assert reply.error == reply.body["message"] and set(reply.body) == {"error_code", "message"}
    ok = await handler.handle("demo.props.describe", {"namespace": "prefs"}, b"", ALICE)
    assert ok.rc == 0 and ok.error is None


async def test_validation_of_values(handler: PropsHandler) -> None:
    """A value over its validator's bound is refused naming the validator, except a secret field's
    validator, which is never named."""
    with pytest.raises(PropsError) as long_title:
        await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"title": "far too long"}')
    assert "max8" in long_title.value.message
    with pytest.raises(PropsError) as long_key:
        await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"api_key": "far too long"}')
    assert "vault_format_v2" not in long_key.value.message


class BrokenStore(MemoryStore):
    async def get(self, namespace: str, key: str) -> Any:
        from service_engine.props import PropsStoreError

        raise PropsStoreError("disk I/O error at /var/lib/secret/path")


async def test_storage_failure_is_storage_error_without_detail() -> None:
    """A store failure answers storage_error rc 20 without the store's path."""
    h = PropsHandler(SVC, BrokenStore(), StaticPolicy({"A/alice": all_caps("demo.settings")}))
    await h.register(SETTINGS)
    reply = await h.handle("demo.props.get", {"namespace": "settings", "key": "k"}, b"", ALICE)
    assert (reply.rc, reply.body["error_code"]) == (20, "storage_error")
    assert "/var/lib" not in reply.body["message"]


def test_verb_registry_classes() -> None:
    """The verb registry lists every props verb of the service with its class (intent or query) and
    the service as owner."""
    from service_engine.props import verb_registry

    assert {e["subject"]: e["class"] for e in verb_registry("demo")} == {
        "demo.props.set": "intent", "demo.props.delete": "intent", "demo.props.get": "query",
        "demo.props.list": "query", "demo.props.describe": "query", "demo.props.watch": "intent",
        "demo.props.audit.watch": "intent",
    }
    assert {e["owner"] for e in verb_registry("demo")} == {"demo"}


class DefectiveStore(MemoryStore):
    async def list_records(self, namespace: str) -> Any:
        raise RuntimeError("a bug")


async def test_a_defect_still_answers_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    """An unexpected exception in the store still answers, as unavailable rc 20, without the
    exception's text."""
    h = PropsHandler(SVC, DefectiveStore(), StaticPolicy({"A/alice": all_caps("demo.settings")}))
    await h.register(SETTINGS)
    reply = await h.handle("demo.props.list", {"namespace": "settings"}, b"", ALICE)
    assert (reply.rc, reply.body["error_code"]) == (20, "unavailable")
    assert "a bug" not in reply.body["message"]


WIDE = Namespace("wide", tuple(FieldSpec(f"field_number_{n:03d}", "integer") for n in range(40)))
WIDE_ROW = json.dumps({f"field_number_{n:03d}": n for n in range(40)}).encode()


async def wide_handler(commits: int, granter: FakeGranter | None = None) -> PropsHandler:
    h = PropsHandler(SVC, MemoryStore(), StaticPolicy({"A/alice": all_caps("demo.wide")}), granter or FakeGranter(Granted("sub_w", "wide")))
    await h.register(WIDE)
    for n in range(commits):
        await call(h, "set", {"namespace": "wide", "key": f"k{n:03d}"}, WIDE_ROW)
    return h


async def handled(h: PropsHandler, verb: str, headers: dict[str, str], limit: int | None) -> Reply:
    return await h.handle(f"{SVC}.props.{verb}", headers, b"", ALICE, limit=limit)


@pytest.mark.parametrize("verb", ["watch", "audit.watch"])
async def test_a_replay_over_the_limit_is_refused_with_where_a_replay_fits(verb: str) -> None:
    """A replay that would not fit is replay_window_exceeded (rc 10) naming
    the limit, whose oldest_nseq is where a replay fits; the refused watch's
    grant is removed; a watch from there replays every later event."""
    granter = FakeGranter(Granted("sub_w", "wide"))
    h = await wide_handler(30, granter)
    full = await handled(h, verb, {"namespace": "wide"}, None)
    assert full.rc == 0 and len(full.body["events"]) == 30 and full.grant == Granted("sub_w", "wide")
    limit = full.wire_size // 3
    refused = await handled(h, verb, {"namespace": "wide"}, limit)
    assert (refused.rc, refused.body["error_code"], refused.body["since_nseq"]) == (10, "replay_window_exceeded", 0)
    assert f"{limit}-byte limit" in refused.body["message"] and refused.error == refused.body["message"]
    assert refused.grant is None and granter.revoked == ["sub_w"]
    oldest = refused.body["oldest_nseq"]
    assert 1 < oldest <= 30
    resumed = await handled(h, verb, {"namespace": "wide", "since_nseq": str(oldest - 1)}, limit)
    assert resumed.rc == 0 and resumed.wire_size <= limit and resumed.grant is not None
    assert [e["nseq"] for e in resumed.body["events"]] == list(range(oldest, 31))
    # One event more would not have fitted: oldest_nseq is the earliest that fits.
    earlier = await handled(h, verb, {"namespace": "wide", "since_nseq": str(oldest - 2)}, limit)
    assert earlier.body["error_code"] == "replay_window_exceeded" and earlier.body["oldest_nseq"] == oldest
    assert granter.revoked == ["sub_w", "sub_w"]


async def test_a_reply_of_exactly_the_limit_is_answered() -> None:
    """A reply of exactly the payload limit is answered and one byte less of limit refuses it, for
    watch, list and get."""
    h = await wide_handler(3)
    for verb, headers in (("watch", {"namespace": "wide"}), ("list", {"namespace": "wide"}), ("get", {"namespace": "wide", "key": "k000"})):
        size = (await handled(h, verb, headers, None)).wire_size
        assert (await handled(h, verb, headers, size)).rc == 0, verb
        assert (await handled(h, verb, headers, size - 1)).rc == 10, verb


async def test_no_single_event_fits_points_past_the_cursor() -> None:
    """When not even the newest event fits, oldest_nseq is the cursor + 1:
    a watch from the cursor replays nothing and is answered."""
    h = await wide_handler(2)
    one = await handled(h, "watch", {"namespace": "wide", "since_nseq": "1"}, None)
    limit = one.wire_size - 1
    refused = await handled(h, "watch", {"namespace": "wide"}, limit)
    assert (refused.body["error_code"], refused.body["oldest_nseq"]) == ("replay_window_exceeded", 3)
    assert (await handled(h, "watch", {"namespace": "wide", "since_nseq": "2"}, limit)).rc == 0


@pytest.mark.parametrize("verb", ["list", "get"])
async def test_a_list_or_get_over_the_limit_is_a_validation_error_naming_it(verb: str) -> None:
    """A list or get reply over the broker's max payload is a validation_error naming the reply's
    size and the limit."""
    h = await wide_handler(20)
    headers = {"namespace": "wide"} if verb == "list" else {"namespace": "wide", "key": "k000"}
    limit = (await handled(h, verb, headers, None)).wire_size - 1
    refused = await handled(h, verb, headers, limit)
    assert (refused.rc, refused.body["error_code"]) == (10, "validation_error")
    assert refused.body["message"] == f"the {verb} reply would be {limit + 1} bytes, over the {limit}-byte limit of the broker's max payload"


async def test_an_oversized_refusal_still_answers_within_the_limit() -> None:
    """Even an error whose message would not fit is answered, with a reply
    that fits."""
    h = await wide_handler(0)
    reply = await h.handle("demo.props.watch", {"namespace": "x" * 500}, b"", ALICE, limit=300)
    assert reply.rc == 10 and reply.body["error_code"] == "validation_error" and reply.wire_size <= 300


async def test_a_failure_after_the_grant_removes_it() -> None:
    """Any refusal or failure after the grant (the retention check, a store
    failure) removes the grant; a success hands it to the transport."""
    granter = FakeGranter(Granted("sub_t", "tiny"), confirms=False)
    h = PropsHandler(SVC, MemoryStore(), StaticPolicy({"A/alice": all_caps("demo.tiny")}), granter)
    await h.register(Namespace("tiny", (FieldSpec("n", "integer"),), retain_events=1))
    for n in range(3):
        await call(h, "set", {"namespace": "tiny", "key": "k"}, f'{{"n": {n}}}'.encode())
    refused = await handled(h, "watch", {"namespace": "tiny"}, None)
    assert refused.body["error_code"] == "replay_window_exceeded" and refused.grant is None
    assert granter.revoked == ["sub_t"]
    with pytest.raises(PropsError):
        await call(h, "watch", {"namespace": "tiny", "since_nseq": "1"})
    assert granter.revoked == ["sub_t", "sub_t"]
    ok = await handled(h, "watch", {"namespace": "tiny", "since_nseq": "2"}, None)
    assert ok.rc == 0 and ok.grant == Granted("sub_t", "tiny") and granter.revoked == ["sub_t", "sub_t"]
    denied = await h.handle("demo.props.watch", {"namespace": "tiny"}, b"", PeerIdentity("Z", "zed"))
    assert denied.body["error_code"] == "auth_denied" and len(granter.calls) == 3


class BrokenHistory(MemoryStore):
    async def history(self, namespace: str, after: int) -> Any:
        from service_engine.props import PropsStoreError

        raise PropsStoreError("disk I/O error")


async def test_a_storage_failure_after_the_grant_removes_it() -> None:
    """A watch whose replay fails after the grant answers storage_error and revokes the grant it
    obtained."""
    granter = FakeGranter(Granted("sub_b", "settings"))
    h = PropsHandler(SVC, BrokenHistory(), StaticPolicy({"A/alice": all_caps("demo.settings")}), granter)
    await h.register(SETTINGS)
    reply = await handled(h, "watch", {"namespace": "settings"}, None)
    assert (reply.rc, reply.body["error_code"], reply.grant) == (20, "storage_error", None)
    assert granter.revoked == ["sub_b"]


async def test_revoke_without_a_granter_or_a_broker_answer_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    """Revoking with no granter, a raising granter or an unconfirmed removal never raises; the last
    two are logged."""
    h = PropsHandler(SVC, MemoryStore(), StaticPolicy({}))
    await h.revoke(Granted("s", "n"))

    class Raising(FakeGranter):
        async def unsubscribe_grant(self, subscription_id: str) -> bool:
            raise RuntimeError("broker gone")

    h.granter = Raising(Granted("s", "n"))
    await h.revoke(Granted("s", "n"))
    h.granter = FakeGranter(Granted("s", "n"), confirms=False)
    await h.revoke(Granted("s2", "n"))
    messages = [r.getMessage() for r in caplog.records]
    assert "removing grant s failed" in messages
    assert "the broker did not confirm removing grant s2" in messages


def test_fitting_start_takes_the_longest_suffix_that_fits() -> None:
    """fitting_start picks the first index whose suffix of items, JSON-framed, fits the byte budget."""
    assert fitting_start([], 0) == 0
    assert fitting_start([5], 5) == 0 and fitting_start([5], 4) == 1
    # [a,b] is 2 + 5 + 1 + 5: two items of 5 need 11 bytes of room.
    assert fitting_start([5, 5], 11) == 0 and fitting_start([5, 5], 10) == 1
    assert fitting_start([1, 100, 3, 3], 7) == 2
    assert fitting_start([1, 100, 3, 3], 6) == 3


@pytest.mark.parametrize(("code", "rc"), [
    ("auth_denied", 10), ("not_found", 10), ("validation_error", 10), ("conflict", 10),
    ("version_mismatch", 10), ("replay_window_exceeded", 10), ("grant_failed", 10),
    ("storage_error", 20), ("hook_error", 20), ("unavailable", 20),
])
def test_every_error_code_answers_its_rc(code: str, rc: int) -> None:
    """The closed vocabulary of the Errors table, each with its rc."""
    from service_engine.props import ERROR_RC

    assert ERROR_RC[code] == rc and PropsError(code, "m").rc == rc  # type: ignore[arg-type]
    reply = Reply.of_error(PropsError(code, "m"))  # type: ignore[arg-type]
    assert (reply.rc, reply.body, reply.error) == (rc, {"error_code": code, "message": "m"}, "m")


async def test_conflict_and_replay_window_answer_rc_10_through_handle() -> None:
    """A saga whose record vanished before completion is a conflict; a
    cursor past retention is replay_window_exceeded: both rc 10 on the wire."""
    store = MemoryStore()

    async def vanish(key: str, fields: Mapping[str, Any]) -> SagaOutcome:
        await store.delete(GONE, key, if_version=None, actor=Actor("demo", now()))
        return SagaOutcome("active")

    GONE = Namespace("gone", (FieldSpec("size", "string"),), saga=vanish)
    h = PropsHandler(SVC, store, StaticPolicy({"A/alice": all_caps("demo.gone")}), FakeGranter(Granted("s", "gone")))
    await h.register(GONE)
    conflict = await h.handle("demo.props.set", {"namespace": "gone", "key": "m"}, b'{"size": "s"}', ALICE)
    assert (conflict.rc, conflict.body["error_code"]) == (10, "conflict")
    tiny = Namespace("tinier", (FieldSpec("n", "integer"),), retain_events=1)
    h.policy = StaticPolicy({"A/alice": all_caps("demo.tinier")})
    await h.register(tiny)
    for n in range(3):
        await call(h, "set", {"namespace": "tinier", "key": "k"}, f'{{"n": {n}}}'.encode())
    window = await h.handle("demo.props.watch", {"namespace": "tinier"}, b"", ALICE)
    assert (window.rc, window.body["error_code"], window.body["oldest_nseq"]) == (10, "replay_window_exceeded", 3)


@pytest.mark.parametrize("raw", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
async def test_non_finite_numbers_answer_validation_error_rc_10(raw: bytes) -> None:
    """NaN, infinities and out-of-range numbers in a set body answer validation_error rc 10."""
    h = PropsHandler(SVC, MemoryStore(), StaticPolicy({"A/alice": all_caps("demo.nums")}))
    await h.register(Namespace("nums", (FieldSpec("n", "number"),)))
    reply = await h.handle("demo.props.set", {"namespace": "nums", "key": "k"}, b'{"n": ' + raw + b"}", ALICE)
    assert (reply.rc, reply.body["error_code"]) == (10, "validation_error")


@pytest.mark.parametrize("name", ["", "a.b", "a b"])
def test_a_service_name_is_one_subject_token(name: str) -> None:
    """A service name that is empty or holds a dot or space is refused as not one subject token."""
    from service_engine.errors import ConfigError

    with pytest.raises(ConfigError, match="must be one subject token"):
        PropsHandler(name, MemoryStore(), StaticPolicy({}))


async def test_registration_and_lookup_name_the_namespace(handler: PropsHandler) -> None:
    """Registering a namespace twice and looking up an unknown one fail with messages naming the
    namespace."""
    from service_engine.errors import DuplicateRegistration

    with pytest.raises(DuplicateRegistration) as twice:
        await handler.register(SETTINGS)
    assert str(twice.value) == "duplicate props namespace registration: 'settings'"
    with pytest.raises(PropsError) as missing:
        handler.namespace("ghost")
    assert (missing.value.error_code, missing.value.message) == ("not_found", "namespace 'ghost' is not registered")


async def test_grant_refusals_keep_detail_in_the_log_only(handler: PropsHandler, caplog: pytest.LogCaptureFixture) -> None:
    """Grant refusals answer fixed messages; the broker's reason and route appear only in the log."""
    handler.granter = FakeGranter(GrantRefused("target_peer_not_connected", "via route r-17"))
    with pytest.raises(PropsError) as refused:
        await call(handler, "watch", {"namespace": "settings"})
    assert refused.value.message == "live delivery could not be granted"
    handler.granter = FakeGranter(GranterMissing("NoRespondersError"))
    with pytest.raises(PropsError) as missing:
        await call(handler, "watch", {"namespace": "settings"})
    assert missing.value.message == "no broker grants live delivery"
    handler.granter = None
    with pytest.raises(PropsError) as none:
        await call(handler, "watch", {"namespace": "settings"})
    assert none.value.message == "no broker grants live delivery"
    logged = [r.getMessage() for r in caplog.records]
    assert "subscription grant refused: target_peer_not_connected via route r-17" in logged
    assert "subscription grant unavailable: NoRespondersError" in logged


async def test_set_passes_merge_and_fence_through_plain_and_saga_writes(handler: PropsHandler) -> None:
    """merge=replace replaces every field and a stale if_version is version_mismatch, in plain and
    saga namespaces alike."""
    for ns, body in (("settings", b'{"title": "t", "color": "red"}'), ("machines", b'{"size": "small"}')):
        await call(handler, "set", {"namespace": ns, "key": "k"}, body)
        replaced = b'{"title": "u"}' if ns == "settings" else b'{"size": "big"}'
        await call(handler, "set", {"namespace": ns, "key": "k", "merge": "replace"}, replaced)
        assert (await call(handler, "get", {"namespace": ns, "key": "k"}))["fields"] == json.loads(replaced)
        with pytest.raises(PropsError) as stale:
            await call(handler, "set", {"namespace": ns, "key": "k", "if_version": "1"}, replaced)
        assert stale.value.error_code == "version_mismatch", ns


async def test_a_saga_step_sees_its_provisioning_record_and_completion_keeps_actor_and_cause() -> None:
    """The saga step runs while its record is provisioning, and both the provisioning and the
    completion events carry the caller's actor and cause."""
    store = MemoryStore()
    seen: list[tuple[str, str | None, dict[str, Any]]] = []

    async def step(key: str, fields: Mapping[str, Any]) -> SagaOutcome:
        snap = await store.get("steps", key)
        assert snap.record is not None
        seen.append((key, snap.record.lifecycle, dict(fields)))
        return SagaOutcome("active")

    steps = Namespace("steps", (FieldSpec("size", "string"),), saga=step)
    h = PropsHandler(SVC, store, StaticPolicy({"A/alice": all_caps("demo.steps")}))
    await h.register(steps)
    await call(h, "set", {"namespace": "steps", "key": "m1", "cause": "c-7"}, b'{"size": "s"}')
    assert seen == [("m1", "provisioning", {"size": "s"})]
    provisioned, completed = await store.events("steps", 0, 2)
    assert (completed.kind, completed.actor, completed.cause) == ("completed", "A/alice", "c-7")
    assert (provisioned.actor, provisioned.cause) == ("A/alice", "c-7")


async def test_a_failing_saga_step_completes_the_record_as_failed(caplog: pytest.LogCaptureFixture) -> None:
    """A saga step that raises completes its record as failed with the exception's type as reason,
    and the exception is logged."""
    async def broken(key: str, fields: Mapping[str, Any]) -> SagaOutcome:
        raise RuntimeError("the cloud is down")

    h = PropsHandler(SVC, MemoryStore(), StaticPolicy({"A/alice": all_caps("demo.broken")}))
    await h.register(Namespace("broken", (FieldSpec("size", "string"),), saga=broken))
    reply = await call(h, "set", {"namespace": "broken", "key": "m1"}, b'{"size": "s"}')
    assert (reply["lifecycle"], reply["reason"]) == ("failed", "saga step failed: RuntimeError")
    assert "saga step of broken/m1 failed: RuntimeError('the cloud is down')" in [r.getMessage() for r in caplog.records]


async def test_reconcile_is_the_owners_commit(handler: PropsHandler) -> None:
    """reconcile commits a reconciled event as the service itself, with an aware timestamp, visible
    to get; an unknown namespace is refused."""
    await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"title": "t"}')
    commit = await handler.reconcile("settings", "k", {"title": "fixed"})
    assert (commit.key, commit.version, commit.event.kind, commit.event.actor, commit.event.audit_epoch) == ("k", 2, "reconciled", "demo", 1)
    assert commit.event.ts.tzinfo is not None
    assert (await call(handler, "get", {"namespace": "settings", "key": "k"}))["fields"] == {"title": "fixed"}
    with pytest.raises(PropsError):
        await handler.reconcile("ghost", "k", {})


def test_the_reply_budget_counts_headers_toward_the_max_payload() -> None:
    """A reply's header block (``rc``) and its ``error`` header count toward
    the broker's max payload, as the server counts them."""
    from service_engine.props.handler import encode_body, reply_limit

    assert reply_limit(1024) == 1024 - len(b"NATS/1.0\r\nrc: 10\r\n\r\n")
    ok = Reply(0, {"a": "é"})
    assert ok.wire_size == len(encode_body({"a": "é"})) == len(b'{"a":"\\u00e9"}')
    refused = Reply.of_error(PropsError("not_found", "nö"))
    assert refused.wire_size == len(encode_body(refused.body)) + len("error: nö\r\n".encode())


async def test_every_commit_records_the_peer_and_cause(handler: PropsHandler) -> None:
    """Every set and delete event records the calling peer as actor and the request's cause."""
    await call(handler, "set", {"namespace": "settings", "key": "k", "cause": "c-1"}, b'{"title": "t"}')
    await call(handler, "delete", {"namespace": "settings", "key": "k", "cause": "c-2"})
    events = await handler.store.events("settings", 0, 2)
    assert [(e.actor, e.cause) for e in events] == [("A/alice", "c-1"), ("A/alice", "c-2")]


async def test_delete_and_get_refusals_name_what_they_refuse(handler: PropsHandler) -> None:
    """Refusals of delete and get name the versions, namespace and key they refuse."""
    await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"title": "t"}')
    with pytest.raises(PropsError) as stale:
        await call(handler, "delete", {"namespace": "settings", "key": "k", "if_version": "7"})
    assert stale.value.extra == {"expected_version": 7, "current_version": 1}
    with pytest.raises(PropsError) as singleton:
        await call(handler, "delete", {"namespace": "prefs"})
    assert singleton.value.message == "delete is for collections; 'prefs' is a singleton"
    with pytest.raises(PropsError) as keyed:
        await call(handler, "delete", {"namespace": "settings"})
    assert keyed.value.message == "collection 'settings' requires a non-empty key"
    with pytest.raises(PropsError) as missing:
        await call(handler, "get", {"namespace": "settings", "key": "nope"})
    assert missing.value.message == "no record 'nope' in 'settings'"
    with pytest.raises(PropsError) as denied:
        await call(handler, "describe", {"namespace": "locked"})
    assert denied.value.message == "public describe of demo.locked is denied"


async def test_list_shows_secrets_to_the_secrets_capability(handler: PropsHandler) -> None:
    """A list shows secret fields in clear to a peer with the secrets capability."""
    await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"api_key": "s3cr3t"}')
    listed = await call(handler, "list", {"namespace": "settings"}, peer=PeerIdentity("P", "secrets"))
    assert listed["records"][0]["fields"] == {"api_key": "s3cr3t"}


async def test_command_is_live_by_default_and_bounded_by_its_limit(handler: PropsHandler) -> None:
    """A watch command is live unless asked otherwise, and a replay over the reply limit is
    replay_window_exceeded with its grant revoked."""
    granter = handler.granter
    assert isinstance(granter, FakeGranter)
    cmd = parse_command(SVC, "demo.props.watch", {"namespace": "settings"}, b"")
    assert (await handler.command(cmd, ALICE))["live"] is True and len(granter.calls) == 1
    await call(handler, "set", {"namespace": "settings", "key": "k"}, b'{"title": "t"}')
    with pytest.raises(PropsError) as refused:
        await handler.command(cmd, ALICE, limit=150)
    assert refused.value.error_code == "replay_window_exceeded" and granter.revoked == ["sub_1"]


async def test_failures_answer_fixed_messages_and_log_the_detail(caplog: pytest.LogCaptureFixture) -> None:
    """Storage failures and defects answer fixed messages; their detail (path, verb) goes to the log
    only."""
    broken = PropsHandler(SVC, BrokenStore(), StaticPolicy({"A/alice": all_caps("demo.settings")}))
    await broken.register(SETTINGS)
    stored = await broken.handle("demo.props.get", {"namespace": "settings", "key": "k"}, b"", ALICE)
    assert stored.body["message"] == "the property store failed"
    defective = PropsHandler(SVC, DefectiveStore(), StaticPolicy({"A/alice": all_caps("demo.settings")}))
    await defective.register(SETTINGS)
    defect = await defective.handle("demo.props.list", {"namespace": "settings"}, b"", ALICE)
    assert defect.body["message"] == "the property service failed"
    logged = [r.getMessage() for r in caplog.records]
    assert "props storage failed: disk I/O error at /var/lib/secret/path" in logged
    assert "props demo.props.list failed" in logged


def test_replay_window_refusals() -> None:
    """replay_window answers nothing when caught up and refuses a cursor before the retained events,
    naming the oldest retained nseq."""
    from service_engine.props import History
    from service_engine.props.handler import replay_window

    assert replay_window(5, History(5, 1, ())) == ()
    with pytest.raises(PropsError) as none_left:
        replay_window(2, History(5, None, ()))
    assert none_left.value.body() == {
        "error_code": "replay_window_exceeded", "message": "events after nseq 2 are no longer retained",
        "since_nseq": 2, "oldest_nseq": 6,
    }
    with pytest.raises(PropsError) as pruned:
        replay_window(2, History(5, 4, ()))
    assert pruned.value.extra == {"since_nseq": 2, "oldest_nseq": 4}


def test_encoding_is_compact_json() -> None:
    """Reply bodies are encoded as compact JSON (no spaces)."""
    from service_engine.props.handler import encode_body

    assert encode_body({"a": [1, 2], "b": {"c": None}}) == b'{"a":[1,2],"b":{"c":null}}'


async def test_a_set_merges_by_default_in_plain_and_saga_writes() -> None:
    """A set without merge merges into the stored fields in plain and saga namespaces alike."""
    async def ok(key: str, fields: Mapping[str, Any]) -> SagaOutcome:
        return SagaOutcome("active")

    two = (FieldSpec("a", "string"), FieldSpec("b", "string"))
    h = PropsHandler(SVC, MemoryStore(), StaticPolicy({"A/alice": all_caps("demo.plain") | all_caps("demo.sagas")}))
    await h.register(Namespace("plain", two))
    await h.register(Namespace("sagas", two, saga=ok))
    for ns in ("plain", "sagas"):
        await call(h, "set", {"namespace": ns, "key": "k"}, b'{"a": "1", "b": "2"}')
        await call(h, "set", {"namespace": ns, "key": "k"}, b'{"a": "3"}')
        assert (await call(h, "get", {"namespace": ns, "key": "k"}))["fields"] == {"a": "3", "b": "2"}, ns


class DeletedUnderTheSaga(MemoryStore):
    """A delete lands between the provisioning commit and the saga's read."""

    async def get(self, namespace: str, key: str) -> Any:
        if namespace == "machines" and (await super().get(namespace, key)).record is not None:
            await self.delete(SAGA, key, if_version=None, actor=Actor("B/bob", now()))
        return await super().get(namespace, key)


async def test_a_record_deleted_under_its_saga_completes_as_a_conflict() -> None:
    """A record deleted while its saga step runs answers conflict rc 10."""
    h = PropsHandler(SVC, DeletedUnderTheSaga(), StaticPolicy({"A/alice": all_caps("demo.machines")}))
    await h.register(SAGA)
    reply = await h.handle("demo.props.set", {"namespace": "machines", "key": "m"}, b'{"size": "s"}', ALICE)
    assert (reply.rc, reply.body["error_code"]) == (10, "conflict")
