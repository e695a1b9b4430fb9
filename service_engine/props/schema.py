"""Namespace declarations: fields, cardinality, hooks, and their pure checks.

A `Namespace` is declared once by its owner and registered with a store
and a service. Declarations are validated at construction (`ConfigError`);
written values are checked by `check_fields` (``validation_error``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from ..failures import ConfigError
from .errors import HookRejected, PropsError

FieldType: TypeAlias = Literal["string", "integer", "number", "boolean", "object", "array"]
Cardinality: TypeAlias = Literal["singleton", "collection"]
Deletion: TypeAlias = Literal["hard", "soft"]
Lifecycle: TypeAlias = Literal["provisioning", "active", "failed"]

LIFECYCLE_FIELD = "_lifecycle"
"""Reserved: no namespace, field or written value may use this name."""

REDACTED_VALIDATOR = "redacted"
"""What public describe shows in place of a secret validator's name."""

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Validator:
    """A named check on one field's value: ``check`` returns a problem or None.

    ``secret=True`` keeps its name out of public describe.
    """

    name: str
    check: Callable[[Any], str | None]
    secret: bool = False


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One declared field. ``until`` marks a field deprecated: writing it warns."""

    name: str
    type: FieldType
    secret: bool = False
    default: Any = None
    validators: tuple[Validator, ...] = ()
    help: str = ""
    since: str | None = None
    until: str | None = None

    def __post_init__(self) -> None:
        if self.name == LIFECYCLE_FIELD or not _NAME.match(self.name):
            raise ConfigError(f"props field name {self.name!r} is reserved or not an identifier")


@dataclass(frozen=True, slots=True)
class SagaOutcome:
    """How a saga step ended: the record completes ``active`` or ``failed``."""

    lifecycle: Literal["active", "failed"]
    reason: str | None = None


ValidateHook: TypeAlias = Callable[[str, Mapping[str, Any]], None]
"""``(key, fields after the write)``; raise `HookRejected` to refuse it.
Runs inside the commit: keep it pure and fast."""

DeleteHook: TypeAlias = Callable[[str], None]
"""``(key)``; raise `HookRejected` to refuse the delete."""

SagaStep: TypeAlias = Callable[[str, Mapping[str, Any]], Awaitable[SagaOutcome]]
"""Runs after the provisioning commit; its outcome is committed as completion."""


@dataclass(frozen=True)
class Namespace:
    """A registered unqualified namespace of one service.

    ``deletion="hard"`` removes a record's metadata (a recreated record starts
    at version 1) and so cannot be combined with ``require_version``;
    ``"soft"`` keeps a tombstone version to recreate against (SQLite only).
    ``retain_events`` bounds the durable replay history.
    """

    name: str
    fields: tuple[FieldSpec, ...]
    cardinality: Cardinality = "collection"
    canonical_key: str = "current"
    primary_key_field: str | None = None
    schema_version: str = "1"
    require_version: bool = False
    deletion: Deletion = "hard"
    schema_public: Literal["allow", "deny"] = "allow"
    validate: ValidateHook | None = None
    on_delete: DeleteHook | None = None
    saga: SagaStep | None = None
    retain_events: int = 10_000
    by_name: Mapping[str, FieldSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.name == LIFECYCLE_FIELD or not _NAME.match(self.name):
            raise ConfigError(
                f"props namespace name {self.name!r} is reserved or not an identifier"
            )
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ConfigError(f"props namespace {self.name!r} declares a field twice")
        if self.cardinality == "singleton" and not self.canonical_key:
            raise ConfigError(f"singleton namespace {self.name!r} needs a canonical key")
        if self.primary_key_field is not None and self.primary_key_field not in names:
            raise ConfigError(f"primary_key_field {self.primary_key_field!r} is not a field")
        if self.deletion == "hard" and self.require_version:
            raise ConfigError(
                f"namespace {self.name!r}: hard delete restarts versions at 1 and "
                "cannot require version fencing (declare deletion='soft')"
            )
        if self.retain_events < 1:
            raise ConfigError("retain_events must be at least 1")
        object.__setattr__(self, "by_name", {f.name: f for f in self.fields})

    @property
    def secret_fields(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields if f.secret)


_TYPES: Mapping[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def _finite(value: Any) -> bool:
    """No NaN or infinity anywhere in ``value``: JSON has no such numbers."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def check_fields(ns: Namespace, fields: Mapping[str, Any]) -> list[str]:
    """Refuse unknown, reserved or ill-typed fields, non-finite numbers and
    failed validators; return the write's warnings (deprecated fields).
    ``None`` clears a field."""
    warnings: list[str] = []
    for name, value in fields.items():
        if name == LIFECYCLE_FIELD:
            raise PropsError("validation_error", f"{LIFECYCLE_FIELD} is reserved")
        spec = ns.by_name.get(name)
        if spec is None:
            raise PropsError("validation_error", f"unknown field {name!r} in namespace {ns.name!r}")
        if value is None:
            continue
        if not _TYPES[spec.type](value):
            raise PropsError("validation_error", f"field {name!r} must be of type {spec.type}")
        if not _finite(value):
            raise PropsError(
                "validation_error",
                f"field {name!r} holds a non-finite number (NaN or infinity is not JSON)",
            )
        for validator in spec.validators:
            problem = validator.check(value)
            if problem is not None:
                shown = REDACTED_VALIDATOR if (validator.secret or spec.secret) else validator.name
                raise PropsError("validation_error", f"field {name!r} failed {shown}: {problem}")
        if spec.until is not None:
            warnings.append(f"field {name!r} is deprecated (until {spec.until})")
    return warnings


def run_validate_hook(ns: Namespace, key: str, fields: Mapping[str, Any]) -> None:
    """Run the namespace's validation hook: a rejection is ``validation_error``,
    any other failure ``hook_error``."""
    if ns.validate is None:
        return
    _run_hook(lambda: ns.validate(key, fields) if ns.validate else None)


def run_delete_hook(ns: Namespace, key: str) -> None:
    if ns.on_delete is None:
        return
    _run_hook(lambda: ns.on_delete(key) if ns.on_delete else None)


def _run_hook(call: Callable[[], None]) -> None:
    try:
        call()
    except HookRejected as exc:
        raise PropsError("validation_error", str(exc)) from exc
    except PropsError:
        raise
    except Exception as exc:
        raise PropsError("hook_error", f"hook failed: {type(exc).__name__}") from exc


def describe(ns: Namespace, view: Literal["public", "full"]) -> dict[str, Any]:
    """The describe reply body. Public omits secret fields and redacts
    secret validator names; full shows everything."""
    fields = []
    for spec in ns.fields:
        if view == "public" and spec.secret:
            continue
        entry: dict[str, Any] = {
            "name": spec.name,
            "type": spec.type,
            "secret": spec.secret,
            "default": spec.default,
            "validators": [
                REDACTED_VALIDATOR if (view == "public" and v.secret) else v.name
                for v in spec.validators
            ],
            "help": spec.help,
        }
        if spec.since is not None:
            entry["since"] = spec.since
        if spec.until is not None:
            entry["until"] = spec.until
        fields.append(entry)
    body: dict[str, Any] = {
        "namespace": ns.name,
        "schema_version": ns.schema_version,
        "cardinality": ns.cardinality,
        "fields": fields,
    }
    key_field = ns.primary_key_field
    if key_field is not None and not (view == "public" and key_field in ns.secret_fields):
        # Public describe omits secret fields: it never names one here either.
        body["primary_key_field"] = key_field
    return body
