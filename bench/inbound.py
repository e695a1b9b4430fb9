"""Inbound throughput: commands/s end to end through the engine's reaction
loop, side by side with raw JetStream consume+ack and a raw Postgres commit
of the same effect.

    python bench/inbound.py [--commands 3000] [--window 256] [--sync both] [--pods 1,2]
    BENCH_INBOUND_PROFILE=/tmp/pod.prof python bench/inbound.py ...  # pods' CPU profile
    BENCH_INBOUND_PYSPY=/tmp/pod python bench/inbound.py ...  # py-spy of the measured cell
    python bench/inbound.py --reactions 3000 --pods 0 --sync default  # the reaction alone

Starts a durable embedded Postgres (fsync on) and, in turn, a nats-server
with ``sync_interval: always`` (as production should run it) and one with
the server's default (acknowledged before on disk), declares the
integration streams, then measures for each:

* **engine, 1 pod / 2 pods**: each pod a separate process running an engine
  with the orders sample's ``place_order`` reaction (claim, advisory lock,
  load, create the order and an effect row, one impact, the confirmation
  staged in the outbox, commit, ack). The bench process publishes
  ``--commands`` commands with up to ``--window`` unacknowledged publishes
  and times publish -> effect committed -> confirmation received (the
  ``order.placed`` event the leader's outbox relay publishes); plus the
  round-trip latency of single commands on an idle system.
* **raw JetStream consume+ack**: one process pulling the same number of
  messages from a durable on the same stream (batch 64) and acking each,
  no database: the broker's ceiling for this loop.
* **raw Postgres commit**: 16 concurrent asyncpg transactions doing the
  effect's writes (claim row, order row, effect row, outbox row, one
  pg_notify), no NATS: the database's ceiling for this effect. It runs
  right before and right after each engine cell (their mean is the cell's
  baseline, and the ratio line divides by it).

Every engine cell and the raw commit also print the CPU each effect cost,
by process (from /proc: the pods, the Postgres server's backends, the
nats-server, this bench process): on a shared 2-core machine throughput
follows the load, CPU per effect much less.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nats  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig  # noqa: E402

from conformance.support.sample_orders import PlaceOrder, place_order  # noqa: E402
from service_engine import Engine, EngineConfig, ReadinessHandle  # noqa: E402
from service_engine.db import Database, connect_pool, service_migrations  # noqa: E402
from service_engine.embedded import (  # noqa: E402
    INTEGRATION_STREAMS,
    EmbeddedNats,
    EmbeddedPostgres,
    provision_database,
)
from service_engine.impacts import Impact, encode_group, new_group_id  # noqa: E402
from service_engine.impacts.transport import CHANNEL  # noqa: E402
from service_engine.messaging.envelope import (  # noqa: E402
    Actor,
    EventMetadata,
    build_command,
    publish_headers,
)
from service_engine.messaging.nats import open_nats  # noqa: E402

CONFIRMATIONS = "integration.evt.orders.order.placed"
RAW_SUBJECT = "integration.cmd.bench.raw.ping"
CONCURRENCY = 16
POD_CONCURRENCY = int(os.environ.get("BENCH_INBOUND_CONCURRENCY", CONCURRENCY))
"""Reactions in flight per pod (the reaction's ``concurrency``)."""
BEAT = timedelta(milliseconds=int(os.environ.get("BENCH_INBOUND_BEAT_MS", "50")))
"""The pods' beat (the engine's default is 1 s; the bench's 50 ms makes a
second pod take over the relay lease quickly)."""


def pod_config(name: str) -> EngineConfig:
    return EngineConfig(
        service="orders", pod_id=name, beat_interval=BEAT,
        lease=timedelta(seconds=2), ack_wait=timedelta(seconds=30),
    )


# -- CPU accounting (Linux /proc) ------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(ppid, CPU seconds, of which in the kernel) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, int(fields[12]) / _TICK


@dataclass
class CpuMeter:
    """CPU seconds of the processes of one run, by role: the pods, the
    Postgres server (postmaster and backends), the nats-server, this
    bench process."""

    pgdata: Path
    nats_dir: Path | None = None
    pods: tuple[int, ...] = ()

    def _pids(self) -> dict[str, list[int]]:
        roles: dict[str, list[int]] = {"pod": list(self.pods), "postgres": [],
                                       "nats": [], "bench": [os.getpid()]}
        try:
            postmaster = int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            postmaster = -1
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _stat(pid)
            if stat is None:
                continue
            if pid == postmaster or stat[0] == postmaster:
                roles["postgres"].append(pid)
            elif self.nats_dir is not None:
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"nats-server" in cmdline and str(self.nats_dir).encode() in cmdline:
                    roles["nats"].append(pid)
        return roles

    def snapshot(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for role, pids in self._pids().items():
            stats = [stat for pid in pids if (stat := _stat(pid)) is not None]
            out[role] = sum(stat[1] for stat in stats)
            out[f"{role} sys"] = sum(stat[2] for stat in stats)
        return out

    @staticmethod
    def per_unit(before: dict[str, float], after: dict[str, float], units: int) -> str:
        """CPU ms per unit by role, and the sum."""
        parts = {role: (after.get(role, 0.0) - before.get(role, 0.0)) * 1000 / units
                 for role in after}
        total = sum(ms for role, ms in parts.items() if not role.endswith(" sys"))
        listed = ", ".join(
            f"{role} {ms:.2f} (sys {parts[f'{role} sys']:.2f})" for role, ms in parts.items()
            if ms > 0.005 and not role.endswith(" sys")
        )
        return f"CPU ms each: {listed}; total {total:.2f}"

    @staticmethod
    def total(line: str) -> float:
        """The total of a `per_unit` line."""
        return float(line.rsplit("total ", 1)[1])


# -- child roles -----------------------------------------------------------------------


async def run_pod(db_url: str, nats_url: str, name: str) -> None:
    """A pod: the engine with ``place_order`` until SIGTERM."""
    db = await connect_pool(db_url, max_size=POD_CONCURRENCY + 4)
    conn = await open_nats(nats_url)
    readiness = ReadinessHandle()
    engine = await Engine.boot(pod_config(name), db, conn, readiness)
    engine.register_reaction(place_order(name, concurrency=POD_CONCURRENCY))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, engine.shutdown)
    task = asyncio.create_task(engine.run())
    while not readiness.is_up:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    print("ready", flush=True)
    try:
        await task
    finally:
        await conn.aclose()
        await db.aclose()


async def run_raw_consumer(nats_url: str, durable: str) -> None:
    """Pull and ack a durable's frames until SIGTERM; no database."""
    client = await nats.connect(nats_url)
    js = client.jetstream()
    sub = await js.pull_subscribe_bind(durable, stream="INTEGRATION_CMD")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    while not stop.is_set():
        try:
            msgs = await sub.fetch(64, timeout=0.05)
        except (nats.errors.TimeoutError, TimeoutError):
            continue
        for msg in msgs:
            await msg.ack()
    await client.close()


@contextlib.asynccontextmanager
async def child(*args: str) -> AsyncIterator[int]:
    """A child process of this script in ``args``' role; yields its pid."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, *args, stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        if line != b"ready\n":
            raise RuntimeError(f"child {args[0]} did not start: {line!r}")
        yield process.pid
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 20)
            except TimeoutError:
                process.kill()
                await process.wait()


@contextlib.asynccontextmanager
async def pyspy(pids: list[int], cell: str) -> AsyncIterator[None]:
    """With ``BENCH_INBOUND_PYSPY=<prefix>``: py-spy samples each pod
    (threads not idle, collapsed stacks in ``<prefix>.<cell>.<pid>.txt``) for
    the measured cell. It pauses the pod for each sample (whole stacks), so
    that cell's figures are a little low; a thread in a socket write counts
    while the kernel has it descheduled (wall time, not CPU)."""
    prefix = os.environ.get("BENCH_INBOUND_PYSPY")
    if not prefix:
        yield
        return
    spies = [await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("py-spy")), "record", "--format", "raw", "--rate", "250",
        "--output", f"{prefix}.{cell}.{pid}.txt", "--pid", str(pid),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    ) for pid in pids]
    await asyncio.sleep(0.5)  # attached
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            await spy.wait()


# -- the measurements -------------------------------------------------------------------


class Producer:
    def __init__(self, client: nats.NATS) -> None:
        self.js = client.jetstream()
        self.metadata = EventMetadata.originating(Actor.service("bench"))

    def command(self, order_id: str) -> tuple[str, bytes, dict[str, str]]:
        message = build_command(
            PlaceOrder(order_id=order_id), service="bench", metadata=self.metadata,
            occurred_at=datetime.now(UTC),
        )
        return (message.subject, message.body_json().encode(),
                publish_headers(message.message_id))

    async def publish_all(self, frames: list[tuple[str, bytes, dict[str, str]]],
                          window: int) -> None:
        slots = asyncio.Semaphore(window)

        async def one(frame: tuple[str, bytes, dict[str, str]]) -> None:
            async with slots:
                await self.js.publish(frame[0], frame[1], headers=frame[2])

        await asyncio.gather(*(one(f) for f in frames))


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p99: float

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        ordered = sorted(values)
        return cls(statistics.median(ordered), ordered[max(int(len(ordered) * 0.99) - 1, 0)])


@dataclass(frozen=True)
class Run:
    effects_per_s: float
    confirmed_per_s: float
    to_commit: Percentiles
    to_confirm: Percentiles
    cpu: str = ""


async def engine_run(client: nats.NATS, db: Database, producer: Producer, commands: int,
                     window: int, meter: CpuMeter | None = None) -> Run:
    """Effects committed/s, confirmations received/s, and the idle latency
    of one command to its commit and to its confirmation.

    A commit is seen by LISTENing on the impact channel (each effect
    commits one NOTIFY, delivered only after the commit), so measuring
    costs the database nothing."""
    run = uuid.uuid4().hex[:8]
    confirmed: dict[str, float] = {}
    commits: list[float] = []
    wanted = {"commits": commands, "confirmations": commands}
    enough_commits, all_in = asyncio.Event(), asyncio.Event()

    def on_commit(*_: object) -> None:
        commits.append(time.perf_counter())
        if len(commits) >= wanted["commits"]:
            enough_commits.set()

    async def on_confirmation(msg: nats.aio.msg.Msg) -> None:
        body = json.loads(msg.data)
        if not isinstance(body, dict) or not isinstance(body.get("payload"), dict):
            return
        order = body["payload"].get("order_id", "")
        if order.startswith(run) and order not in confirmed:
            confirmed[order] = time.perf_counter()
            if len(confirmed) >= wanted["confirmations"]:
                all_in.set()

    listener = await db.connect_dedicated()
    await listener.add_listener(CHANNEL, on_commit)
    sub = await client.subscribe(CONFIRMATIONS, cb=on_confirmation)
    to_commit: list[float] = []
    to_confirm: list[float] = []
    try:
        frames = [producer.command(f"{run}-{i}") for i in range(commands)]
        cpu_before = meter.snapshot() if meter is not None else {}
        started = time.perf_counter()
        await producer.publish_all(frames, window)
        await asyncio.wait_for(enough_commits.wait(), 600)
        await asyncio.wait_for(all_in.wait(), 600)
        cpu = "" if meter is None else CpuMeter.per_unit(cpu_before, meter.snapshot(), commands)
        effects = commands / (commits[commands - 1] - started)
        rate = commands / (max(confirmed.values()) - started)

        for i in range(50):  # one at a time on an idle system
            order = f"{run}-lat-{i}"
            wanted["commits"] = len(commits) + 1
            wanted["confirmations"] = len(confirmed) + 1
            enough_commits.clear()
            all_in.clear()
            sent = time.perf_counter()
            await producer.publish_all([producer.command(order)], 1)
            await asyncio.wait_for(enough_commits.wait(), 30)
            await asyncio.wait_for(all_in.wait(), 30)
            to_commit.append((commits[-1] - sent) * 1000)
            to_confirm.append((confirmed[order] - sent) * 1000)
    finally:
        await sub.unsubscribe()
        await listener.close()
    return Run(effects, rate, Percentiles.of(to_commit), Percentiles.of(to_confirm), cpu)


async def raw_js_run(server: EmbeddedNats, client: nats.NATS, commands: int,
                     window: int) -> float:
    """Messages/s published and consumed+acked by a raw pull consumer process."""
    js = client.jetstream()
    durable = f"bench-raw-{uuid.uuid4().hex[:6]}"
    await js.add_consumer("INTEGRATION_CMD", ConsumerConfig(
        durable_name=durable, ack_policy=AckPolicy.EXPLICIT, filter_subject=RAW_SUBJECT,
        max_ack_pending=1024,
    ))
    producer = Producer(client)
    frames = [(RAW_SUBJECT, b'{"n":1}', {"Nats-Msg-Id": uuid.uuid4().hex})
              for _ in range(commands)]
    async with child("--role", "raw-js", server.url, durable):
        started = time.perf_counter()
        await producer.publish_all(frames, window)
        while True:
            info = await js.consumer_info("INTEGRATION_CMD", durable)
            if info.num_pending == 0 and info.num_ack_pending == 0 \
                    and info.ack_floor.stream_seq >= info.delivered.stream_seq > 0:
                break
            await asyncio.sleep(0.005)
        took = time.perf_counter() - started
    return commands / took


async def raw_pg_run(db: Database, commits: int, meter: CpuMeter | None = None
                     ) -> tuple[float, str]:
    """Commits/s of the effect's writes done by hand, 16 clients (and the
    CPU each commit cost)."""
    run = uuid.uuid4().hex[:8]
    [frame] = encode_group(new_group_id(), [Impact.entity("order", "x")])
    counter = iter(range(commits))

    async def client() -> None:
        for i in counter:
            order = f"{run}-{i}"
            async with db.pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO service_engine.message_claim (message_id, reaction) "
                    "VALUES ($1, 'raw') ON CONFLICT DO NOTHING", uuid.uuid4())
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", order)
                await conn.fetchrow("SELECT * FROM sample_order WHERE id = $1 FOR UPDATE", order)
                await conn.execute(
                    "INSERT INTO sample_order (id, item, qty) VALUES ($1, 'widget', 1)", order)
                await conn.execute(
                    "INSERT INTO sample_order_effect (id, reaction, order_id, message_id) "
                    "VALUES ($1, 'raw', $2, $3)", uuid.uuid4(), order, uuid.uuid4())
                # Written as already published: the raw commit runs beside idle
                # pods, whose relay must not publish (and so load) its rows. (A
                # PENDING row adds one entry to the pending index, no more.)
                await conn.execute(
                    "INSERT INTO service_engine.integration_outbox"
                    " (message_id, subject, payload, status) VALUES ($1, $2, $3, 'PUBLISHED')",
                    uuid.uuid4(), CONFIRMATIONS, {"order_id": order})
                await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, frame)

    cpu_before = meter.snapshot() if meter is not None else {}
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    rate = commits / (time.perf_counter() - started)
    cpu = "" if meter is None else CpuMeter.per_unit(cpu_before, meter.snapshot(), commits)
    return rate, cpu


async def reaction_run(db: Database, reactions: int, meter: CpuMeter) -> tuple[float, str]:
    """Reactions/s of ``place_order`` run in this process through
    `ReactionRunner.handle` (identify, decode, the pipeline transaction,
    the disposition), 16 at a time, no NATS, no relay, no render runtime:
    the reaction's own cost (the bench's CPU is the reaction's client CPU)."""
    from service_engine.inbound.dispatch import InboundFrame, ReactionRunner
    from service_engine.messaging.dead_letters import DeadLetters

    runner = ReactionRunner(place_order("inproc", concurrency=CONCURRENCY), db,
                            EngineConfig(service="orders"), DeadLetters(db))
    producer = Producer.__new__(Producer)
    producer.metadata = EventMetadata.originating(Actor.service("bench"))
    run = uuid.uuid4().hex[:8]
    frames = iter([InboundFrame(*producer.command(f"{run}-{i}"), 1) for i in range(reactions)])

    async def worker() -> None:
        for frame in frames:
            await runner.handle(frame)

    cpu_before = meter.snapshot()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    rate = reactions / (time.perf_counter() - started)
    return rate, CpuMeter.per_unit(cpu_before, meter.snapshot(), reactions)


async def measure_reactions(db: Database, reactions: int, meter: CpuMeter) -> None:
    """The in-process reaction cell beside the raw commit (before and after)."""
    raw_before, raw_cpu = await raw_pg_run(db, reactions, CpuMeter(meter.pgdata))
    await db.pool.expire_connections()  # fresh statement caches: the reactions' alone
    await reaction_run(db, 200, meter)  # warm: new connections, prepared statements
    rate, cpu = await reaction_run(db, reactions, meter)
    async with db.pool.acquire() as conn:  # asyncpg's statement cache, as the server sees it
        prepared = await conn.fetch(
            "SELECT statement, generic_plans + custom_plans AS runs"
            " FROM pg_prepared_statements ORDER BY runs DESC")
    raw_after, _ = await raw_pg_run(db, reactions)
    raw = (raw_before + raw_after) / 2
    print(f"{'in-process reactions (16 at a time, no NATS)':52} {rate:>10.0f}")
    print(f"    {cpu}")
    print(f"    one pool connection's prepared statements: {len(prepared)}, run "
          + ", ".join(f"{r['runs']}x {' '.join(r['statement'].split()[:3])}" for r in prepared))
    print(f"{'raw Postgres commit of the effect (16 clients)':52} {raw:>10.0f}"
          f"   (just before {raw_before:.0f}, just after {raw_after:.0f})")
    print(f"    {raw_cpu}")
    print(f"    reactions/s = {rate / raw:.0%} of the raw commit's; CPU per reaction "
          f"{CpuMeter.total(cpu) / CpuMeter.total(raw_cpu):.1f}x the raw commit's", flush=True)


async def measure_engine(client: nats.NATS, db: Database, producer: Producer, db_url: str,
                         server: EmbeddedNats, commands: int, window: int, label: str,
                         pod_counts: tuple[int, ...], meter: CpuMeter,
                         loops: tuple[str, ...] = ("asyncio",)) -> None:
    for pods, loop in [(pods, loop) for pods in pod_counts for loop in loops]:
        async with contextlib.AsyncExitStack() as stack:
            pids = [await stack.enter_async_context(child(
                "--role", "pod", db_url, server.url, f"pod{p}", loop,
            )) for p in range(pods)]
            # Warm up: prepared statements, the outbox lease.
            await engine_run(client, db, producer, 200, window)
            # The raw commit is measured right before and right after the
            # engine cell: on a shared machine the load drifts between cells.
            raw_before, raw_cpu = await raw_pg_run(db, commands, CpuMeter(meter.pgdata))
            meter.pods = tuple(pids)
            async with pyspy(pids, f"{label.split()[1]}-{pods}-{loop}"):
                run = await engine_run(client, db, producer, commands, window, meter)
            raw_after, _ = await raw_pg_run(db, commands)
        raw = (raw_before + raw_after) / 2
        label_loop = f"{label}, {loop}" if len(loops) > 1 else label
        print(f"{f'engine, {pods} pod(s), nats {label_loop}: effect committed':52} "
              f"{run.effects_per_s:>10.0f} {run.to_commit.p50:>8.1f} "
              f"{run.to_commit.p99:>8.1f}")
        print(f"{f'engine, {pods} pod(s), nats {label_loop}: confirmation received':52} "
              f"{run.confirmed_per_s:>10.0f} {run.to_confirm.p50:>8.1f} "
              f"{run.to_confirm.p99:>8.1f}", flush=True)
        print(f"    {run.cpu}", flush=True)
        print(f"{'raw Postgres commit of the effect (16 clients)':52} {raw:>10.0f}"
              f"   (just before {raw_before:.0f}, just after {raw_after:.0f})")
        print(f"    {raw_cpu}")
        print(f"    engine effects/s = {run.effects_per_s / raw:.0%} of the raw commit's; "
              f"CPU per effect {CpuMeter.total(run.cpu) / CpuMeter.total(raw_cpu):.1f}x "
              "the raw commit's", flush=True)
    rate = await raw_js_run(server, client, commands, window)
    print(f"{f'raw JetStream publish+consume+ack, nats {label}':52} {rate:>10.0f}", flush=True)


async def main(commands: int, window: int, *, syncs: tuple[bool, ...],
               pod_counts: tuple[int, ...], loops: tuple[str, ...] = ("asyncio",),
               reactions: int = 0) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-inbound-") as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg", durable=True)
        await asyncio.to_thread(pg.start)
        try:
            provisioned = await provision_database(
                pg, "bench", extra_migrations=service_migrations(ROOT / "conformance/migrations")
            )
            db = await connect_pool(provisioned.app_url, min_size=CONCURRENCY,
                                    max_size=CONCURRENCY)
            try:
                print(f"{commands} commands, publish window {window}, durable Postgres, "
                      "2 cores shared by everything")
                print(f"{'path':52} {'per second':>10} {'p50 ms':>8} {'p99 ms':>8}")
                print("(latency: one command at a time on an idle system, from its publish)")
                if reactions:
                    await measure_reactions(db, reactions, CpuMeter(pg.pgdata))
                for sync in syncs if any(pod_counts) else ():
                    label = "sync always" if sync else "sync default"
                    server = EmbeddedNats(Path(tmp) / f"nats-{label.split()[1]}",
                                          sync_always=sync)
                    await asyncio.to_thread(server.start)
                    try:
                        client = await nats.connect(server.url)
                        js = client.jetstream()
                        for name, subjects in INTEGRATION_STREAMS.items():
                            await js.add_stream(
                                StreamConfig(name=name, subjects=subjects, max_age=86400))
                        meter = CpuMeter(pg.pgdata, Path(tmp) / f"nats-{label.split()[1]}")
                        try:
                            await measure_engine(client, db, Producer(client),
                                                 provisioned.app_url, server, commands,
                                                 window, label, pod_counts, meter, loops)
                        finally:
                            await client.close()
                    finally:
                        await asyncio.to_thread(server.stop)
            finally:
                await db.aclose()
        finally:
            await asyncio.to_thread(pg.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--commands", type=int, default=3000)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--sync", choices=("both", "always", "default"), default="both",
                        help="nats-server with sync_interval: always, its default, or both "
                             "side by side (the default)")
    parser.add_argument("--pods", default="1,2", help="pod counts to run, e.g. 1 or 1,2")
    parser.add_argument("--loop", default="asyncio",
                        help="the pods' event loop: asyncio, uvloop, or both side by side "
                             "(asyncio,uvloop); uvloop must be installed")
    parser.add_argument("--reactions", type=int, default=0,
                        help="first run N reactions in this process (no NATS) beside the "
                             "raw commit: the reaction's own cost")
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role and args.role[0] == "pod" and args.role[4:5] == ["uvloop"]:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if args.role and args.role[0] == "pod":
        profile_to = os.environ.get("BENCH_INBOUND_PROFILE")
        if profile_to:  # CPU time (not wall time) by function, for a pod's whole life
            import cProfile

            profiler = cProfile.Profile(time.process_time)
            try:
                profiler.runcall(asyncio.run, run_pod(*args.role[1:4]))
            finally:
                profiler.dump_stats(f"{profile_to}.{args.role[3]}")
        else:
            asyncio.run(run_pod(*args.role[1:4]))
    elif args.role and args.role[0] == "raw-js":
        asyncio.run(run_raw_consumer(*args.role[1:3]))
    else:
        syncs = {"both": (True, False), "always": (True,), "default": (False,)}[args.sync]
        asyncio.run(main(args.commands, args.window, syncs=syncs,
                         pod_counts=tuple(int(n) for n in args.pods.split(",")),
                         loops=tuple(args.loop.split(",")), reactions=args.reactions))
