"""The soak harness: the reference service under a mixed load while things
fail, then every promise checked at once.

`run_soak` spawns ``pods`` processes of the reference service (the black-box
`Pods`) on one Postgres and one nats-server of its own (``sync_interval:
always``, so a SIGKILL loses nothing JetStream acknowledged), opens
``sessions`` live subscriptions over real WebSockets spread over ``cohorts``
orgs (half ``boards``, half ``cards``), and drives ``rate`` operations/s
mixed across the slices: GraphQL mutations over HTTP (board and card
renames, ledger postings, typing presence), ``card.create`` commands from
the twin over NATS, replies streamed on lane A by the twin and sealed by its
``reply.finish``, and poison commands the service must dead-letter. While it
runs, a fault schedule injects each kind ``faults`` times, one fault at a
time, waiting for recovery before the next:

* ``nats_kill``: nats-server SIGKILLed, held down past ``nats_grace``, restarted;
* ``listener_kill``: ``pg_terminate_backend`` of every pod's LISTEN backend;
* ``pod_kill``: one pod SIGKILLed mid-load and restarted (its sessions
  reconnect to the other pod and start again from a Reset);
* ``burst``: ``burst`` concurrent mutations at once, past the pods'
  ``listener_channel_capacity`` (set small for the pods);
* ``stall``: a subscriber that stops reading its socket for a while (its
  session must come back Reset or closed; the others are unaffected).

It stops by itself (``seconds`` of load, then a bounded drain) and `check`
compares what every client saw with committed state. The result is a
`SoakReport`: the table `bench/soak.py` prints and the list of violations
the conformance scenario asserts empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import re
import socket
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import nats
from nats.js.api import DeliverPolicy
from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from example_twin.contract import CreateCard
from example_twin.reply import finish_reply, split_text, stream_reply
from example_twin.runner import HEADER_MESSAGE_ID, HEADER_NATS_MSG_ID, Twin
from service_engine import EventMetadata
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase, provision_streams
from service_engine.graphql import PASSPORT_HEADER, Passport
from service_engine.lanes import seal_hash

from .blackbox.harness import PROTOCOL, Pod, Pods
from .harness import owner_connection

__all__ = ["FAULT_KINDS", "SoakConfig", "SoakReport", "run_soak"]

FAULT_KINDS = ("nats_kill", "listener_kill", "pod_kill", "burst", "stall")
SERVER_FAULTS = frozenset({"nats_kill", "listener_kill", "pod_kill"})
"""Faults that need every pod up before they start."""
BOARDS_PER_COHORT = 8
CARDS_PER_COHORT = 3
RECOVERY_BOUND = 90.0
"""Bound on a pod coming back UP (and the sessions live) after a fault: the
soak shares the cores with the parallel battery, so the bound is generous."""
SETTLE = 1.0
"""Seconds after a fault window still counted as inside it (latency samples)."""
NATS_REASON = "nats_unreachable"
NATS_DOWN_BOUND = 15.0
"""Seconds past the grace within which every pod must say DOWN(nats_unreachable)."""
LISTENER_REASONS = frozenset({"listener", "listener_brake"})

BOARD_VIEW = "id org title owner archived member affordances { action allowed reason }"
CARD_VIEW = "id org title stage revision owner overdue reviewedBy"
SUBSCRIPTIONS = {
    "boards": f"""subscription {{ boards {{ __typename
      ... on BoardsReset {{ revision keys views {{ {BOARD_VIEW} }} }}
      ... on BoardsUpsert {{ revision key view {{ {BOARD_VIEW} }} }}
      ... on BoardsRemove {{ revision key }} }} }}""",
    "cards": f"""subscription {{ cards(limit: 50) {{ __typename
      ... on CardsReset {{ revision keys views {{ {CARD_VIEW} }} }}
      ... on CardsUpsert {{ revision key view {{ {CARD_VIEW} }} }}
      ... on CardsRemove {{ revision key }} }} }}""",
}
QUERIES = {
    "boards": f"query {{ boards {{ {BOARD_VIEW} }} }}",
    "cards": f"query {{ cards(limit: 500) {{ {CARD_VIEW} }} }}",
}
CREATE_BOARD = "mutation($id: ID, $t: String!) { createBoard(id: $id, title: $t) { success error { code } } }"
RENAME_BOARD = "mutation($id: ID!, $t: String!) { renameBoard(id: $id, title: $t) { success error { code } } }"
CREATE_CARD = "mutation($id: ID, $t: String!) { createCard(id: $id, title: $t) { success error { code } } }"
RENAME_CARD = "mutation($id: ID!, $t: String!) { renameCard(id: $id, title: $t) { success error { code } } }"
OPEN_LEDGER = "mutation($n: String!) { openLedger(name: $n) { success error { code } } }"
POST_LEDGER = "mutation($n: String!) { postToLedger(name: $n, cents: 1, memo: \"soak\") { success error { code } } }"
START_REPLY = "mutation($id: ID) { startReply(id: $id) { success error { code } } }"
TYPING = "mutation($id: ID!) { replyTyping(id: $id) { success error { code } } }"
HEAD = 50
"""The ``cards`` window's live head: its subscription's limit."""
ROOT_FIELD = re.compile(r"\{\s*(\w+)")
TITLE = re.compile(r'"title":"w(\d+)"')


class Poison(BaseModel):
    """A ``card.create`` payload the service cannot decode: dead-lettered."""

    poison: int


@dataclass(frozen=True)
class SoakConfig:
    pods: int = 2
    sessions: int = 60
    cohorts: int = 6
    rate: float = 40.0
    seconds: float = 40.0
    faults: int = 2
    """Faults of each kind."""
    nats_outage: float = 2.5
    nats_grace: float = 1.0
    channel_capacity: int = 64
    """The pods' ``listener_channel_capacity``: small, so a burst overflows it."""
    burst: int = 120
    stall_for: float = 6.0
    poison: int = 0
    """Poison commands injected (one after each fault while any are left);
    0: two per fault kind's repetition."""
    concurrency: int = 64
    """Operations in flight at most (the load sheds past it, counted)."""
    drain_bound: float = 60.0
    seed: int = 18
    verbose: bool = False
    """Print progress (each fault, each phase) as it runs."""


@dataclass
class FaultRecord:
    kind: str
    start: float
    end: float = 0.0
    """When the fault itself ended (NATS restarted, the pod killed, ...)."""
    recovered: float = 0.0
    """When every pod answered UP again (and the sessions were live)."""
    detail: str = ""


@dataclass
class ReplyState:
    """A reply the load started: its chunks, their seal hash, and whether
    JetStream acknowledged every chunk and the finish."""

    org: str
    chunks: list[bytes]
    digest: str
    finished: bool = False


@dataclass
class Sample:
    at: float
    pod: str
    up: bool | None
    """None: the pod did not answer (killed, restarting)."""
    reasons: frozenset[str] = frozenset()


def _passport(sub: str, org: str) -> Passport:
    return Passport(sub=sub, org=org, roles=("board:archive",))


def _org(cohort: int) -> str:
    return f"o{cohort}"


class Slots:
    """The pods by slot; a killed pod's slot is None until its restart is UP."""

    def __init__(self, pods: list[Pod]) -> None:
        self.pods: list[Pod | None] = list(pods)
        self.changed = asyncio.Event()

    def live(self) -> list[Pod]:
        return [p for p in self.pods if p is not None]

    def put(self, slot: int, pod: Pod | None) -> None:
        """Empty a slot (its pod killed) or fill it (the restart is UP)."""
        self.pods[slot] = pod
        if pod is not None:
            self.changed.set()

    async def wait_live(self, bound: float) -> None:
        """Until some pod is live, at most ``bound`` seconds."""
        if self.live():
            return
        self.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound):
                await self.changed.wait()

    def prefer(self, slot: int) -> Pod | None:
        pod = self.pods[slot % len(self.pods)]
        if pod is not None:
            return pod
        live = self.live()
        return live[0] if live else None


# -- a live session ----------------------------------------------------------------------


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
                self.closes[_close_label(exc)] += 1
                if self.stalled and self.resumed["reading again"]:
                    self.resumed[f"closed: {_close_label(exc)}"] += 1
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


def _close_label(exc: BaseException) -> str:
    if isinstance(exc, ConnectionClosed):
        rcvd = exc.rcvd
        return f"closed {rcvd.code}" if rcvd is not None else "closed abnormally"
    return type(exc).__name__


# -- the run -----------------------------------------------------------------------------


@dataclass
class SoakReport:
    config: SoakConfig
    faults: list[FaultRecord]
    table: list[tuple[str, str]]
    violations: list[str]

    def render(self) -> str:
        width = max(len(k) for k, _ in self.table)
        lines = [f"{k:<{width}}  {v}" for k, v in self.table]
        if self.violations:
            lines.append(f"VIOLATIONS ({len(self.violations)}):")
            lines += [f"  - {v}" for v in self.violations[:40]]
        return "\n".join(lines)


class Soak:
    def __init__(self, config: SoakConfig, store: ProvisionedDatabase, workdir: Path) -> None:
        self.config = config
        self.store = store
        self.workdir = workdir
        self.rng = random.Random(config.seed)
        self.nats = EmbeddedNats(workdir / "nats")
        self.pods: Pods | None = None
        self.slots: Slots | None = None
        self.sessions: list[Session] = []
        self.sent: dict[int, float] = {}
        self.seq = itertools.count(1)
        self.faults: list[FaultRecord] = []
        self.samples: list[Sample] = []
        self.ops: Counter[str] = Counter()
        self.ledger_ok: Counter[str] = Counter()
        self.ledger_unknown: Counter[str] = Counter()
        self.commands: dict[str, tuple[uuid.UUID, str]] = {}
        """card id -> (command id, org) of every card.create JetStream acknowledged."""
        self.poison_ids: set[uuid.UUID] = set()
        self.replies: dict[str, ReplyState] = {}
        self.violations: list[str] = []
        self.pod_serial = itertools.count(1)
        self.metrics_seen: dict[str, dict[str, float]] = {}
        self.twin: Twin | None = None
        self.twin_ok = asyncio.Event()
        self.inflight = 0
        self.stop_load = False
        self.began = time.perf_counter()
        self._stalls: list[asyncio.Task[None]] = []
        self._session_tasks: list[asyncio.Task[None]] = []
        self._restart: tuple[asyncio.Task[None], FaultRecord, str] | None = None

    # -- helpers -----------------------------------------------------------------------

    def say(self, what: str) -> None:
        if self.config.verbose:
            print(f"[soak {time.perf_counter() - self.began:6.1f}s] {what}", flush=True)

    def in_fault(self, at: float) -> bool:
        """Inside a fault's window: from its start to its recovery (or its
        end when nothing needed recovering), plus `SETTLE`."""
        return any(
            f.start <= at <= (max(f.end, f.recovered) if f.end else float("inf")) + SETTLE
            for f in self.faults if f.kind != "stall"
        )

    def pod_env(self) -> dict[str, str]:
        c = self.config
        return {
            "SERVICE_ENGINE_NATS_GRACE": str(c.nats_grace),
            "SERVICE_ENGINE_LISTENER_CHANNEL_CAPACITY": str(c.channel_capacity),
            "SERVICE_ENGINE_BEAT_INTERVAL": "0.25",
            "SERVICE_ENGINE_LEASE": "2",
            "SERVICE_ENGINE_LOCK_TIMEOUT": "2",
            "SERVICE_ENGINE_ACK_WAIT": "6",
            "SERVICE_ENGINE_WS_MAX_SOCKETS": "30000",
        }

    async def post(self, query: str, variables: Mapping[str, Any], passport: Passport,
                   pod: Pod | None = None) -> bool | None:
        """A mutation through a live pod: True / False (refused), None when
        its answer was lost (it may or may not have committed)."""
        assert self.slots is not None
        live = self.slots.live()
        if pod is None and not live:
            return None
        target = pod or self.rng.choice(live)
        try:
            answer = await target.post(query, variables, passport)
        except (httpx.HTTPError, AssertionError):
            return None
        data = answer.get("data") or {}
        root = ROOT_FIELD.search(query)
        result = data.get(root.group(1)) if root is not None else None
        if answer.get("errors") or not isinstance(result, dict):
            return None
        return bool(result.get("success"))

    # -- setup -------------------------------------------------------------------------

    async def setup(self) -> None:
        await asyncio.to_thread(self.nats.start)
        await provision_streams(self.nats.url)
        self.pods = Pods(self.store.app_url, self.nats.url, self.workdir)
        pods = self.pods

        async def spawn(i: int) -> Pod:
            return await pods.spawn(f"p{i}", env={
                **self.pod_env(), "SERVICE_ENGINE_POD_ID": f"soak-p{i}-0"})

        first = await spawn(0)  # provisions the buckets, lanes and Identity once
        spawned = [first, *await asyncio.gather(*(spawn(i) for i in range(1, self.config.pods)))]
        self.slots = Slots(spawned)
        pod = spawned[0]

        async def must(query: str, variables: Mapping[str, Any], as_: Passport) -> None:
            data = await pod.gql(query, variables, as_)
            result = next(iter(data.values()))
            assert result["success"], (query, variables, result)

        for cohort in range(self.config.cohorts):
            owner = _passport(f"w{cohort}", _org(cohort))
            for b in range(BOARDS_PER_COHORT):
                await must(CREATE_BOARD, {"id": f"b-{cohort}-{b}", "t": f"start {b}"}, owner)
            for k in range(CARDS_PER_COHORT):
                await must(CREATE_CARD, {"id": f"c-{cohort}-{k}", "t": f"start {k}"}, owner)
            await must(OPEN_LEDGER, {"n": "soak"}, owner)
            await must(START_REPLY, {"id": f"typing-{cohort}"}, owner)

    async def open_sessions(self) -> None:
        assert self.slots is not None
        for i in range(self.config.sessions):
            cohort = i % self.config.cohorts
            kind = "boards" if (i // self.config.cohorts) % 2 == 0 else "cards"
            self.sessions.append(Session(
                i, kind, cohort, _passport(f"u{i}", _org(cohort)), self.slots, self.sent,
                self.in_fault,
            ))
        self._session_tasks += [asyncio.create_task(s.run()) for s in self.sessions]
        await self.wait_live(self.sessions, 120)

    async def wait_live(self, sessions: list[Session], bound: float) -> None:
        deadline = time.monotonic() + bound
        for s in sessions:
            remaining = deadline - time.monotonic()
            try:
                await asyncio.wait_for(s.live.wait(), max(0.1, remaining))
            except TimeoutError:
                self.violations.append(f"session {s.index} not live within {bound:g}s")
                return

    # -- the load ----------------------------------------------------------------------

    async def load(self, seconds: float) -> None:
        rate = self.config.rate
        tasks: set[asyncio.Task[None]] = set()
        begin = time.perf_counter()
        n = 0
        while time.perf_counter() - begin < seconds and not self.stop_load:
            target = begin + n / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            n += 1
            if self.inflight >= self.config.concurrency:
                self.ops["shed"] += 1
                continue
            task = asyncio.create_task(self.one_op())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=30)

    async def one_op(self) -> None:
        self.inflight += 1
        try:
            roll = self.rng.random()
            cohort = self.rng.randrange(self.config.cohorts)
            if roll < 0.45:
                await self.rename("board", cohort)
            elif roll < 0.65:
                await self.rename("card", cohort)
            elif roll < 0.75:
                await self.ledger(cohort)
            elif roll < 0.88:
                await self.card_command(cohort)
            elif roll < 0.95:
                await self.typing(cohort)
            else:
                await self.reply(cohort)
        finally:
            self.inflight -= 1

    async def rename(self, what: str, cohort: int) -> None:
        seq = next(self.seq)
        k = self.rng.randrange(BOARDS_PER_COHORT if what == "board" else CARDS_PER_COHORT)
        query = RENAME_BOARD if what == "board" else RENAME_CARD
        self.sent[seq] = time.perf_counter()
        ok = await self.post(query, {"id": f"{what[0]}-{cohort}-{k}", "t": f"w{seq}"},
                             _passport(f"w{cohort}", _org(cohort)))
        self.ops[f"{what} rename {_outcome(ok)}"] += 1

    async def ledger(self, cohort: int) -> None:
        ok = await self.post(POST_LEDGER, {"n": "soak"}, _passport(f"w{cohort}", _org(cohort)))
        org = _org(cohort)
        if ok:
            self.ledger_ok[org] += 1
        elif ok is None:
            self.ledger_unknown[org] += 1
        self.ops[f"ledger post {_outcome(ok)}"] += 1

    async def typing(self, cohort: int) -> None:
        ok = await self.post(TYPING, {"id": f"typing-{cohort}"},
                             _passport(f"w{cohort}", _org(cohort)))
        self.ops[f"presence {_outcome(ok)}"] += 1

    async def card_command(self, cohort: int) -> None:
        twin = self.twin
        if twin is None or not self.twin_ok.is_set():
            self.ops["card.create skipped (NATS down)"] += 1
            return
        card_id = f"t-{uuid.uuid4().hex[:12]}"
        try:
            command_id = await twin.command(
                CreateCard.VERB,
                CreateCard(card_id=card_id, org=_org(cohort), title=f"twin {card_id}"),
                EventMetadata.originating(twin.actor), within=3.0,
            )
        except Exception:
            self.ops["card.create unacknowledged"] += 1
            return
        self.commands[card_id] = (command_id, _org(cohort))
        self.ops["card.create acknowledged"] += 1

    async def reply(self, cohort: int) -> None:
        twin = self.twin
        org = _org(cohort)
        reply_id = f"r-{uuid.uuid4().hex[:12]}"
        ok = await self.post(START_REPLY, {"id": reply_id}, _passport(f"w{cohort}", org))
        self.ops[f"reply start {_outcome(ok)}"] += 1
        if not ok:
            return
        chunks = split_text(f"soak reply {reply_id}: " + "x" * self.rng.randrange(8, 40), 8)
        state = ReplyState(org, chunks, seal_hash(chunks))
        self.replies[reply_id] = state
        if twin is None or not self.twin_ok.is_set():
            return
        await self.stream_and_finish(twin, reply_id, state)

    async def stream_and_finish(self, twin: Twin, reply_id: str, state: ReplyState) -> None:
        try:
            await stream_reply(twin, reply_id, state.chunks, within=3.0)
            await finish_reply(twin, reply_id, state.org, len(state.chunks) - 1, state.digest,
                               EventMetadata.originating(twin.actor))
        except Exception:
            self.ops["reply chunks/finish unacknowledged"] += 1
            return
        state.finished = True
        self.ops["reply streamed + finish acknowledged"] += 1

    async def poison(self) -> None:
        twin = self.twin
        assert twin is not None
        command_id = await twin.command(
            CreateCard.VERB, Poison(poison=len(self.poison_ids)),
            EventMetadata.originating(twin.actor), within=10.0,
        )
        self.poison_ids.add(command_id)

    # -- readiness and metrics ---------------------------------------------------------

    async def poll(self) -> None:
        """Sample every live pod's /readyz, each pod on its own beat."""
        assert self.slots is not None

        async def one(pod: Pod) -> None:
            at = time.perf_counter()
            try:
                response = await pod.http.get("/readyz", timeout=2)
            except (httpx.HTTPError, RuntimeError):
                self.samples.append(Sample(at, pod.name, None))
                return
            reasons: frozenset[str] = frozenset()
            if response.status_code != 200:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    reasons = frozenset(r["reason"] for r in response.json()["reasons"])
            self.samples.append(Sample(at, pod.name, response.status_code == 200, reasons))

        while True:
            await asyncio.gather(*(one(p) for p in self.slots.live()))
            await asyncio.sleep(0.2)

    async def scrape(self, pod: Pod) -> None:
        """Keep the pod's last counters (a killed pod keeps what it reported)."""
        with contextlib.suppress(httpx.HTTPError, RuntimeError):
            text = (await pod.http.get("/metrics", timeout=3)).text
            values: dict[str, float] = {}
            for line in text.splitlines():
                if line.startswith(("service_engine_resets_total",
                                    "service_engine_deltas_delivered_total")):
                    name, _, value = line.rpartition(" ")
                    cause = re.search(r'cause="(\w+)"', name)
                    metric = ("resets " + cause.group(1)) if cause else "deltas enqueued"
                    values[metric] = values.get(metric, 0.0) + float(value)
            self.metrics_seen[pod.name] = values

    async def scraper(self) -> None:
        assert self.slots is not None
        while True:
            for pod in self.slots.live():
                await self.scrape(pod)
            await asyncio.sleep(2.0)

    async def all_up(self, bound: float = RECOVERY_BOUND) -> bool:
        assert self.slots is not None
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            pods = self.slots.pods
            if all(p is not None for p in pods):
                answers = await asyncio.gather(
                    *(p.http.get("/readyz", timeout=2) for p in pods if p is not None),
                    return_exceptions=True)
                if all(isinstance(a, httpx.Response) and a.status_code == 200 for a in answers):
                    return True
            await asyncio.sleep(0.1)
        return False

    # -- faults ------------------------------------------------------------------------

    async def fault(self, kind: str, n: int) -> None:
        if kind in SERVER_FAULTS:
            await self.restarted()
        record = FaultRecord(kind, time.perf_counter())
        self.faults.append(record)
        self.say(f"fault {kind} #{n}")
        try:
            await getattr(self, f"fault_{kind}")(record, n)
        finally:
            record.end = time.perf_counter()
        self.say(f"  {kind} #{n} injected: {record.detail}")
        if kind == "pod_kill":
            return  # its restart is awaited before the next server fault
        await self.recovery(record, f"{kind} #{n}")

    async def recovery(self, record: FaultRecord, what: str) -> None:
        """Every pod UP and every (unstalled) session live again, bounded."""
        if not await self.all_up():
            self.violations.append(f"{what}: a pod not UP within {RECOVERY_BOUND:g}s after")
        live = [s for s in self.sessions if not s.stalled]
        deadline = time.monotonic() + RECOVERY_BOUND
        for s in live:
            try:
                await asyncio.wait_for(s.live.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                self.violations.append(f"{what}: session {s.index} not live again")
                break
        record.recovered = time.perf_counter()

    async def restarted(self) -> None:
        """Wait for a killed pod's restart (and recovery) before the next fault."""
        if self._restart is not None:
            task, record, what = self._restart
            self._restart = None
            try:
                await task
            except Exception as exc:
                self.violations.append(f"{what}: the restarted pod never came UP: {exc}")
            await self.recovery(record, what)
            self.say(f"  {what} recovered")

    async def fault_nats_kill(self, record: FaultRecord, n: int) -> None:
        """SIGKILL nats-server and hold it down until every live pod said
        DOWN(nats_unreachable) past the grace (bounded), then restart it."""
        assert self.slots is not None
        self.twin_ok.clear()
        await asyncio.to_thread(self.nats.kill)
        down_at = time.perf_counter()
        bound = down_at + self.config.nats_grace + NATS_DOWN_BOUND
        seen: set[str] = set()
        while True:
            now = time.perf_counter()
            seen |= {s.pod for s in self.samples if s.at >= down_at + self.config.nats_grace
                     and s.up is False and NATS_REASON in s.reasons}
            pods = {p.name for p in self.slots.live()}
            if now - down_at >= self.config.nats_outage and pods <= seen:
                break
            if now > bound:
                for name in sorted(pods - seen):
                    mine = {(s.up, tuple(sorted(s.reasons))) for s in self.samples
                            if s.pod == name and s.at >= down_at}
                    self.violations.append(
                        f"nats_kill #{n}: {name} not DOWN({NATS_REASON}) within "
                        f"{self.config.nats_grace + NATS_DOWN_BOUND:g}s: {sorted(mine)}")
                break
            await asyncio.sleep(0.1)
        up_at = time.perf_counter()
        await asyncio.to_thread(self.nats.start)
        self.twin_ok.set()
        record.detail = f"down {up_at - down_at:.1f}s"

    async def fault_listener_kill(self, record: FaultRecord, n: int) -> None:
        conn = await asyncpg.connect(self.store.app_url)
        try:
            pids = await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"
                " AND datname = current_database() AND pid <> pg_backend_pid()")
            for row in pids:
                await conn.fetchval("SELECT pg_terminate_backend($1)", row["pid"])
        finally:
            await conn.close()
        record.detail = f"{len(pids)} backend(s)"
        if len(pids) < self.config.pods:
            self.violations.append(f"listener_kill #{n}: found {len(pids)} LISTEN backends")
        start = time.perf_counter()
        await self.all_up()
        # Any DOWN in the window names the listener.
        wrong = {r for s in self.samples if s.at >= start and s.up is False
                 for r in s.reasons if r not in LISTENER_REASONS and r != NATS_REASON}
        if wrong:
            self.violations.append(f"listener_kill #{n}: DOWN for {sorted(wrong)}")

    async def fault_pod_kill(self, record: FaultRecord, n: int) -> None:
        """SIGKILL one pod mid-load; its restart boots in the background (its
        sessions reconnect to the other pod meanwhile)."""
        assert self.slots is not None and self.pods is not None
        pods = self.pods
        slots = self.slots
        slot = n % len(slots.pods)
        victim = slots.pods[slot]
        assert victim is not None
        await self.scrape(victim)
        slots.put(slot, None)
        victim.process.kill()
        await asyncio.to_thread(victim.process.wait)
        name = f"p{slot}r{next(self.pod_serial)}"
        record.detail = f"{victim.name} -> {name}"

        async def restart() -> None:
            slots.put(slot, await pods.spawn(name, env={
                **self.pod_env(), "SERVICE_ENGINE_POD_ID": f"soak-{name}"}))

        self._restart = (asyncio.create_task(restart()), record, f"pod_kill #{n}")

    async def fault_burst(self, record: FaultRecord, n: int) -> None:
        before = self.reset_totals().get("resets overflow", 0.0)
        cohorts = self.config.cohorts
        await asyncio.gather(*(self.rename("board", i % cohorts)
                               for i in range(self.config.burst)))
        await asyncio.sleep(1.0)
        assert self.slots is not None
        for pod in self.slots.live():
            await self.scrape(pod)
        after = self.reset_totals().get("resets overflow", 0.0)
        record.detail = f"{self.config.burst} writes, +{after - before:g} overflow resets"

    async def fault_stall(self, record: FaultRecord, n: int) -> None:
        """Open a subscriber that stops reading; it resumes in the background
        after ``stall_for`` (the schedule goes on meanwhile)."""
        assert self.slots is not None
        cohort = n % self.config.cohorts
        stalled = Session(
            10_000 + n, "boards", cohort, _passport(f"stall{n}", _org(cohort)), self.slots,
            self.sent, self.in_fault, stalled=True,
        )
        self.sessions.append(stalled)
        self._session_tasks.append(asyncio.create_task(stalled.run()))
        try:
            await asyncio.wait_for(stalled.live.wait(), 30)
        except TimeoutError:
            self.violations.append(f"stall #{n}: the stalled session never went live")
            return
        stalled.reading.clear()  # it stops reading; its socket fills
        record.detail = f"session {stalled.index} on {stalled.pod_name}"

        async def resume() -> None:
            await asyncio.gather(*(self.rename("board", cohort)
                                   for _ in range(self.config.burst)))
            await asyncio.sleep(self.config.stall_for)
            stalled.resumed["reading again"] = 1
            stalled.reading.set()

        self._stalls.append(asyncio.create_task(resume()))

    def reset_totals(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for values in self.metrics_seen.values():
            for k, v in values.items():
                totals[k] += v
        return dict(totals)

    async def schedule(self) -> None:
        """Each kind ``faults`` times, interleaved, spread over the load."""
        kinds = [k for _ in range(self.config.faults) for k in FAULT_KINDS]
        gap = max(0.5, self.config.seconds / (len(kinds) + 1) / 3)
        poisons = iter(range(self.config.poison or 2 * self.config.faults))
        for i, kind in enumerate(kinds):
            await asyncio.sleep(gap)
            await self.fault(kind, i // len(FAULT_KINDS))
            if next(poisons, None) is not None and self.twin_ok.is_set():
                with contextlib.suppress(Exception):
                    await self.poison()
        for _ in poisons:
            await self.poison()
        await self.restarted()

    # -- the run -----------------------------------------------------------------------

    async def run(self) -> SoakReport:
        started = time.perf_counter()
        await self.setup()
        assert self.slots is not None
        background: list[asyncio.Task[Any]] = [asyncio.create_task(self.poll()),
                                               asyncio.create_task(self.scraper())]
        async with Twin.connect(self.nats.url, name="twin") as twin:
            self.twin = twin
            self.twin_ok.set()
            self.say("pods up; opening sessions")
            await self.open_sessions()
            self.say("sessions live; load and faults start")
            load = asyncio.create_task(self.load(float("inf")))
            try:
                await self.schedule()
                remaining = self.config.seconds - (time.perf_counter() - started)
                if remaining > 0:
                    await asyncio.sleep(remaining)
            finally:
                self.stop_load = True
                await load
                await asyncio.gather(*self._stalls)
            load_s = time.perf_counter() - started
            self.say("load stopped; finishing replies")
            await self.finish_replies(twin)
            await self.check()
        for task in background:
            task.cancel()
        for s in self.sessions:
            s.stop = True
            if s.ws is not None:
                await s.ws.close()
        for task in self._session_tasks:
            task.cancel()
        await asyncio.gather(*background, *self._session_tasks, return_exceptions=True)
        return self.report(load_s, time.perf_counter() - started)

    async def aclose(self) -> None:
        if self.pods is not None:
            await self.pods.aclose()
        await asyncio.to_thread(self.nats.stop)

    async def finish_replies(self, twin: Twin) -> None:
        """Replies whose chunks or finish an outage refused: sent again (the
        same Nats-Msg-Ids, so what did land is deduplicated)."""
        for reply_id, state in list(self.replies.items()):
            if not state.finished:
                await self.stream_and_finish(twin, reply_id, state)

    # -- the checks --------------------------------------------------------------------

    async def check(self) -> None:
        self.say("checking")
        async with owner_connection(self.store) as owner:
            self.say("  check_outbox_drained")
            await self.check_outbox_drained(owner)
            self.say("  check_windows")
            await self.check_windows()
            self.say("  check_inbound")
            await self.check_inbound(owner)
            self.say("  check_replies")
            await self.check_replies(owner)
            self.say("  check_ledgers")
            await self.check_ledgers(owner)
            self.say("  check_outbox_stream")
            await self.check_outbox_stream(owner)
            self.say("  check_offers")
            await self.check_offers(owner)
        for s in self.sessions:
            self.violations += [f"session {s.index}: {v}" for v in s.violations]
        self.check_steady_readiness()

    async def check_outbox_drained(self, owner: asyncpg.Connection) -> None:
        deadline = time.monotonic() + self.config.drain_bound
        while True:
            pending = await owner.fetchval(
                "SELECT count(*) FROM service_engine.integration_outbox WHERE status = 'PENDING'")
            claims = await owner.fetchval("SELECT count(*) FROM service_engine.message_claim")
            if pending == 0 and claims >= len(self.commands) + len(self.finished_replies()):
                return
            if time.monotonic() > deadline:
                self.violations.append(f"{pending} outbox rows PENDING after the drain bound")
                return
            await asyncio.sleep(0.25)

    def finished_replies(self) -> list[str]:
        return [r for r, state in self.replies.items() if state.finished]

    async def check_windows(self) -> None:
        """Each session's window, rebuilt from its deltas, against a fresh
        query as its passport. ``boards`` (every board the caller sees) must
        equal it. ``cards`` is a discovery-only Query window (the newest 50
        at its Reset, plus every card discovered since; a card leaves only
        when deleted or invisible): every card it holds must show its
        committed view, and it must hold the newest 50."""
        assert self.slots is not None
        pod = self.slots.live()[0]
        pending = list(self.sessions)
        deadline = time.monotonic() + 30
        while True:
            mismatched = []
            for s in pending:
                problem = await self.window_problem(pod, s)
                if problem is not None:
                    mismatched.append((s, problem))
            pending = [s for s, _ in mismatched]
            if not pending:
                return
            if time.monotonic() > deadline:
                for s, problem in mismatched[:10]:
                    self.violations.append(
                        f"session {s.index} ({s.kind}, on {s.pod_name}, revision {s.revision}): "
                        f"{problem}")
                self.violations.append(f"{len(pending)} session window(s) never converged")
                return
            await asyncio.sleep(0.3)

    async def window_problem(self, pod: Pod, s: Session) -> str | None:
        if not s.live.is_set():
            return "not live"
        data = await pod.gql(QUERIES[s.kind], None, s.passport)
        committed = {json.dumps(v["id"]): v for v in data[s.kind]}
        must_hold = set(committed) if s.kind == "boards" else set(list(committed)[:HEAD])
        missing = must_hold - s.window.keys()
        extra = s.window.keys() - committed.keys()
        stale = [k for k in s.window.keys() & committed.keys() if committed[k] != s.window[k]]
        if not (missing or extra or stale):
            return None
        odd = missing | extra | set(stale)
        evidence = [h for h in s.history if h[2] in odd or h[0].endswith("Reset")]
        return (f"window of {len(s.window)} keys differs from committed state: missing "
                f"{sorted(missing)[:3]} extra {sorted(extra)[:3]} stale {stale[:3]}; "
                f"its deltas: {evidence[-8:]}")

    async def check_inbound(self, owner: asyncpg.Connection) -> None:
        cards = {r["id"]: r["org"] for r in await owner.fetch(
            "SELECT id, org FROM card WHERE id = ANY($1)", list(self.commands))}
        claims = Counter(r["message_id"] for r in await owner.fetch(
            "SELECT message_id FROM service_engine.message_claim WHERE message_id = ANY($1)",
            [cid for cid, _ in self.commands.values()]))
        lost = [c for c in self.commands if c not in cards]
        if lost:
            self.violations.append(f"{len(lost)} acknowledged card.create without a card: {lost[:3]}")
        wrong = [c for c, (_, org) in self.commands.items() if c in cards and cards[c] != org]
        if wrong:
            self.violations.append(f"cards in the wrong org: {wrong[:3]}")
        twice = [m for m, k in claims.items() if k != 1]
        unclaimed = [c for c, (cid, _) in self.commands.items() if claims.get(cid, 0) == 0]
        if twice or unclaimed:
            self.violations.append(f"claims: {len(twice)} twice, {len(unclaimed)} missing")
        facts = Counter(r["card_id"] for r in await owner.fetch(
            "SELECT card_id FROM card_fact WHERE card_id = ANY($1)", list(self.commands)))
        doubled = [c for c, k in facts.items() if k != 1]
        if doubled:
            self.violations.append(f"card facts recorded twice: {doubled[:3]}")
        self.inbound_dups = len(twice) + len(doubled)
        self.inbound_lost = len(lost) + len(unclaimed)
        others = await owner.fetch(
            "SELECT source, work, reason, count(*) AS n FROM service_engine.dead_letter"
            " WHERE source <> 'Reaction' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
        self.other_letters = [f"{r['source']} {r['work']} ({r['reason']}) x{r['n']}"
                              for r in others]
        letters = await owner.fetch(
            "SELECT message_id, reason, occurrences FROM service_engine.dead_letter"
            " WHERE source = 'Reaction'")
        by_id = Counter(r["message_id"] for r in letters)
        unexpected = [r for r in letters if r["message_id"] not in self.poison_ids]
        missing = [p for p in self.poison_ids if by_id.get(p, 0) == 0]
        doubled_letters = [p for p, k in by_id.items() if k > 1]
        if unexpected:
            self.violations.append(f"unexpected dead letters: {[dict(r) for r in unexpected[:3]]}")
        if missing or doubled_letters:
            self.violations.append(f"poison dead letters: {len(missing)} missing, "
                                   f"{len(doubled_letters)} twice")
        self.dead_letters = len(letters)
        self.poison_lost = len(missing)

    async def check_replies(self, owner: asyncpg.Connection) -> None:
        finished = self.finished_replies()
        deadline = time.monotonic() + 30
        while True:
            rows = {r["id"]: r for r in await owner.fetch(
                "SELECT id, status, hash FROM reply WHERE id = ANY($1)", finished)}
            bad = [r for r in finished if r not in rows or rows[r]["status"] != "finished"
                   or rows[r]["hash"] != self.replies[r].digest]
            if not bad:
                return
            if time.monotonic() > deadline:
                self.violations.append(
                    f"{len(bad)} replies not sealed with their hash: "
                    f"{[(r, dict(rows[r]) if r in rows else None) for r in bad[:3]]}")
                return
            await asyncio.sleep(0.25)

    async def check_ledgers(self, owner: asyncpg.Connection) -> None:
        rows = {r["org"]: r["balance"] for r in await owner.fetch(
            "SELECT org, balance FROM ledger WHERE name = 'soak'")} if await owner.fetchval(
            "SELECT to_regclass('ledger') IS NOT NULL") else {}
        self.ledger_checked = bool(rows)
        for org, ok in self.ledger_ok.items():
            balance = rows.get(org)
            if balance is None:
                continue
            if not ok <= balance <= ok + self.ledger_unknown[org]:
                self.violations.append(
                    f"ledger {org}: balance {balance} outside [{ok}, {ok + self.ledger_unknown[org]}]")

    async def check_outbox_stream(self, owner: asyncpg.Connection) -> None:
        """The relay sweeps PUBLISHED rows, so the committed facts are read
        from the domain: every card has exactly one ``card.created`` in the
        stream, every sealed reply one ``reply.finished``; no Nats-Msg-Id is
        stored twice; no outbox row is left unpublished."""
        left = await owner.fetch(
            "SELECT message_id, status, last_error FROM service_engine.integration_outbox"
            " WHERE status <> 'PUBLISHED'")
        if left:
            self.violations.append(f"{len(left)} outbox rows not PUBLISHED: "
                                   f"{[dict(r) for r in left[:3]]}")
        stored = await _stream_events(self.nats.url, "INTEGRATION_EVT")
        by_id = Counter(e.msg_id for e in stored)
        types = Counter(e.kind for e in stored)
        logical: dict[tuple[str, str], set[str]] = defaultdict(set)
        copies: Counter[str] = Counter()
        for e in stored:
            if e.kind in ("card.created", "reply.finished"):
                logical[(e.kind, e.subject)].add(e.logical_id)
            copies[e.logical_id] += 1
        created = {subject for kind, subject in logical if kind == "card.created"}
        finished = {subject for kind, subject in logical if kind == "reply.finished"}
        cards = {r["id"] for r in await owner.fetch("SELECT id FROM card")}
        sealed = {r["id"] for r in await owner.fetch(
            "SELECT id FROM reply WHERE status = 'finished'")}
        dup_ids = sum(k - 1 for k in by_id.values() if k > 1)
        twice = sorted(f"{kind} {subject}" for (kind, subject), ids in logical.items()
                       if len(ids) > 1)
        lost = len(cards - created) + len(sealed - finished)
        orphans = len(created - cards) + len(finished - sealed)
        self.stream_messages = len(stored)
        self.stream_types = types
        self.replayed = sum(k - 1 for k in copies.values() if k > 1)
        self.outbox_dups = dup_ids + len(twice)
        self.outbox_lost = lost + len(left)
        if dup_ids or twice:
            self.violations.append(f"stream duplicates: {dup_ids} by Nats-Msg-Id, "
                                   f"{len(twice)} facts under two logical ids: {twice[:5]}")
        if lost:
            self.violations.append(
                f"committed facts missing from the stream: cards {sorted(cards - created)[:3]}"
                f" replies {sorted(sealed - finished)[:3]}")
        if orphans:
            self.violations.append(f"{orphans} facts in the stream without their committed row")

    async def check_offers(self, owner: asyncpg.Connection) -> None:
        from example_twin.roster import read_boards

        boards = {r["id"]: (r["title"], r["org"], r["archived"]) for r in await owner.fetch(
            "SELECT id, title, org, archived FROM board")}
        assert self.twin is not None
        deadline = time.monotonic() + 30
        while True:
            offered = await read_boards(self.twin.nats)
            got = {b.id: (b.title, b.org, b.archived) for b in offered.values()}
            if got == boards:
                self.offers = len(got)
                return
            if time.monotonic() > deadline:
                stale = [k for k in boards if got.get(k) != boards[k]]
                self.violations.append(f"{len(stale)} board offers differ from the boards")
                self.offers = len(got)
                return
            await asyncio.sleep(0.3)

    def check_steady_readiness(self) -> None:
        """Outside every fault window, a pod that answered was UP."""
        def covered(at: float) -> bool:
            return any(f.start - 0.2 <= at <= max(f.end, f.recovered) + 0.5
                       for f in self.faults if f.kind in SERVER_FAULTS)
        lies = [s for s in self.samples if s.up is False and not covered(s.at)]
        self.steady_down = len(lies)
        if lies:
            self.violations.append(
                f"{len(lies)} DOWN answers outside outages: "
                f"{sorted({r for s in lies for r in s.reasons})}")

    # -- the table ---------------------------------------------------------------------

    def fault_details(self) -> str:
        def span(values: list[float], unit: str = "s") -> str:
            return f"{min(values):.1f}-{max(values):.1f}{unit}" if values else "-"

        by: dict[str, list[FaultRecord]] = defaultdict(list)
        for f in self.faults:
            by[f.kind].append(f)
        recover = {k: [max(f.end, f.recovered) - f.start for f in v if f.recovered]
                   for k, v in by.items()}
        parts = []
        for kind in FAULT_KINDS:
            records = by.get(kind, [])
            if not records:
                continue
            extra = ""
            if kind == "nats_kill":
                extra = f"down {span([f.end - f.start for f in records])}, "
            elif kind == "listener_kill":
                extra = f"backends {sorted({f.detail for f in records})}, "
            elif kind == "burst":
                extra = f"{'; '.join(f.detail for f in records[:3])}{'...' if len(records) > 3 else ''}, "
            parts.append(f"{kind}: {extra}recovered in {span(recover.get(kind, []))}")
        return "; ".join(parts)

    def stall_details(self) -> str:
        stalled = [s for s in self.sessions if s.stalled]
        after: Counter[str] = Counter()
        for s in stalled:
            after.update({k: v for k, v in s.resumed.items() if k != "reading again"})
        served = sum(1 for s in stalled if s.resumed.get("deltas") or any(
            k.startswith("Reset") for k in s.resumed))
        return (f"{len(stalled)} stalled, {served} served again after reading; after reading: "
                f"{', '.join(f'{k} {v}' for k, v in sorted(after.items())) or 'nothing'}")

    def report(self, load_s: float, total_s: float) -> SoakReport:
        c = self.config
        kinds = Counter(f.kind for f in self.faults)
        resets: Counter[str] = Counter()
        closes: Counter[str] = Counter()
        for s in self.sessions:
            resets.update(s.resets)
            closes.update(s.closes)
        latencies = sorted(x for s in self.sessions for x in s.latencies)
        server = self.reset_totals()
        messages = sum(self.ops.values())
        table = [
            ("scale", f"{c.pods} pods, {c.sessions} sessions / {c.cohorts} cohorts, "
                      f"{c.rate:g} ops/s, {load_s:.0f}s load, {total_s:.0f}s total"),
            ("faults injected", ", ".join(f"{k} {kinds[k]}" for k in FAULT_KINDS)),
            ("fault details", self.fault_details()),
            ("operations", ", ".join(f"{k} {v}" for k, v in sorted(self.ops.items()))),
            ("deltas delivered", f"{sum(s.deltas for s in self.sessions)} Upserts/Removes "
                                 f"(server enqueued {server.get('deltas enqueued', 0):.0f})"),
            ("Resets by cause (clients)", ", ".join(f"{k} {v}" for k, v in sorted(resets.items()))),
            ("Resets by cause (pods)", ", ".join(
                f"{k.split()[1]} {v:.0f}" for k, v in sorted(server.items())
                if k.startswith("resets"))),
            ("socket closes", ", ".join(f"{k} {v}" for k, v in sorted(closes.items())) or "none"),
            ("stalled sessions", self.stall_details()),
            ("messages", f"{getattr(self, 'stream_messages', 0)} events in the stream "
                         f"({', '.join(f'{k} {v}' for k, v in sorted(getattr(self, 'stream_types', {}).items()))}), "
                         f"{len(self.commands)} card.create, {len(self.finished_replies())} "
                         f"replies sealed, {len(self.poison_ids)} poison, "
                         f"{getattr(self, 'offers', 0)} board offers; {messages} ops"),
            ("confirmations replayed", f"{getattr(self, 'replayed', 0)} (a redelivered "
                                       "command's stored answer, same Br-Message-Id)"),
            ("duplicates found", str(getattr(self, "outbox_dups", 0)
                                     + getattr(self, "inbound_dups", 0))),
            ("losses found", str(getattr(self, "outbox_lost", 0)
                                 + getattr(self, "inbound_lost", 0)
                                 + getattr(self, "poison_lost", 0))),
            ("dead letters", f"{getattr(self, 'dead_letters', 0)} reaction (poison injected "
                             f"{len(self.poison_ids)}); others: "
                             f"{', '.join(getattr(self, 'other_letters', [])) or 'none'}"),
            ("commit -> client p50/p99", (
                f"{_pct(latencies, 0.5) * 1e3:.1f} / {_pct(latencies, 0.99) * 1e3:.1f} ms "
                f"({len(latencies)} samples outside fault windows)") if latencies else "n/a"),
            ("readiness samples", f"{len(self.samples)}, DOWN outside outages "
                                  f"{getattr(self, 'steady_down', 0)}"),
            ("violations", str(len(self.violations))),
        ]
        return SoakReport(c, self.faults, table, self.violations)


def _outcome(ok: bool | None) -> str:
    return {True: "ok", False: "refused", None: "unanswered"}[ok]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


@dataclass(frozen=True)
class StoredEvent:
    msg_id: str
    """``Nats-Msg-Id``: the dedup token (fresh on a replayed confirmation)."""
    logical_id: str
    """``Br-Message-Id``: the logical id (a replay keeps it)."""
    kind: str
    subject: str
    """The card or reply the event is about."""


async def _stream_events(url: str, stream: str) -> list[StoredEvent]:
    """Every message stored in ``stream``, read with one ordered consumer."""
    client = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = client.jetstream()
        info = await js.stream_info(stream)
        total = int(info.state.messages)
        out: list[StoredEvent] = []
        if total == 0:
            return out
        done = asyncio.Event()

        async def on(msg: Any) -> None:
            kind = subject = ""
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                event = json.loads(msg.data)
                kind = str(event.get("type", ""))
                payload = event.get("payload") or {}
                subject = str(payload.get("card_id") or payload.get("reply_id") or "")
            headers = msg.headers or {}
            msg_id = headers.get(HEADER_NATS_MSG_ID, "")
            out.append(StoredEvent(msg_id, headers.get(HEADER_MESSAGE_ID, msg_id), kind, subject))
            if len(out) >= total:
                done.set()

        sub = await js.subscribe(">", stream=stream, cb=on, ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.ALL)
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await client.close()


async def run_soak(config: SoakConfig, store: ProvisionedDatabase, workdir: Path) -> SoakReport:
    """Run the soak on ``store`` (a database with the engine's and the example
    service's migrations); everything it spawned is stopped on return."""
    soak = Soak(config, store, workdir)
    try:
        return await soak.run()
    finally:
        await soak.aclose()

