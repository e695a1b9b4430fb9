"""The engine's own bucket client: bind, presign, HEAD and DELETE. Thin I/O.

`BlobStoreConfig` names the S3-compatible endpoint, the one bucket of the
service, the region and the access key pair (from the environment:
``SERVICE_ENGINE_S3_ENDPOINT``, ``_S3_BUCKET``, ``_S3_REGION``,
``_S3_ACCESS_KEY``, ``_S3_SECRET_KEY``). `BlobStore.bind` checks the bucket
with a signed HEAD (absent or refused: `BlobBucketMissing`; never created).
Path-style addressing (``{endpoint}/{bucket}/{key}``), which every
S3-compatible store answers.

The HTTP client is httpx (async, connection-pooled, bounded timeouts); the
signing is `service_engine.blobs.sigv4`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import httpx

from ..failures import ConfigError
from .model import BlobBucketMissing, BlobError, DownloadUrl, UploadUrl
from .sigv4 import Credentials, post_policy, presign_url, sign_headers

__all__ = ["BlobStore", "BlobStoreConfig", "ObjectHead"]

ENV = "SERVICE_ENGINE_S3_"


@dataclass(frozen=True, slots=True)
class BlobStoreConfig:
    """Where the service's blobs live and how the engine signs for them."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    upload_expiry: timedelta = timedelta(minutes=15)
    download_expiry: timedelta = timedelta(minutes=5)
    timeout: timedelta = timedelta(seconds=5)

    def __post_init__(self) -> None:
        parts = urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise ConfigError(f"S3 endpoint is http(s)://host[:port], got {self.endpoint!r}")
        if not self.bucket or "/" in self.bucket:
            raise ConfigError(f"S3 bucket is a bucket name, got {self.bucket!r}")
        if not self.access_key or not self.secret_key:
            raise ConfigError("S3 access_key and secret_key are required")
        for name in ("upload_expiry", "download_expiry"):
            value = getattr(self, name)
            if not timedelta(seconds=1) <= value <= timedelta(days=7):
                raise ConfigError(f"S3 {name} is 1 s .. 7 days, got {value}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BlobStoreConfig | None:
        """The config the environment describes, or None when it names no
        endpoint (the service runs without blobs)."""
        env = os.environ if environ is None else environ
        endpoint = env.get(ENV + "ENDPOINT")
        if not endpoint:
            return None
        return cls(
            endpoint=endpoint, bucket=env.get(ENV + "BUCKET", ""),
            access_key=env.get(ENV + "ACCESS_KEY", ""), secret_key=env.get(ENV + "SECRET_KEY", ""),
            region=env.get(ENV + "REGION", "us-east-1"),
        )


@dataclass(frozen=True, slots=True)
class ObjectHead:
    """What a HEAD of an object found."""

    size: int
    content_type: str | None


def _now() -> datetime:
    return datetime.now(UTC)


class BlobStore:
    """The bound bucket of one service."""

    def __init__(self, config: BlobStoreConfig, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        parts = urlsplit(config.endpoint)
        self._scheme = parts.scheme
        self._host = parts.netloc
        self._credentials = Credentials(config.access_key, config.secret_key, config.region)
        self._client = client or httpx.AsyncClient(timeout=config.timeout.total_seconds())

    def _path(self, key: str = "") -> str:
        return f"/{self.config.bucket}/{key}" if key else f"/{self.config.bucket}"

    def _url(self, path: str) -> str:
        return f"{self._scheme}://{self._host}{path}"

    async def _signed(self, method: str, key: str = "") -> httpx.Response:
        path = self._path(key)
        headers = sign_headers(
            self._credentials, method=method, host=self._host, path=path, at=_now()
        )
        try:
            return await self._client.request(method, self._url(path), headers=headers)
        except httpx.HTTPError as exc:
            raise BlobError(f"S3 {method} {path}: {type(exc).__name__}: {exc}") from exc

    async def bind(self) -> None:
        """Check the bucket answers a signed HEAD; `BlobBucketMissing` else."""
        try:
            response = await self._signed("HEAD")
        except BlobError as exc:
            raise BlobBucketMissing(f"bucket {self.config.bucket!r} unreachable: {exc}") from exc
        if response.status_code != 200:
            raise BlobBucketMissing(
                f"bucket {self.config.bucket!r} at {self.config.endpoint} answered "
                f"{response.status_code} to HEAD (the engine binds its bucket, never creates it)"
            )

    def presign_post(
        self, reference: str, key: str, max_bytes: int, content_type: str | None
    ) -> UploadUrl:
        """The presigned POST of exactly ``key``, at most ``max_bytes``."""
        expiry = self.config.upload_expiry
        form = post_policy(
            self._credentials, bucket=self.config.bucket, key=key, at=_now(), expires=expiry,
            max_bytes=max_bytes, content_type=content_type,
        )
        return UploadUrl(reference, self._url(self._path()), form.fields, max_bytes, expiry)

    def presign_get(self, reference: str, key: str) -> DownloadUrl:
        """A presigned GET of ``key``."""
        expiry = self.config.download_expiry
        url = presign_url(
            self._credentials, method="GET", scheme=self._scheme, host=self._host,
            path=self._path(key), at=_now(), expires=expiry,
        )
        return DownloadUrl(reference, url, expiry)

    async def head(self, key: str) -> ObjectHead | None:
        """The object's size and type, or None when it is absent."""
        response = await self._signed("HEAD", key)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise BlobError(f"S3 HEAD {key}: {response.status_code}")
        return ObjectHead(
            int(response.headers.get("content-length", "0")), response.headers.get("content-type")
        )

    async def delete(self, key: str) -> None:
        """Delete ``key`` (an absent object is already deleted)."""
        response = await self._signed("DELETE", key)
        if response.status_code not in (200, 204, 404):
            raise BlobError(f"S3 DELETE {key}: {response.status_code}")

    async def aclose(self) -> None:
        await self._client.aclose()
