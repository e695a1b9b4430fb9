"""AWS Signature Version 4, the parts the engine's blob store needs. Pure.

Three gestures over one signing-key derivation (``AWS4`` + secret, then
date, region, service, ``aws4_request``):

* `presign_url` — a query-string-authenticated URL (a presigned GET), as
  in the S3 "Authenticating Requests: Using Query Parameters" reference;
* `sign_headers` — the ``Authorization`` header of a request the engine
  sends itself (HEAD bucket, HEAD / DELETE object);
* `post_policy` — a browser-based upload: the base64 policy document and
  the form fields a presigned POST carries, signed as the policy text.

No clock, no I/O: every function takes the instant it signs for. The AWS
documented test vectors pin each one (``tests/test_sigv4.py``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

__all__ = [
    "ALGORITHM",
    "EMPTY_SHA256",
    "UNSIGNED_PAYLOAD",
    "Credentials",
    "PostForm",
    "canonical_query",
    "canonical_uri",
    "post_policy",
    "presign_url",
    "sign_headers",
    "sign_policy",
    "signature",
    "signing_key",
]

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_PRESIGN_EXPIRY = timedelta(days=7)
"""The longest X-Amz-Expires SigV4 admits (604800 s)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key pair and the region and service it signs for."""

    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    service: str = "s3"

    def scope(self, date: str) -> str:
        """``{date}/{region}/{service}/aws4_request``."""
        return f"{date}/{self.region}/{self.service}/aws4_request"

    def credential(self, date: str) -> str:
        return f"{self.access_key}/{self.scope(date)}"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def _stamps(at: datetime) -> tuple[str, str]:
    if at.tzinfo is None:
        raise ValueError("sign with an aware datetime (UTC)")
    utc = at.astimezone(UTC)
    return utc.strftime("%Y%m%dT%H%M%SZ"), utc.strftime("%Y%m%d")


def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    """The derived SigV4 signing key for ``date`` (``YYYYMMDD``)."""
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, "aws4_request")


def signature(credentials: Credentials, date: str, string_to_sign: str) -> str:
    """The hex HMAC-SHA256 of ``string_to_sign`` under the day's signing key."""
    key = signing_key(credentials.secret_key, date, credentials.region, credentials.service)
    return hmac.new(key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()


def _encode(text: str, *, encode_slash: bool) -> str:
    return quote(text, safe="-_.~" if encode_slash else "-_.~/")


def canonical_uri(path: str) -> str:
    """The URI-encoded path (S3 encodes each segment once; ``/`` kept)."""
    return _encode(path if path.startswith("/") else "/" + path, encode_slash=False)


def canonical_query(params: Mapping[str, str]) -> str:
    """Sorted ``name=value`` pairs, both URI-encoded (``/`` encoded too)."""
    pairs = sorted(
        (_encode(k, encode_slash=True), _encode(v, encode_slash=True)) for k, v in params.items()
    )
    return "&".join(f"{k}={v}" for k, v in pairs)


def _canonical_headers(headers: Mapping[str, str]) -> tuple[str, str]:
    lowered = sorted(
        (name.strip().lower(), " ".join(value.split())) for name, value in headers.items()
    )
    text = "".join(f"{name}:{value}\n" for name, value in lowered)
    return text, ";".join(name for name, _ in lowered)


def _string_to_sign(stamp: str, scope: str, canonical_request: str) -> str:
    digest = hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()
    return f"{ALGORITHM}\n{stamp}\n{scope}\n{digest}"


def presign_url(
    credentials: Credentials,
    *,
    method: str,
    scheme: str,
    host: str,
    path: str,
    at: datetime,
    expires: timedelta,
    params: Mapping[str, str] | None = None,
) -> str:
    """A presigned URL for ``method`` on ``path`` at ``host``, valid for
    ``expires`` from ``at`` (1 s .. 7 days); only ``host`` is signed and the
    payload is ``UNSIGNED-PAYLOAD``."""
    seconds = int(expires.total_seconds())
    if not 1 <= seconds <= int(MAX_PRESIGN_EXPIRY.total_seconds()):
        raise ValueError(f"a presigned URL expires within 1 s .. 7 days, got {expires}")
    stamp, date = _stamps(at)
    query = dict(params or {})
    query.update({
        "X-Amz-Algorithm": ALGORITHM,
        "X-Amz-Credential": credentials.credential(date),
        "X-Amz-Date": stamp,
        "X-Amz-Expires": str(seconds),
        "X-Amz-SignedHeaders": "host",
    })
    uri = canonical_uri(path)
    canonical = "\n".join([
        method.upper(), uri, canonical_query(query), f"host:{host}\n", "host", UNSIGNED_PAYLOAD,
    ])
    signed = signature(
        credentials, date, _string_to_sign(stamp, credentials.scope(date), canonical)
    )
    return f"{scheme}://{host}{uri}?{canonical_query(query)}&X-Amz-Signature={signed}"


def sign_headers(
    credentials: Credentials,
    *,
    method: str,
    host: str,
    path: str,
    at: datetime,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
    payload_sha256: str = EMPTY_SHA256,
) -> dict[str, str]:
    """The headers of a header-signed request: ``host``, ``x-amz-date``,
    ``x-amz-content-sha256``, the given ``headers`` and ``Authorization``."""
    stamp, date = _stamps(at)
    signed_headers = {"host": host, "x-amz-date": stamp, "x-amz-content-sha256": payload_sha256}
    signed_headers.update({name.lower(): value for name, value in (headers or {}).items()})
    text, names = _canonical_headers(signed_headers)
    canonical = "\n".join([
        method.upper(), canonical_uri(path), canonical_query(params or {}), text, names,
        payload_sha256,
    ])
    signed = signature(
        credentials, date, _string_to_sign(stamp, credentials.scope(date), canonical)
    )
    authorization = (
        f"{ALGORITHM} Credential={credentials.credential(date)},"
        f"SignedHeaders={names},Signature={signed}"
    )
    return {**signed_headers, "Authorization": authorization}


@dataclass(frozen=True, slots=True)
class PostForm:
    """A presigned POST: the form fields to send before the file, in order."""

    fields: dict[str, str]
    policy: str
    """The base64 policy document (also ``fields["policy"]``)."""


def post_policy(
    credentials: Credentials,
    *,
    bucket: str,
    key: str,
    at: datetime,
    expires: timedelta,
    max_bytes: int,
    content_type: str | None = None,
    extra_conditions: Sequence[object] = (),
) -> PostForm:
    """The signed form of a browser upload of exactly ``key`` to ``bucket``,
    valid for ``expires`` from ``at``, whose policy carries
    ``content-length-range [0, max_bytes]`` (the store refuses a larger
    object) and, when given, an exact ``Content-Type``."""
    if max_bytes < 0:
        raise ValueError("max_bytes is >= 0")
    stamp, date = _stamps(at)
    expiration = (at.astimezone(UTC) + expires).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    fields = {
        "key": key,
        "x-amz-algorithm": ALGORITHM,
        "x-amz-credential": credentials.credential(date),
        "x-amz-date": stamp,
    }
    if content_type is not None:
        fields["Content-Type"] = content_type
    conditions: list[object] = [{"bucket": bucket}, *({k: v} for k, v in fields.items())]
    conditions.append(["content-length-range", 0, max_bytes])
    conditions.extend(extra_conditions)
    document = json.dumps(
        {"expiration": expiration, "conditions": conditions}, separators=(",", ":")
    )
    policy = base64.b64encode(document.encode("utf-8")).decode("ascii")
    fields["policy"] = policy
    fields["x-amz-signature"] = sign_policy(credentials, date, policy)
    return PostForm(fields=fields, policy=policy)


def sign_policy(credentials: Credentials, date: str, policy: str) -> str:
    """The POST signature: the base64 policy itself is the string to sign."""
    return signature(credentials, date, policy)
