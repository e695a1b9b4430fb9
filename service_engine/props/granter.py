"""A development and test stand-in for the broker's grant verb.

Production deployments point the service at their own broker (``noded``).
`DevGranter` answers the same verb the way the property contract describes
it, on a real nats-server:

* ``noded.props.subscribe_grant`` with non-empty ``topic``, ``target_peer``
  and ``namespace`` headers: it authenticates the topic owner (the attested
  requester's account must own ``<svc>``), requires a registered target
  that is connected (a probe to the target's delivery subject finds a
  responder), installs a top-level ``namespace`` body filter and forwards
  each matching topic message to ``noded.deliver.<account>.<user>.<id>``.
  Success is ``{subscription_id,namespace}`` with rc 0; every refusal rc 10
  (``target_peer_not_connected`` among them).
* ``noded.props.unsubscribe_grant`` with a ``subscription_id`` header: the
  topic owner that installed the grant removes it (rc 0
  ``{subscription_id,removed:true}``; rc 10 ``not_found`` or ``auth_denied``).
  The service calls it when a watch reply was refused or could not be sent.
* ``noded.peers.register``: a peer announces itself (identity attested).
* ``noded.topic.subscribe``: refused for the reserved props topics, owner
  included; they are delivered through watch only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ..resources import AsyncResource
from .capabilities import PeerIdentity, attested_peer
from .handler import GRANT_SUBJECT, REVOKE_SUBJECT

_log = logging.getLogger(__name__)

REGISTER_SUBJECT = "noded.peers.register"
TOPIC_SUBSCRIBE_SUBJECT = "noded.topic.subscribe"
DELIVER_PREFIX = "noded.deliver"
PROBE_TOKEN = "probe"
GRANT_VERB = {"owner": "noded", "class": "intent", "version": "0.1.0"}
"""The grant verb's registration in the Bus registry."""

_RESERVED_TOPIC = re.compile(r"^([A-Za-z0-9_-]+)\.props\.(records\.changed|audit)$")


def deliver_prefix(peer: PeerIdentity) -> str:
    """Where the granter delivers to ``peer``: ``noded.deliver.<account>.<user>``."""
    return f"{DELIVER_PREFIX}.{peer.deliver_tokens}"


@dataclass(frozen=True, slots=True)
class _Grant:
    subscription_id: str
    topic: str
    namespace: str
    target: PeerIdentity


def _reply(rc: int, body: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
    headers = {"rc": str(rc)}
    if rc != 0:
        headers["error"] = str(body.get("message", ""))
    return json.dumps(dict(body)).encode(), headers


class DevGranter(AsyncResource):
    """The development broker's grant verb on ``client``.

    ``owners`` maps a service name to the NATS account its connection lives
    in (``None``: any unattested requester, for a single-account development
    server). ``granter_account`` is the account ``client`` connects in.
    """

    def __init__(
        self,
        client: Client,
        owners: Mapping[str, str | None],
        *,
        granter_account: str | None = None,
        probe_timeout: float = 1.0,
    ) -> None:
        self._client = client
        self._owners = dict(owners)
        self._account = granter_account
        self._probe_timeout = probe_timeout
        self._registered: set[str] = set()
        self._grants: dict[str, _Grant] = {}
        self._topic_subs: dict[str, Subscription] = {}
        self._subs: list[Subscription] = []
        self._lock = asyncio.Lock()

    @property
    def grants(self) -> list[tuple[str, str, str, str]]:
        """``(subscription_id, topic, namespace, target_peer)`` of each grant."""
        return [
            (g.subscription_id, g.topic, g.namespace, g.target.peer_id)
            for g in self._grants.values()
        ]

    async def start(self) -> None:
        """Answer the four verbs (idempotent); returns once subscribed."""
        if self._subs:
            return
        for subj, cb in (
            (GRANT_SUBJECT, self._on_grant),
            (REVOKE_SUBJECT, self._on_revoke),
            (REGISTER_SUBJECT, self._on_register),
            (TOPIC_SUBSCRIBE_SUBJECT, self._on_topic_subscribe),
        ):
            self._subs.append(await self._client.subscribe(subj, cb=cb))
        await self._client.flush()

    async def run(self) -> None:
        """Answer until cancelled (a supervisor worker)."""
        await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.aclose()

    async def _respond(self, msg: Msg, rc: int, body: Mapping[str, Any]) -> None:
        if not msg.reply:
            return
        data, headers = _reply(rc, body)
        with contextlib.suppress(nats.errors.Error):
            await self._client.publish(msg.reply, data, headers=headers)

    def _requester(self, msg: Msg) -> PeerIdentity:
        return attested_peer(msg.headers or {}, self._account)

    async def _on_register(self, msg: Msg) -> None:
        peer = self._requester(msg)
        self._registered.add(peer.peer_id)
        await self._respond(msg, 0, {"peer": peer.peer_id, "deliver_prefix": deliver_prefix(peer)})

    async def _on_topic_subscribe(self, msg: Msg) -> None:
        topic = (msg.headers or {}).get("topic", "")
        if _RESERVED_TOPIC.match(topic):
            await self._respond(
                msg,
                10,
                {
                    "error_code": "auth_denied",
                    "message": f"{topic} is a reserved props topic: use watch",
                },
            )
            return
        await self._respond(msg, 10, {"error_code": "not_found", "message": f"no topic {topic}"})

    async def _on_grant(self, msg: Msg) -> None:
        headers = msg.headers or {}
        topic = headers.get("topic", "")
        target_peer = headers.get("target_peer", "")
        namespace = headers.get("namespace", "")
        if not topic or not target_peer or not namespace:
            await self._respond(
                msg,
                10,
                {
                    "error_code": "validation_error",
                    "message": "topic, target_peer and namespace headers are required",
                },
            )
            return
        match = _RESERVED_TOPIC.match(topic)
        owner = match.group(1) if match else None
        requester = self._requester(msg)
        if owner is None or owner not in self._owners or not self._is_owner(requester, owner):
            await self._respond(
                msg,
                10,
                {
                    "error_code": "auth_denied",
                    "message": "the requester does not own the topic",
                },
            )
            return
        try:
            target = PeerIdentity.parse_peer_id(target_peer)
        except Exception:
            await self._respond(
                msg, 10, {"error_code": "validation_error", "message": "bad target_peer"}
            )
            return
        if target.peer_id not in self._registered:
            await self._respond(
                msg,
                10,
                {
                    "error_code": "target_peer_not_registered",
                    "message": f"{target_peer} is not registered",
                },
            )
            return
        if not await self._connected(target):
            await self._respond(
                msg,
                10,
                {
                    "error_code": "target_peer_not_connected",
                    "message": f"{target_peer} is not connected",
                },
            )
            return
        grant = _Grant(f"sub_{secrets.token_hex(8)}", topic, namespace, target)
        async with self._lock:
            if topic not in self._topic_subs:
                self._topic_subs[topic] = await self._client.subscribe(
                    topic, cb=self._on_topic_message
                )
                await self._client.flush()
            self._grants[grant.subscription_id] = grant
        await self._respond(
            msg, 0, {"subscription_id": grant.subscription_id, "namespace": namespace}
        )

    async def _on_revoke(self, msg: Msg) -> None:
        subscription_id = (msg.headers or {}).get("subscription_id", "")
        grant = self._grants.get(subscription_id)
        if grant is None:
            await self._respond(
                msg, 10, {"error_code": "not_found", "message": "no such subscription"}
            )
            return
        match = _RESERVED_TOPIC.match(grant.topic)
        owner = match.group(1) if match else ""
        if not self._is_owner(self._requester(msg), owner):
            await self._respond(
                msg,
                10,
                {"error_code": "auth_denied", "message": "the requester does not own the topic"},
            )
            return
        self._grants.pop(subscription_id, None)
        await self._respond(msg, 0, {"subscription_id": subscription_id, "removed": True})

    def _is_owner(self, requester: PeerIdentity, service: str) -> bool:
        account = self._owners[service]
        if account is None:
            return not requester.attested
        return requester.attested and requester.account == account

    async def _connected(self, target: PeerIdentity) -> bool:
        # Twice on no-responders: a server that just started may answer the
        # first request across a service import with no-responders even though
        # a responder is subscribed.
        for attempt in range(2):
            try:
                await self._client.request(
                    f"{deliver_prefix(target)}.{PROBE_TOKEN}", b"", timeout=self._probe_timeout
                )
            except nats.errors.NoRespondersError:
                if attempt == 0:
                    await asyncio.sleep(0.05)
                continue
            except (nats.errors.TimeoutError, TimeoutError, nats.errors.Error):
                return False
            return True
        return False

    async def _on_topic_message(self, msg: Msg) -> None:
        try:
            body = json.loads(msg.data or b"")
        except ValueError:
            return
        namespace = body.get("namespace") if isinstance(body, dict) else None
        for grant in list(self._grants.values()):
            if grant.topic != msg.subject or grant.namespace != namespace:
                continue
            try:
                await self._client.publish(
                    f"{deliver_prefix(grant.target)}.{grant.subscription_id}",
                    msg.data,
                    headers={"topic": grant.topic, "subscription_id": grant.subscription_id},
                )
            except nats.errors.Error as exc:
                _log.warning("granter delivery to %s failed: %s", grant.target.peer_id, exc)

    async def aclose(self) -> None:
        for sub in [*self._subs, *self._topic_subs.values()]:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._subs.clear()
        self._topic_subs.clear()
