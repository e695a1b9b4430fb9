"""The soak's load: ``rate`` operations/s mixed across the slices (board and
card renames, ledger postings, typing presence over GraphQL; ``card.create``
commands and streamed, sealed replies from the twin over NATS; poison
commands), with what each acknowledged kept for the oracle."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any

import httpx

from example_twin.contract import CreateCard
from example_twin.reply import finish_reply, split_text, stream_reply
from example_twin.runner import Twin
from service_engine import EventMetadata
from service_engine.graphql import Passport
from service_engine.lanes import seal_hash

from ...blackbox.harness import Pod
from .context import SoakContext
from .model import (
    BOARDS_PER_COHORT,
    CARDS_PER_COHORT,
    POST_LEDGER,
    RENAME_BOARD,
    RENAME_CARD,
    ROOT_FIELD,
    START_REPLY,
    TYPING,
    Poison,
    ReplyState,
    org_of,
    outcome,
    passport,
)


class Load:
    """Drives the operations and records their outcomes: ``ops`` counts
    each kind by outcome; the acknowledged commands, poison, replies and
    ledger postings are what the oracle holds committed state to."""

    def __init__(self, ctx: SoakContext) -> None:
        self.ctx = ctx
        self.seq = itertools.count(1)
        self.ops: Counter[str] = Counter()
        self.ledger_ok: Counter[str] = Counter()
        self.ledger_unknown: Counter[str] = Counter()
        self.commands: dict[str, tuple[uuid.UUID, str]] = {}
        """card id -> (command id, org) of every card.create JetStream acknowledged."""
        self.poison_ids: set[uuid.UUID] = set()
        self.replies: dict[str, ReplyState] = {}
        self.inflight = 0
        self.stop = False

    async def post(self, query: str, variables: Mapping[str, Any], as_: Passport,
                   pod: Pod | None = None) -> bool | None:
        """A mutation through a live pod: True / False (refused), None when
        its answer was lost (it may or may not have committed)."""
        live = self.ctx.slots.live()
        if pod is None and not live:
            return None
        target = pod or self.ctx.rng.choice(live)
        try:
            answer = await target.post(query, variables, as_)
        except (httpx.HTTPError, AssertionError):
            return None
        data = answer.get("data") or {}
        root = ROOT_FIELD.search(query)
        result = data.get(root.group(1)) if root is not None else None
        if answer.get("errors") or not isinstance(result, dict):
            return None
        return bool(result.get("success"))

    async def run(self, seconds: float) -> None:
        """Start operations at ``rate``/s until ``seconds`` pass or `stop`;
        past ``concurrency`` in flight an operation is shed (counted)."""
        rate = self.ctx.config.rate
        tasks: set[asyncio.Task[None]] = set()
        begin = time.perf_counter()
        n = 0
        while time.perf_counter() - begin < seconds and not self.stop:
            target = begin + n / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the pace of the load, not a wait on an event
            n += 1
            if self.inflight >= self.ctx.config.concurrency:
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
            roll = self.ctx.rng.random()
            cohort = self.ctx.rng.randrange(self.ctx.config.cohorts)
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
        k = self.ctx.rng.randrange(BOARDS_PER_COHORT if what == "board" else CARDS_PER_COHORT)
        query = RENAME_BOARD if what == "board" else RENAME_CARD
        self.ctx.sent[seq] = time.perf_counter()
        ok = await self.post(query, {"id": f"{what[0]}-{cohort}-{k}", "t": f"w{seq}"},
                             passport(f"w{cohort}", org_of(cohort)))
        self.ops[f"{what} rename {outcome(ok)}"] += 1

    async def ledger(self, cohort: int) -> None:
        ok = await self.post(POST_LEDGER, {"n": "soak"}, passport(f"w{cohort}", org_of(cohort)))
        org = org_of(cohort)
        if ok:
            self.ledger_ok[org] += 1
        elif ok is None:
            self.ledger_unknown[org] += 1
        self.ops[f"ledger post {outcome(ok)}"] += 1

    async def typing(self, cohort: int) -> None:
        ok = await self.post(TYPING, {"id": f"typing-{cohort}"},
                             passport(f"w{cohort}", org_of(cohort)))
        self.ops[f"presence {outcome(ok)}"] += 1

    async def card_command(self, cohort: int) -> None:
        twin = self.ctx.twin
        if twin is None or not self.ctx.twin_ok.is_set():
            self.ops["card.create skipped (NATS down)"] += 1
            return
        card_id = f"t-{uuid.uuid4().hex[:12]}"
        try:
            command_id = await twin.command(
                CreateCard.VERB,
                CreateCard(card_id=card_id, org=org_of(cohort), title=f"twin {card_id}"),
                EventMetadata.originating(twin.actor), within=3.0,
            )
        except Exception:
            self.ops["card.create unacknowledged"] += 1
            return
        self.commands[card_id] = (command_id, org_of(cohort))
        self.ops["card.create acknowledged"] += 1

    async def reply(self, cohort: int) -> None:
        twin = self.ctx.twin
        org = org_of(cohort)
        reply_id = f"r-{uuid.uuid4().hex[:12]}"
        ok = await self.post(START_REPLY, {"id": reply_id}, passport(f"w{cohort}", org))
        self.ops[f"reply start {outcome(ok)}"] += 1
        if not ok:
            return
        chunks = split_text(f"soak reply {reply_id}: " + "x" * self.ctx.rng.randrange(8, 40), 8)
        state = ReplyState(org, chunks, seal_hash(chunks))
        self.replies[reply_id] = state
        if twin is None or not self.ctx.twin_ok.is_set():
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

    async def finish_replies(self, twin: Twin) -> None:
        """Replies whose chunks or finish an outage refused: sent again (the
        same Nats-Msg-Ids, so what did land is deduplicated)."""
        for reply_id, state in list(self.replies.items()):
            if not state.finished:
                await self.stream_and_finish(twin, reply_id, state)

    def finished_replies(self) -> list[str]:
        return [r for r, state in self.replies.items() if state.finished]

    async def poison(self) -> None:
        twin = self.ctx.twin
        assert twin is not None
        command_id = await twin.command(
            CreateCard.VERB, Poison(poison=len(self.poison_ids)),
            EventMetadata.originating(twin.actor), within=10.0,
        )
        self.poison_ids.add(command_id)
