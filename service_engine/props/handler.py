"""Every props verb, transport-free: a parsed command and an attested peer
in, one reply body out.

`PropsHandler` is what the NATS responder (`service.PropsService`) calls for
each request; it holds the registered namespaces, the `Store`, the
`Policy` and the `Granter` that installs live delivery for watches.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from ..failures import ConfigError, DuplicateRegistration
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
from .records import Actor, Commit, History, StoredEvent, now
from .schema import Namespace, SagaOutcome, describe
from .store import Store

_log = logging.getLogger(__name__)

GRANT_SUBJECT = "noded.props.subscribe_grant"
"""The broker's grant verb (owner ``noded``, class ``intent``, version 0.1.0)."""

REVOKE_SUBJECT = "noded.props.unsubscribe_grant"
"""The broker's verb removing a grant its owner installed (``subscription_id``
header): a watch whose reply cannot be delivered leaves no grant behind."""


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
    ``namespace`` to ``target_peer``, and removes one it installed."""

    async def subscribe_grant(
        self, topic: str, target_peer: str, namespace: str
    ) -> GrantOutcome: ...

    async def unsubscribe_grant(self, subscription_id: str) -> bool:
        """Remove the grant; False when the broker did not confirm it."""


def encode_body(body: Mapping[str, Any]) -> bytes:
    """A reply body on the wire: compact JSON."""
    return json.dumps(body, separators=(",", ":")).encode()


REPLY_HEADER_BYTES = len(b"NATS/1.0\r\nrc: 10\r\n\r\n")
"""The header block of a reply (``rc`` alone), within the broker's max payload."""

_ERROR_HEADER_BYTES = len(b"error: \r\n")


def reply_limit(max_payload: int) -> int:
    """The bytes a reply's body and ``error`` header may take under the
    broker's ``max_payload`` (a message's headers count toward it)."""
    return max_payload - REPLY_HEADER_BYTES


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer: rc 0 with the verb's body, or rc 10/20 with
    ``{error_code, message}`` and the human message in ``error``.

    ``grant`` is the live grant a watch installed: the transport removes it
    (`PropsHandler.revoke`) when it cannot deliver the reply."""

    rc: int
    body: dict[str, Any]
    error: str | None = None
    grant: Granted | None = None

    @classmethod
    def of_error(cls, exc: PropsError) -> Reply:
        return cls(exc.rc, exc.body(), exc.message)

    @property
    def wire_size(self) -> int:
        """Bytes of the encoded body plus the ``error`` header, if any."""
        size = len(encode_body(self.body))
        if self.error is not None:
            size += _ERROR_HEADER_BYTES + len(self.error.encode())
        return size


def too_large(verb: str, size: int, limit: int) -> PropsError:
    """The refusal of a reply that would not fit the broker's max payload."""
    return PropsError(
        "validation_error",
        f"the {verb} reply would be {size} bytes, over the {limit}-byte limit "
        "of the broker's max payload",
    )


def replay_window(since: int, history: History) -> tuple[StoredEvent, ...]:
    """The events a replay from ``since`` returns, or ``replay_window_exceeded``
    when the retained history no longer reaches back to ``since + 1``."""
    if since >= history.nseq:
        return ()
    oldest = history.oldest
    if oldest is None or oldest > since + 1:
        raise PropsError(
            "replay_window_exceeded",
            f"events after nseq {since} are no longer retained",
            since_nseq=since,
            oldest_nseq=oldest if oldest is not None else history.nseq + 1,
        )
    return history.events


def fitting_start(sizes: Sequence[int], room: int) -> int:
    """The index of the first item of the longest suffix of items of
    ``sizes`` bytes that fits ``room`` bytes as JSON array elements (one
    comma between two); ``len(sizes)`` when not even the last one fits."""
    used = 0
    start = len(sizes)
    while start > 0:
        extra = sizes[start - 1] + (1 if start < len(sizes) else 0)
        if used + extra > room:
            break
        used += extra
        start -= 1
    return start


def bounded_replay(
    reply: dict[str, Any], events: Sequence[Mapping[str, Any]], since: int, limit: int | None
) -> dict[str, Any]:
    """``reply`` with ``events``, or ``replay_window_exceeded`` when they do
    not fit ``limit``: its ``oldest_nseq`` is the first nseq from which a
    replay fits (a watch from ``oldest_nseq - 1`` is answered)."""
    reply = {**reply, "events": list(events)}
    if limit is None:
        return reply
    size = len(encode_body(reply))
    if size <= limit:
        return reply
    room = limit - len(encode_body({**reply, "events": []}))
    sizes = [len(encode_body(e)) for e in events]
    start = fitting_start(sizes, room)
    oldest = int(events[start]["nseq"]) if start < len(events) else int(reply["observed_nseq"]) + 1
    raise PropsError(
        "replay_window_exceeded",
        f"the replay after nseq {since} would be {size} bytes, over the {limit}-byte "
        f"limit of the broker's max payload; a replay from nseq {oldest} fits",
        since_nseq=since,
        oldest_nseq=oldest,
    )


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
        self,
        subject: str,
        headers: Mapping[str, str],
        body: bytes,
        peer: PeerIdentity,
        *,
        limit: int | None = None,
    ) -> Reply:
        """Answer one request; never raises for a refusal or a failure.

        ``limit`` bounds the answer's `Reply.wire_size` (see `reply_limit`):
        a watch whose replay would not fit is ``replay_window_exceeded``, any
        other reply that would not fit is ``validation_error``, each naming
        the limit. A refused watch leaves no grant behind."""
        grant: list[Granted] = []
        try:
            command = parse_command(self.service, subject, headers, body)
            reply = Reply(RC_OK, await self._command(command, peer, True, limit, grant))
        except PropsError as exc:
            reply = Reply.of_error(exc)
        except PropsStoreError as exc:
            _log.error("props storage failed: %s", exc)
            reply = Reply.of_error(PropsError("storage_error", "the property store failed"))
        except Exception:
            # A defect, not a refusal: the caller still gets an answer.
            _log.exception("props %s failed", subject)
            reply = Reply.of_error(PropsError("unavailable", "the property service failed"))
        if limit is not None and reply.wire_size > limit:
            verb = subject.rpartition(".props.")[2] or subject
            reply = Reply.of_error(too_large(verb, reply.wire_size, limit))
        if grant and reply.rc == RC_OK:
            return Reply(reply.rc, reply.body, grant=grant[0])
        for installed in grant:
            await self.revoke(installed)
        return reply

    async def command(
        self, cmd: Command, peer: PeerIdentity, *, live: bool = True, limit: int | None = None
    ) -> dict[str, Any]:
        """Run one parsed command for ``peer``. ``live=False`` (replay without
        a grant) exists for the library's unit tests only: the wire never sets it."""
        grant: list[Granted] = []
        try:
            return await self._command(cmd, peer, live, limit, grant)
        except BaseException:
            for installed in grant:
                await self.revoke(installed)
            raise

    async def _command(
        self,
        cmd: Command,
        peer: PeerIdentity,
        live: bool,
        limit: int | None,
        grant: list[Granted],
    ) -> dict[str, Any]:
        cap = capability_name(self.service, cmd.namespace)
        caps = self.policy.capabilities(peer)
        needed = required_capability(cmd.verb, cap, cmd.view)
        if needed not in caps:
            raise PropsError("auth_denied", f"{cmd.verb} on {cap} requires {needed}")
        ns = self.namespace(cmd.namespace)
        actor = Actor(peer.peer_id, now(), cmd.cause)
        if cmd.verb == "set":
            return await self._set(ns, resolve_key(ns, cmd.key), cmd, actor)
        if cmd.verb == "delete":
            # The planner refuses singletons (after their delete hook, whose
            # refusal says why, as the logging bridge's does).
            key = resolve_key(ns, cmd.key)
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
            key = resolve_key(ns, cmd.key)
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
        return await self._watch(ns, cmd, peer, live, limit, grant)

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
        outcome = await self._saga(ns, key)
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

    async def _saga(self, ns: Namespace, key: str) -> SagaOutcome:
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
        self,
        ns: Namespace,
        cmd: Command,
        peer: PeerIdentity,
        live: bool,
        limit: int | None,
        grant: list[Granted],
    ) -> dict[str, Any]:
        audit = cmd.verb == "audit.watch"
        if live:
            topic = audit_topic(self.service) if audit else records_changed_topic(self.service)
            grant.append(await self._grant(topic, peer, ns.name))
        # The grant completes before the cursor is captured: everything after
        # it is eligible for live delivery, everything up to it is replayed.
        # The cursor, the retention check and the events are one snapshot.
        history = await self.store.history(ns.name, cmd.since_nseq)
        events = replay_window(cmd.since_nseq, history)
        project = audit_body if audit else records_changed_body
        reply: dict[str, Any] = {
            "namespace": ns.name,
            "observed_nseq": history.nseq,
            "events": [],
            "live": live,
        }
        if not audit:
            reply["caught_up"] = caught_up(ns.name, history.nseq)
        return bounded_replay(reply, [project(e) for e in events], cmd.since_nseq, limit)

    async def _grant(self, topic: str, peer: PeerIdentity, namespace: str) -> Granted:
        if self.granter is None:
            raise PropsError("unavailable", "no broker grants live delivery")
        outcome = await self.granter.subscribe_grant(topic, peer.peer_id, namespace)
        if isinstance(outcome, Granted):
            return outcome
        if isinstance(outcome, GranterMissing):
            _log.warning("subscription grant unavailable: %s", outcome.detail)
            raise PropsError("unavailable", "no broker grants live delivery")
        _log.warning("subscription grant refused: %s %s", outcome.error_code, outcome.message)
        raise PropsError("grant_failed", "live delivery could not be granted")

    async def revoke(self, grant: Granted) -> None:
        """Remove a grant whose watch reply was refused or could not be
        delivered (logged when the broker does not confirm it)."""
        if self.granter is None:
            return
        try:
            removed = await self.granter.unsubscribe_grant(grant.subscription_id)
        except Exception:
            _log.exception("removing grant %s failed", grant.subscription_id)
            return
        if not removed:
            _log.warning("the broker did not confirm removing grant %s", grant.subscription_id)

    async def reconcile(self, namespace: str, key: str, fields: Mapping[str, Any]) -> Commit:
        """The owner's reconciliation of one record (bumps the audit epoch)."""
        ns = self.namespace(namespace)
        return await self.store.reconcile(ns, key, fields, actor=Actor(self.service, now()))
