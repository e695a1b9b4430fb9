"""What a handler's context does for blobs: mint an upload whose row
commits with the transaction, release a reference (`BlobGestures`, a part of
every pipeline context)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..failures import DeclarationError
from ..persistence.base import Aggregate, Persistence, store_of
from .model import BlobKind, UploadUrl, object_key
from .staging import BlobStaging, NewBlob, blob_refs_of

__all__ = ["BlobGestures"]


class BlobGestures:
    """``cx.blob``, ``cx.blob_owned``, ``cx.release_blob``: staged with the
    transaction (`BlobStaging`)."""

    _blobs: BlobStaging

    if TYPE_CHECKING:

        def _identity(self, store: Persistence[Any, Any], key: object) -> tuple[str, str]: ...

    def blob(self, kind: BlobKind, *, content_type: str | None = None) -> UploadUrl:
        """Mint an upload of ``kind``: its ``service_engine.blob`` row commits
        with this transaction; answer the presigned POST (hand it to the
        caller; store only ``upload.reference``, listing it in the
        aggregate's ``blob_refs``). `ConfigError` for a content type the
        kind's policy does not admit; `BlobStoreUnbound` before ``run``."""
        return self._mint(kind, content_type, None, None)

    def blob_owned(
        self, kind: BlobKind, owner: Aggregate, *, content_type: str | None = None
    ) -> UploadUrl:
        """As `blob`, recording ``owner`` (the aggregate that will list the
        reference) on the row."""
        store = store_of(type(owner))
        _, key_text = self._identity(store, store.key_of(owner))
        return self._mint(kind, content_type, store.store_type, key_text)

    def release_blob(self, reference: str) -> None:
        """Release ``reference`` with this transaction (the reaper deletes its
        object past the kind's ``orphan_after``). A reference an aggregate
        dropped from ``blob_refs`` on save, or a deleted aggregate held, is
        released without this call."""
        self._blobs.release(blob_refs_of(_Refs(reference)))

    def _mint(
        self, kind: BlobKind, content_type: str | None,
        owner_store: str | None, owner_key: str | None,
    ) -> UploadUrl:
        if not isinstance(kind, BlobKind):
            raise DeclarationError(f"cx.blob takes a BlobKind (register_blobs), got {kind!r}")
        policy = kind.policy
        signed_type = policy.content_type(content_type)
        reference = uuid.uuid4()
        key = object_key(kind.name, str(reference))
        upload = kind.store.presign_post(str(reference), key, policy.max_bytes, signed_type)
        self._blobs.mint(NewBlob(
            reference, kind.name, key, signed_type, policy.max_bytes, policy.orphan_after,
            owner_store, owner_key,
        ))
        return upload


@dataclass(frozen=True, slots=True)
class _Refs:
    reference: str

    def blob_refs(self) -> tuple[str]:
        return (self.reference,)

