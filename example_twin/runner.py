"""The twin's work: send commands, publish its own events, read the
service's events, and close cycles.

Everything the twin puts on the bus is in the frontier envelope, with its
own service identity as the actor. A command's ``Nats-Msg-Id`` and
``Br-Message-Id`` are its envelope id, so a publish retried after an
unanswered one is deduplicated by JetStream. The twin reads the service's
card events with its own consumer on the gitops-declared ``INTEGRATION_EVT``
stream (it never creates a stream): an ordered consumer from "new" for a
run of cycles, a durable one for the reviewer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import BaseModel, ValidationError

from service_engine import (
    Actor,
    EventMetadata,
    IntegrationCommand,
    IntegrationEvent,
    Nats,
    open_nats,
)
from service_engine.errors import NatsUnavailable
from service_engine.integration import Acked, Duplicate, Unanswered, command_subject, event_subject

from .contract import (
    CARD,
    REVIEW,
    STALE_REVISION,
    AdvanceCard,
    CardAdvanced,
    CardCreated,
    CardRejected,
    CardReviewed,
    CreateCard,
    ReviewApproved,
)

__all__ = ["EVENT_STREAM", "CycleResult", "Summary", "Twin", "TwinError"]

_log = logging.getLogger("example_twin")

EVENT_STREAM = "INTEGRATION_EVT"
"""The gitops-declared stream of ``integration.evt.>`` (bound, never created)."""
HEADER_NATS_MSG_ID = "Nats-Msg-Id"
HEADER_MESSAGE_ID = "Br-Message-Id"
_PUBLISH_RETRY = 0.2
MAX_ADVANCES = 5
"""How many times one cycle sends ``card.advance`` (the first, then one per
``StaleRevision`` answer) before it gives up."""
CONNECT_BOUND = 10.0
"""Seconds the twin waits for NATS before giving up (it does not retry forever)."""


class TwinError(Exception):
    """The twin could not do what it was asked (a refused publish, a
    rejected command, an answer that never came)."""


@dataclass
class CycleResult:
    """One cycle: ``closed`` when every answer arrived; ``correlated`` when
    each answer carried the cycle's correlation id and, as causation, the id
    of the message it answers."""

    card_id: str
    closed: bool = False
    correlated: bool = True
    elapsed_ms: float = 0.0
    seen: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Summary:
    cycles: int
    closed: int
    elapsed_ms: float
    results: list[CycleResult]

    @property
    def ok(self) -> bool:
        return self.closed == self.cycles and all(r.correlated for r in self.results)

    def to_json(self) -> str:
        return json.dumps({
            "ok": self.ok, "cycles": self.cycles, "closed": self.closed,
            "elapsed_ms": round(self.elapsed_ms, 1),
            "results": [asdict(r) for r in self.results],
        }, sort_keys=True)


Received = IntegrationEvent[dict[str, Any]]


class Twin:
    """The twin on one NATS connection. ``name`` is its own service (its
    identity and the producer of its events); ``target`` the service whose
    card commands it sends and whose card events it reads."""

    def __init__(self, nats: Nats, *, name: str = "twin", target: str = "example") -> None:
        self.nats = nats
        self.name = name
        self.target = target
        self.actor = Actor.service(name)
        self._inboxes: dict[str, asyncio.Queue[Received]] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, url: str, *, connect_within: float = CONNECT_BOUND, **options: Any
    ) -> AsyncIterator[Twin]:
        """The twin on a fresh connection to ``url``; raises `NatsUnavailable`
        when no server answers within ``connect_within`` seconds."""
        try:
            nats = await asyncio.wait_for(
                open_nats(url, name=f"{options.get('name', 'twin')}-runner"), connect_within
            )
        except TimeoutError:
            raise NatsUnavailable(f"no NATS server answered at {url} "
                                  f"within {connect_within:g}s") from None
        try:
            yield cls(nats, **options)
        finally:
            await nats.aclose()

    # -- sending ---------------------------------------------------------------------

    async def command(
        self, verb: str, payload: BaseModel, metadata: EventMetadata, *, within: float = 10.0,
        aggregate: str = CARD,
    ) -> uuid.UUID:
        """Send ``{aggregate}.{verb}`` (a card command by default) to the
        target service; its command id."""
        envelope: IntegrationCommand[BaseModel] = IntegrationCommand(
            command_id=uuid.uuid4(), type=f"{aggregate}.{verb}", version=1,
            occurred_at=datetime.now(UTC), metadata=metadata, payload=payload,
        )
        await self._publish(command_subject(self.target, aggregate, verb), envelope, within)
        return envelope.command_id

    async def event(
        self, aggregate: str, fact: str, payload: BaseModel, metadata: EventMetadata,
        *, event_id: uuid.UUID | None = None, within: float = 10.0,
    ) -> uuid.UUID:
        """Publish the twin's own fact ``{aggregate}.{fact}``; its event id."""
        envelope: IntegrationEvent[BaseModel] = IntegrationEvent(
            event_id=event_id or uuid.uuid4(), type=f"{aggregate}.{fact}", version=1,
            occurred_at=datetime.now(UTC), metadata=metadata, payload=payload,
        )
        await self._publish(event_subject(self.name, aggregate, fact), envelope, within)
        return envelope.event_id

    async def _publish(
        self, subject: str, envelope: IntegrationCommand[Any] | IntegrationEvent[Any],
        within: float,
    ) -> None:
        # The payload is dumped as its own model (a field typed BaseModel
        # would serialise only the base class's fields).
        frame = envelope.model_dump(mode="json", exclude={"payload"})
        frame["payload"] = envelope.payload.model_dump(mode="json")
        body = json.dumps(frame, separators=(",", ":")).encode()
        msg_id = str(envelope.envelope_id)
        headers = {HEADER_NATS_MSG_ID: msg_id, HEADER_MESSAGE_ID: msg_id}
        deadline = time.monotonic() + within
        while True:
            outcome = await self.nats.publish(subject, body, headers)
            if isinstance(outcome, Acked | Duplicate):
                return
            if not isinstance(outcome, Unanswered) or time.monotonic() > deadline:
                raise TwinError(f"publish to {subject} failed: {outcome}")
            # Unanswered: the same Nats-Msg-Id again, so a late ack cannot double it.
            await asyncio.sleep(_PUBLISH_RETRY)

    # -- reading -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Read the target's card events from now on (an ordered consumer),
        routing each to the cycle waiting on its card."""
        js = self.nats.client.jetstream()
        subscription = await js.subscribe(
            # Every fact of the target's cards: the wildcard is the last token.
            event_subject(self.target, CARD, "created").rsplit(".", 1)[0] + ".*",
            stream=EVENT_STREAM, cb=self._route,
            ordered_consumer=True, deliver_policy=DeliverPolicy.NEW,
        )
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _route(self, msg: Msg) -> None:
        event = _decode(msg.data)
        if event is None:
            return
        card_id = event.payload.get("card_id")
        inbox = self._inboxes.get(card_id) if isinstance(card_id, str) else None
        if inbox is not None:
            inbox.put_nowait(event)

    # -- a cycle ------------------------------------------------------------------------

    async def cycle(
        self, card_id: str, *, org: str, due_in: float | None = None
    ) -> CycleResult:
        """Create ``card_id`` by command, and on ``card.created`` advance it by
        command (from the created card's revision) and approve its review by
        event; closed once ``card.advanced`` and ``card.reviewed`` (and, with
        a deadline, ``card.overdue``) came back. The review and the deadline
        race the advance: an advance answered ``StaleRevision`` is sent again
        from the revision that answer names, at most `MAX_ADVANCES` times."""
        result = CycleResult(card_id)
        inbox: asyncio.Queue[Received] = asyncio.Queue()
        self._inboxes[card_id] = inbox
        started = time.monotonic()
        try:
            origin = EventMetadata.originating(self.actor)
            create_id = await self.command(
                CreateCard.VERB,
                CreateCard(card_id=card_id, org=org, title=f"made by {self.name}",
                           due_in_seconds=due_in),
                origin,
            )
            created = await self._expect(inbox, result, {"card.created"})
            created_fact = CardCreated.model_validate(created["card.created"].payload)
            self._check(result, created["card.created"], origin.correlation_id, create_id)

            follow_up = created["card.created"].metadata.caused(
                created["card.created"].event_id, self.actor
            )
            advance_id = await self.command(
                AdvanceCard.VERB,
                AdvanceCard(card_id=card_id, expected_revision=created_fact.version), follow_up,
            )
            advances = 1
            review_id = await self.event(
                REVIEW, ReviewApproved.FACT, ReviewApproved(card_id=card_id), follow_up
            )

            async def stale(rejected: CardRejected, event: Received) -> bool:
                """Re-send an advance answered stale, from the revision it names."""
                nonlocal advance_id, advances
                if (rejected.command != f"{CARD}.{AdvanceCard.VERB}"
                        or rejected.outcome != STALE_REVISION or rejected.revision is None
                        or event.metadata.causation_id != advance_id
                        or advances >= MAX_ADVANCES):
                    return False
                advances += 1
                advance_id = await self.command(
                    AdvanceCard.VERB,
                    AdvanceCard(card_id=card_id, expected_revision=rejected.revision), follow_up,
                )
                return True

            expected = {"card.advanced", "card.reviewed"}
            if due_in is not None:
                expected.add("card.overdue")
            answers = await self._expect(inbox, result, expected, retry=stale)
            advanced = CardAdvanced.model_validate(answers["card.advanced"].payload)
            reviewed = CardReviewed.model_validate(answers["card.reviewed"].payload)
            self._check(result, answers["card.advanced"], origin.correlation_id, advance_id)
            self._check(result, answers["card.reviewed"], origin.correlation_id, review_id)
            if advanced.stage != "doing" or reviewed.reviewed_by != self.name:
                raise TwinError(f"unexpected answers: {advanced} {reviewed}")
            if created_fact.org != org:
                raise TwinError(f"card created in {created_fact.org}, not {org}")
            result.closed = True
        except TwinError as exc:
            result.error = str(exc)
        finally:
            result.elapsed_ms = (time.monotonic() - started) * 1000
            del self._inboxes[card_id]
        return result

    async def _expect(
        self, inbox: asyncio.Queue[Received], result: CycleResult, types: set[str],
        *, retry: Callable[[CardRejected, Received], Awaitable[bool]] | None = None,
    ) -> dict[str, Received]:
        """Wait for one event of each of ``types``; a ``card.rejected`` fails
        the cycle unless ``retry`` took it up (answered True)."""
        found: dict[str, Received] = {}
        while not types <= found.keys():
            event = await inbox.get()
            result.seen.append(event.type)
            if event.type == "card.rejected":
                rejected = CardRejected.model_validate(event.payload)
                if retry is not None and await retry(rejected, event):
                    continue
                raise TwinError(f"{rejected.command} rejected: {rejected.code}: {rejected.message}")
            found.setdefault(event.type, event)
        return found

    def _check(
        self, result: CycleResult, event: Received, correlation: uuid.UUID, cause: uuid.UUID
    ) -> None:
        meta = event.metadata
        if meta.correlation_id != correlation or meta.causation_id != cause:
            result.correlated = False
            _log.warning("%s of %s: correlation %s cause %s, expected %s / %s", event.type,
                         result.card_id, meta.correlation_id, meta.causation_id, correlation,
                         cause)

    async def run_cycles(
        self, n: int, *, org: str, bound: float, due_in: float | None = None
    ) -> Summary:
        """``n`` cycles at once, each bounded by ``bound`` seconds."""
        run = uuid.uuid4().hex[:8]
        started = time.monotonic()

        async def bounded(i: int) -> CycleResult:
            card_id = f"twin-{run}-{i}"
            try:
                return await asyncio.wait_for(self.cycle(card_id, org=org, due_in=due_in), bound)
            except TimeoutError:
                return CycleResult(card_id, error=f"no answer within {bound:g}s")

        async with self.watching():
            results = await asyncio.gather(*(bounded(i) for i in range(n)))
        closed = sum(r.closed for r in results)
        return Summary(n, closed, (time.monotonic() - started) * 1000, list(results))

    # -- the reviewer -----------------------------------------------------------------------

    async def review(self, stop: asyncio.Event, *, durable: str | None = None) -> int:
        """Approve the review of every card the target creates, until ``stop``
        is set; answers how many it approved. A durable consumer remembers
        where it stopped; each approval's id derives from the ``card.created``
        it answers, so a redelivery publishes a duplicate JetStream drops."""
        js = self.nats.client.jetstream()
        subscription = await js.pull_subscribe(
            event_subject(self.target, CARD, "created"),
            durable=durable or f"{self.name}-reviewer", stream=EVENT_STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL),
        )
        approved = 0
        try:
            while not stop.is_set():
                try:
                    messages = await subscription.fetch(16, timeout=1.0)
                except TimeoutError:
                    continue
                for msg in messages:
                    created = _decode(msg.data)
                    if created is None or created.type != "card.created":
                        await msg.term()
                        continue
                    card_id = created.payload.get("card_id")
                    if not isinstance(card_id, str):
                        await msg.term()
                        continue
                    await self.event(
                        REVIEW, ReviewApproved.FACT, ReviewApproved(card_id=card_id),
                        created.metadata.caused(created.event_id, self.actor),
                        event_id=uuid.uuid5(created.event_id, "review.approved"),
                    )
                    await msg.ack()
                    approved += 1
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        return approved


def _decode(data: bytes) -> Received | None:
    try:
        raw: Mapping[str, Any] = json.loads(data)
        return IntegrationEvent[dict[str, Any]].model_validate(raw)
    except (ValueError, ValidationError) as exc:
        _log.warning("ignored a frame that is no integration event: %s", exc)
        return None
