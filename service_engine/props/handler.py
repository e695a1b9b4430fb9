"""Every props verb, transport-free: a parsed command and an attested peer
in, one reply body out.

`PropsHandler` is what the NATS responder (`service.PropsService`) calls for
each request; it holds the registered namespaces, the `Store`, the
`Policy` and the `Granter` that installs live delivery for watches.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from ..errors import ConfigError, DuplicateRegistration
from .addressing import Command, audit_topic, parse_command, records_changed_topic, resolve_key
from .capabilities import (
    PeerIdentity,
    Policy,
    capability_name,
    redact,
    required_capability,
    secrets_cap,
)
from .errors import RC_OK, PropsError, PropsStoreError
from .events import audit_body, caught_up, records_changed_body
from .records import Actor, Commit, now
from .schema import Namespace, SagaOutcome, describe
from .store import Store

_log = logging.getLogger(__name__)

GRANT_SUBJECT = "noded.props.subscribe_grant"
"""The broker's grant verb (owner ``noded``, class ``intent``, version 0.1.0)."""


@dataclass(frozen=True, slots=True)
class Granted:
    subscription_id: str
    namespace: str


@dataclass(frozen=True, slots=True)
class GrantRefused:
    """The broker answered rc 10 (``error_code`` is kept for logs only)."""

    error_code: str
    message: str


@dataclass(frozen=True, slots=True)
class GranterMissing:
    """No broker answered the grant verb."""

    detail: str


GrantOutcome: TypeAlias = Granted | GrantRefused | GranterMissing


class Granter(Protocol):
    """Installs a broker subscription delivering ``topic``'s messages of
    ``namespace`` to ``target_peer``."""

    async def subscribe_grant(
        self, topic: str, target_peer: str, namespace: str
    ) -> GrantOutcome: ...


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer: rc 0 with the verb's body, or rc 10/20 with
    ``{error_code, message}`` and the human message in ``error``."""

    rc: int
    body: dict[str, Any]
    error: str | None = None

    @classmethod
    def of_error(cls, exc: PropsError) -> Reply:
        return cls(exc.rc, exc.body(), exc.message)


class PropsHandler:
    """The verbs of one service's registered namespaces."""

    def __init__(
        self, service: str, store: Store, policy: Policy, granter: Granter | None = None
    ) -> None:
        if not service or "." in service or " " in service:
            raise ConfigError(f"props service name {service!r} must be one subject token")
        self.service = service
        self.store = store
        self.policy = policy
        self.granter = granter
        self._namespaces: dict[str, Namespace] = {}

    @property
    def namespaces(self) -> Mapping[str, Namespace]:
        return self._namespaces

    async def register(self, ns: Namespace) -> None:
        """Register ``ns`` with the store and answer for it."""
        if ns.name in self._namespaces:
            raise DuplicateRegistration("props namespace", ns.name)
        await self.store.register(ns)
        self._namespaces[ns.name] = ns

    def namespace(self, name: str) -> Namespace:
        ns = self._namespaces.get(name)
        if ns is None:
            raise PropsError("not_found", f"namespace {name!r} is not registered")
        return ns

    async def handle(
        self, subject: str, headers: Mapping[str, str], body: bytes, peer: PeerIdentity
    ) -> Reply:
        """Answer one request; never raises for a refusal or a failure."""
        try:
            command = parse_command(self.service, subject, headers, body)
            return Reply(RC_OK, await self.command(command, peer))
        except PropsError as exc:
            return Reply.of_error(exc)
        except PropsStoreError as exc:
            _log.error("props storage failed: %s", exc)
            return Reply.of_error(PropsError("storage_error", "the property store failed"))
        except Exception:
            # A defect, not a refusal: the caller still gets an answer.
            _log.exception("props %s failed", subject)
            return Reply.of_error(PropsError("unavailable", "the property service failed"))

    async def command(
        self, cmd: Command, peer: PeerIdentity, *, live: bool = True
    ) -> dict[str, Any]:
        """Run one parsed command for ``peer``. ``live=False`` (replay without
        a grant) exists for the library's unit tests only: the wire never sets it."""
        cap = capability_name(self.service, cmd.namespace)
        caps = self.policy.capabilities(peer)
        needed = required_capability(cmd.verb, cap, cmd.view)
        if needed not in caps:
            raise PropsError("auth_denied", f"{cmd.verb} on {cap} requires {needed}")
        ns = self.namespace(cmd.namespace)
        actor = Actor(peer.peer_id, now(), cmd.cause)
        if cmd.verb == "set":
            return await self._set(ns, resolve_key(ns, "set", cmd.key), cmd, actor)
        if cmd.verb == "delete":
            if ns.cardinality != "collection" and ns.on_delete is None:
                raise PropsError(
                    "validation_error", f"delete is for collections; {ns.name!r} is a singleton"
                )
            key = (
                ns.canonical_key
                if ns.cardinality == "singleton"
                else resolve_key(ns, "delete", cmd.key)
            )
            commit = await self.store.delete(ns, key, if_version=cmd.if_version, actor=actor)
            return {
                "namespace": ns.name,
                "key": key,
                "deleted": True,
                "tombstone_version": commit.version,
                "nseq": commit.nseq,
            }
        secrets = secrets_cap(cap) in caps
        if cmd.verb == "get":
            key = resolve_key(ns, "get", cmd.key)
            snap = await self.store.get(ns.name, key)
            if snap.record is None:
                raise PropsError("not_found", f"no record {key!r} in {ns.name!r}")
            return {
                "namespace": ns.name,
                "key": key,
                "version": snap.record.version,
                "nseq": snap.nseq,
                "fields": redact(ns.secret_fields, snap.record.fields, secrets),
            }
        if cmd.verb == "list":
            nseq, records = await self.store.list_records(ns.name)
            return {
                "namespace": ns.name,
                "nseq": nseq,
                "records": [
                    {
                        "key": r.key,
                        "version": r.version,
                        "fields": redact(ns.secret_fields, r.fields, secrets),
                    }
                    for r in records
                ],
                "next_cursor": None,
            }
        if cmd.verb == "describe":
            if cmd.view == "public" and ns.schema_public == "deny":
                raise PropsError("auth_denied", f"public describe of {cap} is denied")
            return describe(ns, cmd.view)
        return await self._watch(ns, cmd, peer, live=live)

    async def _set(self, ns: Namespace, key: str, cmd: Command, actor: Actor) -> dict[str, Any]:
        if ns.saga is None:
            commit = await self.store.set(
                ns, key, cmd.fields, merge=cmd.merge, if_version=cmd.if_version, actor=actor
            )
            reply: dict[str, Any] = {
                "namespace": ns.name,
                "key": key,
                "version": commit.version,
                "nseq": commit.nseq,
                "created": commit.created,
            }
            if commit.warnings:
                reply["warnings"] = list(commit.warnings)
            return reply
        provisioned = await self.store.set(
            ns,
            key,
            cmd.fields,
            merge=cmd.merge,
            if_version=cmd.if_version,
            actor=actor,
            lifecycle="provisioning",
        )
        outcome = await self._saga(ns, key, provisioned)
        completed = await self.store.complete(
            ns,
            key,
            lifecycle=outcome.lifecycle,
            reason=outcome.reason,
            actor=Actor(actor.actor, now(), actor.cause),
        )
        reply = {
            "namespace": ns.name,
            "key": key,
            "set_version": provisioned.version,
            "set_nseq": provisioned.nseq,
            "complete_version": completed.version,
            "complete_nseq": completed.nseq,
            "lifecycle": outcome.lifecycle,
            "created": provisioned.created,
        }
        if outcome.reason is not None:
            reply["reason"] = outcome.reason
        return reply

    async def _saga(self, ns: Namespace, key: str, provisioned: Commit) -> SagaOutcome:
        assert ns.saga is not None
        snap = await self.store.get(ns.name, key)
        fields = snap.record.fields if snap.record is not None else {}
        try:
            return await ns.saga(key, fields)
        except Exception as exc:
            # The provisioning commit stands; the record completes as failed.
            _log.warning("saga step of %s/%s failed: %r", ns.name, key, exc)
            return SagaOutcome("failed", f"saga step failed: {type(exc).__name__}")

    async def _watch(
        self, ns: Namespace, cmd: Command, peer: PeerIdentity, *, live: bool
    ) -> dict[str, Any]:
        audit = cmd.verb == "audit.watch"
        if live:
            topic = audit_topic(self.service) if audit else records_changed_topic(self.service)
            await self._grant(topic, peer, ns.name)
        # The grant completes before the cursor is captured: everything after
        # it is eligible for live delivery, everything up to it is replayed.
        observed = await self.store.cursor(ns.name)
        since = cmd.since_nseq
        events = []
        if since < observed:
            oldest = await self.store.oldest_nseq(ns.name)
            if oldest is None or oldest > since + 1:
                oldest_nseq = oldest if oldest is not None else observed + 1
                raise PropsError(
                    "replay_window_exceeded",
                    f"events after nseq {since} are no longer retained",
                    since_nseq=since,
                    oldest_nseq=oldest_nseq,
                )
            events = await self.store.events(ns.name, since, observed)
        project = audit_body if audit else records_changed_body
        reply: dict[str, Any] = {
            "namespace": ns.name,
            "observed_nseq": observed,
            "events": [project(e) for e in events],
            "live": live,
        }
        if not audit:
            reply["caught_up"] = caught_up(ns.name, observed)
        return reply

    async def _grant(self, topic: str, peer: PeerIdentity, namespace: str) -> None:
        if self.granter is None:
            raise PropsError("unavailable", "no broker grants live delivery")
        outcome = await self.granter.subscribe_grant(topic, peer.peer_id, namespace)
        if isinstance(outcome, Granted):
            return
        if isinstance(outcome, GranterMissing):
            _log.warning("subscription grant unavailable: %s", outcome.detail)
            raise PropsError("unavailable", "no broker grants live delivery")
        _log.warning("subscription grant refused: %s %s", outcome.error_code, outcome.message)
        raise PropsError("grant_failed", "live delivery could not be granted")

    async def reconcile(self, namespace: str, key: str, fields: Mapping[str, Any]) -> Commit:
        """The owner's reconciliation of one record (bumps the audit epoch)."""
        ns = self.namespace(namespace)
        return await self.store.reconcile(ns, key, fields, actor=Actor(self.service, now()))
