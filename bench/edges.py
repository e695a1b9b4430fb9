"""Hostile input at the edge, unbounded ("before": every edge bound set out
of reach, as main was) side by side with the default `EngineConfig` bounds.

    python bench/edges.py [--body-mb 300] [--aliases 5000] [--subscriptions 3000]

Each mode serves a toy schema (``boards { id title }``) from its own child
process, so the server's peak RSS is its own. Figures per input: the answer
(status or refusal code), seconds to it, bytes answered, and the server's
peak RSS before and after the input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import strawberry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

UNBOUNDED: dict[str, Any] = {
    "http_max_body_bytes": 10**12, "query_max_tokens": 10**9, "query_max_aliases": 10**9,
    "query_max_depth": 10**6, "ws_max_message_bytes": 10**12,
    "ws_max_subscriptions_per_socket": 10**9, "ws_max_sockets": 10**9,
}


# -- the server (child process) ------------------------------------------------------


@strawberry.type
class Board:
    id: str
    title: str


@strawberry.type
class Query:
    @strawberry.field
    def boards(self) -> list[Board]:
        return [Board(id=f"b{i}", title=f"Board {i}") for i in range(3)]


@strawberry.type
class Subscription:
    @strawberry.subscription
    async def live(self) -> AsyncGenerator[int, None]:
        yield 0
        await asyncio.Event().wait()



def _memory() -> dict[str, float]:
    # VmHWM, not ru_maxrss: the latter survives exec and would report the
    # parent's peak at fork time.
    status = dict(
        line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
        if ":" in line
    )
    return {"peak_mb": int(status["VmHWM"].split()[0]) / 1024,
            "now_mb": int(status["VmRSS"].split()[0]) / 1024}


def _write(path: Path, text: str) -> None:
    path.write_text(text)


async def serve(mode: str, port_file: Path, data: Path) -> None:
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from service_engine import Engine, EngineConfig, ReadinessHandle, connect_pool
    from service_engine.embedded import EmbeddedPostgres, provision_database
    from service_engine.graphql import graphql_app
    from service_engine.server.host import bind_listener

    pg = EmbeddedPostgres(data / "pg", durable=False)
    pg.start()
    try:
        provisioned = await provision_database(pg, "edges")
        db = await connect_pool(provisioned.app_url)
        overrides = UNBOUNDED if mode == "before" else {}
        config = EngineConfig(service="edges", **overrides)
        engine = await Engine.boot(config, db, None, ReadinessHandle())

        async def rss(_request: Request) -> JSONResponse:
            return JSONResponse(_memory())

        app = graphql_app(
            engine, strawberry.Schema(query=Query, subscription=Subscription),
            lambda passport: passport, routes=[Route("/rss", rss)],
        )
        sock = bind_listener("127.0.0.1:0")
        server = uvicorn.Server(uvicorn.Config(
            app, lifespan="off", log_level="critical", ws_max_size=2**40))
        task = asyncio.create_task(engine.run())
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
            await asyncio.sleep(0.05)
        _write(port_file, str(sock.getsockname()[1]))
        await serving
        engine.shutdown()
        await task
    finally:
        pg.stop()


# -- the client --------------------------------------------------------------------


PASSPORT = json.dumps({"sub": "mallory", "org": "evil"})


async def http_raw(port: int, head: bytes, body_chunks: Any) -> tuple[int, int, float]:
    """(status, response bytes, seconds to the status line)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.perf_counter()
    writer.write(head)

    async def write() -> None:
        for chunk in body_chunks:
            writer.write(chunk)
            await writer.drain()

    sending = asyncio.create_task(write())
    try:
        status_line = await asyncio.wait_for(reader.readline(), 600)
        elapsed = time.perf_counter() - started
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        return int(status_line.split()[1]), len(body), elapsed
    finally:
        sending.cancel()
        with contextlib.suppress(BaseException):
            await sending
        writer.close()


def big_body(mb: int) -> tuple[bytes, bytes, list[bytes]]:
    """A valid GraphQL request whose variables carry ``mb`` MB of text."""
    filler = b"a" * (mb * 2**20)
    prefix = b'{"query": "{ boards { id } }", "variables": {"x": "'
    suffix = b'"}}'
    return prefix, suffix, [filler[i:i + 2**20] for i in range(0, len(filler), 2**20)]


async def rss(port: int) -> dict[str, float]:
    import httpx

    async with httpx.AsyncClient() as http:
        result: dict[str, float] = (await http.get(f"http://127.0.0.1:{port}/rss")).json()
        return result


async def measure(port: int, args: argparse.Namespace) -> dict[str, str]:
    import httpx
    from websockets.asyncio.client import connect

    out: dict[str, str] = {}
    before = await rss(port)
    out["idle peak RSS"] = f"{before['peak_mb']:.0f} MB"

    prefix, suffix, chunks = big_body(args.body_mb)
    length = len(prefix) + len(suffix) + sum(len(c) for c in chunks)
    head = (f"POST /graphql HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"X-Passport: {PASSPORT}\r\nContent-Length: {length}\r\n\r\n").encode()
    status, _, seconds = await http_raw(port, head, [prefix, *chunks, suffix])
    after = await rss(port)
    out[f"{args.body_mb} MB body (Content-Length)"] = (
        f"{status} in {seconds:.2f}s; peak RSS {after['peak_mb']:.0f} MB")

    framed = [f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in [prefix, *chunks, suffix]]
    head = (b"POST /graphql HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"X-Passport: {PASSPORT}\r\n".encode() + b"Transfer-Encoding: chunked\r\n\r\n")
    status, _, seconds = await http_raw(port, head, [*framed, b"0\r\n\r\n"])
    after = await rss(port)
    out[f"{args.body_mb} MB body (chunked)"] = (
        f"{status} in {seconds:.2f}s; peak RSS {after['peak_mb']:.0f} MB")

    query = "{" + " ".join(f"a{i}: boards {{ id title }}" for i in range(args.aliases)) + "}"
    async with httpx.AsyncClient(timeout=600) as http:
        started = time.perf_counter()
        response = await http.post(f"http://127.0.0.1:{port}/graphql", json={"query": query},
                                   headers={"X-Passport": PASSPORT})
        seconds = time.perf_counter() - started
        body = response.json()
        code = (body.get("errors") or [{}])[0].get("extensions", {}).get("code", "served")
    out[f"{args.aliases} aliases"] = (
        f"{response.status_code} {code} in {seconds:.2f}s, {len(response.content) / 1024:.0f} KB")

    live = 0
    refused = ""
    async with connect(f"ws://127.0.0.1:{port}/graphql/ws", subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
                       additional_headers={"X-Passport": PASSPORT}, max_size=None) as ws:
        await ws.send(json.dumps({"type": "connection_init"}))
        await ws.recv()
        started = time.perf_counter()
        for n in range(args.subscriptions):
            await ws.send(json.dumps({"id": str(n), "type": "subscribe",
                                      "payload": {"query": "subscription { live }"}}))
        for _ in range(args.subscriptions):
            message = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if message["type"] == "next":
                live += 1
            elif message["type"] == "error":
                refused = message["payload"][0].get("extensions", {}).get("code", "error")
        seconds = time.perf_counter() - started
    out[f"{args.subscriptions} subscriptions, one socket"] = (
        f"{live} live" + (f", {args.subscriptions - live} refused {refused}" if refused else "")
        + f" in {seconds:.2f}s")
    return out


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", mode, str(port_file), tmp], cwd=ROOT)
        try:
            deadline = time.monotonic() + 60
            while not port_file.exists() or not port_file.read_text():
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {mode} server did not start")
                time.sleep(0.05)
            return asyncio.run(measure(int(port_file.read_text()), args))
        finally:
            child.terminate()
            child.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--body-mb", type=int, default=300)
    parser.add_argument("--aliases", type=int, default=5000)
    parser.add_argument("--subscriptions", type=int, default=3000)
    parser.add_argument("--serve", nargs=3, metavar=("MODE", "PORT_FILE", "DATA"))
    args = parser.parse_args()
    if args.serve:
        mode, port_file, data = args.serve
        asyncio.run(serve(mode, Path(port_file), Path(data)))
        return
    before = run_mode("before", args)
    after = run_mode("after", args)
    width = max(len(k) for k in before)
    print(f"{'input'.ljust(width)}  {'unbounded (before)':<44}  default bounds (after)")
    for key in before:
        print(f"{key.ljust(width)}  {before[key]:<44}  {after[key]}")


if __name__ == "__main__":
    main()
