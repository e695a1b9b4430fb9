"""Blob values (pure): the policy's bounds, the release diff, references,
and the presigned capabilities refusing every way out of the caller's hands."""

from __future__ import annotations

import copy
import json
import pickle
from datetime import timedelta
from typing import Any

import pydantic
import pytest

from service_engine.blobs.model import (
    BlobKind,
    BlobPolicy,
    BlobStoreUnbound,
    DownloadUrl,
    InvalidBlobReference,
    UploadUrl,
    parse_reference,
)
from service_engine.blobs.s3 import BlobStoreConfig
from service_engine.blobs.staging import blob_refs_of, released_refs
from service_engine.errors import ConfigError, DeclarationError
from service_engine.impacts import Impact
from service_engine.persistence import DomainEvent

REF = "6f1c2d9e-8a4b-4c3d-9e2f-1a2b3c4d5e6f"


def test_policy_bounds() -> None:
    """max_bytes, content types and orphan_after are checked at declaration."""
    for bad in (
        {"max_bytes": 0}, {"max_bytes": True}, {"max_bytes": 10, "content_types": "text/plain"},
        {"max_bytes": 10, "content_types": ("plain",)},
        {"max_bytes": 10, "orphan_after": timedelta(0)},
    ):
        with pytest.raises(ConfigError):
            BlobPolicy(**bad)
    policy = BlobPolicy(10, ("image/png", "image/jpeg"))
    assert policy.content_type("image/png") == "image/png"
    with pytest.raises(ConfigError):
        policy.content_type("text/html")
    with pytest.raises(ConfigError):
        policy.content_type(None)
    assert BlobPolicy(10, ("image/png",)).content_type(None) == "image/png"
    assert BlobPolicy(10).content_type(None) is None


def test_kind_names_and_unbound_store() -> None:
    """A kind is lower_snake_case; presigning before run is BlobStoreUnbound."""
    with pytest.raises(ConfigError):
        BlobKind("Bad-Name", BlobPolicy(1))
    with pytest.raises(BlobStoreUnbound):
        _ = BlobKind("attachment", BlobPolicy(1)).store


def test_release_diff() -> None:
    """Dropped and repointed references are released; kept ones are not."""
    assert released_refs({"a", "b"}, {"b", "c"}) == {"a"}
    assert released_refs((), {"a"}) == frozenset()


def test_blob_refs_of_normalises_and_refuses_a_str() -> None:
    """References are normalised to uuid text; a bare str is a declaration error."""

    class Holder:
        def __init__(self, refs: object) -> None:
            self.refs = refs

        def blob_refs(self) -> object:
            return self.refs

    assert blob_refs_of(Holder([REF.upper(), None])) == {REF}
    assert blob_refs_of(object()) == frozenset()
    with pytest.raises(DeclarationError):
        blob_refs_of(Holder(REF))
    with pytest.raises(InvalidBlobReference):
        parse_reference("not-a-uuid")


@pytest.mark.parametrize("capability", [
    UploadUrl(REF, "http://s3/b", {"policy": "p"}, 10, timedelta(minutes=1)),
    DownloadUrl(REF, "http://s3/b/k?X-Amz-Signature=s", timedelta(minutes=1)),
])
def test_capabilities_cannot_travel(capability: object) -> None:
    """Neither URL is JSON, picklable, copyable, a pydantic field, an impact
    key or event data; repr hides the signed parts."""
    with pytest.raises(TypeError):
        json.dumps(capability)
    with pytest.raises(TypeError):
        pickle.dumps(capability)
    with pytest.raises(TypeError):
        copy.deepcopy(capability)
    with pytest.raises(TypeError):
        pydantic.create_model("M", url=(type(capability), ...))
    with pytest.raises((TypeError, ValueError, ConfigError, DeclarationError)):
        Impact.entity("doc", capability)  # type: ignore[arg-type]
    with pytest.raises((TypeError, DeclarationError)):
        DomainEvent("attached", {"url": capability})  # type: ignore[dict-item]
    assert "Signature" not in repr(capability) and "policy" not in repr(capability)


def test_store_config_bounds() -> None:
    """The endpoint, bucket, keys and expiries are checked; no endpoint in the
    environment means no store."""
    ok: dict[str, Any] = {"endpoint": "http://127.0.0.1:9000", "bucket": "b", "access_key": "a", "secret_key": "s"}
    BlobStoreConfig(**ok)
    for bad in ({"endpoint": "s3://x"}, {"bucket": "a/b"}, {"secret_key": ""},
                {"upload_expiry": timedelta(days=8)}):
        with pytest.raises(ConfigError):
            BlobStoreConfig(**{**ok, **bad})
    assert BlobStoreConfig.from_env({}) is None
    env = {"SERVICE_ENGINE_S3_ENDPOINT": "http://h:1", "SERVICE_ENGINE_S3_BUCKET": "b",
           "SERVICE_ENGINE_S3_ACCESS_KEY": "a", "SERVICE_ENGINE_S3_SECRET_KEY": "s"}
    config = BlobStoreConfig.from_env(env)
    assert config is not None and config.bucket == "b" and "secret_key" not in repr(config)
