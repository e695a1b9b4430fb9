"""Blobs over a real S3-compatible store (a spawned SeaweedFS ``weed mini``).

The presigned POST round trip against the server's own enforcement (an
object within the size lands, an oversize one is refused and never lands, a
tampered policy is refused), the beat's reaper (promotion from a HEAD and
exactly its two reap categories), the gated download (refused once the
viewer loses sight of the view or the reference leaves ``blob_refs``), the
release at the aggregate boundary, and the fail-loud bucket bind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from service_engine import Database, Engine, ReadinessHandle
from service_engine.blobs.model import BlobBucketMissing, BlobKind, BlobPolicy, UploadUrl
from service_engine.blobs.runtime import BlobStoreMissing
from service_engine.blobs.s3 import BlobStoreConfig
from service_engine.embedded import EmbeddedSeaweed
from service_engine.errors import WorkerStopped
from service_engine.impacts import JsonValue
from service_engine.persistence.crud import CrudStore
from service_engine.pipeline import Mutation
from service_engine.render.projector import Populate, Projector, Visibility

from ..support.harness import fast_engine_config, wait_until

# One worker runs this module: its SeaweedFS server (module-scoped) starts once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("blobs")]


@dataclass(frozen=True)
class Principal:
    id: str
    orgs: frozenset[str] = field(default_factory=frozenset)


@dataclass
class Document:
    id: str
    org: str
    attachment: str | None = None

    Store: ClassVar[Any]

    def pending_events(self) -> Sequence[Any]:
        return ()

    def blob_refs(self) -> Sequence[str]:
        return () if self.attachment is None else (self.attachment,)


class DocumentStore(CrudStore[Document, str]):
    TABLE = "sample_document"
    COLUMNS: ClassVar[tuple[str, ...]] = ("id", "org", "attachment")

    def to_row(self, doc: Document) -> Mapping[str, object]:
        return {"id": doc.id, "org": doc.org, "attachment": doc.attachment}

    def from_row(self, row: Mapping[str, Any]) -> Document:
        attachment = row["attachment"]
        return Document(row["id"], row["org"], None if attachment is None else str(attachment))


Document.Store = DocumentStore()


class OrgVisibility(Visibility[Document, Principal]):
    def cohorts(self, row: Document) -> Iterable[Hashable]:
        return (row.org,)

    def memberships(self, principal: Principal) -> Iterable[Hashable]:
        return principal.orgs


class DocumentsView(Projector[Document, str, Principal, None]):
    NAME = "documents"
    NOUN = "document"
    STORE: ClassVar[Any] = Document.Store
    VISIBILITY = OrgVisibility()

    async def populate(self, cx: Populate[Principal], query: None) -> Sequence[JsonValue]:
        return []

    def project(self, row: Document, principal: Principal) -> str:
        return row.id


ALICE = Principal("alice", frozenset({"acme"}))
EVE = Principal("eve", frozenset({"other"}))
POLICY = BlobPolicy(max_bytes=1024, content_types=("text/plain",), orphan_after=timedelta(hours=1))


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedSeaweed]:
    server = EmbeddedSeaweed(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def store_config(seaweed: EmbeddedSeaweed) -> BlobStoreConfig:
    bucket = f"t-{secrets.token_hex(4)}"
    seaweed.create_bucket(bucket)
    return BlobStoreConfig(
        endpoint=seaweed.endpoint, bucket=bucket,
        access_key=seaweed.ACCESS_KEY, secret_key=seaweed.secret_key,
    )


@dataclass
class Running:
    engine: Engine
    kind: BlobKind
    readiness: ReadinessHandle


@contextlib.asynccontextmanager
async def running(
    db: Database, config: BlobStoreConfig | None, policy: BlobPolicy = POLICY
) -> AsyncIterator[Running]:
    readiness = ReadinessHandle()
    engine = await Engine.boot(fast_engine_config("sample", lock_timeout=timedelta(seconds=1)), db, None, readiness)
    engine.register_projector(DocumentsView())
    kind = engine.register_blobs("attachment", policy)
    engine.use_blob_store(config)
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: readiness.is_up or task.done(), what="the engine UP")
        if task.done():
            task.result()
        yield Running(engine, kind, readiness)
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, 10)


async def create_with_upload(run: Running, doc_id: str) -> UploadUrl:
    async def handler(cx: Mutation[Principal]) -> UploadUrl:
        upload = cx.blob(run.kind, content_type="text/plain")
        await cx.create(Document(doc_id, "acme", upload.reference))
        cx.impact("document", doc_id)
        return upload

    result = await run.engine.mutation_executor().execute(ALICE, handler)
    assert isinstance(result, UploadUrl), result
    return result


async def post(upload: UploadUrl, body: bytes, **overrides: str) -> httpx.Response:
    fields = {**upload.fields, **overrides}
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(
            upload.url, data=fields, files={"file": ("f.txt", body, "text/plain")}
        )


async def blob_row(db: Database, reference: str) -> Mapping[str, Any] | None:
    row = await db.pool.fetchrow(
        "SELECT state, size, kind FROM service_engine.blob WHERE id = $1::uuid", reference
    )
    return None if row is None else dict(row)


async def test_presigned_post_round_trip_enforced_by_the_store(db: Database, store_config: BlobStoreConfig) -> None:
    """An upload within max_bytes lands and the reaper promotes it with the
    HEAD's size; an oversize object is refused by the store (400) and never
    lands; a tampered policy is refused (403)."""
    async with running(db, store_config) as run:
        upload = await create_with_upload(run, "d1")
        assert (await blob_row(db, upload.reference)) == {"state": "pending", "size": None, "kind": "attachment"}
        assert upload.max_bytes == 1024

        oversize = await post(upload, b"x" * 2048)
        assert oversize.status_code == 400, oversize.text
        assert "EntityTooLarge" in oversize.text
        store = run.engine.blobs.store
        assert store is not None
        assert await store.head(f"attachment/{upload.reference}") is None

        tampered = await post(upload, b"hi", policy=upload.fields["policy"][:-4] + "AAAA")
        assert tampered.status_code == 403, tampered.text

        ok = await post(upload, b"hello blob")
        assert ok.status_code in (200, 201, 204), ok.text

        async def promoted() -> bool:
            return (await blob_row(db, upload.reference) or {}).get("state") == "complete"

        await wait_until(promoted, what="the beat's reaper promoting the upload")
        assert (await blob_row(db, upload.reference)) == {"state": "complete", "size": 10, "kind": "attachment"}


async def test_download_gated_by_view_and_blob_refs(db: Database, store_config: BlobStoreConfig) -> None:
    """download presigns a GET only for a caller who sees the view while the
    row lists the reference; a caller outside the cohort, an unknown
    reference, and a reference the aggregate dropped (released with the
    save) all get None; the reaper then deletes the released object."""
    async with running(db, store_config, BlobPolicy(1024, orphan_after=timedelta(seconds=2))) as run:
        upload = await create_with_upload(run, "d2")
        assert (await post(upload, b"secret bytes")).status_code in (200, 201, 204)

        url = await run.engine.download("documents", "d2", upload.reference, ALICE)
        assert url is not None and url.reference == upload.reference
        async with httpx.AsyncClient(timeout=10) as client:
            got = await client.get(url.url)
            assert got.status_code == 200 and got.content == b"secret bytes"
            forged = await client.get(url.url[:-6] + "000000")
            assert forged.status_code == 403
        with pytest.raises(TypeError):
            json.dumps(url)

        assert await run.engine.download("documents", "d2", upload.reference, EVE) is None
        assert await run.engine.download("documents", "d2", secrets.token_hex(4), ALICE) is None

        async def drop(cx: Mutation[Principal]) -> None:
            doc = await cx.load(Document, "d2")
            doc.attachment = None
            await cx.save(doc)

        await run.engine.mutation_executor().execute(ALICE, drop)
        assert (await blob_row(db, upload.reference) or {})["state"] == "released"
        assert await run.engine.download("documents", "d2", upload.reference, ALICE) is None

        reaper = run.engine.blobs.reaper
        store = run.engine.blobs.store
        assert reaper is not None and store is not None
        await wait_until(
            lambda: _absent(db, upload.reference), what="the released blob reaped"
        )
        assert await store.head(f"attachment/{upload.reference}") is None


async def _absent(db: Database, reference: str) -> bool:
    return await blob_row(db, reference) is None


async def test_reaper_reaps_exactly_two_categories(db: Database, store_config: BlobStoreConfig) -> None:
    """Past orphan_after: an upload that never landed loses its row, a
    deleted aggregate's blob loses object and row; a complete, referenced
    blob is kept."""
    policy = BlobPolicy(1024, orphan_after=timedelta(seconds=2))
    async with running(db, store_config, policy) as run:
        never = await create_with_upload(run, "n1")
        kept = await create_with_upload(run, "k1")
        assert (await post(kept, b"data")).status_code in (200, 201, 204)
        gone = await create_with_upload(run, "g1")
        assert (await post(gone, b"data")).status_code in (200, 201, 204)

        async def delete(cx: Mutation[Principal]) -> None:
            await cx.delete(await cx.load(Document, "g1"))

        await run.engine.mutation_executor().execute(ALICE, delete)
        assert (await blob_row(db, gone.reference) or {})["state"] == "released"

        await wait_until(lambda: _absent(db, never.reference), what="the incomplete upload reaped")
        await wait_until(lambda: _absent(db, gone.reference), what="the deleted aggregate's blob reaped")
        store = run.engine.blobs.store
        assert store is not None
        assert await store.head(f"attachment/{gone.reference}") is None
        assert (await blob_row(db, kept.reference) or {})["state"] == "complete"
        assert await store.head(f"attachment/{kept.reference}") is not None


async def test_a_rolled_back_mutation_mints_nothing(db: Database, store_config: BlobStoreConfig) -> None:
    """cx.blob stages its row in the transaction: a handler that raises
    leaves no blob row."""
    async with running(db, store_config) as run:
        minted: list[str] = []

        async def failing(cx: Mutation[Principal]) -> None:
            minted.append(cx.blob(run.kind).reference)
            raise RuntimeError("no")

        with pytest.raises(RuntimeError):
            await run.engine.mutation_executor().execute(ALICE, failing)
        assert minted and await blob_row(db, minted[0]) is None


async def test_bucket_bind_fails_loud(db: Database, store_config: BlobStoreConfig) -> None:
    """A registered kind with an absent bucket raises BlobBucketMissing, and
    with no store configured BlobStoreMissing; both hold readiness DOWN
    under blob_store. The bucket is never created."""
    absent = BlobStoreConfig(
        endpoint=store_config.endpoint, bucket="no-such-bucket",
        access_key=store_config.access_key, secret_key=store_config.secret_key,
    )
    for config, error in ((absent, BlobBucketMissing), (None, BlobStoreMissing)):
        readiness = ReadinessHandle()
        engine = await Engine.boot(fast_engine_config("sample", lock_timeout=timedelta(seconds=1)), db, None, readiness)
        engine.register_blobs("attachment", POLICY)
        engine.use_blob_store(config)
        with pytest.raises(error):
            await engine.run()
        assert not readiness.is_up
        assert readiness.holds("blob_store")


def test_seaweed_runs_from_the_wheel() -> None:
    """The embedded extra ships the weed binary."""
    assert Path(EmbeddedSeaweed.binary()).exists()


async def test_erasure_purges_the_persons_blobs(db: Database, store_config: BlobStoreConfig) -> None:
    """An erasure whose manifest names a blob releases it in the erasure's
    transaction and, after the commit, deletes its object and its row."""
    from service_engine.erasure import Erase

    async with running(db, store_config) as run:
        upload = await create_with_upload(run, "e1")
        assert (await post(upload, b"personal")).status_code in (200, 201, 204)

        class Documents:
            async def erase(self, cx: Erase, person: str) -> None:
                doc = await cx.load(Document, "e1")
                await cx.delete(doc)
                for reference in doc.blob_refs():
                    cx.erased.blob(reference)

        run.engine.register_erasable("documents", Documents())
        result = await run.engine.erase("alice")
        assert result.purged and result.manifest.blobs == {upload.reference}
        assert await blob_row(db, upload.reference) is None
        store = run.engine.blobs.store
        assert store is not None
        assert await store.head(f"attachment/{upload.reference}") is None


async def test_query_kit_download_takes_the_views_gate(db: Database, store_config: BlobStoreConfig) -> None:
    """Views.download (the query context's gesture) presigns for a caller who
    sees the view and answers None for one who does not."""
    from types import SimpleNamespace
    from typing import cast

    from service_engine.graphql import GraphQLContext
    from service_engine.graphql.reads import Views

    async with running(db, store_config) as run:
        upload = await create_with_upload(run, "q1")
        views = Views("documents", str)
        seen = cast(GraphQLContext[Any], SimpleNamespace(engine=run.engine, principal=ALICE))
        unseen = cast(GraphQLContext[Any], SimpleNamespace(engine=run.engine, principal=EVE))
        url = await views.download(seen, "q1", upload.reference)
        assert url is not None and "X-Amz-Signature=" in url.url
        assert await views.download(unseen, "q1", upload.reference) is None


async def test_blob_owned_and_release_blob(db: Database, store_config: BlobStoreConfig) -> None:
    """``cx.blob_owned`` commits the blob's row with the aggregate, naming
    that aggregate (store type and key) as its owner from the start; the
    upload lands in the real bucket and downloads. ``cx.release_blob``
    releases the reference with its transaction (a rolled-back release
    changes nothing): the download is refused at once even though the row
    still lists it, and past orphan_after the reaper deletes the object
    from the bucket and the row."""
    policy = BlobPolicy(1024, content_types=("text/plain",), orphan_after=timedelta(seconds=2))
    async with running(db, store_config, policy) as run:

        async def create(cx: Mutation[Principal]) -> UploadUrl:
            doc = Document("owned", "acme")
            upload = cx.blob_owned(run.kind, doc, content_type="text/plain")
            doc.attachment = upload.reference
            await cx.create(doc)
            cx.impact("document", doc.id)
            return upload

        upload = await run.engine.mutation_executor().execute(ALICE, create)
        assert isinstance(upload, UploadUrl), upload
        row = await db.pool.fetchrow(
            "SELECT state, owner_store, owner_key::text AS owner_key FROM service_engine.blob"
            " WHERE id = $1::uuid", upload.reference,
        )
        assert row is not None
        assert dict(row) == {
            "state": "pending", "owner_store": Document.Store.store_type, "owner_key": '"owned"',
        }
        assert (await post(upload, b"owned bytes")).status_code in (200, 201, 204)
        await wait_until(lambda: _in_state(db, upload.reference, "complete"), what="the upload promoted")
        url = await run.engine.download("documents", "owned", upload.reference, ALICE)
        assert url is not None
        async with httpx.AsyncClient(timeout=10) as client:
            got = await client.get(url.url)
            assert got.status_code == 200 and got.content == b"owned bytes"

        async def release_then_fail(cx: Mutation[Principal]) -> None:
            cx.release_blob(upload.reference)
            raise RuntimeError("changed my mind")

        with pytest.raises(RuntimeError):
            await run.engine.mutation_executor().execute(ALICE, release_then_fail)
        assert (await blob_row(db, upload.reference) or {})["state"] == "complete"
        assert await run.engine.download("documents", "owned", upload.reference, ALICE) is not None

        async def release(cx: Mutation[Principal]) -> None:
            cx.release_blob(upload.reference)

        await run.engine.mutation_executor().execute(ALICE, release)
        assert (await blob_row(db, upload.reference) or {})["state"] == "released"
        assert await run.engine.download("documents", "owned", upload.reference, ALICE) is None
        await wait_until(lambda: _absent(db, upload.reference), what="the released blob reaped")
        async with httpx.AsyncClient(timeout=10) as client:
            gone = await client.get(url.url)  # the GET presigned before the release
            assert gone.status_code == 404, gone.text


async def _in_state(db: Database, reference: str, state: str) -> bool:
    return (await blob_row(db, reference) or {}).get("state") == state
