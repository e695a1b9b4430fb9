"""The mutation path: one ``renameBoard`` at a time, its answer time and its CPU.

    python bench/mutation.py [--count 400] [--rounds 3] [--subscribers 1] [--board]
                             [--variant NAME=REPO[:EXTRA_PATH...]] ... [--py-spy FILE]
                             [--in-process] [--profile FILE]
    python bench/mutation.py --writers 4,16,64 [--mutations create,rename] [--seconds 10]
                             [--rounds 2] [--variant NAME=REPO...] ... [--py-spy FILE]

The reference service (``python -m example_service`` on its embedded
Postgres + NATS) runs in a child process per variant, from ``REPO`` (its
working directory and the head of its ``PYTHONPATH``, so a worktree of
another commit runs its own code; ``EXTRA_PATH`` entries follow it). Each
round sends ``count`` ``renameBoard`` mutations over HTTP one after the
other (closed loop: the next is sent when the previous answered), with
``subscribers`` graphql-transport-ws sessions subscribed to ``boards`` in
the same org (the render side's per-commit work included). ``--board``
selects the result's ``board { id title }`` (a read after the write). The
requests go out through ``bench/lean_http.py`` (keep-alive HTTP/1.1; the
``httpx`` client used before cost ~2-4 ms of CPU a request on these shared
cores, counted in every answer time).

Per variant and round: the answer time p50 / p99 (from just before the
request to its response), the service process's CPU per mutation (user +
sys, and the sys part alone) and the CPU of the whole tree (the service with its Postgres and
nats-server children) per mutation. Variants run round-robin, so a load
change on the machine hits them alike; compare the columns of one run.

``--writers K[,K...]``: closed-loop writers instead of the one sequential
writer. Each of K writers holds its own keep-alive connection and sends its
next mutation as soon as the previous one answered, for ``--seconds`` per
cell; a cell is one (variant, mutation, K), and the cells run round-robin
over the variants, ``--rounds`` times. ``create`` sends ``createBoard``
(a new id and title each time), ``rename`` sends ``renameBoard`` on the
writer's own board (no two writers contend for one board's lock), both
with their values as variables. Per cell: mutations/s, the answer p50 /
p99, and the CPU per mutation of the service process and of its Postgres
(the postmaster and every process under it alive at both ends of the
cell: the backends, walwriter, checkpointer, background writer, io
workers, autovacuum launcher; an autovacuum worker that exits within the
cell is not counted), their sum, the mutations that failed (answered an
error: not counted in mutations/s, their CPU is), and the cluster's WAL
flushes (``fsyncs``, every process's, from ``pg_stat_io``) and WAL bytes
per mutation (a flush costs CPU in the kernel; commits that overlap share
one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from lean_http import LeanClient
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

PROTOCOL = Subprotocol("graphql-transport-ws")
SUBSCRIPTION = """subscription { boards { __typename
  ... on BoardsReset { revision keys views { id title } }
  ... on BoardsUpsert { revision key view { id title archived affordances { action allowed reason } } cause { name } }
  ... on BoardsRemove { revision key } } }"""
CREATE = ("mutation($id: ID, $title: String!) { createBoard(id: $id, title: $title) "
          "{ success error { code message } } }")
RENAME = ("mutation($id: ID!, $title: String!) { renameBoard(id: $id, title: $title) "
          "{ success error { code } } }")
RENAME_BOARD = ("mutation($id: ID!, $title: String!) { renameBoard(id: $id, title: $title) "
                "{ success error { code } board { id title } } }")
ORG = "m-org"
BOARDS = 5


def passport(sub: str) -> str:
    return json.dumps({"sub": sub, "org": ORG, "roles": ["board:archive"]}, separators=(",", ":"))


WRITER = {"X-Passport": passport("writer")}
"""The writer's headers (its requests go through `lean_http.LeanClient`)."""


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    return sum(cpu_split(pid))


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                out += tree(int(child))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Variant:
    name: str
    repo: Path
    path: list[str]
    proc: subprocess.Popen[bytes] | None = None
    addr: str = ""
    rows: list[dict[str, float]] | None = None
    data: Path | None = None
    command: tuple[str, ...] = ("-m", "example_service")
    """What the child runs (``stack_floor.py`` for ``--floor``)."""


@contextlib.asynccontextmanager
async def started(variant: Variant) -> AsyncIterator[Variant]:
    data = Path(tempfile.mkdtemp(prefix=f"mutation-{variant.name}-"))
    addr_file = data / "addr"
    variant.data = data
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(variant.repo), *variant.path]),
        "EXAMPLE_SERVICE_DATA": str(data),
        "EXAMPLE_SERVICE_HTTP_ADDR": "127.0.0.1:0",
        "EXAMPLE_SERVICE_ADDR_FILE": str(addr_file),
        "EXAMPLE_SERVICE_LOG_LEVEL": "WARNING",
    }
    log = (data / "service.log").open("wb")
    variant.proc = subprocess.Popen([sys.executable, *variant.command],  # noqa: ASYNC220
                                    cwd=variant.repo, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not addr_file.exists():
            if variant.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((data / "service.log").read_text()[-3000:])
            await asyncio.sleep(0.1)
        variant.addr = addr_file.read_text().strip()
        async with httpx.AsyncClient(base_url=f"http://{variant.addr}") as http:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        yield variant
    finally:
        variant.proc.terminate()
        try:
            variant.proc.wait(30)
        except subprocess.TimeoutExpired:
            variant.proc.kill()
        log.close()


async def drain_socket(ws: Any) -> None:
    with contextlib.suppress(Exception):
        async for _ in ws:
            pass


async def round_of(variant: Variant, http: LeanClient, count: int, document: str,
                   start: int) -> dict[str, float]:
    assert variant.proc is not None
    pids = tree(variant.proc.pid)
    own0, all0 = cpu_split(variant.proc.pid), sum(cpu_seconds(p) for p in pids)
    answers: list[float] = []
    for n in range(count):
        seq = start + n
        body = {"query": document, "variables": {"id": f"b-{seq % BOARDS}", "title": f"w{seq}"}}
        began = time.perf_counter()
        _status, answer = await http.post_json("/graphql", body, WRITER)
        answers.append(time.perf_counter() - began)
        assert answer["data"]["renameBoard"]["success"], answer
    own1, all1 = cpu_split(variant.proc.pid), sum(cpu_seconds(p) for p in pids)
    return {
        "p50": pct(answers, 0.5) * 1000, "p99": pct(answers, 0.99) * 1000,
        "own_us": (sum(own1) - sum(own0)) / count * 1e6,
        "sys_us": (own1[1] - own0[1]) / count * 1e6,
        "tree_us": (all1 - all0) / count * 1e6,
    }


HERE = Path(__file__).resolve().parents[1]


def postmaster(data: Path) -> int | None:
    """The pid of the embedded Postgres under the service's data directory
    (``pg_ctl`` starts it in a session of its own: not the service's child)."""
    for pidfile in data.rglob("postmaster.pid"):
        with contextlib.suppress(OSError, ValueError):
            return int(pidfile.read_text().split()[0])
    return None


async def postgres_admin(variant: Variant) -> asyncpg.Connection:
    """A superuser connection to the variant's embedded Postgres (its port
    from ``postmaster.pid``, its password from the data directory)."""
    assert variant.data is not None
    pidfile = next(variant.data.rglob("postmaster.pid"))
    port = int(pidfile.read_text().splitlines()[3])
    password = (pidfile.parent.parent / "superuser.password").read_text().strip()
    return await asyncpg.connect(host="127.0.0.1", port=port, user="postgres",
                                 password=password, database="postgres")


_WAL = ("SELECT (SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'),"
        " pg_current_wal_lsn() - '0/0'::pg_lsn")


async def wal_position(admin: asyncpg.Connection) -> tuple[int, int]:
    """The cluster's WAL flushes (fsyncs) so far and its WAL position in bytes."""
    row = await admin.fetchrow(_WAL)
    assert row is not None
    return int(row[0]), int(row[1])


def postgres_cpu(variant: Variant) -> float:
    """CPU seconds of the variant's Postgres: the postmaster and every
    backend under it (the pool's backends live as long as its connections:
    the cells reopen none)."""
    assert variant.data is not None
    root = postmaster(variant.data)
    return 0.0 if root is None else sum(cpu_seconds(pid) for pid in tree(root))


async def writers_cell(variant: Variant, mutation: str, writers: int, seconds: float,
                       seq: list[int], admin: asyncpg.Connection) -> dict[str, float]:
    """K closed-loop writers for ``seconds``: mutations/s, answers, CPU, and
    the cluster's WAL flushes and bytes (``admin``: `postgres_admin`)."""
    assert variant.proc is not None
    svc = variant.proc.pid
    answers: list[float] = []
    failed: list[str] = []
    stop = time.monotonic() + seconds
    clients = [LeanClient(variant.addr, max_connections=1) for _ in range(writers)]

    async def writer(w: int, client: LeanClient) -> None:
        while time.monotonic() < stop:
            seq[0] += 1
            n = seq[0]
            if mutation == "create":
                document, field = CREATE, "createBoard"
                variables = {"id": f"c-{variant.name}-{n}", "title": f"c{n}"}
            else:
                document, field = RENAME, "renameBoard"
                variables = {"id": f"w-{w}", "title": f"r{n}"}
            began = time.perf_counter()
            _status, answer = await client.post_json("/graphql", {"query": document,
                                                                  "variables": variables}, WRITER)
            outcome = answer["data"][field]
            if outcome["success"]:
                answers.append(time.perf_counter() - began)
            else:  # counted, not timed: mutations/s counts the committed ones
                failed.append(outcome["error"]["code"])

    fsyncs0, wal0 = await wal_position(admin)
    own0, pg0 = cpu_seconds(svc), postgres_cpu(variant)
    began = time.monotonic()
    try:
        await asyncio.gather(*(writer(w, c) for w, c in enumerate(clients)))
    finally:
        for client in clients:
            await client.aclose()
    elapsed = time.monotonic() - began
    own1, pg1 = cpu_seconds(svc), postgres_cpu(variant)
    fsyncs1, wal1 = await wal_position(admin)
    count = max(1, len(answers))
    return {
        "per_s": len(answers) / elapsed,
        "p50": pct(answers, 0.5) * 1000, "p99": pct(answers, 0.99) * 1000,
        "svc_us": (own1 - own0) / count * 1e6, "pg_us": (pg1 - pg0) / count * 1e6,
        "sum_us": (own1 - own0 + pg1 - pg0) / count * 1e6,
        "failed": len(failed),
        "fsyncs": (fsyncs1 - fsyncs0) / count, "wal_b": float(wal1 - wal0) / count,
    }


async def writers_main(args: argparse.Namespace, variants: list[Variant]) -> None:
    ks = [int(k) for k in args.writers.split(",")]
    mutations = args.mutations.split(",")
    rows: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    loads: list[float] = []
    admins: dict[str, asyncpg.Connection] = {}
    async with contextlib.AsyncExitStack() as stack:
        for variant in variants:
            await stack.enter_async_context(started(variant))
            admins[variant.name] = admin = await postgres_admin(variant)
            stack.push_async_callback(admin.close)
            async with LeanClient(variant.addr, max_connections=8) as lean:
                for w in range(max(ks)):  # each rename writer's own board
                    _s, got = await lean.post_json("/graphql", {"query": CREATE, "variables": {
                        "id": f"w-{w}", "title": f"start {w}"}}, WRITER)
                    assert got["data"]["createBoard"]["success"], got
            for mutation in mutations:  # warm-up
                await writers_cell(variant, mutation, 4, 2.0, [10**6], admin)
        seq = [10**7]
        for _ in range(args.rounds):
            for mutation in mutations:
                for k in ks:
                    for variant in variants:
                        spy = None
                        if args.py_spy:
                            spy = subprocess.Popen(  # noqa: ASYNC220
                                [str(Path(sys.executable).parent / "py-spy"), "record",
                                 "--format", "raw", "-r", "200", "-o",
                                 f"{args.py_spy}.{variant.name}.{mutation}.{k}.txt",
                                 "-p", str(variant.proc.pid if variant.proc else 0)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                            await asyncio.sleep(1)
                        row = await writers_cell(variant, mutation, k, args.seconds, seq,
                                                 admins[variant.name])
                        loads.append(os.getloadavg()[0])
                        rows.setdefault((variant.name, mutation, k), []).append(row)
                        if spy is not None:
                            spy.send_signal(2)
                            await asyncio.to_thread(spy.wait, 30)
    print(f"load average over the cells {min(loads):.2f}-{max(loads):.2f}; "
          f"{args.seconds:g} s per cell x {args.rounds} rounds; 0 subscribers; values as variables")
    print(f"{'variant':<10} {'mutation':<8} {'K':>3} {'mut/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'svc us':>7} {'pg us':>7} {'sum us':>7} {'failed':>6} {'fsyncs':>6} {'WAL B':>6}")
    for (name, mutation, k), got in rows.items():
        for row in got:
            print(f"{name:<10} {mutation:<8} {k:>3} {row['per_s']:>7.0f} {row['p50']:>8.1f} "
                  f"{row['p99']:>8.1f} {row['svc_us']:>7.0f} {row['pg_us']:>7.0f} "
                  f"{row['sum_us']:>7.0f} {row['failed']:>6.0f} {row['fsyncs']:>6.2f}"
                  f" {row['wal_b']:>6.0f}")


async def pipeline_child(count: int, rounds: int, profile: str) -> None:
    """The in-process measurement (run as a child by `in_process`): prints
    one JSON row per round."""
    import cProfile

    from example_service.kernel import Principal
    from example_service.slices import commands
    from example_service.slices.board.commands import create_board, rename_board
    from service_engine import EngineConfig, MutationExecutor, connect_pool
    from service_engine.commands import install_commands
    from service_engine.db import service_migrations
    from service_engine.embedded import EmbeddedPostgres, provision_database
    from service_engine.metrics import Metrics

    writer = Principal(id="writer", actor="writer", org=ORG, roles=frozenset({"board:archive"}))
    with tempfile.TemporaryDirectory(prefix="mutation-inproc-") as tmp:
        pg = EmbeddedPostgres(Path(tmp))
        await asyncio.to_thread(pg.start)
        try:
            provisioned = await provision_database(
                pg, "bench",
                extra_migrations=service_migrations(Path.cwd() / "example_service/migrations"),
                owner_setup=lambda conn: install_commands(conn, commands()))
            db = await connect_pool(provisioned.app_url, min_size=4, max_size=4)
            metrics = Metrics("example", "bench")
            executor = MutationExecutor(db, EngineConfig(service="example"), metrics)
            try:
                for b in range(BOARDS):
                    await executor.execute(writer, create_board, f"start {b}", f"b-{b}")
                seq = 0

                async def round_() -> dict[str, float]:
                    nonlocal seq
                    answers: list[float] = []
                    cpu0 = time.process_time()
                    for _ in range(count):
                        seq += 1
                        began = time.perf_counter()
                        outcome = await executor.execute(
                            writer, rename_board, f"b-{seq % BOARDS}", f"w{seq}")
                        answers.append(time.perf_counter() - began)
                        assert outcome is None, outcome
                    cpu = time.process_time() - cpu0
                    return {"p50": pct(answers, 0.5) * 1000, "p99": pct(answers, 0.99) * 1000,
                            "own_us": cpu / count * 1e6}

                await round_()  # warm-up
                for _ in range(rounds):
                    print(json.dumps(await round_()), flush=True)
                if profile:
                    profiler = cProfile.Profile()
                    profiler.enable()
                    await round_()
                    profiler.disable()
                    profiler.dump_stats(profile)
            finally:
                await db.aclose()
                metrics.shutdown()
        finally:
            await asyncio.to_thread(pg.stop)


def in_process(args: argparse.Namespace, variants: list[Variant]) -> None:
    """Each variant's child one round at a time, round-robin."""
    rows: dict[str, list[dict[str, float]]] = {v.name: [] for v in variants}
    for r in range(args.rounds):
        for variant in variants:
            env = {**os.environ,
                   "PYTHONPATH": os.pathsep.join([str(variant.repo), *variant.path])}
            profile = (f"{args.profile}.{variant.name}.prof"
                       if args.profile and r == args.rounds - 1 else "")
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--pipeline-child",
                 "--count", str(args.count), "--rounds", "1", "--profile", profile],
                cwd=variant.repo, env=env, check=True, capture_output=True, text=True).stdout
            rows[variant.name].extend(json.loads(line) for line in out.splitlines() if line)
    print(f"load average {os.getloadavg()[0]:.2f}; in process: rename_board through "
          f"MutationExecutor, {args.count} calls x {args.rounds} rounds (a child per round)")
    print(f"{'variant':<12} {'round':>5} {'p50 ms':>8} {'p99 ms':>8} {'cpu us/call':>12}")
    for name, got in rows.items():
        for i, row in enumerate(got):
            print(f"{name:<12} {i:>5} {row['p50']:>8.3f} {row['p99']:>8.3f} "
                  f"{row['own_us']:>12.0f}")
        med = {k: pct([r[k] for r in got], 0.5) for k in got[0]}
        print(f"{name:<12} {'med':>5} {med['p50']:>8.3f} {med['p99']:>8.3f} "
              f"{med['own_us']:>12.0f}")


def parse() -> tuple[argparse.Namespace, list[Variant]]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=1)
    parser.add_argument("--board", action="store_true", help="select the result's board")
    parser.add_argument("--py-spy", default="",
                        help="record each variant's rounds with py-spy to FILE.<variant>.txt")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=REPO[:EXTRA_PATH...] (default: this repo)")
    parser.add_argument("--in-process", action="store_true",
                        help="the write pipeline alone, in a child process per variant")
    parser.add_argument("--profile", default="",
                        help="with --in-process: cProfile of the last round to FILE.<variant>.prof")
    parser.add_argument("--writers", default="",
                        help="K[,K...]: closed-loop writers, one keep-alive connection each")
    parser.add_argument("--mutations", default="create,rename",
                        help="with --writers: create and/or rename")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="with --writers: the length of each cell")
    parser.add_argument("--floor", action="store_true",
                        help="with --writers: also the stack's floor (stack_floor.py): floor-gql "
                             "(Strawberry, Starlette, uvicorn, three round trips) and floor-http "
                             "(the same without GraphQL)")
    parser.add_argument("--pipeline-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = []
    for spec in args.variant or [f"this={HERE}"]:
        name, _, paths = spec.partition("=")
        repo, *extra = paths.split(os.pathsep)
        variants.append(Variant(name, Path(repo).resolve(), extra, rows=[]))
    if args.floor:
        floor = str(Path(__file__).resolve().parent / "stack_floor.py")
        variants += [Variant("floor-gql", HERE, [], rows=[], command=(floor, "--graphql")),
                     Variant("floor-http", HERE, [], rows=[], command=(floor,))]
    return args, variants


async def main(args: argparse.Namespace, variants: list[Variant]) -> None:
    document = RENAME_BOARD if args.board else RENAME
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, LeanClient] = {}
        for variant in variants:
            await stack.enter_async_context(started(variant))
            http = await stack.enter_async_context(httpx.AsyncClient(
                base_url=f"http://{variant.addr}", timeout=60,
                headers={"X-Passport": passport("writer")}))
            clients[variant.name] = lean = await stack.enter_async_context(LeanClient(variant.addr))
            for b in range(BOARDS):
                response = await http.post("/graphql", json={"query": CREATE, "variables": {
                    "id": f"b-{b}", "title": f"start {b}"}})
                assert response.json()["data"]["createBoard"]["success"], response.text
            for s in range(args.subscribers):
                ws = await stack.enter_async_context(connect(
                    f"ws://{variant.addr}/graphql/ws", subprotocols=[PROTOCOL],
                    additional_headers={"X-Passport": passport(f"s{s}")}, compression=None,
                    max_queue=None))
                await ws.send(json.dumps({"type": "connection_init"}))
                await ws.recv()
                await ws.send(json.dumps({"id": "1", "type": "subscribe",
                                          "payload": {"query": SUBSCRIPTION}}))
                asyncio.get_running_loop().create_task(drain_socket(ws))
            await round_of(variant, lean, 50, document, 0)  # warm-up
        seq = 1000
        for _ in range(args.rounds):
            for variant in variants:
                assert variant.rows is not None and variant.proc is not None
                spy = None
                if args.py_spy:
                    spy = subprocess.Popen(  # noqa: ASYNC220
                        [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
                         "-r", "200", "-o", f"{args.py_spy}.{variant.name}.txt",
                         "-p", str(variant.proc.pid)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    await asyncio.sleep(1)
                variant.rows.append(await round_of(variant, clients[variant.name], args.count,
                                                   document, seq))
                seq += args.count
                if spy is not None:
                    spy.send_signal(2)
                    await asyncio.to_thread(spy.wait, 30)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.count} mutations x {args.rounds} "
          f"rounds; {args.subscribers} subscriber(s); board selected: {args.board}")
    print(f"{'variant':<12} {'round':>5} {'p50 ms':>8} {'p99 ms':>8} {'svc cpu us':>11} "
          f"{'of it sys':>10} {'tree cpu us':>12}")
    for variant in variants:
        assert variant.rows is not None
        for i, row in enumerate(variant.rows):
            print(f"{variant.name:<12} {i:>5} {row['p50']:>8.2f} {row['p99']:>8.2f} "
                  f"{row['own_us']:>11.0f} {row['sys_us']:>10.0f} {row['tree_us']:>12.0f}")
        med = {k: pct([r[k] for r in variant.rows], 0.5) for k in variant.rows[0]}
        print(f"{variant.name:<12} {'med':>5} {med['p50']:>8.2f} {med['p99']:>8.2f} "
              f"{med['own_us']:>11.0f} {med['sys_us']:>10.0f} {med['tree_us']:>12.0f}")


if __name__ == "__main__":
    parsed, chosen = parse()
    if parsed.pipeline_child:
        asyncio.run(pipeline_child(parsed.count, parsed.rounds, parsed.profile))
    elif parsed.writers:
        asyncio.run(writers_main(parsed, chosen))
    elif parsed.in_process:
        in_process(parsed, chosen)
    else:
        asyncio.run(main(parsed, chosen))
