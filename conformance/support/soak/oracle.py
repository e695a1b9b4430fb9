"""The soak's oracle: once the load stops, every promise checked against
committed state. Each session's window equals a fresh query as its passport;
every acknowledged command has its card, claim and fact exactly once; only
the injected poison is dead-lettered, once each; every sealed reply carries
its hash; every ledger balance is within what was acknowledged; every
committed fact is in the stream exactly once; the board offers equal the
boards; readiness was UP outside the faults."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import nats
from nats.js.api import DeliverPolicy

from example_twin.runner import HEADER_MESSAGE_ID, HEADER_NATS_MSG_ID

from ...blackbox.harness import Pod
from ..harness import owner_connection
from .context import SoakContext
from .load import Load
from .model import HEAD, LISTENER_REASONS, QUERIES, SERVER_FAULTS
from .session import Session

LISTENER_SETTLE = 10.0
"""Seconds after a listener kill's recovery in which a DOWN naming only the
listener is still that kill's (a loaded pod reads its listener's end late)."""


@dataclass
class Findings:
    """What the checks counted, for the report."""

    inbound_dups: int = 0
    inbound_lost: int = 0
    poison_lost: int = 0
    dead_letters: int = 0
    other_letters: list[str] = field(default_factory=list)
    ledger_checked: bool = False
    stream_messages: int = 0
    stream_types: Counter[str] = field(default_factory=Counter)
    replayed: int = 0
    outbox_dups: int = 0
    outbox_lost: int = 0
    offers: int = 0
    steady_down: int = 0


class Oracle:
    """The checks, holding committed state to what the load had acknowledged
    and what every session saw."""

    def __init__(self, ctx: SoakContext, load: Load) -> None:
        self.ctx = ctx
        self.load = load
        self.found = Findings()

    async def check(self) -> None:
        """Every check in turn; what fails is appended to the violations."""
        self.ctx.say("checking")
        async with owner_connection(self.ctx.store) as owner:
            self.ctx.say("  check_outbox_drained")
            await self.check_outbox_drained(owner)
            self.ctx.say("  check_windows")
            await self.check_windows()
            self.ctx.say("  check_inbound")
            await self.check_inbound(owner)
            self.ctx.say("  check_replies")
            await self.check_replies(owner)
            self.ctx.say("  check_ledgers")
            await self.check_ledgers(owner)
            self.ctx.say("  check_outbox_stream")
            await self.check_outbox_stream(owner)
            self.ctx.say("  check_offers")
            await self.check_offers(owner)
        for s in self.ctx.sessions:
            self.ctx.violations += [f"session {s.index}: {v}" for v in s.violations]
        self.check_steady_readiness()

    async def check_outbox_drained(self, owner: asyncpg.Connection) -> None:
        deadline = time.monotonic() + self.ctx.config.drain_bound
        while True:
            pending = await owner.fetchval(
                "SELECT count(*) FROM service_engine.integration_outbox WHERE status = 'PENDING'")
            claims = await owner.fetchval("SELECT count(*) FROM service_engine.message_claim")
            if pending == 0 and claims >= len(self.load.commands) + len(self.load.finished_replies()):
                return
            if time.monotonic() > deadline:
                self.ctx.violations.append(f"{pending} outbox rows PENDING after the drain bound")
                return
            await asyncio.sleep(0.25)

    async def check_windows(self) -> None:
        """Each session's window, rebuilt from its deltas, against a fresh
        query as its passport. ``boards`` (every board the caller sees) must
        equal it. ``cards`` is a discovery-only Query window (the newest 50
        at its Reset, plus every card discovered since; a card leaves only
        when deleted or invisible): every card it holds must show its
        committed view, and it must hold the newest 50."""
        pod = self.ctx.slots.live()[0]
        pending = list(self.ctx.sessions)
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
                    self.ctx.violations.append(
                        f"session {s.index} ({s.kind}, on {s.pod_name}, revision {s.revision}): "
                        f"{problem}")
                self.ctx.violations.append(f"{len(pending)} session window(s) never converged")
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
            "SELECT id, org FROM card WHERE id = ANY($1)", list(self.load.commands))}
        claims = Counter(r["message_id"] for r in await owner.fetch(
            "SELECT message_id FROM service_engine.message_claim WHERE message_id = ANY($1)",
            [cid for cid, _ in self.load.commands.values()]))
        lost = [c for c in self.load.commands if c not in cards]
        if lost:
            self.ctx.violations.append(f"{len(lost)} acknowledged card.create without a card: {lost[:3]}")
        wrong = [c for c, (_, org) in self.load.commands.items() if c in cards and cards[c] != org]
        if wrong:
            self.ctx.violations.append(f"cards in the wrong org: {wrong[:3]}")
        twice = [m for m, k in claims.items() if k != 1]
        unclaimed = [c for c, (cid, _) in self.load.commands.items() if claims.get(cid, 0) == 0]
        if twice or unclaimed:
            self.ctx.violations.append(f"claims: {len(twice)} twice, {len(unclaimed)} missing")
        facts = Counter(r["card_id"] for r in await owner.fetch(
            "SELECT card_id FROM card_fact WHERE card_id = ANY($1)", list(self.load.commands)))
        doubled = [c for c, k in facts.items() if k != 1]
        if doubled:
            self.ctx.violations.append(f"card facts recorded twice: {doubled[:3]}")
        self.found.inbound_dups = len(twice) + len(doubled)
        self.found.inbound_lost = len(lost) + len(unclaimed)
        others = await owner.fetch(
            "SELECT source, work, reason, count(*) AS n FROM service_engine.dead_letter"
            " WHERE source <> 'Reaction' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
        self.found.other_letters = [f"{r['source']} {r['work']} ({r['reason']}) x{r['n']}"
                              for r in others]
        letters = await owner.fetch(
            "SELECT message_id, reason, occurrences FROM service_engine.dead_letter"
            " WHERE source = 'Reaction'")
        by_id = Counter(r["message_id"] for r in letters)
        unexpected = [r for r in letters if r["message_id"] not in self.load.poison_ids]
        missing = [p for p in self.load.poison_ids if by_id.get(p, 0) == 0]
        doubled_letters = [p for p, k in by_id.items() if k > 1]
        if unexpected:
            self.ctx.violations.append(f"unexpected dead letters: {[dict(r) for r in unexpected[:3]]}")
        if missing or doubled_letters:
            self.ctx.violations.append(f"poison dead letters: {len(missing)} missing, "
                                   f"{len(doubled_letters)} twice")
        self.found.dead_letters = len(letters)
        self.found.poison_lost = len(missing)

    async def check_replies(self, owner: asyncpg.Connection) -> None:
        finished = self.load.finished_replies()
        deadline = time.monotonic() + 30
        while True:
            rows = {r["id"]: r for r in await owner.fetch(
                "SELECT id, status, hash FROM reply WHERE id = ANY($1)", finished)}
            bad = [r for r in finished if r not in rows or rows[r]["status"] != "finished"
                   or rows[r]["hash"] != self.load.replies[r].digest]
            if not bad:
                return
            if time.monotonic() > deadline:
                self.ctx.violations.append(
                    f"{len(bad)} replies not sealed with their hash: "
                    f"{[(r, dict(rows[r]) if r in rows else None) for r in bad[:3]]}")
                return
            await asyncio.sleep(0.25)

    async def check_ledgers(self, owner: asyncpg.Connection) -> None:
        rows = {r["org"]: r["balance"] for r in await owner.fetch(
            "SELECT org, balance FROM ledger WHERE name = 'soak'")} if await owner.fetchval(
            "SELECT to_regclass('ledger') IS NOT NULL") else {}
        self.found.ledger_checked = bool(rows)
        for org, ok in self.load.ledger_ok.items():
            balance = rows.get(org)
            if balance is None:
                continue
            if not ok <= balance <= ok + self.load.ledger_unknown[org]:
                self.ctx.violations.append(
                    f"ledger {org}: balance {balance} outside [{ok}, {ok + self.load.ledger_unknown[org]}]")

    async def check_outbox_stream(self, owner: asyncpg.Connection) -> None:
        """The relay sweeps PUBLISHED rows, so the committed facts are read
        from the domain: every card has exactly one ``card.created`` in the
        stream, every sealed reply one ``reply.finished``; no Nats-Msg-Id is
        stored twice; no outbox row is left unpublished."""
        left = await owner.fetch(
            "SELECT message_id, status, last_error FROM service_engine.integration_outbox"
            " WHERE status <> 'PUBLISHED'")
        if left:
            self.ctx.violations.append(f"{len(left)} outbox rows not PUBLISHED: "
                                   f"{[dict(r) for r in left[:3]]}")
        stored = await stream_events(self.ctx.nats.url, "INTEGRATION_EVT")
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
        self.found.stream_messages = len(stored)
        self.found.stream_types = types
        self.found.replayed = sum(k - 1 for k in copies.values() if k > 1)
        self.found.outbox_dups = dup_ids + len(twice)
        self.found.outbox_lost = lost + len(left)
        if dup_ids or twice:
            self.ctx.violations.append(f"stream duplicates: {dup_ids} by Nats-Msg-Id, "
                                   f"{len(twice)} facts under two logical ids: {twice[:5]}")
        if lost:
            self.ctx.violations.append(
                f"committed facts missing from the stream: cards {sorted(cards - created)[:3]}"
                f" replies {sorted(sealed - finished)[:3]}")
        if orphans:
            self.ctx.violations.append(f"{orphans} facts in the stream without their committed row")

    async def check_offers(self, owner: asyncpg.Connection) -> None:
        from example_twin.roster import read_boards

        boards = {r["id"]: (r["title"], r["org"], r["archived"]) for r in await owner.fetch(
            "SELECT id, title, org, archived FROM board")}
        twin = self.ctx.twin
        assert twin is not None
        deadline = time.monotonic() + 30
        while True:
            offered = await read_boards(twin.nats)
            got = {b.id: (b.title, b.org, b.archived) for b in offered.values()}
            if got == boards:
                self.found.offers = len(got)
                return
            if time.monotonic() > deadline:
                stale = [k for k in boards if got.get(k) != boards[k]]
                self.ctx.violations.append(f"{len(stale)} board offers differ from the boards")
                self.found.offers = len(got)
                return
            await asyncio.sleep(0.3)

    def check_steady_readiness(self) -> None:
        """Outside every fault window, a pod that answered was UP. A listener
        kill's window closes once every pod answers UP, yet a pod whose
        listener had not read its connection's end by then goes DOWN for
        ``listener`` just after: that DOWN, naming only the listener, belongs
        to the kill for `LISTENER_SETTLE` seconds more."""
        def covered(at: float, reasons: frozenset[str]) -> bool:
            for f in self.ctx.faults:
                if f.kind not in SERVER_FAULTS:
                    continue
                end = max(f.end, f.recovered) + 0.5
                if f.kind == "listener_kill" and reasons and reasons <= LISTENER_REASONS:
                    end += LISTENER_SETTLE
                if f.start - 0.2 <= at <= end:
                    return True
            return False
        lies = [s for s in self.ctx.samples if s.up is False and not covered(s.at, s.reasons)]
        self.found.steady_down = len(lies)
        if lies:
            # Each with its pod, its time on the run's clock (as `say` prints
            # it) and the details its readiness gave, to place it in the run.
            self.ctx.violations.append(
                f"{len(lies)} DOWN answers outside outages: "
                f"{sorted({r for s in lies for r in s.reasons})}: " + "; ".join(
                    f"{s.pod} at {s.at - self.ctx.began:.1f}s {s.details}" for s in lies[:5]))


@dataclass(frozen=True)
class StoredEvent:
    msg_id: str
    """``Nats-Msg-Id``: the dedup token (fresh on a replayed confirmation)."""
    logical_id: str
    """``Br-Message-Id``: the logical id (a replay keeps it)."""
    kind: str
    subject: str
    """The card or reply the event is about."""


async def stream_events(url: str, stream: str) -> list[StoredEvent]:
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
