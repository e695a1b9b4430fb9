"""The scope manifest and the handshake wire (pure)."""

from __future__ import annotations

import json
import uuid

import pytest

from service_engine.scopes.handshake_wire import (
    REQUEST_SCHEMA,
    ScopeReply,
    ScopeRequest,
    ScopeWireError,
    declare_subject,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from service_engine.scopes.identity import known_scopes
from service_engine.scopes.manifest import (
    EmptyScopeManifest,
    MalformedScopeKey,
    ScopeDeclaration,
    ScopeManifest,
    ScopeManifestSpansServices,
)


def test_assembled_union_is_sorted_and_deduplicated() -> None:
    """Contributions from several slices form one sorted manifest."""
    manifest = ScopeManifest.assemble([
        ["board:archive"], ("example.card:advance", "board:archive"),
    ])
    declaration = manifest.declaration("example")
    assert declaration.service == "example"
    assert declaration.scopes == ("board:archive", "card:advance")
    assert len(declaration.digest) == 64


@pytest.mark.parametrize("keys", [
    ["board"], ["Board:archive"], ["board::archive"], ["board:archive "], ["example.board"],
    ["board-x:archive"], [3], ["board:" + "a" * 200], ["a.b.board:archive"],
])
def test_malformed_keys_are_boot_errors(keys: list[object]) -> None:
    """A key not of the shape service.segment.segment is refused."""
    with pytest.raises(MalformedScopeKey):
        ScopeManifest.of(keys).declaration("example")  # type: ignore[arg-type]


def test_two_services_empty_and_foreign_manifests_are_boot_errors() -> None:
    """A manifest spanning two services, naming another service than the
    pod's, or empty, is refused; a bare str is not a manifest."""
    with pytest.raises(ScopeManifestSpansServices):
        ScopeManifest.of(["a.x:y", "b.x:y"]).declaration()
    with pytest.raises(ScopeManifestSpansServices):
        ScopeManifest.of(["twin.x:y"]).declaration("example")
    with pytest.raises(ScopeManifestSpansServices):
        ScopeManifest.of(["x:y"]).declaration()
    assert ScopeManifest.of(["twin.x:y"]).declaration().service == "twin"
    with pytest.raises(EmptyScopeManifest):
        ScopeManifest.of([]).declaration("example")
    with pytest.raises(MalformedScopeKey):
        ScopeManifest.of("example.board.archive")


def _request() -> ScopeRequest:
    rid = uuid.uuid4()
    return ScopeRequest(
        rid, ScopeDeclaration("example", ("board:archive",)), "pod-1", uuid.uuid4(), rid
    )


def test_request_round_trips_in_the_envelope_shape() -> None:
    """The request is the integration envelope shape under a versioned schema."""
    request = _request()
    data = encode_request(request)
    document = json.loads(data)
    assert document["schema"] == REQUEST_SCHEMA and document["type"] == "scope.declared"
    assert document["metadata"]["actor"]["kind"] == "service"
    assert decode_request(data) == request
    assert declare_subject("example") == "identity.scope.declare.v1.example"
    tampered = json.loads(data)
    tampered["payload"]["scopes"].append("card:advance")
    with pytest.raises(ScopeWireError):
        decode_request(json.dumps(tampered).encode())


def test_reply_must_answer_this_declaration() -> None:
    """A reply of another correlation, digest, schema or status is refused."""
    request = _request()
    good = ScopeReply(request.envelope_id, request.declaration.digest, "rejected", "unknown")
    assert decode_reply(encode_reply(good), request) == good
    for bad in (
        ScopeReply(uuid.uuid4(), request.declaration.digest, "confirmed"),
        ScopeReply(request.envelope_id, "0" * 64, "confirmed"),
    ):
        with pytest.raises(ScopeWireError):
            decode_reply(encode_reply(bad), request)
    with pytest.raises(ScopeWireError):
        decode_reply(b'{"schema": "other/1"}', request)
    with pytest.raises(ScopeWireError):
        decode_reply(encode_reply(good).replace(b"rejected", b"maybe"), request)


def test_known_scopes_decision() -> None:
    """Identity's usual decision names the unknown keys."""
    decide = known_scopes({"board:archive"})
    assert decide(ScopeDeclaration("example", ("board:archive",))) is None
    assert "board:archiv" in (decide(ScopeDeclaration("example", ("board:archiv",))) or "")
