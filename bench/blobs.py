"""Blobs: presign cost and upload throughput through a real store, in one run.

    python bench/blobs.py [--urls 20000] [--uploads 200] [--size 65536] [--concurrency 16]

Starts an embedded SeaweedFS (``weed mini``, SigV4 and POST policies
enforced) and prints side by side:

* **presign cost**: µs per URL for the presigned POST (policy document,
  base64, HMAC chain) and the presigned GET, against one bare HMAC-SHA256
  signing-key derivation + signature (the floor of any SigV4 signature);
* **upload throughput**: ``--uploads`` objects of ``--size`` bytes POSTed
  through their presigned forms with ``--concurrency`` in flight —
  uploads/s and MB/s — against signed HEADs of the same objects (the
  store's round trip with no body) and presigned GETs reading them back.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service_engine.blobs.s3 import BlobStore, BlobStoreConfig
from service_engine.blobs.sigv4 import Credentials, signature
from service_engine.embedded import EmbeddedSeaweed


def per_url(label: str, count: int, make: object) -> float:
    assert callable(make)
    started = time.perf_counter()
    for i in range(count):
        make(i)
    micros = (time.perf_counter() - started) / count * 1e6
    print(f"  {label:<38} {micros:8.1f} µs/URL")
    return micros


async def bounded(concurrency: int, jobs: list[object]) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(job: object) -> None:
        async with gate:
            assert callable(job)
            await job()

    started = time.perf_counter()
    await asyncio.gather(*(one(job) for job in jobs))
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls", type=int, default=20000)
    parser.add_argument("--uploads", type=int, default=200)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        seaweed = EmbeddedSeaweed(Path(tmp) / "seaweed")
        await asyncio.to_thread(seaweed.start)
        try:
            await asyncio.to_thread(seaweed.create_bucket, "bench")
            config = BlobStoreConfig(
                endpoint=seaweed.endpoint, bucket="bench",
                access_key=seaweed.ACCESS_KEY, secret_key=seaweed.secret_key,
            )
            store = BlobStore(config)
            await store.bind()
            credentials = Credentials(config.access_key, config.secret_key)

            print(f"presign cost ({args.urls} URLs each)")
            per_url("bare SigV4 signature (key + HMAC)", args.urls,
                    lambda i: signature(credentials, "20260101", f"string {i}"))
            per_url("presigned POST (policy + signature)", args.urls,
                    lambda i: store.presign_post(str(i), f"bench/{i}", 1 << 20, "text/plain"))
            per_url("presigned GET", args.urls, lambda i: store.presign_get(str(i), f"bench/{i}"))

            body = secrets.token_bytes(args.size)
            keys = [f"bench/{secrets.token_hex(8)}" for _ in range(args.uploads)]
            async with httpx.AsyncClient(timeout=30) as http:

                def upload(key: str) -> object:
                    async def run() -> None:
                        form = store.presign_post(key, key, args.size, "application/octet-stream")
                        response = await http.post(
                            form.url, data=dict(form.fields),
                            files={"file": ("b", body, "application/octet-stream")},
                        )
                        assert response.status_code in (200, 201, 204), response.text
                    return run

                def head(key: str) -> object:
                    async def run() -> None:
                        assert await store.head(key) is not None
                    return run

                def get(key: str) -> object:
                    async def run() -> None:
                        response = await http.get(store.presign_get(key, key).url)
                        assert response.status_code == 200 and len(response.content) == args.size
                    return run

                mb = args.uploads * args.size / 1e6
                print(f"\nstore throughput ({args.uploads} x {args.size} B, "
                      f"{args.concurrency} in flight)")
                for label, make in (("presigned POST upload", upload),
                                    ("signed HEAD (no body)", head),
                                    ("presigned GET download", get)):
                    seconds = await bounded(args.concurrency, [make(k) for k in keys])
                    rate = args.uploads / seconds
                    extra = f"{mb / seconds:7.1f} MB/s" if make is not head else ""
                    print(f"  {label:<38} {rate:8.1f} /s  {extra}")
            await store.aclose()
        finally:
            await asyncio.to_thread(seaweed.stop)


if __name__ == "__main__":
    asyncio.run(main())
