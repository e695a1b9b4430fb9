"""End to end: the reference service in its own process, standard clients.

    python bench/e2e.py [--seconds 8] [--cells all|quick|overload|"subs/orgs/rate,..."]
                        [--idle 1000,10000] [--compare-tree PATH] [--env NAME=VALUE ...]
                        [--compare-env NAME=VALUE ...] [--pods 1,2] [--py-spy FILE]
                        [--writer lean|httpx|lean,httpx] [--subscriber lean|websockets]
                        [--interleave]

The service (``python -m example_service`` on its embedded Postgres + NATS in
a temporary folder) runs in a child process; this process opens one
graphql-transport-ws socket per subscriber (the ``websockets`` library, the
passport on the upgrade), each subscribed to ``boards`` (the caller's
boards). A cell is ``subs`` subscribers spread over ``orgs`` orgs (five
boards per org) and ``rate`` writes/s spread over the orgs and their boards: each write is a
``renameBoard`` mutation over HTTP whose title carries its sequence number,
sent by ``bench/lean_http.py`` (keep-alive HTTP/1.1, the same request bytes;
``--writer httpx`` sends them with ``httpx`` as before, whose own CPU per
request on these shared cores was more than the service's HTTP floor;
``--writer lean,httpx`` runs every cell with each, alternating on the one
service).

- latency: ``perf_counter`` just before the mutation is sent to the receipt
  of the Upsert carrying that title, per subscriber (p50 / p99 / max);
- ``deliv``: Upserts received / expected (writes x subscribers of the org);
- ``ack p99``: the mutation's answer time (writers must not be pushed back);
- ``client us``: this process's own CPU (the subscribers' sockets and the writer) per delivery,
  on the same cores;
- ``cpu/deliv``: the service process's CPU (user+sys; ``of it sys`` the kernel part; not Postgres's or
  NATS's) during the cell over the deliveries.

``--idle`` opens that many idle sessions at once (one subscription each),
reports the service's RSS, how many went live and the time to all live, then
closes them and reports RSS again once the pod has released memory by itself
(its beat, after a mass close) and RSS stopped moving (``after s``: seconds
from the close), and a 1-subscriber, 20 writes/s cell's latency after
(compare with the same cell run first, on the fresh process).
``--compare-tree PATH`` runs everything again from another checkout (e.g. a
worktree of an older commit; with ``--interleave`` side by side); ``--env`` passes ``SERVICE_ENGINE_*`` settings to the service (e.g.
``SERVICE_ENGINE_GC_TUNED=false``); ``--compare-env`` adds a variant with
that setting beside the default (``--interleave``: every variant's service
up at once, each cell run on each in turn); ``--pods 1,2`` runs every variant with 1
and with 2 pods behind the one port (``cpu/deliv`` sums the pods); ``--py-spy``
records the service (its first pod). ``--loop-watch MS`` switches the pod's
debug loop watch on (``SERVICE_ENGINE_DEBUG_LOOP_WATCH``,
`bench/loopwatch.py`) and prints, per cell, what held the loop for MS
or more (long iterations by kind, collections by generation) and the
delivery timeline (COMMIT -> NOTIFY -> render pass -> last frame written).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from lean_http import LeanClient
from lean_ws import LeanSocket
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = Subprotocol("graphql-transport-ws")
SUBSCRIPTION = """subscription { boards { __typename
  ... on BoardsReset { revision keys views { id title } }
  ... on BoardsUpsert { revision key view { id title archived affordances { action allowed reason } } cause { name } }
  ... on BoardsRemove { revision key } } }"""
CREATE = "mutation($id: ID, $title: String!) { createBoard(id: $id, title: $title) { success error { code message } } }"
TITLE = "query($id: ID!) { board(id: $id) { title } }"
RENAME = "mutation($id: ID!, $title: String!) { renameBoard(id: $id, title: $title) { success error { code } } }"
BOARDS_PER_ORG = 5
"""Boards per org: an org's writes rotate over them (one hot row would
measure its row lock and Postgres's commit, not delivery)."""
CELLS = {
    "quick": [(1, 1, 50), (100, 10, 100), (1000, 50, 50)],
    "all": [(1, 1, 50), (100, 10, 100), (1000, 50, 50), (1000, 1, 20)],
    # ~2x and ~10x what one core delivers (~5,000 deliveries/s): issue 11, item 4.
    "overload": [(1000, 1, 10), (1000, 1, 50)],
}


def passport(sub: str, org: str) -> str:
    return json.dumps({"sub": sub, "org": org, "roles": ["board:archive"]}, separators=(",", ":"))


def cpu_seconds(pid: int, *, sys_only: bool = False) -> float:
    """The process's CPU (user + sys), or its sys part alone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[12]) if sys_only else int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pod_children(pid: int) -> list[int]:
    """The ``example_service`` children of ``pid`` (the pods of ``--pods N``)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = []
    for child in children:
        with contextlib.suppress(OSError):
            if b"example_service" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(int(child))
    return out


@dataclass
class Service:
    procs: list[subprocess.Popen[bytes]]
    addr: str
    data: Path
    pods: int = 1

    @property
    def pids(self) -> list[int]:
        """The service's pods: the process itself, or its N child pods."""
        roots = [p.pid for p in self.procs]
        if self.pods == 1:
            return roots
        return [c for root in roots for c in pod_children(root)]

    def cpu(self) -> float:
        return sum(cpu_seconds(p) for p in self.pids)

    def sys_cpu(self) -> float:
        return sum(cpu_seconds(p, sys_only=True) for p in self.pids)

    def rss(self) -> float:
        return sum(rss_mb(p) for p in self.pids)


@contextlib.asynccontextmanager
async def service(env: dict[str, str], pods: int = 1, *, command: list[str] | None = None,
                  prefix: str = "e2e-", tree: Path = REPO) -> AsyncIterator[Service]:
    """The reference service in a child process on its embedded Postgres and
    NATS (a fresh temporary folder named ``prefix...``), ready; ``command``
    runs another entry point of it (its arguments after the interpreter);
    ``tree`` is the checkout it runs from (another worktree: an older tree).
    A variable of ``env`` set to "" is left out (the service's default)."""
    data = Path(tempfile.mkdtemp(prefix=prefix))
    addr_file = data / "addr"
    environ = {
        **os.environ,
        "EXAMPLE_SERVICE_DATA": str(data),
        "EXAMPLE_SERVICE_HTTP_ADDR": "127.0.0.1:0",
        "EXAMPLE_SERVICE_ADDR_FILE": str(addr_file),
        "EXAMPLE_SERVICE_LOG_LEVEL": "WARNING",
        "SERVICE_ENGINE_WS_MAX_SOCKETS": "30000",
        **env,
    }
    environ = {name: value for name, value in environ.items() if value != ""}
    log = (data / "service.log").open("wb")
    if command is None:
        # The loop watch is a diagnostic of bench/ (it patches the loop): the
        # service runs under it when asked for.
        runner = (["bench/loopwatch.py", "example_service"]
                  if environ.get("SERVICE_ENGINE_DEBUG_LOOP_WATCH") else ["-m", "example_service"])
        command = runner + (["--pods", str(pods)] if pods > 1 else [])
    proc = subprocess.Popen([sys.executable, *command], cwd=tree,  # noqa: ASYNC220
                            env=environ, stdout=log, stderr=subprocess.STDOUT)
    procs = [proc]
    try:
        deadline = time.monotonic() + 120
        while not addr_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((data / "service.log").read_text()[-3000:])
            await asyncio.sleep(0.1)
        addr = addr_file.read_text().strip()
        async with httpx.AsyncClient(base_url=f"http://{addr}") as http:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        yield Service(procs, addr, data, pods)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@dataclass
class Subscriber:
    ws: ClientConnection | LeanSocket
    org: str
    latencies: list[float] = field(default_factory=list)
    live: asyncio.Event = field(default_factory=asyncio.Event)
    resets: int = 0
    """Resets received after the first (overflow, reconnect, threshold)."""
    seen: dict[str, int] = field(default_factory=dict)
    """The write (sequence number) last received per board id."""
    last_at: float = 0.0


def _see(subscriber: Subscriber, board: str, seq: int) -> None:
    subscriber.seen[board] = seq


SUBSCRIBER_CLIENT = "lean"
"""The subscribers' client: ``lean`` (`lean_ws.LeanSocket`, websockets'
protocol driven from an asyncio ``Protocol``) or ``websockets`` (its asyncio
client); ``--subscriber`` sets it."""


async def open_subscriber(addr: str, sub: str, org: str, sent: dict[int, float]) -> Subscriber:
    headers = {"X-Passport": passport(sub, org)}
    init = json.dumps({"type": "connection_init"})
    subscribe = json.dumps({"id": "1", "type": "subscribe", "payload": {"query": SUBSCRIPTION}})
    if SUBSCRIBER_CLIENT == "lean":
        lean = await LeanSocket.connect(addr, "/graphql/ws", headers, PROTOCOL)
        lean.send_text(init)
        await lean.recv()
        lean.send_text(subscribe)
        subscriber = Subscriber(lean, org)
        lean.on_text = lambda raw: _message(subscriber, raw, sent)
        return subscriber
    ws = await connect(f"ws://{addr}/graphql/ws", subprotocols=[PROTOCOL],
                       additional_headers=headers, open_timeout=120, max_queue=None,
                       compression=None)
    await ws.send(init)
    await ws.recv()
    await ws.send(subscribe)
    subscriber = Subscriber(ws, org)
    asyncio.get_running_loop().create_task(read(subscriber, sent))
    return subscriber


async def read(subscriber: Subscriber, sent: dict[int, float]) -> None:
    ws = subscriber.ws
    assert isinstance(ws, ClientConnection)
    with contextlib.suppress(Exception):
        async for raw in ws:
            assert isinstance(raw, str)
            _message(subscriber, raw, sent)


_MARKER = '"title":"w'
_IDENT = '"id":"'


def _message(subscriber: Subscriber, raw: str, sent: dict[int, float]) -> None:
    now = time.perf_counter()
    subscriber.last_at = now
    if "Reset" in raw:
        if subscriber.live.is_set():
            subscriber.resets += 1
        subscriber.live.set()
        payload = json.loads(raw).get("payload", {}).get("data", {}).get("boards", {})
        for view in payload.get("views") or ():
            if view["title"].startswith("w"):
                _see(subscriber, view["id"], int(view["title"][1:]))
        return
    at = raw.find(_MARKER)
    if at >= 0:
        end = raw.index('"', at + len(_MARKER))
        seq = int(raw[at + len(_MARKER):end])
        started = sent.get(seq)
        if started is not None:
            subscriber.latencies.append(now - started)
        start = raw.rfind(_IDENT, 0, at)  # the view's id, before its title
        if start >= 0:
            start += len(_IDENT)
            _see(subscriber, raw[start:raw.index('"', start)], seq)


async def open_many(addr: str, count: int, orgs: list[str], prefix: str,
                    sent: dict[int, float], batch: int = 500) -> list[Subscriber]:
    """Open ``count`` subscribers, ``batch`` at once; those refused or closed
    before their ack (e.g. 4408, the init timeout) are left out."""
    subscribers: list[Subscriber] = []
    for start in range(0, count, batch):
        opened = await asyncio.gather(*(
            open_subscriber(addr, f"{prefix}u{i}", orgs[i % len(orgs)], sent)
            for i in range(start, min(count, start + batch))), return_exceptions=True)
        subscribers += [s for s in opened if isinstance(s, Subscriber)]
    return subscribers


def watch_file(pid: int) -> Path:
    """`bench/loopwatch.py`'s ``dump_path`` (the bench runs older trees too)."""
    return Path(tempfile.gettempdir()) / f"service-engine-loopwatch-{pid}.json"


async def watch_dump(svc: Service) -> dict[str, Any] | None:
    """Ask the first pod's loop watch for what it recorded since the last ask."""
    pid = svc.pids[0]
    path = watch_file(pid)
    before = path.stat().st_mtime_ns if path.exists() else 0
    os.kill(pid, signal.SIGUSR2)
    for _ in range(200):
        await asyncio.sleep(0.05)
        if path.exists() and path.stat().st_mtime_ns != before:
            loaded: dict[str, Any] = json.loads(path.read_text())
            return loaded
    return None


def print_watch(name: str, w: dict[str, Any]) -> None:
    def span(key: str) -> str:
        s = w[key]
        return f"{s['p50_ms']:.1f}/{s['p99_ms']:.1f}/{s['max_ms']:.1f}"

    long = w["long_iterations"]
    print(f"  loop watch {name}: {w['seconds']} s, {w['iterations']} iterations, busy "
          f"{w['busy_ms']:.0f} ms (cpu {w['cpu_ms']:.0f}); iteration busy p50/p99/max {span('iteration_busy')} ms; "
          f">= {w['threshold_ms']:g} ms: {long['count']} iterations, {long['total_ms']:.0f} ms")
    for kind in long["kinds"][:8]:
        print(f"    long: {kind['count']:4} x {kind['kind'][:90]} total {kind['total_ms']:.0f} "
              f"(cpu {kind['cpu_ms']:.0f}) max {kind['max_ms']:.0f} (cpu {kind['max_cpu_ms']:.0f}) "
              f"gc {kind['gc_ms']:.0f}")
    for kind in w["slow_callbacks"][:8]:
        where = "; ".join(f"{k} x{v}" for k, v in list(kind["where"].items())[:2])
        print(f"    slow callback: {kind['count']:4} x {kind['kind'][:60]} total "
              f"{kind['total_ms']:.0f} (cpu {kind['cpu_ms']:.0f}) max {kind['max_ms']:.0f} "
              f"(cpu {kind['max_cpu_ms']:.0f}) gc {kind['gc_ms']:.0f} {where[:150]}")
    for kind in w.get("long_cpu_iterations", [])[:6]:
        print(f"    long by cpu: {kind['count']:4} x {kind['kind'][:90]} cpu {kind['cpu_ms']:.0f} "
              f"max cpu {kind['max_cpu_ms']:.0f} gc {kind['gc_ms']:.0f}")
    for kind in w.get("slow_cpu_callbacks", [])[:6]:
        where = "; ".join(f"{k} x{v}" for k, v in list(kind["where"].items())[:2])
        print(f"    slow by cpu: {kind['count']:4} x {kind['kind'][:60]} cpu {kind['cpu_ms']:.0f} "
              f"max cpu {kind['max_cpu_ms']:.0f} gc {kind['gc_ms']:.0f} {where[:150]}")
    gcs = ", ".join(f"gen{g} {v['n']} x p99 {v['p99_ms']:.1f} max {v['max_ms']:.1f} "
                    f"(total {v['total_ms']:.0f}, cpu {v['cpu_ms']:.0f}, {v['long']} long, "
                    f"young max {v['young_max']})" for g, v in w["gc"].items())
    print(f"    gc {tuple(w.get('gc_thresholds', ()))}: {gcs}")
    grown = w.get("tracked_growth")
    if grown:
        types = ", ".join(f"{k} {v:+}" for k, v in list(grown["types"].items())[:10])
        print(f"    tracked objects {grown['total']:+} over the cell: {types}")
    print(f"    p50/p99/max ms: timer lag {span('timer_lag')}; commit->notify "
          f"{span('commit_to_notify')}; notify->pass {span('notify_to_pass')}; pass "
          f"{span('pass_duration')}; pass->last write {span('pass_to_last_write')}")
    if "pass_cpu" in w:
        turns = w["pass_turns"]
        print(f"    a pass's own CPU p50/p99/max {span('pass_cpu')} ms over loop turns "
              f"p50/p99/max {turns['p50']:.0f}/{turns['p99']:.0f}/{turns['max']:.0f}")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def cell(svc: Service, name: str, subs: int, n_orgs: int, rate: float,
               seconds: float, watch: bool = False, writer: str = "lean") -> dict[str, Any]:
    orgs = [f"{name}o{j}" for j in range(n_orgs)]
    sent: dict[int, float] = {}
    async with httpx.AsyncClient(base_url=f"http://{svc.addr}", timeout=60,
                                 limits=httpx.Limits(max_connections=64)) as http, \
            LeanClient(svc.addr) as lean:
        for org in orgs:
            for b in range(BOARDS_PER_ORG):
                response = await http.post("/graphql", json={"query": CREATE, "variables": {
                    "id": f"b-{org}-{b}", "title": f"start {b}"}},
                    headers={"X-Passport": passport("w", org)})
                assert response.json()["data"]["createBoard"]["success"], response.text
        subscribers = await open_many(svc.addr, subs, orgs, name, sent)
        await asyncio.wait_for(asyncio.gather(*(s.live.wait() for s in subscribers)), 120)
        await asyncio.sleep(0.5)
        per_org = {org: sum(1 for s in subscribers if s.org == org) for org in orgs}
        acks: list[float] = []
        failed = 0
        expected = 0
        last_write: dict[str, int] = {}
        """Each written board's committed title (its sequence number), read
        back once the writes are done: concurrent writes to one board commit
        in any order."""

        async def write(seq: int, org: str) -> None:
            nonlocal failed
            t0 = time.perf_counter()
            sent[seq] = t0
            board = f"b-{org}-{seq // n_orgs % BOARDS_PER_ORG}"
            body = {"query": RENAME, "variables": {"id": board, "title": f"w{seq}"}}
            headers = {"X-Passport": passport("w", org)}
            try:
                if writer == "lean":
                    _status, answer = await lean.post_json("/graphql", body, headers)
                else:
                    answer = (await http.post("/graphql", json=body, headers=headers)).json()
                ok = answer["data"]["renameBoard"]["success"]
            except Exception:
                ok = False
            if ok:
                last_write[board] = -1
            acks.append(time.perf_counter() - t0)
            failed += not ok

        if watch:
            await watch_dump(svc)  # what ran before the writes: discarded
        cpu0, sys0, own0 = svc.cpu(), svc.sys_cpu(), time.process_time()
        tasks = []
        total = int(rate * seconds)
        begin = time.perf_counter()
        for seq in range(total):
            target = begin + seq / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            org = orgs[seq % n_orgs]
            expected += per_org[org]
            tasks.append(asyncio.create_task(write(seq, org)))
        await asyncio.gather(*tasks)
        writes_done = time.perf_counter()
        for board in last_write:
            org = board.split("-")[1]
            response = await http.post("/graphql", json={"query": TITLE, "variables": {
                "id": board}}, headers={"X-Passport": passport("w", org)})
            title = response.json()["data"]["board"]["title"]
            last_write[board] = int(title[1:]) if title.startswith("w") else -1
        deadline = time.monotonic() + 30

        def converged() -> int:
            return sum(all(s.seen.get(b, -1) == q for b, q in last_write.items()
                           if b.startswith(f"b-{s.org}-")) for s in subscribers)

        while time.monotonic() < deadline:
            got = sum(len(s.latencies) for s in subscribers)
            if got >= expected:
                break
            quiet = time.perf_counter() - max((s.last_at for s in subscribers), default=0.0)
            if quiet > 1.0 and converged() == len(subscribers):
                break  # every subscriber holds the latest state: the rest collapsed
            await asyncio.sleep(0.2)
        cpu, sys_cpu = svc.cpu() - cpu0, svc.sys_cpu() - sys0
        own = time.process_time() - own0
        watched = await watch_dump(svc) if watch else None
        settled = max((s.last_at for s in subscribers), default=writes_done) - writes_done
        n_converged = converged()
        resets = sum(s.resets for s in subscribers)
        latencies = [x for s in subscribers for x in s.latencies]
        await asyncio.gather(*(s.ws.close() for s in subscribers), return_exceptions=True)
    delivered = len(latencies)
    return {
        "cell": f"{subs} subs / {n_orgs} orgs / {rate:g} w/s",
        "p50": pct(latencies, 0.5) * 1e3, "p99": pct(latencies, 0.99) * 1e3,
        "max": max(latencies, default=float("nan")) * 1e3,
        "deliv": f"{delivered}/{expected}", "ack_p99": pct(acks, 0.99) * 1e3,
        "ack_p50": pct(acks, 0.5) * 1e3, "resets": resets,
        "converged": f"{n_converged}/{len(subscribers)}", "settle_s": max(0.0, settled),
        "failed": failed, "cpu_us": cpu / max(1, delivered) * 1e6,
        "sys_us": sys_cpu / max(1, delivered) * 1e6,
        "client_us": own / max(1, delivered) * 1e6,
        "deliv_per_s": delivered / max(1e-9, max((s.last_at for s in subscribers),
                                                   default=begin + seconds) - begin),
        "watch": watched,
    }


async def series(http: httpx.AsyncClient, name: str) -> float:
    """The sum of the pod's samples of ``name``."""
    text = (await http.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


async def settle(svc: Service, http: httpx.AsyncClient, releases: float | None,
                 bound: float = 120, count: int = 1) -> tuple[float, bool, float]:
    """Wait until the pod reports no live session, has counted ``count``
    releases of free memory since ``releases`` (within 20 s of the last
    close; None: do not wait for one) and its RSS
    stops moving; the seconds it took, whether it released and the settled
    RSS (before the probe's own collection)."""
    begin = time.monotonic()
    while await series(http, "service_engine_live_sessions") > 0:
        if time.monotonic() - begin > bound:
            raise TimeoutError("sessions still live after every socket closed")
        await asyncio.sleep(0.2)
    closed = time.monotonic()
    released = False
    while releases is not None and time.monotonic() - closed < 20:
        if await series(http, "service_engine_memory_releases_total") >= releases + count:
            released = True
            break
        await asyncio.sleep(0.2)
    last = svc.rss()
    while time.monotonic() - begin < bound:
        await asyncio.sleep(1.0)
        now = svc.rss()
        if abs(now - last) < 0.5:
            break
        last = now
    return time.monotonic() - begin, released, last


async def idle(svc: Service, count: int, seconds: float) -> dict[str, Any]:
    sent: dict[int, float] = {}
    before = svc.rss()
    orgs = [f"idle{count}o{j}" for j in range(50)]
    begin = time.perf_counter()
    subscribers = await open_many(svc.addr, count, orgs, f"idle{count}", sent, batch=count)
    opened = time.perf_counter() - begin
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(s.live.wait() for s in subscribers)), 120)
    live_at = time.perf_counter() - begin
    live = sum(s.live.is_set() for s in subscribers)
    await asyncio.sleep(2)
    held = svc.rss()
    async with httpx.AsyncClient(base_url=f"http://{svc.addr}") as http:
        releases = await series(http, "service_engine_memory_releases_total")
        await asyncio.gather(*(s.ws.close() for s in subscribers), return_exceptions=True)
        del subscribers
        # After the pod's own release for a mass close and its follow-up
        # (RELEASE_FOLLOW_UP beats later), once RSS stopped moving.
        settled, _released, after = await settle(svc, http, releases, count=2)
    fresh = await cell(svc, f"after{count}", 1, 1, 20, seconds)
    return {"sessions": count, "rss_before": before, "rss_held": held, "rss_after": after,
            "after_s": settled,
            "live": live, "open_s": opened, "live_s": live_at,
            "after_p50": fresh["p50"], "after_p99": fresh["p99"]}


async def run(args: argparse.Namespace) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    base = dict(kv.split("=", 1) for kv in args.env)
    if args.loop_watch:
        base["SERVICE_ENGINE_DEBUG_LOOP_WATCH"] = str(args.loop_watch)
    variants: list[tuple[str, dict[str, str]]] = [("engine", base)]
    for kv in args.compare_env:  # each setting beside the default, in one run
        name, value = kv.split("=", 1)
        label = f"{name.removeprefix('SERVICE_ENGINE_').lower()}={value}"
        variants.insert(len(variants) - 1, (label, {**base, name: value}))
    if args.cells in CELLS:
        cells = CELLS[args.cells]
    else:
        cells = [tuple(float(x) for x in c.split("/")) for c in args.cells.split(",") if c]
    rows: dict[str, list[dict[str, Any]]] = {}
    idles: dict[str, list[dict[str, Any]]] = {}
    pod_counts = [int(x) for x in args.pods.split(",") if x]
    writers = [w for w in args.writer.split(",") if w]
    global SUBSCRIBER_CLIENT
    SUBSCRIBER_CLIENT = args.subscriber
    trees = [("", REPO)] + [(f"{t} ", Path(t)) for t in args.compare_tree]
    runs = [(tree_label + (label if pod_counts == [1] else f"{label} {n}p"), env, n, tree)
            for tree_label, tree in trees for label, env in variants for n in pod_counts]
    async def cells_of(label: str, svc: Service, numbered: list[tuple[int, tuple[float, ...]]]) -> None:
        for n, (subs, orgs, rate) in numbered:
            for writer in writers:  # alternating, on the one service
                row = f"{label} {writer}" if len(writers) > 1 else label
                rows.setdefault(row, []).append(await cell(
                    svc, f"c{n}{writer[0]}", int(subs), int(orgs), rate, args.seconds,
                    watch=bool(args.loop_watch), writer=writer))
                watched = rows[row][-1].pop("watch")
                print(row, rows[row][-1], flush=True)
                if watched is not None:
                    print_watch(f"{row} {rows[row][-1]['cell']}", watched)

    async def idles_of(label: str, svc: Service) -> None:
        idles[label] = []
        for count in [int(x) for x in args.idle.split(",") if x]:
            idles[label].append(await idle(svc, count, min(args.seconds, 4)))
            print(label, idles[label][-1], flush=True)

    if args.interleave:  # every variant up at once, each cell run on each in turn
        async with contextlib.AsyncExitStack() as stack:
            services = [(label, await stack.enter_async_context(service(env, pods, tree=tree)))
                        for label, env, pods, tree in runs]
            for numbered in enumerate(cells):
                for label, svc in services:
                    await cells_of(label, svc, [numbered])
            for label, svc in services:
                await idles_of(label, svc)
    for label, env, pods, tree in [] if args.interleave else runs:
        async with service(env, pods, tree=tree) as svc:
            spy = None
            if args.py_spy:
                command = [str(Path(sys.executable).parent / "py-spy"), "record", "--format",
                           "raw", "-r", "200", "-o", f"{args.py_spy}.{label.replace(' ', '_').replace('/', '_')}.txt",
                           "-p", str(svc.pids[0])]
                spy = subprocess.Popen(command, stdout=subprocess.DEVNULL,  # noqa: ASYNC220
                                       stderr=subprocess.DEVNULL)
            await cells_of(label, svc, list(enumerate(cells)))
            await idles_of(label, svc)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                await asyncio.to_thread(spy.wait, 30)
    print(f"\nload average {os.getloadavg()[0]:.2f}; env {base}")
    print(f"{'cell':32} {'variant':12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'deliv':>14} "
          f"{'ack p50':>8} {'ack p99':>8} {'fail':>5} {'cpu/deliv us':>12} {'of it sys':>9} {'client us':>9} {'deliv/s':>8} "
          f"{'resets':>6} {'converged':>10} {'settle s':>8}")
    for i in range(len(cells)):
        for label in rows:
            r = rows[label][i]
            print(f"{r['cell']:32} {label:12} {r['p50']:8.1f} {r['p99']:8.1f} {r['max']:8.1f} "
                  f"{r['deliv']:>14} {r['ack_p50']:8.1f} {r['ack_p99']:8.1f} {r['failed']:5} "
                  f"{r['cpu_us']:12.1f} {r['sys_us']:9.1f} {r['client_us']:9.1f} {r['deliv_per_s']:8.0f} {r['resets']:6} "
                  f"{r['converged']:>10} {r['settle_s']:8.1f}")
    if any(idles.values()):
        print(f"\n{'sessions':>8} {'variant':9} {'RSS idle':>9} {'RSS held':>9} {'RSS after':>9} "
              f"{'after/idle':>10} {'after s':>7} {'live':>6} {'open s':>7} {'live s':>7} {'after p50':>9} {'after p99':>9}")
        for label, entries in idles.items():
            for r in entries:
                print(f"{r['sessions']:8} {label:9} {r['rss_before']:9.1f} {r['rss_held']:9.1f} "
                      f"{r['rss_after']:9.1f} {r['rss_after'] / r['rss_before']:10.2f} "
                      f"{r['after_s']:7.1f} {r['live']:6} {r['open_s']:7.1f} {r['live_s']:7.1f} "
                      f"{r['after_p50']:9.1f} {r['after_p99']:9.1f}")


def steady_heap() -> None:
    """The bench process's glibc heap held, not trimmed and regrown: asyncio
    reads into a 256 KiB buffer per ``recv``, and with glibc's sliding mmap
    and trim thresholds a fresh process maps and unmaps or trims and regrows
    its heap on every read burst (the first cell of a run spent ~1.3 s more
    of its own kernel CPU than the next, ~43 against ~26 us a delivery at
    1000/1/20, on the cores the service uses). A fixed 1 MiB mmap threshold
    and a 64 MiB trim threshold (glibc's ``mallopt``; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 64 << 20)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def main() -> None:
    steady_heap()
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--cells", default="all")
    parser.add_argument("--idle", default="")
    parser.add_argument("--compare-tree", action="append", default=[], metavar="PATH",
                        help="also run the service from this checkout (e.g. an older commit's worktree)")
    parser.add_argument("--pods", default="1",
                        help="pods behind the one port (python -m example_service --pods N); "
                             "a list (1,2) runs each side by side")
    parser.add_argument("--compare-env", action="append", default=[], metavar="NAME=VALUE",
                        help="also run with this SERVICE_ENGINE_* setting, side by side "
                             "(e.g. SERVICE_ENGINE_GC_TUNED=false)")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--subscriber", default="lean", choices=("lean", "websockets"),
                        help="the subscribers' client: lean (bench/lean_ws.py, websockets' own "
                             "protocol without its asyncio client's per-message machinery) or "
                             "websockets (its asyncio client)")
    parser.add_argument("--interleave", action="store_true",
                        help="start every variant's service at once and run each cell on each "
                             "in turn (a load change on the machine hits them alike)")
    parser.add_argument("--writer", default="lean",
                        help="the writers' HTTP client: lean (bench/lean_http.py) or httpx; "
                             "a list (lean,httpx) runs each cell with each, alternating")
    parser.add_argument("--py-spy", default="", help="record the service with py-spy to FILE.<variant>.txt")
    parser.add_argument("--loop-watch", type=float, default=0, metavar="MS",
                        help="the pod's debug loop watch: what held the loop for MS or more, per cell")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
