"""Readiness: the pod's UP/DOWN verdict with the reasons it is DOWN.

The caller owns the `ReadinessHandle` and passes it to `Engine.boot`, so a
boot that fails (posture, schema version, listener probe) leaves it DOWN with
the reason. Each component reports under its own reason code and clears only
its own, so one recovering component never hides another's failure.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

REASON_BOOTING = "booting"
REASON_WORKER_STOPPED = "worker_stopped"
REASON_SHUTTING_DOWN = "shutting_down"
REASON_SCHEMA_VERSION_DISPLACED = "schema_version_displaced"
REASON_LISTENER_BRAKE = "listener_brake"
REASON_NATS_UNREACHABLE = "nats_unreachable"
REASON_INBOUND_STOPPED = "inbound_stopped"
REASON_MISSING_GRANT = "missing_grant"
"""A table a registered store uses is not readable and writable by the app
role (checked once at `Engine.run`; grant it, then restart the pod)."""


@dataclass(frozen=True, slots=True)
class Readiness:
    """A snapshot of the verdict: UP exactly when no reason is held."""

    reasons: MappingProxyType[str, str]

    @property
    def status(self) -> Literal["UP", "DOWN"]:
        return "DOWN" if self.reasons else "UP"

    @property
    def is_up(self) -> bool:
        return not self.reasons

    def to_json(self) -> dict[str, object]:
        if not self.reasons:
            return {"status": "UP"}
        return {
            "status": "DOWN",
            "reasons": [{"reason": k, "detail": v} for k, v in sorted(self.reasons.items())],
        }


class ReadinessHandle:
    """The shared, mutable readiness of one pod.

    Starts DOWN with `REASON_BOOTING`; boot clears it once the pod may serve.
    Safe to read from any thread (the HTTP server may run elsewhere).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reasons: dict[str, str] = {REASON_BOOTING: "the engine has not booted yet"}

    def set_down(self, reason: str, detail: str) -> None:
        """Hold the pod DOWN under ``reason`` until `clear` is called for it."""
        with self._lock:
            self._reasons[reason] = detail

    def clear(self, reason: str) -> None:
        """Withdraw ``reason``; the pod is UP once no reason is held."""
        with self._lock:
            self._reasons.pop(reason, None)

    def current(self) -> Readiness:
        with self._lock:
            return Readiness(MappingProxyType(dict(self._reasons)))

    @property
    def is_up(self) -> bool:
        with self._lock:
            return not self._reasons

    def holds(self, reason: str) -> bool:
        with self._lock:
            return reason in self._reasons


def readiness_route(handle: ReadinessHandle, path: str = "/readyz") -> Route:
    """A Starlette route answering 200 ``{"status":"UP"}`` or 503 with reasons."""

    async def readyz(_request: Request) -> JSONResponse:
        snapshot = handle.current()
        return JSONResponse(snapshot.to_json(), status_code=200 if snapshot.is_up else 503)

    return Route(path, readyz, methods=["GET"])
