"""The opt-in logging bridge: Python logging levels driven by a props singleton.

`log_namespace` declares singleton ``log`` (canonical key ``current``);
its hooks refuse unknown enum values (``log_unknown_enum_variant:``),
unparseable filters (``log_filter_invalid:``) and every delete
(``log_undeletable:``). `LogBridge` watches the store through its own
private signal (not the dispatcher's) and applies ``level`` and ``filter``
to Python loggers with ``setLevel`` only: it rebuilds no handler and writes
nothing back to the record.

``filter`` is an EnvFilter-style string: comma-separated directives, each
``level`` (the default) or ``target=level`` (``target`` a logger name,
``::`` read as ``.``), or a bare ``target`` (everything for it); levels
``off,error,warn,info,debug,trace``. ``level=none`` maps to off.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..failures import EngineError
from ..resources import AsyncResource
from .errors import HookRejected, PropsError, PropsStoreError
from .schema import FieldSpec, Namespace
from .store import Store

_log = logging.getLogger(__name__)

LOG_NAMESPACE = "log"
LOG_KEY = "current"

LEVELS = ("none", "error", "warn", "info", "debug")
FORMATS = ("human", "json")
APPLIED_BY = ("cli", "env", "props", "default")

OFF = logging.CRITICAL + 10
"""A level above every record: ``off``."""

_PY_LEVELS: Mapping[str, int] = {
    "off": OFF,
    "none": OFF,
    "error": logging.ERROR,
    "warn": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": logging.DEBUG,
}
_FILTER_LEVELS = ("off", "error", "warn", "info", "debug", "trace")
_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*((::|\.)[A-Za-z_][A-Za-z0-9_]*)*$")

UNKNOWN_ENUM = "log_unknown_enum_variant"
FILTER_INVALID = "log_filter_invalid"
UNDELETABLE = "log_undeletable"


class LogBridgeError(EngineError):
    """Registering or reading the ``log`` namespace failed (the contract's
    ``LogError::Props``)."""


@dataclass(frozen=True, slots=True)
class Directive:
    """One filter directive: ``target`` None sets the default level."""

    target: str | None
    level: int


def parse_filter(text: str) -> list[Directive]:
    """Parse an EnvFilter-style string; `HookRejected` (``log_filter_invalid:``)
    if it is not one."""
    directives: list[Directive] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            if text.strip():
                raise HookRejected(f"{FILTER_INVALID}: empty directive in {text!r}")
            continue
        target, sep, level = part.partition("=")
        target, level = target.strip(), level.strip().lower()
        if not sep:
            if target.lower() in _FILTER_LEVELS:
                directives.append(Directive(None, _PY_LEVELS[target.lower()]))
                continue
            level = "trace"
        if level not in _FILTER_LEVELS:
            raise HookRejected(f"{FILTER_INVALID}: unknown level {level!r} in {part!r}")
        if not _TARGET.match(target):
            raise HookRejected(f"{FILTER_INVALID}: bad target {target!r} in {part!r}")
        directives.append(Directive(target.replace("::", "."), _PY_LEVELS[level]))
    return directives


def _validate(key: str, fields: Mapping[str, Any]) -> None:
    for name, allowed in (("level", LEVELS), ("format", FORMATS), ("applied_by", APPLIED_BY)):
        value = fields.get(name)
        if value is not None and value not in allowed:
            raise HookRejected(
                f"{UNKNOWN_ENUM}: {name} {value!r} is not one of {', '.join(allowed)}"
            )
    value = fields.get("filter")
    if isinstance(value, str):
        parse_filter(value)


def _undeletable(key: str) -> None:
    raise HookRejected(f"{UNDELETABLE}: the log record cannot be deleted")


def log_namespace() -> Namespace:
    """Singleton ``log`` with its six mutable fields and hooks."""
    return Namespace(
        LOG_NAMESPACE,
        (
            FieldSpec("level", "string", default="info", help="none, error, warn, info or debug"),
            FieldSpec("filter", "string", default="", help="EnvFilter directives"),
            FieldSpec("format", "string", default="human", help="human or json"),
            FieldSpec("applied_at", "string", default=""),
            FieldSpec("source", "string", default=""),
            FieldSpec("applied_by", "string", default="default", help="cli, env, props or default"),
        ),
        cardinality="singleton",
        canonical_key=LOG_KEY,
        validate=_validate,
        on_delete=_undeletable,
    )


class LogBridge(AsyncResource):
    """Applies the ``log`` record to Python logging whenever it changes.

    ``root`` is the logger the ``level`` applies to (the root logger by
    default); filter targets are logger names. `start` (after the namespace
    is registered) applies the current record and begins listening; the
    watcher is `run`, a supervised worker: a read failure ends it with
    `LogBridgeError`, so the supervisor (and readiness) sees it.
    """

    def __init__(self, store: Store, *, root: str = "") -> None:
        self._store = store
        self._root = root
        self._notify = asyncio.Event()
        self._remove: Callable[[], None] | None = None
        self._filtered: set[str] = set()
        self.applied = asyncio.Event()
        """Set each time a change has been applied (tests wait on it)."""
        self.applied_version = 0

    def apply(self, fields: Mapping[str, Any]) -> None:
        """Set levels from one record's fields; nothing else is touched."""
        level = fields.get("level", "info")
        base = _PY_LEVELS.get(level if isinstance(level, str) else "info", logging.INFO)
        text = fields.get("filter") or ""
        try:
            directives = parse_filter(text) if isinstance(text, str) else []
        except HookRejected as exc:
            # Only a reconciliation can store one: keep the level, skip the filter.
            _log.warning("log filter not applied: %s", exc)
            directives = []
        for directive in directives:
            if directive.target is None:
                base = directive.level
        logging.getLogger(self._root or None).setLevel(base)
        targets = {d.target: d.level for d in directives if d.target is not None}
        for name in self._filtered - set(targets):
            logging.getLogger(name).setLevel(logging.NOTSET)
        for name, value in targets.items():
            logging.getLogger(name).setLevel(value)
        self._filtered = set(targets)

    async def _apply_current(self) -> None:
        try:
            snap = await self._store.get(LOG_NAMESPACE, LOG_KEY)
        except (PropsError, PropsStoreError) as exc:
            raise LogBridgeError(f"reading the log record failed: {exc}") from exc
        if snap.record is not None and snap.record.version != self.applied_version:
            self.apply(snap.record.fields)
            self.applied_version = snap.record.version
            self.applied.set()

    async def start(self) -> None:
        """Listen for commits and apply the current record (idempotent).
        Changes are applied while `run` runs."""
        if self._remove is not None:
            return
        self._remove = self._store.add_listener(self._on_commit)
        await self._apply_current()

    def _on_commit(self, namespace: str) -> None:
        if namespace == LOG_NAMESPACE:
            self._notify.set()

    async def run(self) -> None:
        """Apply every change until cancelled (a supervisor worker). A read
        failure raises `LogBridgeError`: the watcher never ends silently."""
        try:
            await self.start()
            while True:
                await self._notify.wait()
                self._notify.clear()
                await self._apply_current()
        except LogBridgeError as exc:
            _log.error("the logging bridge stopped: %s", exc)
            raise
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None


class _Registers(Protocol):
    @property
    def store(self) -> Store: ...

    async def register(self, ns: Namespace) -> None: ...


async def open_log_bridge(owner: _Registers, *, root: str = "") -> LogBridge:
    """Register the ``log`` namespace with ``owner`` (a `PropsService` or
    `PropsHandler`) and start a bridge on its store (the current record is
    applied). Failures raise `LogBridgeError`. Changes are applied by the
    bridge's `run`: run it under a supervisor, or `aclose` the bridge."""
    try:
        await owner.register(log_namespace())
    except Exception as exc:
        raise LogBridgeError(f"registering the log namespace failed: {exc}") from exc
    bridge = LogBridge(owner.store, root=root)
    await bridge.start()
    return bridge
