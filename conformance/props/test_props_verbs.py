"""The props verbs over a real nats-server with accounts: attested actors,
every verb's reply shape and refusal on the wire (rc header, error header,
``{error_code, message}`` body), the capability and redaction matrix, the
SQLite store on disk."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from conformance.support.props_support import SERVICE, PropsStack, props_stack
from service_engine.props import (
    FieldSpec,
    Namespace,
    PropsError,
    StaticPolicy,
    Validator,
    all_caps,
    read_cap,
)

SETTINGS = Namespace(
    "settings",
    (
        FieldSpec("title", "string", default="untitled"),
        FieldSpec("api_key", "string", secret=True, validators=(Validator("vault_v2", lambda v: None, secret=True),)),
    ),
)
PREFS = Namespace("prefs", (FieldSpec("theme", "string"),), cardinality="singleton")
POLICY = StaticPolicy({
    "A/alice": all_caps("demo.settings") | all_caps("demo.prefs"),
    "B/bob": {read_cap("demo.settings")},
})


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[PropsStack]:
    async with props_stack(tmp_path, [SETTINGS, PREFS], POLICY) as s:
        yield s


async def raw(stack: PropsStack, user: str, verb: str, headers: dict[str, str], body: bytes = b"") -> tuple[dict[str, str], dict[str, Any]]:
    msg = await stack.clients[user].request(f"{SERVICE}.props.{verb}", body, timeout=5, headers=headers)
    return dict(msg.headers or {}), json.loads(msg.data)


async def test_actor_is_the_attested_peer_not_a_caller_header(stack: PropsStack) -> None:
    """The actor recorded for a commit is the account/user the server attests
    in Nats-Request-Info; a forged header (and an ``actor`` header) is ignored."""
    forged = {"namespace": "settings", "key": "k", "actor": "root", "Nats-Request-Info": '{"acc":"SVC","user":"root"}'}
    headers, body = await raw(stack, "alice", "set", forged, b'{"title": "t"}')
    assert headers["rc"] == "0" and body["version"] == 1
    (event,) = await stack.store.events("settings", 0, 1)
    assert event.actor == "A/alice"


async def test_service_account_users_cannot_call_the_verbs(stack: PropsStack) -> None:
    """Within the service's own account nothing attests a requester, so its
    users are denied publishing to the verb subjects at all."""
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await stack.clients["svc"].request("demo.props.get", b"", timeout=0.5, headers={"namespace": "settings", "key": "k"})


async def test_every_verb_reply_shape_on_the_wire(stack: PropsStack) -> None:
    """set, get, list, describe and delete answer rc 0 with exactly their
    documented fields; replies use the canonical singleton key."""
    alice = stack.caller("alice")
    assert await alice.set("settings", {"title": "t", "api_key": "s"}, key="k", cause="c-1") == {
        "namespace": "settings", "key": "k", "version": 1, "nseq": 1, "created": True,
    }
    assert await alice.set("prefs", {"theme": "dark"}) == {
        "namespace": "prefs", "key": "current", "version": 1, "nseq": 1, "created": True,
    }
    assert await alice.get("settings", key="k") == {
        "namespace": "settings", "key": "k", "version": 1, "nseq": 1, "fields": {"title": "t", "api_key": "s"},
    }
    listed = await alice.request("list", "settings")
    assert listed == {"namespace": "settings", "nseq": 1, "records": [{"key": "k", "version": 1, "fields": {"title": "t", "api_key": "s"}}], "next_cursor": None}
    described = await alice.request("describe", "settings")
    assert set(described) == {"namespace", "schema_version", "cardinality", "fields"}
    assert [f["name"] for f in described["fields"]] == ["title"]
    full = await alice.request("describe", "settings", view="full")
    assert full["fields"][1]["validators"] == ["vault_v2"]
    assert await alice.request("delete", "settings", key="k", if_version="1") == {
        "namespace": "settings", "key": "k", "deleted": True, "tombstone_version": 2, "nseq": 2,
    }


async def test_refusals_carry_rc_error_header_and_body(stack: PropsStack) -> None:
    """Each refusal answers rc 10 with {error_code, message} and the human
    message in the error header; prefixes are exactly the contract's."""
    cases: list[tuple[str, dict[str, str], bytes, str, str | None]] = [
        ("set", {"namespace": "settings", "key": "k", "path": "a.b"}, b"{}", "validation_error", "flat_path_mutation_deferred"),
        ("get", {"namespace": "settings", "key": "k", "path": "a"}, b"", "validation_error", "mixed addressing"),
        ("get", {"namespace": "settings", "key": "k", "field_path": ""}, b"", "validation_error", "field_path_deferred"),
        ("delete", {"namespace": "settings", "key": "k", "field_path": "x"}, b"", "validation_error", "field_path_deferred"),
        ("get", {"namespace": "settings", "key": "k"}, b'{"fields": []}', "validation_error", "get_projection_deferred"),
        ("list", {"namespace": "settings", "limit": "5"}, b"", "validation_error", "list_option_deferred"),
        ("list", {"namespace": "settings"}, b"{}", "validation_error", "list_option_deferred"),
        ("set", {"namespace": "settings", "key": "k"}, b'{"_lifecycle": "active"}', "validation_error", None),
        ("set", {"namespace": "settings"}, b'{"title": "t"}', "validation_error", None),
        ("get", {"namespace": "settings", "key": "nope"}, b"", "not_found", None),
        ("get", {"namespace": "ghost", "key": "k"}, b"", "auth_denied", None),
        ("delete", {"namespace": "prefs"}, b"", "validation_error", None),
    ]
    for verb, headers, body, code, prefix in cases:
        reply_headers, reply = await raw(stack, "alice", verb, headers, body)
        assert reply_headers["rc"] == "10", (verb, headers)
        assert set(reply) == {"error_code", "message"} and reply["error_code"] == code, (verb, headers, reply)
        assert reply_headers["error"] == reply["message"]
        if prefix is not None:
            assert reply["message"].startswith(prefix), reply


async def test_version_mismatch_on_the_wire(stack: PropsStack) -> None:
    """A failed fence adds expected_version and current_version."""
    alice = stack.caller("alice")
    await alice.set("settings", {"title": "t"}, key="k", if_version="0")
    headers, body = await raw(stack, "alice", "set", {"namespace": "settings", "key": "k", "if_version": "0"}, b'{"title": "u"}')
    assert headers["rc"] == "10"
    assert body == {"error_code": "version_mismatch", "message": body["message"], "expected_version": 0, "current_version": 1}


async def test_capability_and_redaction_over_the_wire(stack: PropsStack) -> None:
    """bob (read only) gets secrets nulled and is denied writes, describe and
    audit; alice, with the secrets capability, sees them."""
    await stack.caller("alice").set("settings", {"title": "t", "api_key": "s3cr3t"}, key="k")
    bob = stack.caller("bob")
    assert (await bob.get("settings", key="k"))["fields"] == {"title": "t", "api_key": None}
    assert (await bob.request("list", "settings"))["records"][0]["fields"]["api_key"] is None
    for verb, headers, body in (
        ("set", {"key": "k"}, {"title": "x"}), ("delete", {"key": "k"}, None),
        ("describe", {}, None), ("audit.watch", {}, None), ("get", {"key": "x"}, None),
    ):
        namespace = "prefs" if verb == "get" else "settings"
        with pytest.raises(PropsError) as caught:
            await bob.request(verb, namespace, body=body, **headers)
        assert caught.value.error_code == "auth_denied", verb


async def test_requests_are_answered_concurrently(stack: PropsStack) -> None:
    """Commits from many concurrent requests each get their own nseq."""
    alice = stack.caller("alice")
    replies = await asyncio.gather(*(alice.set("settings", {"title": str(n)}, key=f"k{n}") for n in range(20)))
    assert sorted(r["nseq"] for r in replies) == list(range(1, 21))
