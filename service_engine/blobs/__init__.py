"""Blobs over S3-compatible object storage: a kind declares what may be
uploaded (`BlobKind`, `BlobPolicy`), a write asks for an upload URL
(`UploadUrl`) and a read signs a download (`DownloadUrl`); the store is
configured with `BlobStoreConfig` (``Engine.use_blob_store``).

`model` declares kinds and references, `staging` writes what a transaction
stages, `s3` talks to the object store; `runtime` and `reaper` are the
engine's own.
"""

from __future__ import annotations

from .model import BlobBucketMissing, BlobError, BlobKind, BlobPolicy, DownloadUrl, UploadUrl
from .s3 import BlobStoreConfig

__all__ = [
    "BlobBucketMissing",
    "BlobError",
    "BlobKind",
    "BlobPolicy",
    "BlobStoreConfig",
    "DownloadUrl",
    "UploadUrl",
]
