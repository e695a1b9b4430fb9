"""The reference service's reply attachment over a real S3-compatible store
(a spawned SeaweedFS), a spawned nats-server and real Postgres, through the
service's GraphQL over HTTP: the author's presigned upload lands, the
download is gated by the reply view and its ``blob_refs``, a replaced
attachment is released, erasing the author purges the blob; without a
blob store the service runs and refuses attachments."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from example_service.slices.reply.commands import start_reply
from service_engine.blobs import BlobStoreConfig
from service_engine.embedded import (
    EmbeddedNats,
    EmbeddedSeaweed,
    ProvisionedDatabase,
)
from service_engine.graphql import Passport

from ..blackbox.harness import provision_kv, provision_lanes
from ..support.example_support import Running, person, running
from ..support.harness import owner_connection
from ..support.nats_support import engine_nats

# One worker runs this module: its SeaweedFS server (module-scoped) starts once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("reply_attachment")]

ALICE = Passport(sub="alice", org="acme")
BOB = Passport(sub="bob", org="acme")
GINA = Passport(sub="gina", org="globex")
ATTACH = """mutation($id: ID!, $type: String!) { attachToReply(id: $id, contentType: $type) {
    success error { code }
    upload { reference url fields { name value } maxBytes }
    reply { attachment }
} }"""
DOWNLOAD = """query($id: ID!, $ref: ID!) { replyAttachment(id: $id, reference: $ref) { url } }"""


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedSeaweed]:
    server = EmbeddedSeaweed(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def blob_store(seaweed: EmbeddedSeaweed) -> BlobStoreConfig:
    bucket = f"t-{secrets.token_hex(4)}"
    seaweed.create_bucket(bucket)
    return BlobStoreConfig(
        endpoint=seaweed.endpoint, bucket=bucket,
        access_key=seaweed.ACCESS_KEY, secret_key=seaweed.secret_key,
    )



async def _upload(upload: dict[str, Any], body: bytes) -> httpx.Response:
    fields = {f["name"]: f["value"] for f in upload["fields"]}
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(
            upload["url"], data=fields, files={"file": ("note.txt", body, "text/plain")}
        )


async def _download(run: Running, reply_id: str, reference: str, who: Passport) -> str | None:
    data = await run.gql(DOWNLOAD, {"id": reply_id, "ref": reference}, who)
    answer = data["replyAttachment"]
    return None if answer is None else str(answer["url"])


async def _blob_state(store: ProvisionedDatabase, reference: str) -> str | None:
    async with owner_connection(store) as conn:
        state = await conn.fetchval(
            "SELECT state FROM service_engine.blob WHERE id = $1::uuid", reference
        )
    return None if state is None else str(state)


async def test_a_reply_attachment_uploads_downloads_gated_and_is_released_and_erased(
    store: ProvisionedDatabase, nats_server: EmbeddedNats, blob_store: BlobStoreConfig
) -> None:
    """The author's attachToReply answers a presigned POST the store
    accepts; replyAttachment presigns a GET for a viewer of the reply
    (another org gets null, and so does a reference the reply dropped);
    someone else may not attach; a second attachment releases the first;
    erasing the author purges the current blob, object and row."""
    await provision_lanes(nats_server.url)
    await provision_kv(nats_server.url)
    async with engine_nats(nats_server) as conn, running(
        store, ["reply"], nats=conn, blob_store=blob_store
    ) as run:
        await run.executor.execute(person("alice"), start_reply, "r1")
        first = (await run.gql(ATTACH, {"id": "r1", "type": "text/plain"}, ALICE))["attachToReply"]
        assert first["success"], first
        reference = first["upload"]["reference"]
        assert first["reply"] == {"attachment": reference}
        assert (await _upload(first["upload"], b"attached words")).status_code in (200, 201, 204)

        url = await _download(run, "r1", reference, ALICE)
        assert url is not None
        async with httpx.AsyncClient(timeout=10) as client:
            got = await client.get(url)
        assert (got.status_code, got.content) == (200, b"attached words")
        assert await _download(run, "r1", reference, GINA) is None

        refused = (await run.gql(ATTACH, {"id": "r1", "type": "text/plain"}, BOB))["attachToReply"]
        assert refused["error"] == {"code": "reply.not_author"}

        second = (await run.gql(ATTACH, {"id": "r1", "type": "text/plain"}, ALICE))["attachToReply"]
        replaced = second["upload"]["reference"]
        assert await _blob_state(store, reference) == "released"
        assert await _download(run, "r1", reference, ALICE) is None
        assert await _download(run, "r1", replaced, ALICE) is not None

        result = await run.engine.erase("alice")
        assert result.purged and replaced in result.manifest.blobs
        assert await _blob_state(store, replaced) is None
        store_client = run.engine.blobs.store
        assert store_client is not None
        assert await store_client.head(f"reply_attachment/{replaced}") is None


async def test_without_a_blob_store_the_reply_slice_runs_and_refuses_attachments(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A deployment with no S3 configured registers no blob kind, boots,
    and answers attachToReply with a typed refusal."""
    await provision_lanes(nats_server.url)
    await provision_kv(nats_server.url)
    async with engine_nats(nats_server) as conn, running(store, ["reply"], nats=conn) as run:
        assert run.engine.blobs.kinds == {}
        await run.executor.execute(person("alice"), start_reply, "r2")
        refused = (await run.gql(ATTACH, {"id": "r2", "type": "text/plain"}, ALICE))["attachToReply"]
        assert refused["error"] == {"code": "reply.attachments_unavailable"}
