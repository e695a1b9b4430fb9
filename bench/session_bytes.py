"""Bytes per idle session on the wire: what the server keeps per socket, by owner.

    python bench/session_bytes.py [--sessions 500] [--warmup 50] [--frames 12]
                                  [--top 15] [--env NAME=VALUE ...]

The reference service (``python -m example_service`` on its embedded
Postgres + NATS) runs in a child process started by this script with a
probe of its own (``--serve``, SIGUSR1): only the server process is
measured, never the client's objects. The steps:

1. a warm-up opens and closes ``--warmup`` sessions (what a process builds
   once: lazy imports, caches' first entries, the planned documents);
2. **mark**: the probe collects, starts tracemalloc (``--frames`` frames)
   and takes a snapshot;
3. ``--sessions`` graphql-transport-ws sockets open (the ``websockets``
   client, the passport on the upgrade, ``bench/e2e.py``'s), each with one
   ``boards`` subscription, and go live (their Reset received);
4. **held**: the probe collects and snapshots again, and compares with the
   mark (``Snapshot.compare_to``): the bytes allocated since the mark and
   still alive, per session, grouped by the allocating file's owner (the
   package; the module for the engine's own), the top tracebacks, and the
   objects the collector tracks, by type, per session;
5. the sockets close.

tracemalloc's own bookkeeping is not counted (it is filtered out); the
figures are Python allocations (RSS per session is ~1.6-1.8x these,
fragmentation in pymalloc's arenas; ``bench/e2e.py --idle`` measures RSS).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import json
import os
import resource
import signal
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # e2e's helpers
from e2e import REPO, open_many, open_subscriber, rss_mb, service

STDLIB = sysconfig.get_paths()["stdlib"]
SCRIPT = str(Path(__file__).resolve())


def owner(filename: str) -> str:
    """The owner of an allocating file: ``service_engine.<module>``, a
    third-party package, ``asyncio``, another stdlib module, or the
    reference service."""
    path = filename.replace("\\", "/")
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    repo = str(REPO) + "/"
    if path.startswith(repo):
        rel = path[len(repo):].removesuffix(".py").replace("/", ".")
        if rel.startswith("service_engine."):
            parts = rel.split(".")
            return ".".join(parts[:3] if len(parts) > 3 else parts)
        return rel.split(".", 1)[0]
    if path.startswith(STDLIB + "/"):
        rel = path[len(STDLIB) + 1:]
        top = rel.split("/", 1)[0].removesuffix(".py")
        return top if "/" in rel and top == "asyncio" else f"stdlib {top}"
    return path.rsplit("/", 1)[-1]


# -- the probe (in the service's process) ---------------------------------------------


class _Probe:
    def __init__(self, folder: Path, frames: int) -> None:
        self.folder = folder
        self.frames = frames
        self.mark: Any = None
        self.mid: Any = None
        self.types: collections.Counter[str] = collections.Counter()

    @staticmethod
    def _types() -> collections.Counter[str]:
        return collections.Counter(
            f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())

    def _garbage(self) -> None:
        """What a full collection would free now (cyclic garbage left since
        the mark's collection), by type: ``garbage.json``."""
        import tracemalloc

        from dev.memory_pins import cyclic_garbage

        found = cyclic_garbage()

        counts: collections.Counter[str] = collections.Counter()
        sizes: collections.Counter[str] = collections.Counter()
        sites: collections.Counter[str] = collections.Counter()
        for obj in found:
            name = f"{type(obj).__module__}.{type(obj).__qualname__}"
            counts[name] += 1
            sizes[name] += sys.getsizeof(obj)
            where = tracemalloc.get_object_traceback(obj)
            if where is not None:
                sites[name + " at " + " <- ".join(
                    f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                    for f in list(reversed(where))[:5])] += sys.getsizeof(obj)
        del found
        (self.folder / "garbage.json").write_text(json.dumps(
            {"counts": dict(counts.most_common(40)), "sizes": dict(sizes.most_common(40)),
             "sites": dict(sites.most_common(12))}))

    def __call__(self) -> None:
        import tracemalloc

        step = (self.folder / "step").read_text().strip()
        if step == "held":
            self._garbage()
        gc.collect()
        ignored = [tracemalloc.Filter(False, tracemalloc.__file__),
                   tracemalloc.Filter(False, __file__),
                   tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
                   tracemalloc.Filter(False, "<unknown>")]
        if step == "mid":
            # Mid-burst: what is alive now and gone by "held" is the burst's
            # transient state (`--burst`).
            self.mid = tracemalloc.take_snapshot().filter_traces(ignored)
        elif step == "mark":
            self.types = self._types()
            tracemalloc.start(self.frames)
            self.mark = tracemalloc.take_snapshot().filter_traces(ignored)
        elif step == "held":
            held = tracemalloc.take_snapshot().filter_traces(ignored)
            tracemalloc.stop()
            by_file = held.compare_to(self.mark, "filename")
            owners: collections.Counter[str] = collections.Counter()
            files: collections.Counter[str] = collections.Counter()
            for stat in by_file:
                filename = stat.traceback[0].filename
                owners[owner(filename)] += stat.size_diff
                files[filename] += stat.size_diff
            traces = []
            for stat in held.compare_to(self.mark, "traceback")[:60]:
                traces.append({"size": stat.size_diff, "count": stat.count_diff,
                               "frames": [f"{f.filename}:{f.lineno}"
                                          for f in stat.traceback][:self.frames]})
            lines = [{"size": s.size_diff, "count": s.count_diff,
                      "line": f"{s.traceback[0].filename}:{s.traceback[0].lineno}"}
                     for s in held.compare_to(self.mark, "lineno")[:60]]
            transient: list[dict[str, Any]] = []
            if self.mid is not None:
                freed = [stat for stat in held.compare_to(self.mid, "traceback")
                         if stat.size_diff < 0]
                for stat in sorted(freed, key=lambda stat: stat.size_diff)[:40]:
                    if stat.size_diff < 0:
                        transient.append({"size": -stat.size_diff, "count": -stat.count_diff,
                                          "frames": [f"{f.filename}:{f.lineno}"
                                                     for f in stat.traceback][:self.frames]})
                transient.sort(key=lambda t: -t["size"])
            self.mark = self.mid = None
            types = self._types()
            grown = {k: types[k] - self.types.get(k, 0) for k in types}
            (self.folder / "held.json").write_text(json.dumps({
                "owners": dict(owners), "files": dict(files.most_common(80)),
                "traces": traces, "lines": lines,
                "types": {k: v for k, v in grown.items() if v > 0},
                "transient": transient,
            }))
        (self.folder / f"{step}.done").touch()


async def _serve(folder: Path, frames: int) -> None:
    from example_service.boot import main as service_main

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, _Probe(folder, frames))
    await service_main()


# -- the driver ----------------------------------------------------------------------


async def probe(pid: int, folder: Path, step: str) -> None:
    (folder / f"{step}.done").unlink(missing_ok=True)
    (folder / "step").write_text(step)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 600
    while not (folder / f"{step}.done").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the service wrote no {step} figures")
        await asyncio.sleep(0.1)


async def open_live(addr: str, count: int, prefix: str, batch: int = 100,
                    mid: Any = None) -> list[Any]:
    sent: dict[int, float] = {}
    orgs = [f"{prefix}o{j}" for j in range(50)]
    if mid is None:
        subscribers = await open_many(addr, count, orgs, prefix, sent, batch=batch)
    else:
        # All at once, and ``mid()`` once half of them are through their ack.
        half = asyncio.Event()
        done = 0

        def one_done(_task: Any) -> None:
            nonlocal done
            done += 1
            if done >= count // 2:
                half.set()

        tasks = [asyncio.ensure_future(open_subscriber(addr, f"{prefix}u{i}", orgs[i % 50], sent))
                 for i in range(count)]
        for task in tasks:
            task.add_done_callback(one_done)
        await half.wait()
        await mid()
        opened = await asyncio.gather(*tasks, return_exceptions=True)
        subscribers = [s for s in opened if not isinstance(s, BaseException)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(s.live.wait() for s in subscribers)), 300)
    return subscribers


async def close_all(subscribers: list[Any]) -> None:
    await asyncio.gather(*(s.ws.close() for s in subscribers), return_exceptions=True)


def short(frame: str) -> str:
    path, _, line = frame.rpartition(":")
    for cut in ("/site-packages/", str(REPO) + "/", STDLIB + "/"):
        if cut in path:
            path = path.split(cut, 1)[1]
            break
    return f"{path}:{line}"


async def run(args: argparse.Namespace) -> None:
    env = dict(kv.split("=", 1) for kv in args.env)
    load0 = os.getloadavg()[0]
    command = [SCRIPT, "--serve", "--frames", str(args.frames)]
    async with service(env, command=command, prefix="session-bytes-") as svc:
        proc, addr, folder = svc.procs[0], svc.addr, svc.data
        if args.warmup:
            await close_all(await open_live(addr, args.warmup, "warm"))
            await asyncio.sleep(1.0)
        rss0 = rss_mb(proc.pid)
        await probe(proc.pid, folder, "mark")
        mid = (lambda: probe(proc.pid, folder, "mid")) if args.burst else None
        subscribers = await open_live(addr, args.sessions, "held", mid=mid)
        live = sum(s.live.is_set() for s in subscribers)
        await asyncio.sleep(1.0)
        rss1 = rss_mb(proc.pid)
        await probe(proc.pid, folder, "held")
        await close_all(subscribers)
    held = json.loads((folder / "held.json").read_text())
    garbage = json.loads((folder / "garbage.json").read_text())
    n = max(1, live)
    total = sum(held["owners"].values())
    print(f"{args.sessions} sessions, {live} live; load average {load0:.2f} -> "
          f"{os.getloadavg()[0]:.2f}; env {args.env}; tracemalloc {args.frames} frames")
    print(f"Python memory held per session: {total / n / 1024:.2f} KB "
          f"(RSS, traced: {rss0:.0f} -> {rss1:.0f} MB, {(rss1 - rss0) * 1024 / n:.1f} KB a session)")
    print("\nby owner (the allocating file's package; the engine by module), KB per session:")
    for name, size in sorted(held["owners"].items(), key=lambda kv: -kv[1]):
        if abs(size) / n >= 10:
            print(f"  {size / n / 1024:7.2f}  {name}")
    print("\nby file, KB per session:")
    for name, size in list(held["files"].items())[:args.top * 2]:
        if abs(size) / n >= 10:
            print(f"  {size / n / 1024:7.2f}  {short(name)}")
    print(f"\ntop {args.top} tracebacks (bytes and blocks per session, most recent first):")
    for trace in held["traces"][:args.top]:
        frames = " <- ".join(short(f) for f in reversed(trace["frames"][-6:]))
        print(f"  {trace['size'] / n:7.0f} B {trace['count'] / n:5.1f}  {frames}")
    total_garbage = sum(garbage["sizes"].values())
    print(f"\ncyclic garbage left since the mark (what a full collection frees): "
          f"{sum(garbage['counts'].values()) / n:.1f} objects, "
          f"{total_garbage / n / 1024:.2f} KB a session; by type (count, bytes a session):")
    for name, count in list(garbage["counts"].items())[:20]:
        if count / n >= 0.5:
            print(f"  {count / n:6.2f} {garbage['sizes'][name] / n:7.0f} B  {name}")
    for site, size in garbage.get("sites", {}).items():
        if size / n >= 20:
            print(f"     {size / n:7.0f} B  {site}")
    if held.get("transient"):
        print("\n--burst: alive mid-burst and freed by held (bytes, blocks a session):")
        for trace in held["transient"][:args.top]:
            frames = " <- ".join(short(f) for f in reversed(trace["frames"][-6:]))
            print(f"  {trace['size'] / n:7.0f} B {trace['count'] / n:5.1f}  {frames}")
    print("\nobjects the collector tracks, grown per session (top 25):")
    for name, count in sorted(held["types"].items(), key=lambda kv: -kv[1])[:25]:
        if count / n >= 0.5:
            print(f"  {count / n:6.2f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--burst", action="store_true",
                        help="open every session at once; report what the burst held mid-way")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        # The served child: its folder is the one `e2e.service` made for it.
        asyncio.run(_serve(Path(os.environ["EXAMPLE_SERVICE_DATA"]), args.frames))
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
