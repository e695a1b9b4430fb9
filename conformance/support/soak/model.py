"""What the soak's parts share: its configuration, the GraphQL it sends, the
records of faults, replies and readiness samples, and the pods by slot."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pydantic import BaseModel

from service_engine.graphql import Passport

from ...blackbox.harness import Pod

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
LISTENER_REASONS = frozenset({"listener", "listener_brake"})
READYZ_TIMEOUT = 2.0
"""Bound on one /readyz answer to the poller (past it the sample says the pod
did not answer)."""
POLL_PERIOD = 0.2
"""Seconds between two rounds of /readyz samples."""

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
    verdict: float = 0.0
    """nats_kill: how long the outage had lasted when the engine said DOWN
    (the earliest any pod reported, in its own clock)."""


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
    details: dict[str, str] = field(default_factory=dict)
    """Reason -> its detail (DOWN only)."""


@dataclass(eq=False)
class Samples:
    """Every readiness sample in order; a waiter wakes on each new one."""

    all: list[Sample] = field(default_factory=list)
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    async def add(self, sample: Sample) -> None:
        self.all.append(sample)
        async with self._arrived:
            self._arrived.notify_all()

    async def wait_for(self, holds: Callable[[], bool], bound: float) -> bool:
        """Until ``holds()`` (checked on each new sample), at most ``bound``
        seconds; whether it held."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound), self._arrived:
                await self._arrived.wait_for(holds)
        return holds()


def passport(sub: str, org: str) -> Passport:
    return Passport(sub=sub, org=org, roles=("board:archive",))


def org_of(cohort: int) -> str:
    return f"o{cohort}"


def outcome(ok: bool | None) -> str:
    return {True: "ok", False: "refused", None: "unanswered"}[ok]


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
