"""A reconnect storm and a leak test, against the reference service.

    python bench/storm.py [--sockets 5000] [--orgs 50] [--cycles 5]
                          [--cycle-sockets 1000] [--trees .,/path/to/older/tree]
                          [--rounds 1] [--py-spy FILE] [--timeline]

For each tree (this checkout by default; ``--trees`` adds another worktree,
e.g. an older commit, run by the same interpreter), the reference service
runs in its own process (``bench/e2e.py``'s `service`) at the engine's
defaults (``ws_max_sockets`` not raised), and:

* storm: ``--sockets`` graphql-transport-ws sockets are opened at once, each
  with one ``boards`` subscription, spread over ``--orgs`` orgs (what a pod
  restart brings: every client reconnecting), by `StormSocket`s (the bytes
  a client sends, for a fraction of a client library's CPU: this process
  shares the two cores with the service). Reported: how many reached
  their first frame (the Reset), how many were refused (1013) or failed, and
  the seconds from the burst's start to the first frame of the last one
  (``all_s``; the target is 2.5 s for 5,000) with the p50 / p99 over sockets
  (and the p50 / max of when the upgrade was answered and the
  ``connection_ack`` came),
  and the service's CPU seconds (user + sys) from the burst's start until
  every socket was live (``cpu_s``; its sys part, the kernel's work on the
  sockets, ``sys_s``) and per attach (``cpu_ms_per_attach``),
  and this process's (the client's) and Postgres's over the same time
  (``client_cpu_s``, ``postgres_cpu_s``).
* leak: ``--cycles`` cycles of opening ``--cycle-sockets`` sessions at once
  and closing them all; the service's RSS after each cycle once the pod has
  no live session and its RSS stopped moving. ``drift`` is the RSS after the
  last cycle over the RSS after the first (the target: within 5 %).

``--rounds`` repeats the storm, the trees interleaved (each tree's service
up for the whole run). ``--py-spy FILE`` records the service's stacks during
each storm (py-spy's raw format, ``FILE.<round>.<n>.txt``; ``bench/spy_profile.py``
sums them per function); ``--timeline``
prints, every half second of a storm, the CPU shares of the service, this
process and Postgres and how many sockets were upgraded, acknowledged and
live. The leak test's subscribers are ``bench/e2e.py``'s. Each service's
data folder (``/tmp/storm-*``) is removed when the run ends.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from e2e import (
    PROTOCOL,
    REPO,
    SUBSCRIPTION,
    Service,
    Subscriber,
    cpu_seconds,
    open_subscriber,
    passport,
    series,
    service,
    settle,
)
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import USER_AGENT


def postgres_cpu(svc: Service) -> float:
    """The CPU seconds of the service's embedded Postgres: its postmaster
    and the backends running now (the pool's connections)."""
    total = 0.0
    for pid_file in svc.data.rglob("postmaster.pid"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            root = int(pid_file.read_text().split()[0])
            children = Path(f"/proc/{root}/task/{root}/children").read_text().split()
            for pid in (root, *map(int, children)):
                with contextlib.suppress(OSError):
                    total += cpu_seconds(pid)
    return total


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class StormSocket(asyncio.Protocol):
    """One storm subscriber, as cheap for this process as a socket can be:
    the upgrade written from a template, the server's frames parsed from
    their headers, ``connection_init`` and ``subscribe`` masked once for
    every socket (`Frames`). The bytes on the wire are what a client sends
    (a masked text frame each, the ack awaited before the subscribe), so
    the service does the same work for it as for any client; this process,
    on the same two cores, does little.

    ``live`` is done when the first frame after the ack arrived (its time
    in ``first_at``), or failed (refused: a close frame or the connection
    lost before it, ``close_code`` then the close's code)."""

    def __init__(self, request: bytes, frames: Frames) -> None:
        self._request = request
        self._frames = frames
        self._buffer = b""
        self._upgraded = False
        self._acked = False
        self._transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.live: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self.first_at = 0.0
        self.upgraded_at = 0.0
        self.acked_at = 0.0
        self.close_code: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        if not self._upgraded:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                self._buffer = buffer
                return
            if not buffer.startswith(b"HTTP/1.1 101 "):
                self._fail(f"upgrade refused: {buffer[:end].splitlines()[0]!r}")
                return
            self._upgraded = True
            self.upgraded_at = time.perf_counter()
            assert self._transport is not None
            self._transport.write(self._frames.init)  # on ``open``, as a client does
            buffer = buffer[end + 4:]
        at = 0
        size = len(buffer)
        while size - at >= 2:
            opcode = buffer[at] & 0x0F
            length = buffer[at + 1] & 0x7F
            head = 2
            if length == 126:
                head = 4
                length = int.from_bytes(buffer[at + 2:at + 4], "big") if size - at >= 4 else -1
            elif length == 127:
                head = 10
                length = int.from_bytes(buffer[at + 2:at + 10], "big") if size - at >= 10 else -1
            if length < 0 or size - at < head + length:
                break
            payload = buffer[at + head:at + head + length]
            at += head + length
            self._frame(opcode, payload)
        self._buffer = buffer[at:]

    def _frame(self, opcode: int, payload: bytes) -> None:
        if opcode == 0x8:  # close
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            self.close_code = code
            if self._transport is not None and not self._transport.is_closing():
                self._transport.write(self._frames.close)
            self._fail(f"closed {code}: {payload[2:].decode(errors='replace')}")
            return
        if opcode != 0x1 or self.live.done():
            return  # a ping (its pong is not needed here), or after the first frame
        if not self._acked:
            if b'"connection_ack"' not in payload:
                self._fail(f"not an ack: {payload[:80]!r}")
                return
            self._acked = True
            self.acked_at = time.perf_counter()
            assert self._transport is not None
            self._transport.write(self._frames.subscribe)
            return
        self.first_at = time.perf_counter()
        if b"Reset" in payload:
            self.live.set_result(None)
        else:
            self._fail(f"first frame not a Reset: {payload[:120]!r}")

    def _fail(self, why: str) -> None:
        if not self.live.done():
            self.live.set_exception(ConnectionError(why))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"connection lost: {exc}")
        if not self.lost.done():
            self.lost.set_result(None)

    async def close(self) -> None:
        """The closing handshake (1000), then the connection closed (within 10 s)."""
        transport = self._transport
        if transport is None or self.lost.done():
            return
        if self.close_code is None:
            transport.write(self._frames.close)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.lost), 10)
        transport.close()


class Frames:
    """What every storm socket sends: the upgrade's template and its masked frames."""

    def __init__(self, addr: str) -> None:
        def masked(text: str) -> bytes:
            return Frame(Opcode.TEXT, text.encode()).serialize(mask=True)

        self.init = masked(json.dumps({"type": "connection_init"}))
        self.subscribe = masked(json.dumps(
            {"id": "1", "type": "subscribe", "payload": {"query": SUBSCRIPTION}}))
        self.close = Frame(Opcode.CLOSE, Close(1000, "").serialize()).serialize(mask=True)
        self.addr = addr

    def request(self, sub: str, org: str) -> bytes:
        """The upgrade of one subscriber (the headers websockets' client sends)."""
        key = base64.b64encode(os.urandom(16)).decode()
        return (
            f"GET /graphql/ws HTTP/1.1\r\nHost: {self.addr}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {PROTOCOL}\r\n"
            f"User-Agent: {USER_AGENT}\r\nX-Passport: {passport(sub, org)}\r\n\r\n"
        ).encode()


async def open_storm_socket(frames: Frames, sub: str, org: str) -> StormSocket:
    """A storm subscriber, connected, its upgrade sent."""
    host, port = frames.addr.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    socket = StormSocket(frames.request(sub, org), frames)
    # (No wait_for of its own: the burst as a whole is bounded, `storm`.)
    await loop.create_connection(lambda: socket, host, int(port))
    return socket


async def timeline(svc: Service, sockets: list[StormSocket], begin: float,
                   every: float = 0.5) -> None:
    """Every ``every`` seconds until cancelled: the CPU share the service,
    this process and Postgres took over the last interval (of one core), and
    how many sockets were upgraded, acknowledged and live by then."""
    last = (time.perf_counter(), svc.cpu(), time.process_time(), postgres_cpu(svc))
    while True:
        await asyncio.sleep(every)
        now = (time.perf_counter(), svc.cpu(), time.process_time(), postgres_cpu(svc))
        span = now[0] - last[0]
        shares = " ".join(f"{name} {100 * (b - a) / span:3.0f}%" for name, a, b in
                          zip(("service", "client", "postgres"), last[1:], now[1:], strict=True))
        upgraded = sum(1 for s in sockets if s.upgraded_at)
        acked = sum(1 for s in sockets if s.acked_at)
        live = sum(1 for s in sockets if s.first_at)
        print(f"  t={now[0] - begin:5.2f}s {shares} upgraded {upgraded:5} acked {acked:5} "
              f"live {live:5} load {os.getloadavg()[0]:.1f}", flush=True)
        last = now


async def storm(svc: Service, count: int, n_orgs: int, tag: str,
                show_timeline: bool = False) -> dict[str, Any]:
    """``count`` sockets opened at once; when each got its first frame."""
    orgs = [f"{tag}o{j}" for j in range(n_orgs)]
    frames = Frames(svc.addr)
    cpu0, sys0, own0, pg0 = svc.cpu(), svc.sys_cpu(), time.process_time(), postgres_cpu(svc)
    begin = time.perf_counter()
    connecting = [asyncio.ensure_future(open_storm_socket(frames, f"{tag}u{i}", orgs[i % n_orgs]))
                  for i in range(count)]
    watch = None
    if show_timeline:
        watch = asyncio.ensure_future(timeline(svc, [], begin))
    opened = await asyncio.wait_for(asyncio.gather(*connecting, return_exceptions=True), 120)
    sockets = [s for s in opened if isinstance(s, StormSocket)]
    if watch is not None:
        watch.cancel()
        watch = asyncio.ensure_future(timeline(svc, sockets, begin))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(s.live for s in sockets),
                                              return_exceptions=True), 120)
    cpu, own, pg = svc.cpu() - cpu0, time.process_time() - own0, postgres_cpu(svc) - pg0
    sys_cpu = svc.sys_cpu() - sys0
    if watch is not None:
        watch.cancel()
    live = [s for s in sockets
            if s.live.done() and not s.live.cancelled() and s.live.exception() is None]
    firsts = [s.first_at - begin for s in live]
    upgraded = [s.upgraded_at - begin for s in live]
    acked = [s.acked_at - begin for s in live]
    refused = sum(1 for s in sockets if s.close_code == 1013)
    rss = svc.rss()
    async with httpx.AsyncClient(base_url=f"http://{svc.addr}") as http:
        await asyncio.gather(*(s.close() for s in sockets))
        await settle(svc, http, None)
    return {"sockets": count, "live": len(firsts), "refused": refused,
            "failed": count - len(firsts) - refused,
            "all_s": round(max(firsts, default=float("nan")), 3),
            "p50_s": round(pct(firsts, 0.5), 3), "p99_s": round(pct(firsts, 0.99), 3),
            "upgraded_p50_max_s": (round(pct(upgraded, 0.5), 3), round(max(upgraded), 3)),
            "acked_p50_max_s": (round(pct(acked, 0.5), 3), round(max(acked), 3)),
            "cpu_s": round(cpu, 2), "sys_s": round(sys_cpu, 2),
            "cpu_ms_per_attach": round(cpu / max(1, len(firsts)) * 1e3, 3),
            "client_cpu_s": round(own, 2), "postgres_cpu_s": round(pg, 2),
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
        services = [(str(tree), await stack.enter_async_context(_served(env, tree)))
                    for tree in trees]
        for n in range(args.rounds):
            for i, (label, svc) in enumerate(services):
                spy = None
                if args.py_spy:
                    spy = subprocess.Popen(  # noqa: ASYNC220
                        [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
                         "-r", "200", "-o", f"{args.py_spy}.{n}.{i}.txt", "-p", str(svc.pids[0])],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    await asyncio.sleep(1)  # attached before the burst
                row = await storm(svc, args.sockets, args.orgs, f"s{n}", args.timeline)
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    await asyncio.to_thread(spy.wait, 30)
                print(label, "storm", row, f"load {os.getloadavg()[0]:.1f}", flush=True)
        if args.cycles:
            for label, svc in services:
                row = await leak(svc, args.cycles, args.cycle_sockets, args.orgs, "l")
                print(label, "leak", row, flush=True)


@contextlib.asynccontextmanager
async def _served(env: dict[str, str], tree: Path) -> AsyncIterator[Service]:
    """`service` on ``tree``; its data folder removed once it stopped."""
    data: Path | None = None
    try:
        async with service(env, tree=tree, prefix="storm-") as svc:
            data = svc.data
            yield svc
    finally:
        if data is not None:
            shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sockets", type=int, default=5000)
    parser.add_argument("--orgs", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--cycle-sockets", type=int, default=1000)
    parser.add_argument("--trees", default=".")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--py-spy", default="")
    parser.add_argument("--timeline", action="store_true",
                        help="print the CPU shares and the sockets' progress every 0.5 s")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
