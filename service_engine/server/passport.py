"""The trusted ``X-Passport`` header: who the caller is, for authorisation.

The passport is **authorisation only, never authentication**. The engine
does not check a signature: a gateway in front of the service authenticates
the caller, strips any ``X-Passport`` the client sent, and injects its own.
Never expose a service to clients without such a gateway.

Wire format
-----------

The header value is a JSON object, sent either as **base64url** of its UTF-8
text (the canonical form, with or without ``=`` padding) or as the plain
JSON text itself (handy by hand, e.g. in GraphiQL's Headers tab); a value
starting with ``{`` is read as plain JSON, anything else as base64url::

    {"v": 1, "sub": "u-42", "actor": "u-42", "org": "acme",
     "roles": ["member"], "kind": "person"}

========  ================================  ==================================
member    type                              meaning
========  ================================  ==================================
``v``     ``1`` (optional)                  the format version; others refused
``sub``   non-empty string (required)       whom the request is about
``actor`` non-empty string (default: sub)   who acts (differs under delegation)
``org``   non-empty string or null          the organisation context
``roles`` array of non-empty strings        the caller's roles (default ``[]``)
``kind``  ``"person"`` or ``"service"``     what ``sub`` is (default person)
========  ================================  ==================================

Any other member is kept, untouched, in `Passport.claims`, so a gateway may
add claims a service reads without an engine change. A value that is not
such an object (bad base64url, bad UTF-8, bad JSON, a duplicate member, a
non-finite number, a member of the wrong type, more than
`MAX_PASSPORT_BYTES`) is refused with `PassportMalformed`; an absent or
blank header with `PassportMissing`. Error messages never echo the value.

A service maps a `Passport` to its own principal type with a
`PassportPrincipal` resolver; the resolver refuses a passport the service
will not serve by raising `PassportRefused`. A service that needs no more
than who the caller is and in which org takes the default, `OrgMember`
(`OrgMember.of`, what `graphql_app` resolves when given no resolver).
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias, TypeVar, cast, get_args, overload

from ..failures import EngineError
from ..impacts.model import JsonValue

__all__ = [
    "MAX_PASSPORT_BYTES", "PASSPORT_HEADER", "OrgMember", "Passport", "PassportError",
    "PassportKind", "PassportMalformed", "PassportMissing", "PassportPrincipal", "PassportRefused",
    "parse_passport", "resolve_principal",
]

PASSPORT_HEADER = "X-Passport"
"""The header the gateway injects (HTTP and the WebSocket upgrade alike)."""

MAX_PASSPORT_BYTES = 8192
"""The longest header value read; a longer one is malformed, never truncated."""

PASSPORT_VERSION = 1

PassportKind: TypeAlias = Literal["person", "service"]
_KINDS: frozenset[str] = frozenset(get_args(PassportKind))
_KNOWN = frozenset({"v", "sub", "actor", "org", "roles", "kind"})

P = TypeVar("P")

_NO_CLAIMS: Mapping[str, JsonValue] = MappingProxyType({})
"""The claims of every passport that has none (a socket keeps its passport
for its life: ~110 bytes a session saved)."""


class PassportError(EngineError):
    """The request carries no passport the service will serve. ``code`` is
    the stable refusal: the GraphQL error's ``extensions.code``, or the start
    of the 4403 close reason refusing a socket's ``connection_init``."""

    code = "passport"

    @property
    def extensions(self) -> dict[str, object]:
        # graphql-core copies an original error's ``extensions`` onto the
        # GraphQL error it reports, so the code reaches the client.
        return {"code": self.code}


class PassportMissing(PassportError):
    """No ``X-Passport`` header (or a blank one): the gateway did not pass one."""

    code = "passport_missing"


class PassportMalformed(PassportError):
    """The ``X-Passport`` value is not a passport in the documented format."""

    code = "passport_malformed"


class PassportRefused(PassportError):
    """A well-formed passport the service will not serve: raise it from a
    `PassportPrincipal` resolver (an unknown subject, a retired role)."""

    code = "passport_refused"


@dataclass(frozen=True, slots=True)
class Passport:
    """The parsed ``X-Passport`` (`parse_passport`): the caller's identity
    claims, read-only; `to_header` gives its canonical header value."""

    sub: str
    actor: str = ""
    org: str | None = None
    roles: tuple[str, ...] = ()
    kind: PassportKind = "person"
    claims: Mapping[str, JsonValue] = field(default_factory=lambda: _NO_CLAIMS, hash=False)

    def __post_init__(self) -> None:
        if not self.actor:
            object.__setattr__(self, "actor", self.sub)
        if not isinstance(self.claims, MappingProxyType):
            object.__setattr__(self, "claims", MappingProxyType(dict(self.claims)))
        reserved = _KNOWN.intersection(self.claims)
        if reserved:
            raise PassportMalformed(
                f"passport malformed: claims may not use the reserved names {sorted(reserved)}"
            )
        problem = _validate(self.to_json())
        if problem:
            raise PassportMalformed(f"passport malformed: {problem}")

    def has_role(self, role: str) -> bool:
        return role in self.roles

    @property
    def delegated(self) -> bool:
        """True when someone other than ``sub`` acts (``actor != sub``)."""
        return self.actor != self.sub

    def to_json(self) -> dict[str, Any]:
        """The passport as its JSON object (claims included)."""
        out: dict[str, Any] = dict(self.claims)
        out.update(
            v=PASSPORT_VERSION, sub=self.sub, actor=self.actor, org=self.org,
            roles=list(self.roles), kind=self.kind,
        )
        return out

    def to_header(self) -> str:
        """The canonical header value: unpadded base64url of the JSON text."""
        text = json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)
        return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode("ascii")


PassportPrincipal: TypeAlias = Callable[[Passport], Awaitable[P]] | Callable[[Passport], P]
"""Maps a passport to the service's own principal, once per request or
socket (a plain or a coroutine function). Raise `PassportRefused` for a
passport the service will not serve; any other exception propagates."""


@dataclass(frozen=True, slots=True)
class OrgMember:
    """The default principal (`OrgMember.of`, `graphql_app`'s resolver when
    a service names none): the passport's subject (``id``) in its ``org``,
    with its ``roles``. Its ``org`` matches a `TableWindow`'s
    ``cohort="org"`` column, so an org's projector needs no `Visibility`."""

    id: str
    org: str
    roles: tuple[str, ...] = ()

    @classmethod
    def of(cls, passport: Passport) -> OrgMember:
        """The member ``passport`` names; `PassportRefused` when it names no
        org (every row such a service serves belongs to one)."""
        if passport.org is None:
            raise PassportRefused("the passport names no org: this service serves an org's members")
        return cls(passport.sub, passport.org, passport.roles)


@overload
async def resolve_principal(
    resolver: Callable[[Passport], Awaitable[P]], passport: Passport
) -> P: ...
@overload
async def resolve_principal(resolver: Callable[[Passport], P], passport: Passport) -> P: ...
async def resolve_principal(resolver: PassportPrincipal[P], passport: Passport) -> P:
    """Run ``resolver`` on ``passport``, awaiting it if it is asynchronous."""
    result = resolver(passport)
    if inspect.isawaitable(result):
        return cast(P, await result)
    return result


def parse_passport(value: str | None) -> Passport:
    """Parse an ``X-Passport`` header value: `PassportMissing` for ``None``
    or a blank one, `PassportMalformed` for anything not in the format this
    module documents."""
    text = value.strip() if value is not None else ""
    if not text:
        raise PassportMissing(f"no {PASSPORT_HEADER} header: the gateway passed no passport")
    if len(text) > MAX_PASSPORT_BYTES:
        raise PassportMalformed(
            f"{PASSPORT_HEADER} is longer than {MAX_PASSPORT_BYTES} characters"
        )
    if text[0] != "{":
        text = _decode_base64url(text)
    try:
        document = _DECODER.decode(text)
    except _DuplicateMember as exc:
        raise PassportMalformed(f"passport malformed: member {exc.name!r} appears twice") from None
    except (ValueError, RecursionError):
        raise PassportMalformed(f"{PASSPORT_HEADER} is not valid JSON") from None
    if type(document) is not dict:
        raise PassportMalformed("passport malformed: not a JSON object")
    problem = _validate(document)
    if problem:
        raise PassportMalformed(f"passport malformed: {problem}")
    sub = document["sub"]
    org = document.get("org")
    roles = document.get("roles")
    claims = {k: v for k, v in document.items() if k not in _KNOWN}
    # Built as validated, without `__post_init__` checking it all again; the
    # org, roles and kind interned (a pod's sessions repeat them).
    passport = object.__new__(Passport)
    setattr_ = object.__setattr__
    setattr_(passport, "sub", sub)
    setattr_(passport, "actor", document.get("actor") or sub)
    setattr_(passport, "org", None if org is None else sys.intern(org))
    setattr_(passport, "roles", tuple(dict.fromkeys(map(sys.intern, roles))) if roles else ())
    setattr_(passport, "kind", sys.intern(document.get("kind", "person")))
    setattr_(passport, "claims", MappingProxyType(claims) if claims else _NO_CLAIMS)
    return passport


def _decode_base64url(text: str) -> str:
    # ``validate=True`` after mapping to the standard alphabet refuses any
    # character outside base64url instead of silently skipping it.
    standard = text.replace("-", "+").replace("_", "/")
    standard += "=" * (-len(standard) % 4)
    try:
        raw = base64.b64decode(standard, validate=True)
    except (binascii.Error, ValueError):
        raise PassportMalformed(f"{PASSPORT_HEADER} is neither JSON nor base64url") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PassportMalformed(f"{PASSPORT_HEADER} is not UTF-8 once decoded") from None


class _DuplicateMember(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A member given twice is read differently by different JSON parsers
    # (first wins, last wins): the gateway and the engine could disagree on
    # who the caller is, so the value is refused outright.
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for name, _value in pairs:
            if name in seen:
                raise _DuplicateMember(name)
            seen.add(name)
    return out


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_members, parse_constant=_refuse_constant)
"""One decoder for every passport: ``json.loads`` with hooks builds one per
call, leaving small blocks alive that keep a burst's pages mapped
(``bench/README.md``, "Back to idle")."""


def _non_empty_str(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _validate(document: Mapping[str, Any]) -> str | None:
    """The first rule ``document`` breaks, or None."""
    version = document.get("v", PASSPORT_VERSION)
    if type(version) is not int or version != PASSPORT_VERSION:
        return f"v must be {PASSPORT_VERSION}"
    if not _non_empty_str(document.get("sub")):
        return "sub must be a non-empty string"
    actor = document.get("actor")
    if actor is not None and not _non_empty_str(actor):
        return "actor must be a non-empty string when present"
    org = document.get("org")
    if org is not None and not _non_empty_str(org):
        return "org must be a non-empty string or null"
    roles = document.get("roles", [])
    if not isinstance(roles, list | tuple) or not all(_non_empty_str(r) for r in roles):
        return "roles must be an array of non-empty strings"
    kind = document.get("kind", "person")
    if not isinstance(kind, str) or kind not in _KINDS:
        return f"kind must be one of {sorted(_KINDS)}"
    return None
