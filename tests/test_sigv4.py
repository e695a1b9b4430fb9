"""The SigV4 signer against the AWS documented test vectors (pure, no I/O).

The vectors are AWS's own published examples: the signing-key derivation
("Examples of how to derive a signing key for Signature Version 4"), the S3
header-signed GET Object with a Range, the S3 presigned URL for GET
``/test.txt`` and the S3 browser-based POST upload example.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from service_engine.blobs.sigv4 import (
    Credentials,
    canonical_query,
    canonical_uri,
    post_policy,
    presign_url,
    sign_headers,
    sign_policy,
    signing_key,
)

EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
AT = datetime(2013, 5, 24, tzinfo=UTC)


def test_signing_key_derivation_vector() -> None:
    """The documented derived key of the IAM example (20120215, us-east-1, iam)."""
    key = signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1", "iam")
    assert key.hex() == "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"


def test_header_signed_get_object_vector() -> None:
    """GET /test.txt with Range: bytes=0-9 signs to the documented signature."""
    headers = sign_headers(
        EXAMPLE, method="GET", host="examplebucket.s3.amazonaws.com", path="/test.txt",
        at=AT, headers={"Range": "bytes=0-9"},
    )
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


def test_presigned_get_vector() -> None:
    """The documented presigned URL of GET /test.txt, 86400 s."""
    url = presign_url(
        EXAMPLE, method="GET", scheme="https", host="examplebucket.s3.amazonaws.com",
        path="/test.txt", at=AT, expires=timedelta(seconds=86400),
    )
    assert url.endswith(
        "X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    )
    assert "X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request" in url


def test_post_policy_signature_vector() -> None:
    """The browser-based upload example: its base64 policy signs to the documented value."""
    policy = (
        "eyAiZXhwaXJhdGlvbiI6ICIyMDEzLTA4LTA3VDEyOjAwOjAwLjAwMFoiLA0KI"
        "CAiY29uZGl0aW9ucyI6IFsNCiAgICB7ImJ1Y2tldCI6ICJleGFtcGxlYnVja2V0In0sD"
        "QogICAgWyJzdGFydHMtd2l0aCIsICIka2V5IiwgInVzZXIvdXNlcjEvIl0sDQogICAge"
        "yJhY2wiOiAicHVibGljLXJlYWQifSwNCiAgICB7InN1Y2Nlc3NfYWN0aW9uX3JlZGlyZ"
        "WN0IjogImh0dHA6Ly9leGFtcGxlYnVja2V0LnMzLmFtYXpvbmF3cy5jb20vc3VjY2Vzc"
        "2Z1bF91cGxvYWQuaHRtbCJ9LA0KICAgIFsic3RhcnRzLXdpdGgiLCAiJENvbnRlbnQtV"
        "HlwZSIsICJpbWFnZS8iXSwNCiAgICB7IngtYW16LW1ldGEtdXVpZCI6ICIxNDM2NTEyM"
        "zY1MTI3NCJ9LA0KICAgIFsic3RhcnRzLXdpdGgiLCAiJHgtYW16LW1ldGEtdGFnIiwgI"
        "iJdLA0KDQogICAgeyJ4LWFtei1jcmVkZW50aWFsIjogIkFLSUFJT1NGT0ROTjdFWEFNU"
        "ExFLzIwMTMwODA2L3VzLWVhc3QtMS9zMy9hd3M0X3JlcXVlc3QifSwNCiAgICB7IngtY"
        "W16LWFsZ29yaXRobSI6ICJBV1M0LUhNQUMtU0hBMjU2In0sDQogICAgeyJ4LWFtei1kY"
        "XRlIjogIjIwMTMwODA2VDAwMDAwMFoiIH0NCiAgXQ0KfQ=="
    )
    assert sign_policy(EXAMPLE, "20130806", policy) == (
        "21496b44de44ccb73d545f1a995c68214c9cb0d41c45a17a5daeec0b1a6db047"
    )


def test_post_policy_carries_the_length_range_and_exact_key() -> None:
    """The policy pins bucket, key, credential, date, content type and [0, max_bytes]."""
    form = post_policy(
        EXAMPLE, bucket="b", key="attachment/x", at=AT, expires=timedelta(minutes=5),
        max_bytes=1024, content_type="image/png",
    )
    document = json.loads(base64.b64decode(form.policy))
    assert document["expiration"] == "2013-05-24T00:05:00.000Z"
    conditions = document["conditions"]
    assert {"bucket": "b"} in conditions and {"key": "attachment/x"} in conditions
    assert ["content-length-range", 0, 1024] in conditions
    assert {"Content-Type": "image/png"} in conditions
    assert form.fields["x-amz-signature"] == sign_policy(EXAMPLE, "20130524", form.policy)


def test_canonical_encoding() -> None:
    """Paths keep '/', query values encode it; unreserved characters stay."""
    assert canonical_uri("a b/c~d") == "/a%20b/c~d"
    assert canonical_query({"b": "x/y", "a": "1 2"}) == "a=1%202&b=x%2Fy"


def test_refuses_naive_time_and_bad_expiry() -> None:
    """A naive datetime and an expiry outside 1 s..7 days are refused."""
    with pytest.raises(ValueError):
        sign_headers(EXAMPLE, method="HEAD", host="h", path="/", at=datetime(2020, 1, 1))
    with pytest.raises(ValueError):
        presign_url(EXAMPLE, method="GET", scheme="http", host="h", path="/k", at=AT,
                    expires=timedelta(days=8))
