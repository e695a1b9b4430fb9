"""Peer identities, capability strings and the verb-to-capability rules.

Pure policy: nothing here does I/O. A `Policy` resolves the authenticated
`PeerIdentity` of a request into the exact capability strings it holds;
`required_capability` says which one a verb needs; `redact` nulls secret
fields for a caller without the secrets capability.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .errors import PropsError

REQUEST_INFO_HEADER = "Nats-Request-Info"
"""The header nats-server sets on a request that crossed a service import:
``{"acc": <requesting account>, "user": <user>, ...}`` (``user`` only when
the import shares request info, ``share: true``)."""

_TOKEN = re.compile(r"^[A-Za-z0-9_$-]+$")


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """Who sent a request, as the server attested it.

    ``attested=False`` is a request the server did not vouch for (no request
    info header, or one from the service's own account, which a client could
    have written itself): policies should grant it nothing outside development.
    """

    account: str | None
    user: str | None = None
    attested: bool = True

    @property
    def peer_id(self) -> str:
        """The peer as a string: ``account/user``, ``account`` or ``anonymous``."""
        if not self.attested or self.account is None:
            return "anonymous"
        return f"{self.account}/{self.user}" if self.user else self.account

    @property
    def deliver_tokens(self) -> str:
        """Subject tokens naming this peer (``account.user``, ``account._``,
        ``anonymous``)."""
        if not self.attested or self.account is None:
            return "anonymous"
        return f"{self.account}.{self.user or '_'}"

    @classmethod
    def unattested(cls) -> PeerIdentity:
        return cls(None, None, attested=False)

    @classmethod
    def parse_peer_id(cls, peer_id: str) -> PeerIdentity:
        """Inverse of `peer_id`; refuses what no attested peer could be."""
        if peer_id == "anonymous":
            return cls.unattested()
        account, _, user = peer_id.partition("/")
        if not _TOKEN.match(account) or (user and not _TOKEN.match(user)):
            raise PropsError("validation_error", f"not a peer id: {peer_id!r}")
        return cls(account, user or None)


def attested_peer(headers: Mapping[str, str], service_account: str | None) -> PeerIdentity:
    """The requester the server attests in ``Nats-Request-Info``.

    Only a request that crossed a service import from another account is
    attested: the server writes the header there (replacing any the client
    sent). Within ``service_account`` nothing rewrites it, so a header whose
    ``acc`` is the service's own account, an unreadable one, or any header
    when ``service_account`` is None, is unattested. Account and user names
    that cannot be subject tokens are unattested too.
    """
    raw = headers.get(REQUEST_INFO_HEADER)
    if raw is None or service_account is None:
        return PeerIdentity.unattested()
    try:
        info = json.loads(raw)
    except ValueError:
        return PeerIdentity.unattested()
    if not isinstance(info, dict):
        return PeerIdentity.unattested()
    account = info.get("acc")
    user = info.get("user") or None
    if not isinstance(account, str) or not _TOKEN.match(account) or account == service_account:
        return PeerIdentity.unattested()
    if user is not None and (not isinstance(user, str) or not _TOKEN.match(user)):
        return PeerIdentity.unattested()
    return PeerIdentity(account, user)


def capability_name(service: str, namespace: str) -> str:
    return f"{service}.{namespace}"


def read_cap(cap: str) -> str:
    return f"props.read:{cap}"


def write_cap(cap: str) -> str:
    return f"props.write:{cap}"


def describe_cap(cap: str, view: Literal["public", "full"]) -> str:
    return f"props.describe:{cap}:{view}"


def audit_cap(cap: str) -> str:
    return f"props.audit:{cap}"


def secrets_cap(cap: str) -> str:
    return f"props.read:{cap}:secrets"


def all_caps(cap: str) -> frozenset[str]:
    """Every capability string of one namespace."""
    return frozenset(
        {
            read_cap(cap),
            write_cap(cap),
            describe_cap(cap, "public"),
            describe_cap(cap, "full"),
            audit_cap(cap),
            secrets_cap(cap),
        }
    )


def required_capability(verb: str, cap: str, view: Literal["public", "full"] = "public") -> str:
    """Set/delete need write; get/list/watch need read; audit.watch needs
    audit (independently of read); describe needs the selected view's."""
    if verb in ("set", "delete"):
        return write_cap(cap)
    if verb in ("get", "list", "watch"):
        return read_cap(cap)
    if verb == "audit.watch":
        return audit_cap(cap)
    if verb == "describe":
        return describe_cap(cap, view)
    raise PropsError("validation_error", f"unknown verb {verb!r}")


class Policy(Protocol):
    """Resolves a peer into the exact capability strings it holds."""

    def capabilities(self, peer: PeerIdentity) -> frozenset[str]: ...


class StaticPolicy:
    """Capabilities by peer id (``account/user`` or a whole ``account``).

    A user's capabilities are its own entry's plus its account's. The
    ``anonymous`` entry is what unattested requests get: leave it out in
    production.
    """

    def __init__(self, grants: Mapping[str, Iterable[str]]) -> None:
        self._grants = {peer: frozenset(caps) for peer, caps in grants.items()}

    def capabilities(self, peer: PeerIdentity) -> frozenset[str]:
        caps = self._grants.get(peer.peer_id, frozenset())
        if peer.attested and peer.account is not None and peer.user is not None:
            caps = caps | self._grants.get(peer.account, frozenset())
        return caps


def redact(
    ns_secret_fields: frozenset[str], fields: Mapping[str, Any], may_see_secrets: bool
) -> dict[str, Any]:
    """Stored values verbatim, with secret fields replaced by null unless the
    caller holds the secrets capability. Missing fields stay missing."""
    if may_see_secrets:
        return dict(fields)
    return {name: (None if name in ns_secret_fields else value) for name, value in fields.items()}
