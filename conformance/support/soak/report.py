"""The soak's result: the table `bench/soak.py` prints (scale, faults and
how each recovered, operations, deltas, Resets by cause, messages, losses and
duplicates found, latency outside the faults) and the violations the
conformance scenario asserts empty."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from .context import SoakContext
from .load import Load
from .model import FAULT_KINDS, FaultRecord, SoakConfig
from .observe import Observer
from .oracle import Findings


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


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nan when empty)."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def fault_details(faults: list[FaultRecord]) -> str:
    def span(values: list[float], unit: str = "s") -> str:
        return f"{min(values):.1f}-{max(values):.1f}{unit}" if values else "-"

    by: dict[str, list[FaultRecord]] = defaultdict(list)
    for f in faults:
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
            extra = (f"down {span([f.end - f.start for f in records])}, DOWN after "
                     f"{span([f.verdict for f in records if f.verdict])} by the engine, ")
        elif kind == "listener_kill":
            extra = f"backends {sorted({f.detail for f in records})}, "
        elif kind == "burst":
            extra = f"{'; '.join(f.detail for f in records[:3])}{'...' if len(records) > 3 else ''}, "
        parts.append(f"{kind}: {extra}recovered in {span(recover.get(kind, []))}")
    return "; ".join(parts)


def stall_details(ctx: SoakContext) -> str:
    stalled = [s for s in ctx.sessions if s.stalled]
    after: Counter[str] = Counter()
    for s in stalled:
        after.update({k: v for k, v in s.resumed.items() if k != "reading again"})
    served = sum(1 for s in stalled if s.resumed.get("deltas") or any(
        k.startswith("Reset") for k in s.resumed))
    return (f"{len(stalled)} stalled, {served} served again after reading; after reading: "
            f"{', '.join(f'{k} {v}' for k, v in sorted(after.items())) or 'nothing'}")


def soak_report(ctx: SoakContext, load: Load, observer: Observer, found: Findings,
                load_s: float, total_s: float) -> SoakReport:
    c = ctx.config
    kinds = Counter(f.kind for f in ctx.faults)
    resets: Counter[str] = Counter()
    closes: Counter[str] = Counter()
    for s in ctx.sessions:
        resets.update(s.resets)
        closes.update(s.closes)
    latencies = sorted(x for s in ctx.sessions for x in s.latencies)
    server = observer.reset_totals()
    messages = sum(load.ops.values())
    table = [
        ("scale", f"{c.pods} pods, {c.sessions} sessions / {c.cohorts} cohorts, "
                  f"{c.rate:g} ops/s, {load_s:.0f}s load, {total_s:.0f}s total"),
        ("faults injected", ", ".join(f"{k} {kinds[k]}" for k in FAULT_KINDS)),
        ("fault details", fault_details(ctx.faults)),
        ("operations", ", ".join(f"{k} {v}" for k, v in sorted(load.ops.items()))),
        ("deltas delivered", f"{sum(s.deltas for s in ctx.sessions)} Upserts/Removes "
                             f"(server enqueued {server.get('deltas enqueued', 0):.0f})"),
        ("Resets by cause (clients)", ", ".join(f"{k} {v}" for k, v in sorted(resets.items()))),
        ("Resets by cause (pods)", ", ".join(
            f"{k.split()[1]} {v:.0f}" for k, v in sorted(server.items())
            if k.startswith("resets"))),
        ("socket closes", ", ".join(f"{k} {v}" for k, v in sorted(closes.items())) or "none"),
        ("stalled sessions", stall_details(ctx)),
        ("messages", f"{found.stream_messages} events in the stream "
                     f"({', '.join(f'{k} {v}' for k, v in sorted(found.stream_types.items()))}), "
                     f"{len(load.commands)} card.create, {len(load.finished_replies())} "
                     f"replies sealed, {len(load.poison_ids)} poison, "
                     f"{found.offers} board offers; {messages} ops"),
        ("confirmations replayed", f"{found.replayed} (a redelivered "
                                   "command's stored answer, same Br-Message-Id)"),
        ("duplicates found", str(found.outbox_dups + found.inbound_dups)),
        ("losses found", str(found.outbox_lost + found.inbound_lost + found.poison_lost)),
        ("dead letters", f"{found.dead_letters} reaction (poison injected "
                         f"{len(load.poison_ids)}); others: "
                         f"{', '.join(found.other_letters) or 'none'}"),
        ("commit -> client p50/p99", (
            f"{pct(latencies, 0.5) * 1e3:.1f} / {pct(latencies, 0.99) * 1e3:.1f} ms "
            f"({len(latencies)} samples outside fault windows)") if latencies else "n/a"),
        ("readiness samples", f"{len(ctx.samples)}, DOWN outside outages {found.steady_down}"),
        ("violations", str(len(ctx.violations))),
    ]
    return SoakReport(c, ctx.faults, table, ctx.violations)
