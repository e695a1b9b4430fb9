"""What the soak watches while it runs: every pod's /readyz sampled on a
short period (the samples the faults wait on and the oracle checks), and
every pod's delta and Reset counters scraped from /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import defaultdict

import httpx

from ...blackbox.harness import Pod
from .context import SoakContext
from .model import POLL_PERIOD, READYZ_TIMEOUT, RECOVERY_BOUND, Sample


class Observer:
    """Readiness samples and metric scrapes of the live pods."""

    def __init__(self, ctx: SoakContext) -> None:
        self.ctx = ctx
        self.metrics_seen: dict[str, dict[str, float]] = {}
        """Pod name -> its last counters (a killed pod keeps what it reported)."""

    async def poll(self) -> None:
        """Sample every live pod's /readyz every `POLL_PERIOD`, until cancelled."""

        async def one(pod: Pod) -> None:
            at = time.perf_counter()
            try:
                response = await pod.http.get("/readyz", timeout=READYZ_TIMEOUT)
            except (httpx.HTTPError, RuntimeError):
                await self.ctx.samples.add(Sample(at, pod.name, None))
                return
            reasons: frozenset[str] = frozenset()
            details: dict[str, str] = {}
            if response.status_code != 200:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    held = response.json()["reasons"]
                    reasons = frozenset(r["reason"] for r in held)
                    details = {r["reason"]: str(r.get("detail", "")) for r in held}
            await self.ctx.samples.add(
                Sample(at, pod.name, response.status_code == 200, reasons, details))

        while True:
            await asyncio.gather(*(one(p) for p in self.ctx.slots.live()))
            await asyncio.sleep(POLL_PERIOD)  # the sampling period

    async def scrape(self, pod: Pod) -> None:
        """Keep the pod's last counters."""
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
        """Scrape every live pod every 2 s, until cancelled."""
        while True:
            for pod in self.ctx.slots.live():
                await self.scrape(pod)
            await asyncio.sleep(2.0)  # the scraping period

    def reset_totals(self) -> dict[str, float]:
        """The counters summed over every pod seen."""
        totals: dict[str, float] = defaultdict(float)
        for values in self.metrics_seen.values():
            for k, v in values.items():
                totals[k] += v
        return dict(totals)

    async def all_up(self, bound: float = RECOVERY_BOUND) -> bool:
        """Until every slot holds a pod answering UP, at most ``bound`` seconds."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            pods = self.ctx.slots.pods
            if all(p is not None for p in pods):
                answers = await asyncio.gather(
                    *(p.http.get("/readyz", timeout=2) for p in pods if p is not None),
                    return_exceptions=True)
                if all(isinstance(a, httpx.Response) and a.status_code == 200 for a in answers):
                    return True
            await asyncio.sleep(0.1)  # the next probe of the pods
        return False
