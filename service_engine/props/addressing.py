"""Pure parsing of one props command: subject, headers and body.

`parse_command` turns ``<svc>.props.<suffix>`` plus headers and body into a
`Command` or refuses it with the contract's ``validation_error``s. Key
resolution needs the namespace's declaration: `resolve_key`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from .errors import (
    FIELD_PATH_DEFERRED,
    FLAT_PATH_MUTATION_DEFERRED,
    GET_PROJECTION_DEFERRED,
    LIST_OPTION_DEFERRED,
    PropsError,
    validation,
)
from .schema import LIFECYCLE_FIELD, Namespace

Verb: TypeAlias = Literal["set", "delete", "get", "list", "describe", "watch", "audit.watch"]
VERBS: tuple[Verb, ...] = ("set", "delete", "get", "list", "describe", "watch", "audit.watch")
MUTATIONS = frozenset({"set", "delete"})
QUERIES = frozenset({"get", "list", "describe"})
"""Get/list/describe are queries; set/delete/watch/audit.watch are intents."""


def verb_registry(service: str) -> list[dict[str, str]]:
    """The Bus registry entries of a service's props verbs: each subject,
    its owner (the service exposing it) and its class."""
    return [
        {
            "subject": subject(service, verb),
            "owner": service,
            "class": "query" if verb in QUERIES else "intent",
        }
        for verb in VERBS
    ]


# Header names of the wire surface.
H_NAMESPACE = "namespace"
H_KEY = "key"
H_IF_VERSION = "if_version"
H_CAUSE = "cause"
H_MERGE = "merge"
H_VIEW = "view"
H_SINCE_NSEQ = "since_nseq"
H_PATH = "path"
H_FIELD_PATH = "field_path"
LIST_OPTIONS = ("cursor", "limit", "order_by", "filter", "fields")

U64_MAX = 2**64 - 1


def subject(service: str, verb: str) -> str:
    """The command subject of ``verb``: ``<svc>.props.<suffix>``."""
    return f"{service}.props.{verb}"


def records_changed_topic(service: str) -> str:
    return f"{service}.props.records.changed"


def audit_topic(service: str) -> str:
    return f"{service}.props.audit"


@dataclass(frozen=True, slots=True)
class Command:
    """One parsed command; ``key`` is None when absent or empty."""

    verb: Verb
    namespace: str
    key: str | None = None
    if_version: int | None = None
    cause: str | None = None
    merge: bool = True
    view: Literal["public", "full"] = "public"
    since_nseq: int = 0
    fields: Mapping[str, Any] = field(default_factory=dict)


def parse_u64(name: str, raw: str) -> int:
    """A decimal u64 header value."""
    if not raw.isascii() or not raw.isdigit():
        raise PropsError("validation_error", f"{name} must be a decimal u64, got {raw!r}")
    value = int(raw)
    if value > U64_MAX:
        raise PropsError("validation_error", f"{name} exceeds u64")
    return value


def verb_of(service: str, subj: str) -> Verb:
    prefix = f"{service}.props."
    suffix = subj[len(prefix) :] if subj.startswith(prefix) else ""
    for verb in VERBS:
        if suffix == verb:
            return verb
    raise PropsError("validation_error", f"no props verb at subject {subj!r}")


def parse_command(service: str, subj: str, headers: Mapping[str, str], body: bytes) -> Command:
    """Parse and refuse per the Addressing paragraph, before any capability
    or namespace lookup."""
    verb = verb_of(service, subj)
    namespace = headers.get(H_NAMESPACE, "")
    if not namespace:
        raise PropsError("validation_error", "the namespace header is required")
    if H_PATH in headers:
        if verb == "set":
            raise validation(
                FLAT_PATH_MUTATION_DEFERRED,
                "set takes structured addressing (namespace, key, JSON body), not path",
            )
        raise PropsError(
            "validation_error", f"mixed addressing: {verb} refuses path beside the namespace header"
        )
    if H_FIELD_PATH in headers and verb in ("set", "delete", "get"):
        raise validation(FIELD_PATH_DEFERRED, f"{verb} refuses field_path")
    # "Any non-empty body": whitespace is a body too.
    if verb == "get" and body:
        raise validation(GET_PROJECTION_DEFERRED, "get refuses a body")
    if verb == "list":
        for option in LIST_OPTIONS:
            if option in headers:
                raise validation(LIST_OPTION_DEFERRED, f"list refuses {option}")
        if body:
            raise validation(LIST_OPTION_DEFERRED, "list refuses a body")
    key = headers.get(H_KEY) or None
    if_version = None
    if H_IF_VERSION in headers:
        if verb not in MUTATIONS:
            raise PropsError("validation_error", f"{verb} takes no if_version")
        if_version = parse_u64(H_IF_VERSION, headers[H_IF_VERSION])
    cause = headers.get(H_CAUSE) or None
    merge = True
    if H_MERGE in headers:
        raw = headers[H_MERGE]
        if raw in ("true", "patch"):
            merge = True
        elif raw in ("false", "replace"):
            merge = False
        else:
            raise PropsError(
                "validation_error", f"merge must be true, patch, false or replace, got {raw!r}"
            )
    view: Literal["public", "full"] = "public"
    if verb == "describe" and H_VIEW in headers:
        raw = headers[H_VIEW]
        if raw == "full":
            view = "full"
        elif raw != "public":
            raise PropsError("validation_error", f"view must be public or full, got {raw!r}")
    since = 0
    if verb in ("watch", "audit.watch") and H_SINCE_NSEQ in headers:
        since = parse_u64(H_SINCE_NSEQ, headers[H_SINCE_NSEQ])
    fields: Mapping[str, Any] = {}
    if verb == "set":
        fields = _object_body(body)
        if LIFECYCLE_FIELD in fields:
            raise PropsError("validation_error", f"{LIFECYCLE_FIELD} is reserved")
    return Command(verb, namespace, key, if_version, cause, merge, view, since, fields)


def _object_body(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"null")
    except ValueError as exc:
        raise PropsError("validation_error", "set body is not JSON") from exc
    if not isinstance(value, dict):
        raise PropsError("validation_error", "set body must be a JSON object")
    return value


def resolve_key(ns: Namespace, key: str | None) -> str:
    """The record key a command addresses: collections need a non-empty key,
    singletons take none (or their canonical key) and answer with it."""
    if ns.cardinality == "singleton":
        if key is None or key == ns.canonical_key:
            return ns.canonical_key
        raise PropsError(
            "validation_error",
            f"singleton {ns.name!r} takes no key (canonical key {ns.canonical_key!r})",
        )
    if key is None:
        raise PropsError("validation_error", f"collection {ns.name!r} requires a non-empty key")
    return key
