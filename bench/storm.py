"""A reconnect storm and a leak test, against the reference service.

    python bench/storm.py [--sockets 5000] [--orgs 50] [--cycles 5]
                          [--cycle-sockets 1000] [--trees .,/path/to/older/tree]
                          [--rounds 1] [--py-spy FILE]

For each tree (this checkout by default; ``--trees`` adds another worktree,
e.g. an older commit, run by the same interpreter), the reference service
runs in its own process (``bench/e2e.py``'s `service`) at the engine's
defaults (``ws_max_sockets`` not raised), and:

* storm: ``--sockets`` graphql-transport-ws sockets are opened at once, each
  with one ``boards`` subscription, spread over ``--orgs`` orgs (what a pod
  restart brings: every client reconnecting). Reported: how many reached
  their first frame (the Reset), how many were refused (1013) or failed, and
  the seconds from the burst's start to the first frame of the last one
  (``all_s``; the target is 2.5 s for 5,000) with the p50 / p99 over sockets.
* leak: ``--cycles`` cycles of opening ``--cycle-sockets`` sessions at once
  and closing them all; the service's RSS after each cycle once the pod has
  no live session and its RSS stopped moving. ``drift`` is the RSS after the
  last cycle over the RSS after the first (the target: within 5 %).

``--rounds`` repeats the storm, the trees interleaved (each tree's service
up for the whole run). ``--py-spy FILE`` records the service's stacks during
each storm (py-spy's raw format, ``FILE.<round>.<n>.txt``). The client (this process, lean sockets) shares the
machine's cores with the service.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from e2e import REPO, Service, Subscriber, open_subscriber, series, service, settle


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def storm(svc: Service, count: int, n_orgs: int, tag: str) -> dict[str, Any]:
    """``count`` sockets opened at once; when each got its first frame."""
    sent: dict[int, float] = {}
    orgs = [f"{tag}o{j}" for j in range(n_orgs)]
    begin = time.perf_counter()
    opened = await asyncio.gather(*(
        open_subscriber(svc.addr, f"{tag}u{i}", orgs[i % n_orgs], sent) for i in range(count)
    ), return_exceptions=True)
    subscribers = [s for s in opened if isinstance(s, Subscriber)]
    refused = sum(1 for s in opened if not isinstance(s, Subscriber))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(s.live.wait() for s in subscribers)), 120)
    # Idle sessions: a subscriber's last message is its first frame, the Reset.
    firsts = [s.last_at - begin for s in subscribers if s.live.is_set()]
    rss = svc.rss()
    async with httpx.AsyncClient(base_url=f"http://{svc.addr}") as http:
        await asyncio.gather(*(_close(s) for s in subscribers))
        await settle(svc, http, None)
    return {"sockets": count, "live": len(firsts), "refused_or_failed": refused,
            "all_s": round(max(firsts, default=float("nan")), 3),
            "p50_s": round(pct(firsts, 0.5), 3), "p99_s": round(pct(firsts, 0.99), 3),
            "rss_held_mb": round(rss, 1)}


async def _close(subscriber: Subscriber) -> None:
    with contextlib.suppress(Exception):
        await subscriber.ws.close()


async def leak(svc: Service, cycles: int, count: int, n_orgs: int, tag: str) -> dict[str, Any]:
    """RSS after each of ``cycles`` cycles of ``count`` sessions opened and closed."""
    after: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://{svc.addr}") as http:
        for cycle in range(cycles):
            sent: dict[int, float] = {}
            orgs = [f"{tag}c{cycle}o{j}" for j in range(n_orgs)]
            opened = await asyncio.gather(*(
                open_subscriber(svc.addr, f"{tag}c{cycle}u{i}", orgs[i % n_orgs], sent)
                for i in range(count)), return_exceptions=True)
            subscribers = [s for s in opened if isinstance(s, Subscriber)]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(s.live.wait() for s in subscribers)), 120)
            releases = await series(http, "service_engine_memory_releases_total")
            await asyncio.gather(*(_close(s) for s in subscribers))
            del subscribers, opened
            _took, _released, rss = await settle(svc, http, releases)
            after.append(round(rss, 1))
    return {"cycles": cycles, "sessions": count, "rss_after_mb": after,
            "drift": round(after[-1] / after[0] - 1, 4) if after else float("nan")}


async def run(args: argparse.Namespace) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    trees = [REPO if t in (".", "") else Path(t) for t in args.trees.split(",")]
    # The engine's defaults: the socket bound not raised (e2e raises it).
    env = {"SERVICE_ENGINE_WS_MAX_SOCKETS": ""}
    async with contextlib.AsyncExitStack() as stack:
        services = [(str(tree), await stack.enter_async_context(
            service(env, tree=tree, prefix="storm-"))) for tree in trees]
        for n in range(args.rounds):
            for i, (label, svc) in enumerate(services):
                spy = None
                if args.py_spy:
                    spy = subprocess.Popen(  # noqa: ASYNC220
                        [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
                         "-r", "200", "-o", f"{args.py_spy}.{n}.{i}.txt", "-p", str(svc.pids[0])],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    await asyncio.sleep(1)  # attached before the burst
                row = await storm(svc, args.sockets, args.orgs, f"s{n}")
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    await asyncio.to_thread(spy.wait, 30)
                print(label, "storm", row, f"load {os.getloadavg()[0]:.1f}", flush=True)
        if args.cycles:
            for label, svc in services:
                row = await leak(svc, args.cycles, args.cycle_sockets, args.orgs, "l")
                print(label, "leak", row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sockets", type=int, default=5000)
    parser.add_argument("--orgs", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--cycle-sockets", type=int, default=1000)
    parser.add_argument("--trees", default=".")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--py-spy", default="")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
