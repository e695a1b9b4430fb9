"""The engine's blob runtime: kinds, the bound bucket, the reaper, download.

`BlobRuntime` is the blobs component `Engine` composes.
`Engine.register_blobs` records kinds here; `BlobRuntime.start` (from
`Engine.run`) binds the configured bucket — fail-loud: kinds registered
and no store configured is `BlobStoreMissing`, a bucket that does not
answer is `BlobBucketMissing`, both holding readiness DOWN under
``blob_store`` — hands each kind its store and adds the reaper to the beat.
A service that registers no kind never needs S3 at all.

`BlobRuntime.download` is the one way to mint a `DownloadUrl`: the caller
must currently see the view (the render registry's fetch path: same store,
same RLS regime, same visibility gate) *and* the loaded aggregate must still
list the reference in ``blob_refs``; otherwise None.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..beat.component import NO_TASKS, BeatStep
from ..db.errors import Stage, translating
from ..db.pool import Database
from ..failures import DuplicateRegistration, EngineError
from ..impacts.model import JsonValue
from ..readiness import ReadinessHandle
from ..supervisor import Worker
from .model import BlobKind, BlobPolicy, DownloadUrl, object_key, parse_reference
from .reaper import BlobReaper
from .s3 import BlobStore, BlobStoreConfig
from .staging import blob_refs_of

__all__ = ["REASON_BLOB_STORE", "BlobRuntime", "BlobStoreMissing"]

REASON_BLOB_STORE = "blob_store"

_log = logging.getLogger(__name__)

RowFetch = Callable[[], Awaitable[Any | None]]


class BlobStoreMissing(EngineError):
    """Blob kinds are registered but no S3 store is configured."""

    reason = REASON_BLOB_STORE


class BlobRuntime:
    """The blob kinds of one engine and their bound store."""

    def __init__(self, db: Database, readiness: ReadinessHandle) -> None:
        self._db = db
        self._readiness = readiness
        self.kinds: dict[str, BlobKind] = {}
        self.config: BlobStoreConfig | None = None
        self.store: BlobStore | None = None
        self.reaper: BlobReaper | None = None

    def register(self, kind: str, policy: BlobPolicy) -> BlobKind:
        """Declare the blob kind ``kind`` (``cx.blob(handle)`` mints its
        uploads). A service with kinds needs an S3 store (`use_blob_store`,
        or ``SERVICE_ENGINE_S3_*``): `run` binds its bucket, fail-loud."""
        if kind in self.kinds:
            raise DuplicateRegistration("blob kind", kind)
        declared = self.kinds[kind] = BlobKind(kind, policy)
        if self.store is not None:
            declared._bind(self.store)
        return declared

    def kind(self, kind: str) -> BlobKind | None:
        """The blob kind ``kind`` as `Engine.register_blobs` declared it (pass
        it to ``cx.blob``), or None when this engine did not register it."""
        return self.kinds.get(kind)

    @property
    def configured(self) -> bool:
        """Whether `start` has an S3 store to bind: one given to
        `Engine.use_blob_store`, or ``SERVICE_ENGINE_S3_*`` in the
        environment. A slice whose blobs are optional registers its kinds
        only then."""
        return self.config is not None or BlobStoreConfig.from_env() is not None

    def configure(self, config: BlobStoreConfig | None) -> None:
        """The S3-compatible store `run` binds (bind-only: the bucket must exist)."""
        self.config = config

    async def start(self) -> None:
        """Bind the bucket when kinds are registered (the reaper joins the beat)."""
        if not self.kinds:
            _log.info("no blob kind is registered: the service runs without S3")
            return
        if self.config is None:
            self.config = BlobStoreConfig.from_env()
        try:
            if self.config is None:
                raise BlobStoreMissing(
                    f"blob kinds {sorted(self.kinds)} are registered but no S3 store is "
                    "configured (SERVICE_ENGINE_S3_ENDPOINT / Engine.use_blob_store)"
                )
            store = BlobStore(self.config)
            try:
                await store.bind()
            except BaseException:
                await store.aclose()
                raise
        except EngineError as exc:
            self._readiness.set_down(REASON_BLOB_STORE, f"{type(exc).__name__}: {exc}")
            raise
        self.store = store
        for kind in self.kinds.values():
            kind._bind(store)
        self.reaper = BlobReaper(self._db, store)

    def tasks(self) -> Mapping[str, Worker]:
        return NO_TASKS

    def beat_steps(self) -> Mapping[str, BeatStep]:
        return {} if self.reaper is None else {"blob_reaper": self.reaper.beat}

    async def aclose(self) -> None:
        if self.store is not None:
            await self.store.aclose()

    async def download(self, fetch_row: RowFetch, reference: JsonValue) -> DownloadUrl | None:
        """Presign a GET of ``reference`` when ``fetch_row`` (the caller's
        visibility-gated read of the referencing row) finds the row and the
        row still lists the reference; None otherwise (also for a reference
        released, never uploaded, or of no registered kind)."""
        try:
            ref = str(parse_reference(reference))
        except EngineError:
            return None
        row = await fetch_row()
        if row is None or ref not in blob_refs_of(row):
            return None
        with translating(Stage.READ):
            found = await self._db.pool.fetchrow(
                "SELECT kind, state FROM service_engine.blob WHERE id = $1::uuid", ref
            )
        if found is None or found["state"] == "released":
            return None
        kind = self.kinds.get(found["kind"])
        if kind is None:
            return None
        return kind.store.presign_get(ref, object_key(kind.name, ref))
