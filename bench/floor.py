"""The 1-subscriber cell's floor on this machine: a write answered and
delivered with K Postgres round trips and nothing else, beside the engine.

    python bench/floor.py [--seconds 6] [--rate 50] [--trips 1,3,5,8,10] [--rounds 2] [--no-engine]

What ``e2e.py``'s ``1 / 1 / 50`` cell times (a write sent, its answer, its
delta received by one subscriber) has a floor set by the machine, not the
engine: every hop between processes (bench -> service, service <->
Postgres, Postgres -> the service's listener, service -> subscriber) wakes a
sleeping process on another core, and at 50 writes/s every process is asleep
when its turn comes. This script measures that floor directly.

The floor service (this file with ``--serve``, a child process like the
engine's pod) speaks one line per message over loopback TCP: a writer's line
is a title; the service writes it with K round trips on one asyncpg
connection and answers ``ok``; a subscriber's connection receives each
committed title as a line, sent from the NOTIFY callback of a second
connection. K = 1 is one autocommit statement (an ``UPDATE`` and its
``pg_notify``); K >= 2 is ``BEGIN``, then ``SELECT ... FOR UPDATE`` and
``UPDATE`` and advisory locks as fillers up to K - 1 round trips, then
``pg_notify`` and ``COMMIT`` in one simple query (as the engine's last round
trip carries its NOTIFY with the COMMIT). Nothing else runs: no HTTP, no
GraphQL, no command layer, no render pass. Writes rotate over five rows, like
``e2e.py``'s five boards per org. The Postgres server is durable (fsync on),
as the engine's is.

Beside it, the same run measures the engine's cell (``e2e.py``'s
``1 / 1 / 50``: HTTP ``renameBoard``, a ``boards`` subscription over
graphql-transport-ws), whose write takes 8 round trips
(``conformance/write/test_mutation_statements.py``). Variants alternate, ``--rounds``
times each. ``cpu us`` is the service process's CPU per write (user + sys;
not Postgres's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
from e2e import cell, cpu_seconds, pct, service

from service_engine.embedded import EmbeddedPostgres

ROWS = 5


async def serve(url: str, port: int, trips: int) -> None:
    """The floor service: ``trips`` round trips per write, NOTIFY to subscribers."""
    writer = await asyncpg.connect(url)
    listener = await asyncpg.connect(url)
    await writer.execute("CREATE TABLE IF NOT EXISTS floor_board (id int PRIMARY KEY, title text)")
    await writer.execute(f"INSERT INTO floor_board SELECT g, '' FROM generate_series(0, {ROWS - 1}) g "
                         "ON CONFLICT DO NOTHING")
    subscribers: list[asyncio.StreamWriter] = []

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        frame = payload.encode() + b"\n"
        for subscriber in subscribers:
            subscriber.write(frame)

    await listener.add_listener("floor", on_notify)

    async def write(seq: int, title: str) -> None:
        row = seq % ROWS
        if trips == 1:
            await writer.execute(
                "WITH u AS (UPDATE floor_board SET title = $1 WHERE id = $2 RETURNING id) "
                "SELECT pg_notify('floor', $1) FROM u", title, row)
            return
        await writer.execute("BEGIN")
        fillers = trips - 2
        if fillers >= 2:
            await writer.fetchrow("SELECT * FROM floor_board WHERE id = $1 FOR UPDATE", row)
            fillers -= 1
        for _ in range(fillers - 1):
            await writer.execute("SELECT pg_advisory_xact_lock($1)", row)
        if fillers >= 1:
            await writer.execute("UPDATE floor_board SET title = $1 WHERE id = $2", title, row)
            await writer.execute(f"SELECT pg_notify('floor', $t${title}$t$); COMMIT")
        else:
            await writer.execute(f"UPDATE floor_board SET title = $t${title}$t$ WHERE id = {row}; "
                                 f"SELECT pg_notify('floor', $t${title}$t$); COMMIT")

    async def handle(reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        if line == b"subscribe\n":
            subscribers.append(out)
            out.write(b"ok\n")
            return
        seq = 0
        while line:
            await write(seq, line.decode().strip())
            out.write(b"ok\n")
            seq += 1
            line = await reader.readline()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


async def arrival(reader: asyncio.StreamReader) -> float:
    await reader.readline()
    return time.perf_counter()


async def floor_cell(url: str, trips: int, rate: float, seconds: float) -> dict[str, float]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "--serve", url, str(port), str(trips)],  # noqa: ASYNC220
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        await asyncio.to_thread(proc.stdout.readline)
        sub_r, sub_w = await asyncio.open_connection("127.0.0.1", port)
        sub_w.write(b"subscribe\n")
        await sub_r.readline()
        w_r, w_w = await asyncio.open_connection("127.0.0.1", port)
        latencies: list[float] = []
        acks: list[float] = []
        n = int(seconds * rate)
        cpu0 = cpu_seconds(proc.pid)
        begin = time.perf_counter()
        for i in range(n):
            await asyncio.sleep(max(0.0, begin + i / rate - time.perf_counter()))
            sent = time.perf_counter()
            w_w.write(f"t{trips}-{i}\n".encode())
            # One write in flight: its delta and its answer, each timed on arrival.
            delta = asyncio.ensure_future(arrival(sub_r))
            await w_r.readline()
            acks.append(time.perf_counter() - sent)
            latencies.append(await delta - sent)
        cpu = (cpu_seconds(proc.pid) - cpu0) / n * 1e6
        sub_w.close()
        w_w.close()
    finally:
        proc.terminate()
        proc.wait(10)
    return {"p50": pct(latencies, 0.5) * 1e3, "p99": pct(latencies, 0.99) * 1e3,
            "ack_p50": pct(acks, 0.5) * 1e3, "cpu_us": cpu}


async def run(args: argparse.Namespace) -> None:
    trips = [int(t) for t in args.trips.split(",")]
    rows: list[tuple[str, str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="floor-") as folder:
        pg = EmbeddedPostgres(Path(folder))
        pg.start()
        try:
            engine = service({}) if not args.no_engine else None
            svc = await engine.__aenter__() if engine is not None else None
            try:
                for r in range(args.rounds):
                    for k in trips:
                        rows.append((f"floor, {k} trips", str(k),
                                     await floor_cell(pg.admin_url, k, args.rate, args.seconds)))
                    if svc is not None:
                        result = await cell(svc, f"floor{r}", 1, 1, args.rate, args.seconds)
                        rows.append(("engine (e2e 1/1)", "8", result))
            finally:
                if engine is not None:
                    await engine.__aexit__(None, None, None)
        finally:
            pg.stop()
    print(f"\nload average {os.getloadavg()[0]:.2f}; {args.rate:g} writes/s, {args.seconds:g} s a cell")
    print(f"{'variant':20} {'trips':>5} {'p50 ms':>8} {'p99 ms':>8} {'ack p50':>8} {'cpu us':>8}")
    for label, k, result in rows:
        print(f"{label:20} {k:>5} {result['p50']:8.2f} {result['p99']:8.2f} "
              f"{result['ack_p50']:8.2f} {result['cpu_us']:8.0f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        asyncio.run(serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--rate", type=float, default=50)
    parser.add_argument("--trips", default="1,3,5,8,10")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-engine", action="store_true", help="the floor cells alone")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
