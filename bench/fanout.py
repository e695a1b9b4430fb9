"""Fan-out: commit -> delta latency, backlog, overflows and CPU per delivered
delta for N sessions in 1, 50 or per-principal cohorts at a steady write
rate, the engine side by side with the per-subscriber strategy (each session
re-queries its own row per impact, as Supabase-style delivery does).

    python bench/fanout.py [--seconds 4] [--rate 200] [--sizes 100,1000,10000]
                           [--cohorts 1,50,pp] [--deletes 0.1] [--grace 0.5]

The load: one writer in a child process (the writers are other pods) commits
``--rate`` operations/s on 200 cards: an upsert (a random org of the cell's
cohorts, a random rank, the commit's start time as title) or, for a
``--deletes`` share, a delete. In 50 cohorts an upsert usually moves the card
to another org, so Removes come from moves as well as deletes. The window
(`RankQuery(200)`) holds every visible card: nothing leaves a window by its
bound, so a session's expected changes follow from the writes alone.

Both strategies deliver the same delta set: per session, an Upsert when a
visible card's view changed or a card became visible, a Remove when a card
it held was deleted or left its cohorts, a Reset (counted apart) when a
backlog is replaced by a snapshot. The bench replays the writes against each
session's cohorts and scores every expected change of every session:

* latency: commit start -> the first delta on that session that shows this
  write or a later one of the same card (a coalesced write counts at the delta
  that superseded it); the engine's deltas are timed when put on the session
  stream, the per-subscriber ones when its query returns;
* ``netted``: expected changes that needed no delta: the card appeared and
  disappeared again while the session showed it absent (coalesced away);
  not in the percentiles;
* ``late``: expected changes never delivered by the end (writers stopped, then
  ``--grace`` seconds). They stay in the percentiles with their wait so far as
  a lower bound; a percentile that lands on one prints as ``>N``;
* ``q@stop``: expected changes not yet delivered when the writers stopped
  (the late ones included);
* ``backlog``: impacts committed but not yet rendered (engine) or processed
  (per-subscriber) at the end;
* ``ovf s/c``: session-stream overflows (the backlog dropped, a Reset follows;
  the dropped deltas are not counted as delivered) / listener-channel overflows;
* ``extra``: delivered Upserts/Removes that match no expected change (0 when
  the strategy is exact);
* ``cpu us/d``: this process's CPU (the writer excluded) from the first write
  to the end, per delivered Upsert or Remove (Resets excluded);
* ``db us/d``: the Postgres server's CPU over the same span (its backends,
  the writer's included, and its own processes), per delivered Upsert or Remove.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.support.sample_cards import (
    Card,
    CardsView,
    Principal,
    RankQuery,
    delete_card,
    write_card,
)
from service_engine import EngineConfig, Query, ReadinessHandle, WindowSpec
from service_engine.db import Database, connect_pool, service_migrations
from service_engine.embedded import EmbeddedPostgres, provision_database
from service_engine.impacts.transport import PgListenNotify
from service_engine.render import Remove, Reset, Upsert
from service_engine.render.runtime import RenderRuntime

MIGRATIONS = Path(__file__).resolve().parents[1] / "conformance" / "migrations"
KEYS = 200

Op = tuple[str, str | None, int]
"""One committed write: card id, its org (None: deleted), commit start (ns)."""

Event = tuple[int, str, Any, int]
"""One delivered delta, as scored: (ns, "u" | "r" | "reset", payload, seen)
with payload (card id, title ns) for an Upsert, the card id for a Remove and
{card id: title ns} for a Reset; ``seen``: how many writes the strategy had
taken in (impacts drained or being processed) when it produced the delta."""


class PerPrincipal(CardsView):
    """The same view grouped per principal (the default cohort)."""

    NAME = "cards_pp"

    def cohort(self, principal: Principal) -> Any:  # the base default
        return super(CardsView, self).cohort(principal)


def principals(n: int, cohorts: str) -> list[Principal]:
    if cohorts == "1":
        return [Principal(f"p{i}", frozenset({"o0"})) for i in range(n)]
    return [Principal(f"p{i}", frozenset({f"o{i % 50}"})) for i in range(n)]


# -- the writer (a child process) -------------------------------------------------


async def _write(url: str, cohorts: str, rate: int, seconds: float, deletes: float) -> list[Op]:
    rng = random.Random(1)
    interval = 1.0 / rate
    ops: list[Op] = []
    db = await connect_pool(url, min_size=1, max_size=1)
    async with db.pool.acquire() as conn:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            key = f"k{rng.randrange(KEYS)}"
            org = None if rng.random() < deletes else ("o0" if cohorts == "1" else f"o{rng.randrange(50)}")
            rank = rng.randrange(1000)
            stamp = time.perf_counter_ns()  # CLOCK_MONOTONIC: shared by every process
            if org is None:
                await delete_card(conn, key)
            else:
                await write_card(conn, Card(key, org, rank, str(stamp)))
            ops.append((key, org, stamp))
            await asyncio.sleep(max(0.0, start + len(ops) * interval - time.perf_counter()))
    await db.aclose()
    return ops


def _writer_process(url: str, cohorts: str, rate: int, seconds: float, deletes: float,
                    out: multiprocessing.Queue[list[Op]]) -> None:
    out.put(asyncio.run(_write(url, cohorts, rate, seconds, deletes)))


async def write_load(url: str, cohorts: str, rate: int, seconds: float, deletes: float) -> list[Op]:
    """Commit ``rate`` writes/s from a child process; return them in commit order."""
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[list[Op]] = ctx.Queue()
    proc = ctx.Process(target=_writer_process, args=(url, cohorts, rate, seconds, deletes, out))
    proc.start()

    def result() -> list[Op]:
        while True:
            try:
                return out.get(timeout=1.0)
            except queue.Empty:
                if not proc.is_alive():
                    raise RuntimeError(f"the writer exited ({proc.exitcode}) without a result") from None

    ops = await asyncio.to_thread(result)
    await asyncio.to_thread(proc.join)
    return ops


def server_cpu(pgdata: Path) -> float:
    """CPU seconds the Postgres server has used: the postmaster with the
    backends it reaped, and every live child."""
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile: its time is in the postmaster's reaped total
        if int(entry) == postmaster:
            ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        elif int(fields[1]) == postmaster:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


# -- scoring (pure) -------------------------------------------------------------------


@dataclass
class Score:
    upserts: int = 0
    removes: int = 0
    resets: int = 0
    extra: int = 0
    netted: int = 0
    late: int = 0
    queued_at_stop: int = 0
    latencies: list[tuple[float, bool]] = field(default_factory=list)
    """(seconds, censored): censored = never delivered, the wait so far."""

    def pct(self, q: float) -> str:
        if not self.latencies:
            return "nan"
        ordered = sorted(self.latencies)
        value, censored = ordered[min(len(ordered) - 1, int(q * len(ordered)))]
        return f"{'>' if censored else ''}{value * 1000:.2f}"


class _Expected:
    """What the writes mean to one set of cohort memberships: per card, the
    writes that change its view as (index, ns, invisible after), in commit
    order."""

    def __init__(self, ops: Sequence[Op], orgs: frozenset[str]) -> None:
        self.changes: dict[str, list[tuple[int, int, bool]]] = {}
        visible: dict[str, bool] = {}
        for i, (key, org, stamp) in enumerate(ops):
            now = org is not None and org in orgs
            if now or visible.get(key, False):
                self.changes.setdefault(key, []).append((i, stamp, not now))
            visible[key] = now


class _Session:
    """One session's scoring: per card, how many of its expected changes are
    settled and whether the session shows the card."""

    def __init__(self, exp: _Expected, out: Score, stopped: int) -> None:
        self.exp = exp
        self.out = out
        self.stopped = stopped
        self.done: dict[str, int] = {}
        self.shown: set[str] = set()

    def net(self, key: str, seen: int) -> None:
        """While the session shows ``key`` absent, a write the strategy took
        in (index < ``seen``) that made it invisible again settles every
        change up to it: an appearance and a disappearance coalesced, no
        delta was due."""
        if key in self.shown:
            return
        todo = self.exp.changes.get(key, ())
        p = q = self.done.get(key, 0)
        last = None
        while q < len(todo) and todo[q][0] < seen:
            if todo[q][2]:
                last = q
            q += 1
        if last is not None:
            self.out.netted += last + 1 - p
            self.done[key] = last + 1

    def cover(self, key: str, at: int, upto: int | None = None) -> int:
        """A delta at ``at`` shows ``key`` as of write ``upto`` (None: absent,
        as of the first pending write that made it invisible): it delivers
        every pending change up to there; returns how many."""
        todo = self.exp.changes.get(key, ())
        p = start = self.done.get(key, 0)
        if upto is None:
            gone = next((q for q in range(p, len(todo)) if todo[q][2]), None)
            if gone is None:
                return 0
            upto = todo[gone][0]
        lat = self.out.latencies
        while p < len(todo) and todo[p][0] <= upto:
            lat.append(((at - todo[p][1]) / 1e9, False))
            if at > self.stopped:
                self.out.queued_at_stop += 1
            p += 1
        self.done[key] = p
        return p - start

    def event(self, event: Event, index: dict[int, int]) -> None:
        at, kind, payload, seen = event
        out = self.out
        if kind == "u":
            key, stamp = payload
            out.upserts += 1
            self.net(key, seen)
            if not self.cover(key, at, index.get(stamp, -1)):
                out.extra += 1
            self.shown.add(key)
        elif kind == "r":
            out.removes += 1
            if payload not in self.shown or not self.cover(payload, at):
                out.extra += 1
            self.shown.discard(payload)
        else:
            out.resets += 1
            for key in self.exp.changes:
                self.net(key, seen)
                stamp = payload.get(key)
                if stamp is not None:
                    self.cover(key, at, index.get(stamp, -1))
                elif key in self.shown:
                    self.cover(key, at)
            self.shown = set(payload)

    def end(self, ended: int, seen: int) -> None:
        out = self.out
        for key, todo in self.exp.changes.items():
            self.net(key, seen)
            for _i, stamp, _gone in todo[self.done.get(key, 0):]:
                out.latencies.append(((ended - stamp) / 1e9, True))
                out.late += 1
                out.queued_at_stop += 1


def score(run: Run) -> Score:
    """Score every session's delivered events against the writes (see the
    module docstring)."""
    out = Score()
    index = {stamp: i for i, (_k, _o, stamp) in enumerate(run.ops)}
    expected: dict[frozenset[str], _Expected] = {}
    for orgs, events in run.sessions:
        exp = expected.get(orgs)
        if exp is None:
            exp = expected[orgs] = _Expected(run.ops, orgs)
        session = _Session(exp, out, run.stopped)
        for event in events:
            session.event(event, index)
        session.end(run.ended, run.seen)
    return out


# -- the two strategies --------------------------------------------------------------


@dataclass
class Run:
    ops: list[Op]
    sessions: list[tuple[frozenset[str], list[Event]]]
    seconds: float
    stopped: int
    ended: int
    cpu: float
    db_cpu: float
    seen: int
    """Writes the strategy had fully rendered / processed at the end."""
    overflows: str
    per_write: float
    """Engine: loads per frame; per-subscriber: queries per write."""


class _Tap:
    """Times every delta put on one session stream. When the stream overflows
    (drops its backlog for a Reset) the dropped deltas are forgotten: only
    what a subscriber could read counts as delivered. ``seen()`` says how
    many writes the render loop had drained when the delta was put."""

    def __init__(self, stream: Any, seen: Callable[[], int]) -> None:
        self.stream = stream
        self.records: list[tuple[int, Any, int]] = []
        self.drained = 0
        self.overflows = 0
        # ``put`` (the stream's name for it since the render split; ``_put`` before)
        name = "put" if hasattr(stream, "end") else "_put"
        put: Callable[[Any], bool] = getattr(stream, name)

        def tapped(item: Any) -> bool:
            ok = put(item)
            if not isinstance(item, (Upsert, Remove, Reset)):
                return ok
            if ok:
                self.records.append((time.perf_counter_ns(), item, seen()))
            else:
                self.overflows += 1
                del self.records[self.drained:]
            return ok

        setattr(stream, name, tapped)

    def drain(self) -> None:
        while self.stream.get_nowait() is not None:
            pass
        self.drained = len(self.records)

    def events(self) -> list[Event]:
        out: list[Event] = []
        for at, delta, seen in self.records:
            if isinstance(delta, Upsert):
                out.append((at, "u", (json.loads(delta.key), int(delta.view[2])), seen))
            elif isinstance(delta, Remove):
                out.append((at, "r", json.loads(delta.key), seen))
            else:
                views = {json.loads(k): int(v[2]) for k, v in delta.views.items()}
                out.append((at, "reset", views, seen))
        return out


async def engine_run(db: Database, url: str, n: int, cohorts: str, args: argparse.Namespace,
                     pgdata: Path) -> Run:
    config = EngineConfig(window_capacity=KEYS * 2, reset_threshold=10_000)
    listener = PgListenNotify(db, config, ReadinessHandle())
    runtime = RenderRuntime(db, config, listener.channel, debug=False)
    view = CardsView() if cohorts != "pp" else PerPrincipal()
    runtime.registry.register_projector(view)
    loads: list[int] = []
    rendered = drained = 0
    get_nowait = listener.channel.get_nowait

    def counted() -> Any:
        nonlocal drained
        item = get_nowait()
        if isinstance(item, list):
            drained += len(item)
        return item

    listener.channel.get_nowait = counted  # type: ignore[method-assign]

    def on_report(report: Any) -> None:
        nonlocal rendered
        if report.impacts:
            rendered += report.impacts
            loads.append(report.loads)

    runtime.on_report = on_report
    listen_task = asyncio.create_task(listener.run())
    await listener.started.wait()
    subs = principals(n, cohorts)
    window = WindowSpec(Query(RankQuery(KEYS)))
    taps = [_Tap(await runtime.registry.attach(p, view.NAME, window), lambda: drained) for p in subs]
    render_task = asyncio.create_task(runtime.run())

    async def drain() -> None:
        while True:
            for tap in taps:
                tap.drain()
            await asyncio.sleep(0.05)

    drainer = asyncio.create_task(drain())
    await asyncio.sleep(0.2)
    for tap in taps:  # the attach Resets precede the first write
        tap.drain()
        tap.records.clear()
        tap.drained = 0
        tap.overflows = 0
    loads.clear()
    rendered = drained = 0
    cpu0, db0 = time.process_time(), server_cpu(pgdata)
    ops = await write_load(url, cohorts, args.rate, args.seconds, args.deletes)
    stopped = time.perf_counter_ns()
    await asyncio.sleep(args.grace)
    for tap in taps:
        tap.drain()
    ended = time.perf_counter_ns()
    cpu, db_cpu = time.process_time() - cpu0, server_cpu(pgdata) - db0
    channel_overflows = listener.channel.overflows
    for t in (drainer, render_task, listen_task):
        t.cancel()
    await asyncio.gather(drainer, render_task, listen_task, return_exceptions=True)
    return Run(
        ops, [(p.orgs, tap.events()) for p, tap in zip(subs, taps, strict=True)], args.seconds,
        stopped, ended, cpu, db_cpu, rendered,
        f"{sum(t.overflows for t in taps)}/{channel_overflows}",
        sum(loads) / len(loads) if loads else 0.0,
    )


async def per_subscriber_run(db: Database, url: str, n: int, cohorts: str,
                             args: argparse.Namespace, pgdata: Path) -> Run:
    """Each session re-queries its own row for every impact it may care
    about; after a listener overflow it re-reads its whole window (a Reset)."""
    config = EngineConfig()
    listener = PgListenNotify(db, config, ReadinessHandle())
    subs = principals(n, cohorts)
    orgs = [sorted(p.orgs) for p in subs]
    last: list[dict[str, int]] = [{} for _ in subs]
    events: list[list[Event]] = [[] for _ in subs]
    queries = 0
    processed = 0

    async def consume() -> None:
        nonlocal queries, processed
        async with db.pool.acquire() as conn:
            while True:
                item = await listener.channel.get()
                if not isinstance(item, list):  # Reconnected: impacts were lost
                    for i in range(len(subs)):
                        rows = await conn.fetch(
                            "SELECT id, title FROM sample_card WHERE org = ANY($1)", orgs[i])
                        queries += 1
                        last[i] = {r["id"]: int(r["title"]) for r in rows}
                        events[i].append(
                            (time.perf_counter_ns(), "reset", dict(last[i]), processed))
                    continue
                for impact in item:
                    key = str(impact.key)
                    for i in range(len(subs)):
                        row = await conn.fetchrow(
                            "SELECT title FROM sample_card WHERE id = $1 AND org = ANY($2)",
                            key, orgs[i])
                        queries += 1
                        held = last[i]
                        if row is not None:
                            stamp = int(row["title"])
                            if held.get(key) != stamp:
                                held[key] = stamp
                                events[i].append(
                                    (time.perf_counter_ns(), "u", (key, stamp), processed + 1))
                        elif key in held:
                            del held[key]
                            events[i].append((time.perf_counter_ns(), "r", key, processed + 1))
                    processed += 1

    listen_task = asyncio.create_task(listener.run())
    await listener.started.wait()
    consumer = asyncio.create_task(consume())
    cpu0, db0 = time.process_time(), server_cpu(pgdata)
    ops = await write_load(url, cohorts, args.rate, args.seconds, args.deletes)
    stopped = time.perf_counter_ns()
    await asyncio.sleep(args.grace)
    ended = time.perf_counter_ns()
    cpu, db_cpu = time.process_time() - cpu0, server_cpu(pgdata) - db0
    consumer.cancel()
    listen_task.cancel()
    await asyncio.gather(consumer, listen_task, return_exceptions=True)
    return Run(
        ops, [(p.orgs, ev) for p, ev in zip(subs, events, strict=True)], args.seconds,
        stopped, ended, cpu, db_cpu, processed, f"-/{listener.channel.overflows}",
        queries / max(len(ops), 1),
    )


# -- the table ------------------------------------------------------------------------

HEADER = (
    f"{'strategy':<14} {'sess':>5} {'coh':>3} | {'w/s':>4} {'upserts':>8} {'removes':>7} "
    f"{'resets':>6} {'extra':>5} {'netted':>6} | {'p50 ms':>8} {'p99 ms':>9} {'q@stop':>7} {'late':>7} "
    f"{'backlog':>7} {'ovf s/c':>7} | {'per/wr':>6} {'cpu us/d':>8} {'db us/d':>8}"
)


def line(strategy: str, n: int, cohorts: str, run: Run) -> str:
    s = score(run)
    delivered = s.upserts + s.removes
    return (
        f"{strategy:<14} {n:>5} {cohorts:>3} | {len(run.ops) / run.seconds:>4.0f} {s.upserts:>8} "
        f"{s.removes:>7} {s.resets:>6} {s.extra:>5} {s.netted:>6} | {s.pct(.5):>8} {s.pct(.99):>9} "
        f"{s.queued_at_stop:>7} {s.late:>7} {len(run.ops) - run.seen:>7} {run.overflows:>7} | "
        f"{run.per_write:>6.1f} {run.cpu / max(delivered, 1) * 1e6:>8.1f} "
        f"{run.db_cpu / max(delivered, 1) * 1e6:>8.1f}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--cohorts", default="1,50,pp")
    parser.add_argument("--deletes", type=float, default=0.1, help="share of writes that delete")
    parser.add_argument("--grace", type=float, default=0.5,
                        help="seconds after the writers stop before the run is scored")
    parser.add_argument("--per-subscriber-max", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg", durable=True)
        pg.start()
        try:
            await provision_database(pg, "template_bench", is_template=True,
                                     extra_migrations=service_migrations(MIGRATIONS))
            print(f"{args.rate} writes/s for {args.seconds:g} s ({args.deletes:.0%} deletes), "
                  f"grace {args.grace:g} s, load average {os.getloadavg()[0]:.2f}")
            print(HEADER)
            print(f"{'':<24}(per/wr: engine loads per frame; per-subscriber queries per write)")
            run = 0
            for n in (int(s) for s in args.sizes.split(",")):
                for cohorts in args.cohorts.split(","):
                    for strategy in ("engine", "per-subscriber"):
                        if strategy == "per-subscriber" and n > args.per_subscriber_max:
                            continue
                        run += 1
                        name = f"bench_{run}"
                        provisioned = await provision_database(pg, name, template="template_bench")
                        db = await connect_pool(provisioned.app_url, min_size=2, max_size=8)
                        try:
                            fn = engine_run if strategy == "engine" else per_subscriber_run
                            result = await fn(db, provisioned.app_url, n, cohorts, args, pg.pgdata)
                        finally:
                            await db.aclose()
                        print(line(strategy, n, cohorts, result), flush=True)
        finally:
            pg.stop()


if __name__ == "__main__":
    asyncio.run(main())
