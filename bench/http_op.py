"""The HTTP operation path, in process: CPU and Python calls per request
outside a trivial resolver.

    python bench/http_op.py [--count 2000] [--rounds 5] [--document create|query|both]
                            [--variant NAME=REPO] ... [--profile FILE]

Each variant's child process (``REPO`` its working directory and the head
of its ``PYTHONPATH``, so a worktree of another commit runs its own code)
boots an `Engine` on its own embedded Postgres and builds `graphql_app`
over a toy schema whose resolvers touch no database: a ``createBoard``-like
mutation (two variables, a result with ``success`` and ``error``) and a
``boards { id title }`` query. A round calls the Starlette app as ASGI
in-process ``count`` times, one request after the other, each a fresh
scope with the ``X-Passport`` header and a JSON body, as uvicorn hands
them: the edge's body bound, the routing, the route, the principal (no
principal facts registered: none read), Strawberry's operation with every
limiter and cache, the answer's bytes. No socket, no HTTP parser: what is
left is the work per request a service pays besides its resolver.

Per variant and document, round by round (the variants alternate, so a
load change hits them alike): the process CPU per request (µs, user +
sys); then one more round under ``sys.setprofile`` counting the Python
function calls (a generator's resumption counts) and C calls per request.
Every answer is checked byte for byte against the first variant's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import strawberry

HERE = Path(__file__).resolve().parents[1]

CREATE = ("mutation($id: ID, $title: String!) { createBoard(id: $id, title: $title) "
          "{ success error { code message } } }")
QUERY = "query { boards { id title } }"
PASSPORT = json.dumps({"sub": "writer", "org": "m-org", "roles": ["board:archive"]},
                      separators=(",", ":"))


@strawberry.type
class Board:
    id: strawberry.ID
    title: str


@strawberry.type
class Failure:
    code: str
    message: str


@strawberry.type
class CreateBoardResult:
    success: bool
    error: Failure | None = None


@strawberry.type
class Query:
    @strawberry.field
    def boards(self) -> list[Board]:
        return [Board(id=strawberry.ID(f"b{i}"), title=f"Board {i}") for i in range(3)]


@strawberry.type
class Mutation:
    @strawberry.mutation
    async def create_board(self, title: str,
                           id: strawberry.ID | None = None) -> CreateBoardResult:
        return CreateBoardResult(success=bool(title))


def _body(document: str, seq: int) -> bytes:
    if document == "create":
        payload: dict[str, Any] = {"query": CREATE,
                                   "variables": {"id": f"b-{seq}", "title": f"title {seq}"}}
    else:
        payload = {"query": QUERY}
    return json.dumps(payload, separators=(",", ":")).encode()


async def _request(app: Any, body: bytes) -> bytes:
    """One POST /graphql through the ASGI app: the status, headers and body sent."""
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/graphql",
        "raw_path": b"/graphql", "root_path": "", "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-passport", PASSPORT.encode()),
        ],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {},
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    out: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out.append(str(message["status"]).encode())
            out.extend(b"%s: %s" % pair for pair in message["headers"])
        else:
            out.append(message.get("body", b""))

    await app(scope, receive, send)
    return b"\n".join(out)


async def _count_calls(app: Any, bodies: list[bytes]) -> dict[str, float]:
    """Python function calls and C calls per request over ``bodies``."""
    calls = {"call": 0, "c_call": 0}

    def counter(_frame: Any, event: str, _arg: Any) -> None:
        if event in calls:
            calls[event] += 1

    sys.setprofile(counter)
    for body in bodies:
        await _request(app, body)
    sys.setprofile(None)
    return {"py_calls": calls["call"] / len(bodies), "c_calls": calls["c_call"] / len(bodies)}


async def child(profile: str) -> None:
    """One variant: boot, then one round per line on stdin (``DOCUMENT COUNT
    SEQ [calls]``), one JSON line answered per round."""
    from service_engine import Engine, EngineConfig, ReadinessHandle, connect_pool
    from service_engine.embedded import EmbeddedPostgres, provision_database
    from service_engine.graphql import graphql_app

    with tempfile.TemporaryDirectory(prefix="http-op-") as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg", durable=False)
        await asyncio.to_thread(pg.start)
        try:
            provisioned = await provision_database(pg, "httpop")
            db = await connect_pool(provisioned.app_url)
            engine = await Engine.boot(EngineConfig(service="httpop"), db, None,
                                       ReadinessHandle())
            app = graphql_app(engine, strawberry.Schema(query=Query, mutation=Mutation), lambda passport: passport)
            loop = asyncio.get_running_loop()
            print(json.dumps({"ready": True}), flush=True)
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                document, count_text, seq_text, *mode = line.split()
                count, seq = int(count_text), int(seq_text)
                bodies = [_body(document, seq + i) for i in range(count)]
                first = await _request(app, bodies[0])
                row: dict[str, Any] = {"answer": first.decode()}
                if mode == ["calls"]:
                    row.update(await _count_calls(app, bodies))
                elif mode == ["profile"] and profile:
                    import cProfile

                    profiler = cProfile.Profile()
                    profiler.enable()
                    for body in bodies:
                        await _request(app, body)
                    profiler.disable()
                    profiler.dump_stats(profile)
                else:
                    cpu0 = time.process_time()
                    for body in bodies:
                        await _request(app, body)
                    row["cpu_us"] = (time.process_time() - cpu0) / count * 1e6
                print(json.dumps(row), flush=True)
            await db.aclose()
        finally:
            await asyncio.to_thread(pg.stop)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(args: argparse.Namespace) -> None:
    variants: list[tuple[str, Path]] = []
    for spec in args.variant or [f"this={HERE}"]:
        name, _, repo = spec.partition("=")
        variants.append((name, Path(repo).resolve()))
    procs: dict[str, subprocess.Popen[str]] = {}
    for name, repo in variants:
        env = {**os.environ, "PYTHONPATH": str(repo)}
        profile = f"{args.profile}.{name}.prof" if args.profile else ""
        procs[name] = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", "--profile", profile],
            cwd=repo, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for proc in procs.values():
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["ready"]

    def ask(name: str, document: str, count: int, seq: int, mode: str = "") -> dict[str, Any]:
        proc = procs[name]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{document} {count} {seq} {mode}\n")
        proc.stdin.flush()
        row: dict[str, Any] = json.loads(proc.stdout.readline())
        return row

    documents = ["create", "query"] if args.document == "both" else [args.document]
    rows: dict[tuple[str, str], list[float]] = {}
    calls: dict[tuple[str, str], dict[str, float]] = {}
    loads: list[float] = []
    try:
        for document in documents:
            answers = {name: ask(name, document, 200, 0)["answer"] for name, _ in variants}
            for name, answer in answers.items():  # warm-up, and the bytes compared
                if answer != answers[variants[0][0]]:
                    raise SystemExit(f"{name} answers {document} differently:\n{answer}\n"
                                     f"{answers[variants[0][0]]}")
            seq = 1000
            for _ in range(args.rounds):
                for name, _repo in variants:
                    rows.setdefault((name, document), []).append(
                        ask(name, document, args.count, seq)["cpu_us"])
                    loads.append(os.getloadavg()[0])
                    seq += args.count
            for name, _repo in variants:
                calls[(name, document)] = ask(name, document, 200, seq, "calls")
                if args.profile:
                    ask(name, document, args.count, seq, "profile")
    finally:
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(60)
    print(f"load average {min(loads):.2f}-{max(loads):.2f}; {args.count} requests x "
          f"{args.rounds} rounds per variant and document, in process (ASGI), interleaved")
    print(f"{'variant':<10} {'document':<8} {'cpu us/req (min / med / max)':>30} "
          f"{'py calls/req':>13} {'C calls/req':>12}")
    for (name, document), got in rows.items():
        c = calls[(name, document)]
        spread = f"{min(got):.0f} / {_pct(got, 0.5):.0f} / {max(got):.0f}"
        print(f"{name:<10} {document:<8} {spread:>30} {c['py_calls']:>13.0f} "
              f"{c['c_calls']:>12.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--document", choices=["create", "query", "both"], default="both")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=REPO (default: this repo)")
    parser.add_argument("--profile", default="",
                        help="a cProfile of one round per variant and document to "
                             "FILE.<variant>.prof (the last document's)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.child:
        asyncio.run(child(parsed.profile))
    else:
        main(parsed)
