"""One soak run from start to finish: the servers and pods, the seeded
state, the sessions, then the load and the fault schedule together, the
drain, the oracle and the report."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from example_twin.runner import Twin
from service_engine.embedded import ProvisionedDatabase, provision_streams
from service_engine.graphql import Passport

from ...blackbox.harness import Pod, Pods
from .context import SoakContext
from .faults import Faults
from .load import Load
from .model import (
    BOARDS_PER_COHORT,
    CARDS_PER_COHORT,
    CREATE_BOARD,
    CREATE_CARD,
    OPEN_LEDGER,
    START_REPLY,
    Slots,
    SoakConfig,
    org_of,
    passport,
)
from .observe import Observer
from .oracle import Oracle
from .report import SoakReport, soak_report
from .session import Session


class Soak:
    """One run: its context and its parts (load, observer, faults, oracle)."""

    def __init__(self, config: SoakConfig, store: ProvisionedDatabase, workdir: Path) -> None:
        self.ctx = SoakContext(config, store, workdir)
        self.load = Load(self.ctx)
        self.observer = Observer(self.ctx)
        self.faults = Faults(self.ctx, self.load, self.observer)
        self.oracle = Oracle(self.ctx, self.load)

    async def setup(self) -> None:
        """nats-server and its streams, the pods, and each cohort's boards,
        cards, ledger and typing reply."""
        ctx = self.ctx
        await asyncio.to_thread(ctx.nats.start)
        await provision_streams(ctx.nats.url)
        pods = Pods(ctx.store.app_url, ctx.nats.url, ctx.workdir)
        ctx.pods = pods

        async def spawn(i: int) -> Pod:
            return await pods.spawn(f"p{i}", env={
                **ctx.pod_env(), "SERVICE_ENGINE_POD_ID": f"soak-p{i}-0"})

        first = await spawn(0)  # provisions the buckets, lanes and Identity once
        spawned = [first, *await asyncio.gather(*(spawn(i) for i in range(1, ctx.config.pods)))]
        ctx.spawned(pods, Slots(spawned))
        pod = spawned[0]

        async def must(query: str, variables: Mapping[str, Any], as_: Passport) -> None:
            data = await pod.gql(query, variables, as_)
            result = next(iter(data.values()))
            assert result["success"], (query, variables, result)

        for cohort in range(ctx.config.cohorts):
            owner = passport(f"w{cohort}", org_of(cohort))
            for b in range(BOARDS_PER_COHORT):
                await must(CREATE_BOARD, {"id": f"b-{cohort}-{b}", "t": f"start {b}"}, owner)
            for k in range(CARDS_PER_COHORT):
                await must(CREATE_CARD, {"id": f"c-{cohort}-{k}", "t": f"start {k}"}, owner)
            await must(OPEN_LEDGER, {"n": "soak"}, owner)
            await must(START_REPLY, {"id": f"typing-{cohort}"}, owner)

    async def open_sessions(self) -> None:
        """``sessions`` subscriptions over the cohorts, half ``boards``, half
        ``cards``, each live (bounded)."""
        ctx = self.ctx
        config = ctx.config
        opened = []
        for i in range(config.sessions):
            cohort = i % config.cohorts
            kind = "boards" if (i // config.cohorts) % 2 == 0 else "cards"
            opened.append(Session(
                i, kind, cohort, passport(f"u{i}", org_of(cohort)), ctx.slots, ctx.sent,
                ctx.in_fault,
            ))
        ctx.sessions += opened
        ctx.session_tasks += [asyncio.create_task(s.run()) for s in opened]
        await self.wait_live(opened, 120)

    async def wait_live(self, sessions: list[Session], bound: float) -> None:
        deadline = time.monotonic() + bound
        for s in sessions:
            remaining = deadline - time.monotonic()
            try:
                await asyncio.wait_for(s.live.wait(), max(0.1, remaining))
            except TimeoutError:
                self.ctx.violations.append(f"session {s.index} not live within {bound:g}s")
                return

    async def run(self) -> SoakReport:
        ctx = self.ctx
        started = time.perf_counter()
        await self.setup()
        background: list[asyncio.Task[Any]] = [asyncio.create_task(self.observer.poll()),
                                               asyncio.create_task(self.observer.scraper())]
        async with Twin.connect(ctx.nats.url, name="twin") as twin:
            ctx.twin = twin
            ctx.twin_ok.set()
            ctx.say("pods up; opening sessions")
            await self.open_sessions()
            ctx.say("sessions live; load and faults start")
            load = asyncio.create_task(self.load.run(float("inf")))
            try:
                await self.faults.schedule()
                remaining = ctx.config.seconds - (time.perf_counter() - started)
                if remaining > 0:
                    await asyncio.sleep(remaining)  # the load's set length
            finally:
                self.load.stop = True
                await load
                await asyncio.gather(*self.faults.stalls)
            load_s = time.perf_counter() - started
            ctx.say("load stopped; finishing replies")
            await self.load.finish_replies(twin)
            await self.oracle.check()
        for task in background:
            task.cancel()
        for s in ctx.sessions:
            s.stop = True
            if s.ws is not None:
                await s.ws.close()
        for task in ctx.session_tasks:
            task.cancel()
        await asyncio.gather(*background, *ctx.session_tasks, return_exceptions=True)
        return soak_report(ctx, self.load, self.observer, self.oracle.found, load_s,
                           time.perf_counter() - started)

    async def aclose(self) -> None:
        if self.ctx.pods is not None:
            await self.ctx.pods.aclose()
        await asyncio.to_thread(self.ctx.nats.stop)


async def run_soak(config: SoakConfig, store: ProvisionedDatabase, workdir: Path) -> SoakReport:
    """Run the soak on ``store`` (a database with the engine's and the example
    service's migrations); everything it spawned is stopped on return."""
    soak = Soak(config, store, workdir)
    try:
        return await soak.run()
    finally:
        await soak.aclose()
