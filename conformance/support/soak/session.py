"""One live subscription of the soak: a client over a real WebSocket that
reconnects when its socket is lost, folds its deltas into a window and
records every breach of the delivery contract it sees."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from service_engine.graphql import PASSPORT_HEADER, Passport

from ...blackbox.harness import PROTOCOL, Pod
from .model import SUBSCRIPTIONS, TITLE, Slots


@dataclass(eq=False)
class Session:
    """One client subscription, reconnecting when its socket is lost. Folds
    its deltas into ``window`` and records every breach of the contract."""

    index: int
    kind: str
    cohort: int
    passport: Passport
    slots: Slots
    sent: Mapping[int, float]
    in_fault: Callable[[float], bool]
    window: dict[str, Any] = field(default_factory=dict)
    revision: int | None = None
    deltas: int = 0
    resets: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    connects: int = 0
    closes: Counter[str] = field(default_factory=Counter)
    live: asyncio.Event = field(default_factory=asyncio.Event)
    stop: bool = False
    pod_name: str = ""
    ws: ClientConnection | None = None
    stalled: bool = False
    """A stalled subscriber: tiny socket buffers, and reading only when told."""
    reading: asyncio.Event = field(default_factory=asyncio.Event)
    resumed: Counter[str] = field(default_factory=Counter)
    """A stalled session after it read again: deltas, Resets (by cause), closes."""
    history: deque[tuple[str, int, str]] = field(default_factory=lambda: deque(maxlen=400))
    """The latest deltas (type, revision, key or key count): the evidence of a failed check."""

    def __post_init__(self) -> None:
        self.reading.set()

    async def run(self) -> None:
        while not self.stop:
            pod = self.slots.prefer(self.index)
            if pod is None:
                # Both pods down: wait for a restart (bounded, so a stop is seen).
                await self.slots.wait_live(1.0)
                continue
            try:
                await self._connection(pod)
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError) as exc:
                if self.stop:
                    return  # the harness closed it
                self.closes[close_label(exc)] += 1
                if self.stalled and self.resumed["reading again"]:
                    self.resumed[f"closed: {close_label(exc)}"] += 1
            self.ws = None
            self.live.clear()
            if not self.stop:
                await asyncio.sleep(0.2)

    async def _connection(self, pod: Pod) -> None:
        options: dict[str, Any] = {}
        if self.stalled:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            host, port = pod.addr.rsplit(":", 1)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
            options = {"sock": sock, "max_queue": 1}
        async with connect(
            f"ws://{pod.addr}/graphql/ws", subprotocols=[PROTOCOL],
            additional_headers={PASSPORT_HEADER: self.passport.to_header()},
            open_timeout=20, close_timeout=2, ping_interval=None, compression=None,
            **options,
        ) as ws:
            self.ws = ws
            self.pod_name = pod.name
            self.connects += 1
            await ws.send(json.dumps({"type": "connection_init"}))
            ack = json.loads(await asyncio.wait_for(ws.recv(), 20))
            if ack.get("type") != "connection_ack":
                self.violations.append(f"no connection_ack: {ack}")
                return
            await ws.send(json.dumps({"id": "s", "type": "subscribe",
                                      "payload": {"query": SUBSCRIPTIONS[self.kind]}}))
            self.revision = None
            first = True
            while not self.stop:
                if not self.reading.is_set():
                    await self.reading.wait()
                raw = await ws.recv()
                now = time.perf_counter()
                assert isinstance(raw, str)
                message = json.loads(raw)
                kind = message.get("type")
                if kind == "ping":
                    await ws.send(json.dumps({"type": "pong"}))
                    continue
                if kind != "next":
                    self.closes[f"message:{kind}"] += 1
                    return  # complete or error: resubscribe on a fresh socket
                payload = message["payload"]
                if payload.get("errors"):
                    self.violations.append(f"subscription error {payload['errors']}")
                    return
                self._apply(payload["data"][self.kind], first, now)
                first = False

    def _apply(self, delta: dict[str, Any], first: bool, now: float) -> None:
        typename: str = delta["__typename"]
        if typename.startswith("Lanes"):
            return  # LanesPaused / LanesResumed carry no revision
        revision = int(delta["revision"])
        self.history.append((typename, revision, delta.get("key") or f"{len(delta['keys'])} keys"))
        if typename.endswith("Reset"):
            if first:
                cause = "initial" if self.connects == 1 else "reconnect"
            elif self.revision is not None and revision != self.revision + 1:
                cause = "gap repaired"
            else:
                cause = "in stream"
            self.resets[cause] += 1
            if self.stalled and self.reading.is_set() and self.resumed["reading again"]:
                self.resumed[f"Reset ({cause})"] += 1
            self.window = dict(zip(delta["keys"], delta["views"], strict=True))
            self.revision = revision
            self.live.set()
            return
        if first or self.revision is None:
            self.violations.append(f"{typename} r{revision} before any Reset")
        elif revision != self.revision + 1:
            self.violations.append(f"{typename} r{revision} after r{self.revision}: a silent gap")
        self.revision = revision
        self.deltas += 1
        if self.stalled and self.resumed["reading again"]:
            self.resumed["deltas"] += 1
        if typename.endswith("Upsert"):
            view = delta["view"]
            self.window[delta["key"]] = view
            match = TITLE.fullmatch(f'"title":"{view.get("title", "")}"')
            if match is not None:
                started = self.sent.get(int(match.group(1)))
                if started is not None and not self.in_fault(started) and not self.in_fault(now):
                    self.latencies.append(now - started)
        else:
            self.window.pop(delta["key"], None)


def close_label(exc: BaseException) -> str:
    if isinstance(exc, ConnectionClosed):
        rcvd = exc.rcvd
        return f"closed {rcvd.code}" if rcvd is not None else "closed abnormally"
    return type(exc).__name__
