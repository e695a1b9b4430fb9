"""Back to idle: what a pod keeps after every session it served has closed.

    python bench/idle_return.py [--sessions 1000,10000] [--warmup 200] [--frames 20]
                                [--latency] [--linger S] [--env NAME=VALUE ...] [--out DIR]

The reference service runs in a child process (``bench/e2e.py``'s helpers)
under its debug memory probe (``dev/memory_probe.py``, on with
``EXAMPLE_SERVICE_MEMORY_PROBE``: on SIGUSR1 it writes ``sys._debugmallocstats()``, live objects by type and, with
``--frames``, a tracemalloc report). For each size N:

1. a warm-up opens and closes ``--warmup`` sessions, so what the first
   session of a process builds once (lazy imports, caches' first entries)
   is not counted as kept;
2. **mark**: RSS idle, pymalloc's arenas, live objects; tracemalloc starts;
3. N sessions open at once (one socket and one ``boards`` subscription
   each) and go live; **held**: RSS and arenas;
4. every socket closes; the probe waits until the pod's
   ``service_engine_live_sessions`` is 0, its beat has released free memory
   (``service_engine_memory_releases_total``, for N of at least
   `RELEASE_MIN_CLOSED`) and its RSS has settled; **after close**: RSS,
   arenas, the object types that grew and the tracemalloc diff (what was
   allocated between mark and after close and is still alive) by traceback
   and by object, written to ``--out``; then the probe itself asks
   ``malloc_trim(0)`` (**trimmed**: what a release gives on a pod that does
   not release by itself).

The service runs on mimalloc by default (`service_engine.run_on_allocator`),
where pymalloc's arena figures read -1; ``--env SERVICE_ENGINE_ALLOCATOR=pymalloc``
serves on pymalloc, and that with ``PYTHONMALLOC=malloc`` in the environment
on glibc's allocator (``bench/README.md``, "Back to idle" and "Back to idle
on mimalloc").

With ``--latency`` a 1-subscriber, 20 writes/s cell runs on the fresh
process and again after the last close. tracemalloc costs CPU and memory
while it traces: ``--frames 0`` gives RSS figures without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e import Service, cell, open_many, series, service, settle

from service_engine.memory import RELEASE_MIN_CLOSED

PROBE = ["dev/memory_probe.py", "example_service"]
"""The service under its debug memory probe (``dev/memory_probe.py``)."""

MALLOC_FIELDS = {
    "arenas": r"# arenas allocated current\s+=\s+([\d,]+)",
    "arenas_highwater": r"# arenas highwater mark\s+=\s+([\d,]+)",
    "allocated": r"# bytes in allocated blocks\s+=\s+([\d,]+)",
    "available": r"# bytes in available blocks\s+=\s+([\d,]+)",
    "unused_pools": r"(\d+) unused pools \*",
}


def malloc_stats(text: str) -> dict[str, int]:
    """The arena figures of one ``sys._debugmallocstats()`` output."""
    out = {}
    for name, pattern in MALLOC_FIELDS.items():
        found = re.search(pattern, text)
        out[name] = int(found.group(1).replace(",", "")) if found else -1
    return out


async def probe(svc: Service, folder: Path, step: str) -> dict[str, Any]:
    """Ask the pod for step ``step``'s figures and read them."""
    (folder / f"{step}.done").unlink(missing_ok=True)
    (folder / "step").write_text(step)
    os.kill(svc.pids[0], signal.SIGUSR1)
    deadline = time.monotonic() + 300
    while not (folder / f"{step}.done").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pod wrote no {step} figures")
        await asyncio.sleep(0.1)
    figures: dict[str, Any] = malloc_stats((folder / f"{step}.malloc.txt").read_text())
    figures["types"] = json.loads((folder / f"{step}.types.json").read_text())
    figures["rss"] = svc.rss()
    return figures


async def open_close(svc: Service, count: int, prefix: str) -> int:
    """Open ``count`` sessions at once, wait until live, close them all;
    how many went live."""
    sent: dict[int, float] = {}
    orgs = [f"{prefix}o{j}" for j in range(50)]
    subscribers = await open_many(svc.addr, count, orgs, prefix, sent, batch=count)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(s.live.wait() for s in subscribers)), 300)
    live = sum(s.live.is_set() for s in subscribers)
    await asyncio.gather(*(s.ws.close() for s in subscribers), return_exceptions=True)
    return live


def grown(before: dict[str, int], after: dict[str, int], top: int = 15) -> list[tuple[str, int]]:
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    return sorted(((k, v) for k, v in diff.items() if v), key=lambda kv: -abs(kv[1]))[:top]


async def size(svc: Service, http: httpx.AsyncClient, folder: Path, count: int,
               out: Path, linger: float) -> dict[str, Any]:
    mark = await probe(svc, folder, "mark")
    releases = await series(http, "service_engine_memory_releases_total")
    sent: dict[int, float] = {}
    orgs = [f"idle{count}o{j}" for j in range(50)]
    begin = time.perf_counter()
    subscribers = await open_many(svc.addr, count, orgs, f"idle{count}", sent, batch=count)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(s.live.wait() for s in subscribers)), 300)
    live_s = time.perf_counter() - begin
    live = sum(s.live.is_set() for s in subscribers)
    await asyncio.sleep(2.0)
    held = await probe(svc, folder, "held")
    await asyncio.gather(*(s.ws.close() for s in subscribers), return_exceptions=True)
    del subscribers
    settled, released, settled_rss = await settle(
        svc, http, releases if count >= RELEASE_MIN_CLOSED else None)
    after = await probe(svc, folder, "report")
    trimmed = await probe(svc, folder, "trim")
    lingered = None
    if linger:
        await asyncio.sleep(linger)
        lingered = await probe(svc, folder, "linger")
    kept = {}
    for name in ("traces", "objects", "pins", "survivors"):
        written = folder / f"report.{name}.txt"
        if written.exists():
            target = out / f"{name}.{count}.txt"
            written.replace(target)
            kept[name] = str(target)
    return {"sessions": count, "live": live, "live_s": live_s, "settle_s": settled,
            "released": released, "settled_rss": settled_rss,
            "mark": mark, "held": held, "after": after,
            "trimmed": trimmed, "lingered": lingered, **kept}


def print_size(r: dict[str, Any]) -> None:
    mark, held, after = r["mark"], r["held"], r["after"]
    print(f"\n== {r['sessions']} sessions: {r['live']} live in {r['live_s']:.1f} s; "
          f"no live session {r['settle_s']:.1f} s after the close; the pod "
          f"{'released' if r['released'] else 'did not release'} free memory")
    print(f"{'':22} {'mark':>10} {'held':>10} {'after close':>12} {'after/mark':>10}")

    def row(name: str, key: str, scale: float, unit: str) -> None:
        a, b, c = (x[key] / scale if x[key] >= 0 else float("nan") for x in (mark, held, after))
        ratio = c / a if a else float("nan")
        print(f"{name:22} {a:10.1f} {b:10.1f} {c:12.1f} {ratio:10.2f}  {unit}")

    row("RSS", "rss", 1, "MB")
    print(f"{'RSS settled, pre-probe':22} {r['settled_rss']:35.1f}  MB (before the probe's collection)")
    print(f"{'RSS after malloc_trim':22} {r['trimmed']['rss']:35.1f}  MB (asked by the probe)")
    if r["lingered"] is not None:
        later = r["lingered"]
        print(f"{'later (--linger)':22} RSS {later['rss']:.1f} MB, arenas {later['arenas']}, "
              f"unused pools {later['unused_pools'] / 64:.1f} MB; types grown since close: "
              + ", ".join(f"{k} {v:+d}" for k, v in grown(after["types"], later["types"], 8)))
    row("pymalloc arenas", "arenas", 1, "x 1 MiB")
    row("allocated blocks", "allocated", 2**20, "MB")
    row("free in used pools", "available", 2**20, "MB")
    row("unused pools", "unused_pools", 64, "MB")
    if held["arenas"] < 0:
        print("(pymalloc's figures while held: none while tracemalloc traces; --frames 0)")
    print(f"live objects (gc): {sum(mark['types'].values())} at mark, "
          f"{sum(held['types'].values())} held, {sum(after['types'].values())} after close")
    print("types grown mark -> after close:",
          ", ".join(f"{k} {v:+d}" for k, v in grown(mark["types"], after["types"])) or "none")
    if r.get("objects"):
        print(f"objects allocated since the mark, alive after close ({r['objects']}), top 20:")
        print("\n".join(Path(r["objects"]).read_text().splitlines()[:40]))
    if r.get("traces"):
        text = Path(r["traces"]).read_text()
        print(f"tracemalloc, still alive after close ({r['traces']}): {text.splitlines()[0]}")
        for block in text.split("\n\n")[1:16]:
            lines = block.strip().splitlines()
            if lines and not lines[0].startswith("by line"):
                print("  " + lines[0] + ": " + " <- ".join(
                    ln.strip() for ln in lines[1:] if ln.startswith("  File"))[:400])


async def run(args: argparse.Namespace, out: Path) -> None:
    folder = out / "probe"
    env = {**dict(kv.split("=", 1) for kv in args.env),
           "EXAMPLE_SERVICE_MEMORY_PROBE": str(folder),
           "EXAMPLE_SERVICE_MEMORY_PROBE_FRAMES": str(args.frames)}
    results = []
    load0 = os.getloadavg()[0]
    async with service(env, command=PROBE) as svc, httpx.AsyncClient(
            base_url=f"http://{svc.addr}", timeout=60) as http:
        fresh = await cell(svc, "fresh", 1, 1, 20, args.seconds) if args.latency else None
        if args.warmup:
            await open_close(svc, args.warmup, "warm")
            await settle(svc, http, None)
        for count in [int(x) for x in args.sessions.split(",") if x]:
            results.append(await size(svc, http, folder, count, out, args.linger))
            print_size(results[-1])
        later = await cell(svc, "later", 1, 1, 20, args.seconds) if args.latency else None
    print(f"\nload average {load0:.2f} -> {os.getloadavg()[0]:.2f}; env {args.env}; "
          f"tracemalloc frames {args.frames}; figures in {out}")
    print(f"{'sessions':>8} {'live':>6} {'RSS idle':>9} {'RSS held':>9} {'RSS after':>9} "
          f"{'after/idle':>10} {'trimmed':>8} {'arenas idle':>11} {'held':>6} {'after':>6}")
    for r in results:
        print(f"{r['sessions']:8} {r['live']:6} {r['mark']['rss']:9.1f} {r['held']['rss']:9.1f} "
              f"{r['after']['rss']:9.1f} {r['after']['rss'] / r['mark']['rss']:10.2f} "
              f"{r['trimmed']['rss']:8.1f} "
              f"{r['mark']['arenas']:11} {r['held']['arenas']:6} {r['after']['arenas']:6}")
    if fresh is not None and later is not None:
        print(f"1 sub / 1 org / 20 w/s p50 / p99 ms: fresh {fresh['p50']:.1f} / {fresh['p99']:.1f}, "
              f"after close {later['p50']:.1f} / {later['p99']:.1f}")
    (out / "results.json").write_text(json.dumps({"results": results, "fresh": fresh,
                                                  "later": later}, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", default="1000,10000")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--frames", type=int, default=20,
                        help="tracemalloc frames (0: no tracemalloc, RSS figures untraced)")
    parser.add_argument("--latency", action="store_true",
                        help="a 1-subscriber 20 writes/s cell fresh and after the last close")
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--linger", type=float, default=0,
                        help="seconds to wait after the close for a later look (asyncpg's "
                             "statement cache and idle pool connections expire after 300 s)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out = Path(args.out or tempfile.mkdtemp(prefix="idle-return-"))
    out.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(args, out))


if __name__ == "__main__":
    main()
