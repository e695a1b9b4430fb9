"""The soak's faults, one at a time, each waited out before the next:
nats-server SIGKILLed, the LISTEN backends terminated, a pod SIGKILLed and
restarted, a burst past the listener channel, a subscriber that stops
reading. Each records its window (`FaultRecord`) for the oracle and the
report."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from datetime import datetime

import asyncpg

from ...blackbox.harness import Pod
from .context import SoakContext
from .load import Load
from .model import (
    FAULT_KINDS,
    LISTENER_REASONS,
    NATS_REASON,
    POLL_PERIOD,
    READYZ_TIMEOUT,
    RECOVERY_BOUND,
    SERVER_FAULTS,
    FaultRecord,
    Sample,
    org_of,
    passport,
)
from .observe import Observer
from .session import Session

OUTAGE_FOR = re.compile(r"NATS unavailable for (\d+(?:\.\d+)?)s")
"""The engine's own reckoning in its DOWN detail: how long the outage had
lasted when it said DOWN."""


def nats_verdict_bound(grace: float) -> float:
    """Seconds after NATS dies within which a pod says DOWN(nats_unreachable),
    by the engine's own configuration: the grace, then at most one probe
    interval and one probe timeout (`NatsHealth`'s defaults, derived from the
    grace)."""
    interval = min(max(grace / 10, 0.05), 1.0)
    probe_timeout = min(grace / 4, 1.0)
    return grace + interval + probe_timeout


def nats_down_bound(grace: float) -> float:
    """Bound on the soak seeing every pod DOWN(nats_unreachable) after NATS
    dies: the engine's verdict bound, a /readyz round (its timeout and the
    sampling period), and `RECOVERY_BOUND` for the cores the soak shares with
    the parallel battery (a loaded observer sees the verdict late; whether
    the engine itself was late is checked from its own detail)."""
    return nats_verdict_bound(grace) + READYZ_TIMEOUT + POLL_PERIOD + RECOVERY_BOUND


def said_down(pod: Pod) -> str | None:
    """The pod's last log line saying it went DOWN for NATS (with its time),
    to tell a late engine from a late observer."""
    with contextlib.suppress(OSError):
        lines = [line for line in pod.log.read_text(errors="replace").splitlines()
                 if "past nats_grace" in line]
        return lines[-1] if lines else None
    return None


class Faults:
    """The fault schedule: each fault injected, its window recorded, and
    recovery (every pod UP, every session live) awaited before the next."""

    def __init__(self, ctx: SoakContext, load: Load, observer: Observer) -> None:
        self.ctx = ctx
        self.load = load
        self.observer = observer
        self.pod_serial = itertools.count(1)
        self.stalls: list[asyncio.Task[None]] = []
        """Stalled subscribers waiting to read again (awaited when the load stops)."""
        self._restart: tuple[asyncio.Task[None], FaultRecord, str] | None = None

    async def schedule(self) -> None:
        """Each kind ``faults`` times, interleaved, spread over the load; a
        poison command after each while any are left."""
        config = self.ctx.config
        kinds = [k for _ in range(config.faults) for k in FAULT_KINDS]
        gap = max(0.5, config.seconds / (len(kinds) + 1) / 3)
        poisons = iter(range(config.poison or 2 * config.faults))
        for i, kind in enumerate(kinds):
            await asyncio.sleep(gap)  # the load runs alone between faults
            await self.fault(kind, i // len(FAULT_KINDS))
            if next(poisons, None) is not None and self.ctx.twin_ok.is_set():
                with contextlib.suppress(Exception):
                    await self.load.poison()
        for _ in poisons:
            await self.load.poison()
        await self.restarted()

    async def fault(self, kind: str, n: int) -> None:
        if kind in SERVER_FAULTS:
            await self.restarted()
        record = FaultRecord(kind, time.perf_counter())
        self.ctx.faults.append(record)
        self.ctx.say(f"fault {kind} #{n}")
        try:
            await getattr(self, f"fault_{kind}")(record, n)
        finally:
            record.end = time.perf_counter()
        self.ctx.say(f"  {kind} #{n} injected: {record.detail}")
        if kind == "pod_kill":
            return  # its restart is awaited before the next server fault
        await self.recovery(record, f"{kind} #{n}")

    async def recovery(self, record: FaultRecord, what: str) -> None:
        """Every pod UP and every (unstalled) session live again, bounded."""
        if not await self.observer.all_up():
            self.ctx.violations.append(f"{what}: a pod not UP within {RECOVERY_BOUND:g}s after")
        live = [s for s in self.ctx.sessions if not s.stalled]
        deadline = time.monotonic() + RECOVERY_BOUND
        for s in live:
            try:
                await asyncio.wait_for(s.live.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                self.ctx.violations.append(f"{what}: session {s.index} not live again")
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
                self.ctx.violations.append(f"{what}: the restarted pod never came UP: {exc}")
            await self.recovery(record, what)
            self.ctx.say(f"  {what} recovered")

    async def fault_nats_kill(self, record: FaultRecord, n: int) -> None:
        """SIGKILL nats-server and hold it down until every live pod said
        DOWN(nats_unreachable) past the grace (bounded by `nats_down_bound`)
        and at least ``nats_outage``, then restart it. The engine's detail
        must show it rode out the grace."""
        ctx = self.ctx
        grace = ctx.config.nats_grace
        ctx.twin_ok.clear()
        await asyncio.to_thread(ctx.nats.kill)
        down_at = time.perf_counter()
        killed = datetime.now().strftime("%H:%M:%S,%f")[:-3]  # as the pods' log lines stamp it
        bound = nats_down_bound(grace)
        downs: list[Sample] = []
        read = 0

        def every_pod_down() -> bool:
            nonlocal read
            fresh = ctx.samples.all[read:]
            read += len(fresh)
            downs.extend(s for s in fresh if s.at >= down_at + grace and s.up is False
                         and NATS_REASON in s.reasons)
            return {p.name for p in ctx.slots.live()} <= {s.pod for s in downs}

        if not await ctx.samples.wait_for(every_pod_down, bound):
            seen = {s.pod for s in downs}
            for pod in ctx.slots.live():
                if pod.name in seen:
                    continue
                mine = [s for s in ctx.samples if s.pod == pod.name and s.at >= down_at]
                answers = sorted({(s.up, tuple(sorted(s.reasons))) for s in mine}, key=repr)
                ctx.violations.append(
                    f"nats_kill #{n}: {pod.name} not seen DOWN({NATS_REASON}) within {bound:g}s "
                    f"(the engine's verdict bound {nats_verdict_bound(grace):g}s): "
                    f"{len(mine)} samples, {sum(s.up is None for s in mine)} unanswered; "
                    f"answers {answers}; NATS killed at {killed}, the pod logged "
                    f"{said_down(pod) or 'no DOWN'}")
        held = time.perf_counter() - down_at
        if held < ctx.config.nats_outage:
            await asyncio.sleep(ctx.config.nats_outage - held)  # the outage's set length
        up_at = time.perf_counter()
        await asyncio.to_thread(ctx.nats.start)
        ctx.twin_ok.set()
        verdicts = [float(m.group(1)) for s in downs
                    if (m := OUTAGE_FOR.search(s.details.get(NATS_REASON, ""))) is not None]
        early = [v for v in verdicts if v < grace - 0.05]
        if early:
            ctx.violations.append(
                f"nats_kill #{n}: DOWN({NATS_REASON}) after {min(early):g}s, inside the grace")
        record.verdict = min(verdicts, default=0.0)
        said = f", DOWN after {record.verdict:.1f}s by the engine" if verdicts else ""
        record.detail = f"down {up_at - down_at:.1f}s{said}"

    async def fault_listener_kill(self, record: FaultRecord, n: int) -> None:
        ctx = self.ctx
        conn = await asyncpg.connect(ctx.store.app_url)
        try:
            pids = await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"
                " AND datname = current_database() AND pid <> pg_backend_pid()")
            for row in pids:
                await conn.fetchval("SELECT pg_terminate_backend($1)", row["pid"])
        finally:
            await conn.close()
        record.detail = f"{len(pids)} backend(s)"
        if len(pids) < ctx.config.pods:
            ctx.violations.append(f"listener_kill #{n}: found {len(pids)} LISTEN backends")
        start = time.perf_counter()
        await self.observer.all_up()
        # Any DOWN in the window names the listener.
        wrong = {r for s in ctx.samples if s.at >= start and s.up is False
                 for r in s.reasons if r not in LISTENER_REASONS and r != NATS_REASON}
        if wrong:
            ctx.violations.append(f"listener_kill #{n}: DOWN for {sorted(wrong)}")

    async def fault_pod_kill(self, record: FaultRecord, n: int) -> None:
        """SIGKILL one pod mid-load; its restart boots in the background (its
        sessions reconnect to the other pod meanwhile)."""
        ctx = self.ctx
        assert ctx.pods is not None
        pods = ctx.pods
        slots = ctx.slots
        slot = n % len(slots.pods)
        victim = slots.pods[slot]
        assert victim is not None
        await self.observer.scrape(victim)
        slots.put(slot, None)
        victim.process.kill()
        await asyncio.to_thread(victim.process.wait)
        name = f"p{slot}r{next(self.pod_serial)}"
        record.detail = f"{victim.name} -> {name}"

        async def restart() -> None:
            slots.put(slot, await pods.spawn(name, env={
                **ctx.pod_env(), "SERVICE_ENGINE_POD_ID": f"soak-{name}"}))

        self._restart = (asyncio.create_task(restart()), record, f"pod_kill #{n}")

    async def fault_burst(self, record: FaultRecord, n: int) -> None:
        """A burst of writes at once; the overflow Resets it causes are counted
        in the report's totals (scraped at the end), not per burst: no event
        says when a burst's Resets have all been rendered."""
        config = self.ctx.config
        await asyncio.gather(*(self.load.rename("board", i % config.cohorts)
                               for i in range(config.burst)))
        record.detail = f"{config.burst} writes"

    async def fault_stall(self, record: FaultRecord, n: int) -> None:
        """Open a subscriber that stops reading; it resumes in the background
        after ``stall_for`` (the schedule goes on meanwhile)."""
        ctx = self.ctx
        cohort = n % ctx.config.cohorts
        stalled = Session(
            10_000 + n, "boards", cohort, passport(f"stall{n}", org_of(cohort)), ctx.slots,
            ctx.sent, ctx.in_fault, stalled=True,
        )
        ctx.sessions.append(stalled)
        ctx.session_tasks.append(asyncio.create_task(stalled.run()))
        try:
            await asyncio.wait_for(stalled.live.wait(), 30)
        except TimeoutError:
            ctx.violations.append(f"stall #{n}: the stalled session never went live")
            return
        stalled.reading.clear()  # it stops reading; its socket fills
        record.detail = f"session {stalled.index} on {stalled.pod_name}"

        async def resume() -> None:
            await asyncio.gather(*(self.load.rename("board", cohort)
                                   for _ in range(ctx.config.burst)))
            await asyncio.sleep(ctx.config.stall_for)  # the stall's set length
            stalled.resumed["reading again"] = 1
            stalled.reading.set()

        self.stalls.append(asyncio.create_task(resume()))
