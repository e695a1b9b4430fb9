"""Watching a namespace from the caller's side.

`WatchMerge` is the pure part: replay, then the ``caught_up`` marker, then
live events, discarding live events through the marker's cursor and
deduplicating by ``(namespace, key, nseq)``. `open_watch` does the I/O:
register with the broker, listen on the peer's delivery subject (answering
the broker's connectivity probe), send the watch verb, and merge.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ..resources import AsyncResource
from .addressing import audit_topic, records_changed_topic, subject
from .client import decode_reply
from .errors import PropsError
from .granter import PROBE_TOKEN, REGISTER_SUBJECT


class WatchMerge:
    """Replay + marker + live, exactly once per ``(namespace, key, nseq)``."""

    def __init__(self) -> None:
        self.through: int | None = None
        self._seen: set[tuple[str, str, int]] = set()
        self._pending: list[Mapping[str, Any]] = []

    def _accept(self, event: Mapping[str, Any]) -> bool:
        ident = (str(event["namespace"]), str(event["key"]), int(event["nseq"]))
        if ident in self._seen:
            return False
        self._seen.add(ident)
        return True

    def on_reply(self, reply: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The watch reply: its events, the marker (records-changed only),
        then the live events that arrived early and lie past the marker."""
        out = [e for e in reply["events"] if self._accept(e)]
        marker = reply.get("caught_up")
        self.through = int(marker["nseq"]) if marker is not None else int(reply["observed_nseq"])
        if marker is not None:
            out.append(marker)
        pending, self._pending = self._pending, []
        for event in pending:
            out.extend(self.on_live(event))
        return out

    def on_live(self, event: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        if self.through is None:
            self._pending.append(event)
            return []
        if int(event["nseq"]) <= self.through or not self._accept(event):
            return []
        return [event]


class PropsWatch(AsyncResource):
    """One open watch; iterate it for replay, the marker, then live events."""

    def __init__(self, client: Client, service: str, namespace: str, *, audit: bool) -> None:
        self._client = client
        self._service = service
        self._namespace = namespace
        self._audit = audit
        self._topic = audit_topic(service) if audit else records_changed_topic(service)
        self._merge = WatchMerge()
        self._queue: asyncio.Queue[Mapping[str, Any]] = asyncio.Queue()
        self._sub: Subscription | None = None
        self.reply: dict[str, Any] = {}
        self.delivered: list[int] = []
        """The nseq of every live delivery received, duplicates included."""

    async def _open(self, since_nseq: int, request_timeout: float) -> None:
        try:
            registered = await self._client.request(REGISTER_SUBJECT, b"", timeout=request_timeout)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            raise PropsError("unavailable", "no broker to register with") from exc
        prefix = json.loads(registered.data)["deliver_prefix"]
        self._sub = await self._client.subscribe(f"{prefix}.>", cb=self._on_delivery)
        await self._client.flush()
        verb = "audit.watch" if self._audit else "watch"
        try:
            msg = await self._client.request(
                subject(self._service, verb),
                b"",
                timeout=request_timeout,
                headers={"namespace": self._namespace, "since_nseq": str(since_nseq)},
            )
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            raise PropsError("unavailable", f"{verb}: {type(exc).__name__}") from exc
        self.reply = decode_reply(msg.headers or {}, msg.data or b"")
        for item in self._merge.on_reply(self.reply):
            self._queue.put_nowait(item)

    async def _on_delivery(self, msg: Msg) -> None:
        if msg.subject.endswith(f".{PROBE_TOKEN}"):
            if msg.reply:
                with contextlib.suppress(nats.errors.Error):
                    await self._client.publish(msg.reply, b"")
            return
        if (msg.headers or {}).get("topic") != self._topic:
            return
        try:
            event = json.loads(msg.data)
        except ValueError:
            return
        if not isinstance(event, dict) or event.get("namespace") != self._namespace:
            return
        self.delivered.append(int(event.get("nseq", 0)))
        for item in self._merge.on_live(event):
            self._queue.put_nowait(item)

    async def next(self, within: float = 5.0) -> Mapping[str, Any]:
        """The next replayed event, marker or live event (`TimeoutError` past ``within``)."""
        return await asyncio.wait_for(self._queue.get(), within)

    async def __aiter__(self) -> AsyncIterator[Mapping[str, Any]]:
        while True:
            yield await self._queue.get()

    async def aclose(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None


async def open_watch(
    client: Client,
    service: str,
    namespace: str,
    *,
    since_nseq: int = 0,
    audit: bool = False,
    request_timeout: float = 5.0,
) -> PropsWatch:
    """Register, listen, and send ``watch`` (or ``audit.watch``); refusals
    raise `PropsError`."""
    watch = PropsWatch(client, service, namespace, audit=audit)
    try:
        await watch._open(since_nseq, request_timeout)
    except BaseException:
        await watch.aclose()
        raise
    return watch
