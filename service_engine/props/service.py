"""`PropsService`: the property verbs answered over NATS request/reply.

It subscribes ``<svc>.props.<suffix>`` for every verb (one queue group, so
any number of pods answer), reads the requester the server attests in
``Nats-Request-Info`` (see `capabilities.attested_peer`), hands the request
to the `PropsHandler` and replies with an ``rc`` header (``0``/``10``/``20``),
an ``error`` header carrying the human message on failure, and the JSON
body. Its dispatcher publishes each commit on the two reserved topics.

How the requester is attested (the actor of every commit and the peer a
policy resolves): nats-server writes ``Nats-Request-Info`` (``acc``, and
``user`` when the import shares request info) on a request that crosses a
service import, replacing whatever header the client sent. Deploy the
service in its own account, export the verb subjects, and let each calling
account import them with ``share: true``; deny the service account's users
publishing to the verb subjects, since within one account nothing rewrites
the header. A request without the header, or whose ``acc`` is the service's
own account, is unattested. (Nkeys and user JWTs change how an account's
users authenticate, not this header: the same rule holds with either.)

nats-py exceptions stay inside this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ..failures import ConfigError
from ..resources import AsyncResource
from .addressing import VERBS, audit_topic, records_changed_topic, subject
from .capabilities import Policy, attested_peer
from .events import audit_body, records_changed_body
from .handler import (
    GRANT_SUBJECT,
    REVOKE_SUBJECT,
    Granted,
    GranterMissing,
    GrantOutcome,
    GrantRefused,
    PropsHandler,
    Reply,
    encode_body,
    reply_limit,
)
from .schema import Namespace
from .store import Store

_log = logging.getLogger(__name__)

H_RC = "rc"
H_ERROR = "error"


def encode_reply(reply: Reply) -> tuple[bytes, dict[str, str]]:
    headers = {H_RC: str(reply.rc)}
    if reply.error is not None:
        headers[H_ERROR] = reply.error
    return encode_body(reply.body), headers


class NatsGranter:
    """Calls the broker's ``noded.props.subscribe_grant`` (and
    ``noded.props.unsubscribe_grant``) over ``client``."""

    def __init__(
        self,
        client: Client,
        *,
        subject: str = GRANT_SUBJECT,
        revoke_subject: str = REVOKE_SUBJECT,
        timeout: float = 2.0,
    ) -> None:
        self._client = client
        self._subject = subject
        self._revoke_subject = revoke_subject
        self._timeout = timeout

    async def unsubscribe_grant(self, subscription_id: str) -> bool:
        try:
            msg = await self._client.request(
                self._revoke_subject,
                b"",
                timeout=self._timeout,
                headers={"subscription_id": subscription_id},
            )
        except (TimeoutError, nats.errors.Error) as exc:
            _log.warning("removing grant %s: %s", subscription_id, type(exc).__name__)
            return False
        return (msg.headers or {}).get(H_RC) == "0"

    async def subscribe_grant(self, topic: str, target_peer: str, namespace: str) -> GrantOutcome:
        headers = {"topic": topic, "target_peer": target_peer, "namespace": namespace}
        try:
            msg = await self._client.request(
                self._subject, b"", timeout=self._timeout, headers=headers
            )
        except (TimeoutError, nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            return GranterMissing(type(exc).__name__)
        except nats.errors.Error as exc:
            return GranterMissing(f"{type(exc).__name__}: {exc}")
        rc = (msg.headers or {}).get(H_RC, "")
        try:
            body = json.loads(msg.data or b"{}")
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if rc == "0" and isinstance(body.get("subscription_id"), str):
            return Granted(body["subscription_id"], str(body.get("namespace", namespace)))
        if rc == "10":
            return GrantRefused(str(body.get("error_code", "")), str(body.get("message", "")))
        return GranterMissing(f"grant answered rc {rc!r}")


class PropsService(AsyncResource):
    """One service's props verbs on a connected nats-py ``client``.

    ``service_account`` is the NATS account the service connects in: only
    requests from other accounts, crossing a service import that shares
    request info, carry an attested requester. Without it every request is
    unattested (development on a single-account server).

    At most ``max_in_flight`` requests are answered at once. Register
    namespaces, then `start` (or run `run` under a supervisor).
    """

    def __init__(
        self,
        client: Client,
        service: str,
        store: Store,
        policy: Policy,
        *,
        service_account: str | None = None,
        granter: NatsGranter | None = None,
        max_in_flight: int = 256,
    ) -> None:
        if max_in_flight < 1:
            raise ConfigError("max_in_flight must be at least 1")
        self._client = client
        self.handler = PropsHandler(service, store, policy, granter or NatsGranter(client))
        self.service = service
        self._service_account = service_account
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._dispatcher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._cursors: dict[str, int] = {}
        self._remove_listener: Any = None
        self._started = False

    @property
    def store(self) -> Store:
        return self.handler.store

    async def register(self, ns: Namespace) -> None:
        await self.handler.register(ns)
        if self._started:
            self._cursors[ns.name] = await self.store.cursor(ns.name)

    async def start(self) -> None:
        """Subscribe every verb and start the dispatcher at the current cursors;
        returns once the subscriptions reached the server."""
        if self._started:
            return
        self._started = True
        for name in self.handler.namespaces:
            self._cursors[name] = await self.store.cursor(name)
        self._remove_listener = self.store.add_listener(lambda _ns: self._wake.set())
        for verb in VERBS:
            sub = await self._client.subscribe(
                subject(self.service, verb), queue=f"{self.service}.props", cb=self._on_request
            )
            self._subs.append(sub)
        await self._client.flush()
        self._dispatcher = asyncio.create_task(
            self._dispatch(), name=f"props:{self.service}:dispatch"
        )

    async def run(self) -> None:
        """Serve until cancelled (a supervisor worker)."""
        await self.start()
        try:
            assert self._dispatcher is not None
            await self._dispatcher
        finally:
            await self.aclose()

    async def _on_request(self, msg: Msg) -> None:
        # Each request in its own task (a watch waits on the broker's grant),
        # at most max_in_flight at once: past that the subscription's own
        # pending limits push back.
        await self._slots.acquire()
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _answer(self, msg: Msg) -> None:
        headers: Mapping[str, str] = msg.headers or {}
        peer = attested_peer(headers, self._service_account)
        # Every reply fits the broker's max payload (headers included): a
        # larger one is refused with the limit instead of never arriving.
        limit = reply_limit(self._client.max_payload)
        reply = await self.handler.handle(
            msg.subject, headers, msg.data or b"", peer, limit=limit
        )
        delivered = False
        if msg.reply:
            data, reply_headers = encode_reply(reply)
            try:
                await self._client.publish(msg.reply, data, headers=reply_headers)
                delivered = True
            except nats.errors.Error as exc:
                _log.warning("props reply to %s failed: %s", msg.subject, exc)
        if reply.grant is not None and not delivered:
            # Nobody learns of this watch: its live delivery must not stay.
            await self.handler.revoke(reply.grant)

    async def _dispatch(self) -> None:
        changed = records_changed_topic(self.service)
        audit = audit_topic(self.service)
        while True:
            await self._wake.wait()
            self._wake.clear()
            for name in list(self._cursors):
                cursor = self._cursors[name]
                try:
                    through = await self.store.cursor(name)
                    events = (
                        await self.store.events(name, cursor, through) if through > cursor else []
                    )
                except Exception as exc:
                    _log.error("props dispatcher could not read %s: %s", name, exc)
                    continue
                for event in events:
                    try:
                        await self._client.publish(changed, _json(records_changed_body(event)))
                        await self._client.publish(audit, _json(audit_body(event)))
                    except nats.errors.Error as exc:
                        # Best-effort: a watcher recovers through watch.
                        _log.warning(
                            "props publication of %s nseq %d failed: %s", name, event.nseq, exc
                        )
                self._cursors[name] = max(cursor, through)

    async def aclose(self) -> None:
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._subs.clear()
        pending = [t for t in (self._dispatcher, *self._tasks) if t is not None]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._dispatcher = None


def _json(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
