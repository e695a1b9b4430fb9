"""The state every part of one soak run shares: its configuration, its
servers and pods, the sessions, the faults so far, the readiness samples and
the violations found."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from example_twin.runner import Twin
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase

from ...blackbox.harness import Pods
from .model import SETTLE, FaultRecord, Samples, Slots, SoakConfig
from .session import Session


@dataclass(eq=False)
class SoakContext:
    config: SoakConfig
    store: ProvisionedDatabase
    workdir: Path
    rng: random.Random = field(init=False)
    nats: EmbeddedNats = field(init=False)
    pods: Pods | None = None
    _slots: Slots | None = None
    sessions: list[Session] = field(default_factory=list)
    session_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    sent: dict[int, float] = field(default_factory=dict)
    """Rename number -> when it was sent (the latency samples' start)."""
    faults: list[FaultRecord] = field(default_factory=list)
    samples: Samples = field(default_factory=Samples)
    violations: list[str] = field(default_factory=list)
    twin: Twin | None = None
    twin_ok: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while NATS is up: the twin may publish."""
    began: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.config.seed)
        self.nats = EmbeddedNats(self.workdir / "nats")

    @property
    def slots(self) -> Slots:
        """The pods by slot (once spawned)."""
        assert self._slots is not None, "the pods are not spawned yet"
        return self._slots

    def spawned(self, pods: Pods, slots: Slots) -> None:
        self.pods = pods
        self._slots = slots

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
