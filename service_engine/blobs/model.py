"""Blob declarations and the two presigned capabilities. Pure values.

A service registers a blob kind with `BlobPolicy` (``Engine.register_blobs``
returns a `BlobKind` handle); a handler stages an upload with
``cx.blob(kind)`` / ``cx.blob_owned(kind, owner)``, which writes a
``service_engine.blob`` row in the pipeline's transaction and answers an
`UploadUrl`: a SigV4 presigned POST whose policy carries
``content-length-range [0, max_bytes]``, so the store itself refuses an
oversize object. Only the opaque `UploadUrl.reference` (a uuid text) may
travel: into the aggregate (`Aggregate.blob_refs` lists it), a view, an
event.

`UploadUrl` and `DownloadUrl` are capabilities, like `OneShot`: they are
not JSON, not picklable or copyable, not a pydantic field, and their
``repr`` hides the signature, so neither can enter a view, impact, offer,
outbox row or chunk. A `DownloadUrl` is minted only by the gated
``Engine.download`` (the view's own visibility path, plus the loaded
aggregate still listing the reference).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn, Protocol, final

from ..failures import ConfigError, EngineError

__all__ = [
    "BlobBucketMissing",
    "BlobError",
    "BlobKind",
    "BlobPolicy",
    "BlobStoreUnbound",
    "DownloadUrl",
    "InvalidBlobReference",
    "UploadUrl",
    "object_key",
    "parse_reference",
]

_KIND = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
MAX_BLOB_BYTES = 5 * 1024**3
"""The largest object one presigned POST may carry (S3's single-PUT limit)."""


class BlobError(EngineError):
    """The base of the blob errors."""


class BlobBucketMissing(BlobError):
    """The configured bucket is absent or not reachable with the engine's
    credentials: the engine binds it, never creates it."""

    reason = "blob_bucket"


class BlobStoreUnbound(BlobError):
    """A blob gesture before the bucket was bound (a service registers its
    kinds, configures the store, and `Engine.run` binds it)."""


class InvalidBlobReference(BlobError):
    """A reference that is not one the engine minted (a uuid text)."""


@dataclass(frozen=True, slots=True)
class BlobPolicy:
    """A kind's upload rules.

    ``max_bytes`` bounds the object (the POST policy's
    ``content-length-range``); ``content_types`` lists the types an upload
    may declare (empty: any, undeclared); ``orphan_after`` is how long an
    upload may stay incomplete, and a released blob stay stored, before the
    beat's reaper removes it.
    """

    max_bytes: int
    content_types: tuple[str, ...] = ()
    orphan_after: timedelta = timedelta(hours=24)

    def __post_init__(self) -> None:
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or not (
            0 < self.max_bytes <= MAX_BLOB_BYTES
        ):
            raise ConfigError(
                f"BlobPolicy.max_bytes is 1..{MAX_BLOB_BYTES}, got {self.max_bytes!r}"
            )
        if isinstance(self.content_types, str) or not all(
            isinstance(t, str) and "/" in t for t in self.content_types
        ):
            raise ConfigError(
                f"BlobPolicy.content_types is a tuple of media types, got {self.content_types!r}"
            )
        if not isinstance(self.orphan_after, timedelta) or self.orphan_after <= timedelta(0):
            raise ConfigError(f"BlobPolicy.orphan_after is positive, got {self.orphan_after!r}")

    def content_type(self, requested: str | None) -> str | None:
        """The type an upload signs for: ``requested`` when the policy admits
        it; the only listed type when none was requested; `ConfigError` else."""
        if requested is None:
            if len(self.content_types) > 1:
                raise ConfigError(
                    f"this kind admits {list(self.content_types)}: name the upload's content_type"
                )
            return self.content_types[0] if self.content_types else None
        if self.content_types and requested not in self.content_types:
            raise ConfigError(
                f"content type {requested!r} is not one of {list(self.content_types)}"
            )
        return requested


class Presigner(Protocol):
    """What a kind needs of its bound store (`BlobStore` is one)."""

    def presign_post(
        self, reference: str, key: str, max_bytes: int, content_type: str | None
    ) -> UploadUrl: ...

    def presign_get(self, reference: str, key: str) -> DownloadUrl: ...


class BlobKind:
    """A registered blob kind (``Engine.register_blobs`` returns it): pass it
    to ``cx.blob`` / ``cx.blob_owned``. Its store is bound by `Engine.run`."""

    def __init__(self, name: str, policy: BlobPolicy) -> None:
        if not isinstance(name, str) or not _KIND.match(name):
            raise ConfigError(
                f"a blob kind is lower_snake_case (a-z, 0-9, _; at most 63), got {name!r}"
            )
        if not isinstance(policy, BlobPolicy):
            raise ConfigError(f"register_blobs takes a BlobPolicy, got {policy!r}")
        self.name = name
        self.policy = policy
        self._store: Presigner | None = None

    @property
    def store(self) -> Presigner:
        if self._store is None:
            raise BlobStoreUnbound(
                f"blob kind {self.name!r}: the bucket is not bound yet (Engine.run binds it)"
            )
        return self._store

    def _bind(self, store: Presigner) -> None:
        self._store = store

    def __repr__(self) -> str:
        return f"BlobKind({self.name!r})"


def object_key(kind: str, reference: str) -> str:
    """The object key of a blob: ``{kind}/{reference}``."""
    return f"{kind}/{reference}"


def parse_reference(reference: object) -> uuid.UUID:
    """``reference`` as the uuid it is; `InvalidBlobReference` otherwise."""
    if isinstance(reference, uuid.UUID):
        return reference
    if isinstance(reference, str):
        try:
            return uuid.UUID(reference)
        except ValueError:
            pass
    raise InvalidBlobReference(f"not a blob reference: {reference!r}")


def _refuse(what: str, name: str) -> NoReturn:
    raise TypeError(
        f"a {name} cannot be {what}: it reaches the caller alone, never a view, impact, "
        "offer, event, outbox row or chunk (only its reference travels)"
    )


class _Capability:
    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if cls.__name__ not in ("UploadUrl", "DownloadUrl"):
            _refuse("subclassed", "presigned URL")
        super().__init_subclass__(**kwargs)

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        _refuse("pickled or copied", type(self).__name__)

    def __reduce__(self) -> NoReturn:
        _refuse("pickled or copied", type(self).__name__)

    def __getstate__(self) -> NoReturn:
        _refuse("pickled or copied", type(self).__name__)

    def __copy__(self) -> NoReturn:
        _refuse("copied", type(self).__name__)

    def __deepcopy__(self, memo: Any) -> NoReturn:
        _refuse("copied", type(self).__name__)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> NoReturn:
        _refuse("a field of a pydantic model", cls.__name__)


@final
@dataclass(frozen=True, slots=True, eq=False)
class UploadUrl(_Capability):
    """A presigned POST: send ``fields`` (in order) then the file as the
    form's ``file`` part to ``url``. ``reference`` is what travels."""

    reference: str
    url: str
    fields: Mapping[str, str] = field(repr=False)
    max_bytes: int
    expires_in: timedelta

    def __repr__(self) -> str:
        return f"UploadUrl(reference={self.reference!r}, <signed>)"

    __str__ = __repr__


@final
@dataclass(frozen=True, slots=True, eq=False)
class DownloadUrl(_Capability):
    """A presigned GET of one blob, valid for ``expires_in``."""

    reference: str
    url: str = field(repr=False)
    expires_in: timedelta

    def __repr__(self) -> str:
        return f"DownloadUrl(reference={self.reference!r}, <signed>)"

    __str__ = __repr__
