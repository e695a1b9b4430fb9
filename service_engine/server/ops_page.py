"""The ops page at ``/ops``: readiness with its reasons, dead letters waiting
(retry and discard, each an audited action), the outbox backlog, live
sessions per projector, and the impact and delta rates over the last minutes.

Everything is served by the pod itself (the page, its script and style;
a Content-Security-Policy of ``'self'`` lets the browser load nothing
else). Every route but the static assets needs a passport with the ops
role (``X-Passport``, as the gateway injects it); without one the answer is
403 with the refusal's code and no data. Actions are POSTs with a JSON body,
which a cross-site form cannot send, and each is logged on the
``service_engine.audit`` logger with the passport's subject.
"""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from importlib import resources
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..messaging.nats import Acked, Duplicate
from ..ops import RateHistory, dead_letters_waiting, outbox_status
from .passport import PASSPORT_HEADER, Passport, PassportError, parse_passport

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = ["DEFAULT_OPS_ROLE", "OpsState", "ops_routes"]

DEFAULT_OPS_ROLE = "ops"
"""The passport role that opens the ops page."""

IMPACTS = "service_engine_impacts_committed_total"
DELTAS = "service_engine_deltas_delivered_total"
LIVE_SESSIONS = "service_engine_live_sessions"

RATE_WINDOW_SECONDS = 600.0
"""How far back the page's rate chart reaches."""
RATE_STEP_SECONDS = 5.0

_audit = logging.getLogger("service_engine.audit")

_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
_STATIC = {
    "ops.js": "text/javascript; charset=utf-8",
    "ops.css": "text/css; charset=utf-8",
}


def _asset(name: str) -> bytes:
    return (resources.files(__package__) / "ops_static" / name).read_bytes()


class OpsState:
    """The rate history of one engine, sampled on its beat."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # A sample every ten beats, at most every RATE_STEP_SECONDS.
        step = min(RATE_STEP_SECONDS, 10 * engine.config.beat_interval.total_seconds())
        self.history = RateHistory(window=RATE_WINDOW_SECONDS, step=step)

    async def sample(self) -> None:
        metrics = self.engine.metrics
        self.history.observe(
            time.time(), {"impacts": metrics.total(IMPACTS), "deltas": metrics.total(DELTAS)}
        )


_STATES: weakref.WeakKeyDictionary[Engine, OpsState] = weakref.WeakKeyDictionary()


def state_of(engine: Engine) -> OpsState:
    """The engine's `OpsState`, its beat step registered on first use."""
    state = _STATES.get(engine)
    if state is None:
        state = _STATES[engine] = OpsState(engine)
        engine.register_beat_step("ops_rates", state.sample)
    return state


def _refused(code: str, message: str, status: int = 403) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _operator(request: Request, role: str) -> Passport | tuple[str, str]:
    """The operator's passport, or the (code, message) refusing the request."""
    try:
        passport = parse_passport(request.headers.get(PASSPORT_HEADER))
    except PassportError as exc:
        return exc.code, str(exc)
    if not passport.has_role(role):
        return "ops_role_required", f"the ops page needs the {role!r} role"
    return passport


def _letter_id(request: Request) -> uuid.UUID | None:
    try:
        return uuid.UUID(request.path_params["letter_id"])
    except ValueError:
        return None


def _audited(passport: Passport, action: str, letter_id: uuid.UUID, outcome: str) -> None:
    _audit.info(
        "ops %s dead letter %s by %s: %s", action, letter_id, passport.sub, outcome,
        extra={"ops_action": action, "ops_actor": passport.sub, "ops_target": str(letter_id),
               "ops_outcome": outcome},
    )


def ops_routes(
    engine: Engine, *, role: str = DEFAULT_OPS_ROLE, path: str = "/ops"
) -> list[BaseRoute]:
    """The ops page's routes for ``engine``, gated by ``role``."""
    state = state_of(engine)

    async def page(request: Request) -> Response:
        operator = _operator(request, role)
        if not isinstance(operator, Passport):
            html = _asset("forbidden.html").decode().replace("{{code}}", operator[0])
            return Response(html, status_code=403, media_type="text/html",
                            headers={"Content-Security-Policy": _CSP})
        html = _asset("ops.html").decode().replace("{{base}}", path)
        return Response(html, media_type="text/html",
                        headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-store"})

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return Response(status_code=404)
        return Response(_asset(name), media_type=_STATIC[name])

    async def api_state(request: Request) -> Response:
        operator = _operator(request, role)
        if not isinstance(operator, Passport):
            return _refused(*operator)
        readiness = engine.readiness.current().to_json()
        letters = await engine.dead_letters.list(limit=200)
        outbox = await outbox_status(engine.db)
        sessions = {
            name: int(count) for name, count in engine.metrics.by_label(
                LIVE_SESSIONS, "projector").items()
        }
        return JSONResponse({
            "service": engine.config.service, "pod": engine.config.pod_id,
            "operator": operator.sub,
            "readiness": readiness,
            "dead_letters": {
                "waiting": await dead_letters_waiting(engine.db),
                "items": [{
                    "id": str(letter.id), "source": letter.source.value, "work": letter.work,
                    "reason": letter.reason, "detail": letter.detail,
                    "occurrences": letter.occurrences,
                    "retryable": letter.subject is not None and letter.payload is not None,
                    "recorded_at": letter.recorded_at.isoformat() if letter.recorded_at else None,
                } for letter in letters],
            },
            "outbox": {"pending": outbox.pending, "failed": outbox.failed,
                       "oldest_pending_age_seconds": outbox.oldest_pending_age_seconds},
            "sessions": sessions,
            "rates": {
                "window_seconds": state.history.window, "step_seconds": state.history.step,
                "series": {name: [[t, round(r, 3)] for t, r in points]
                           for name, points in state.history.rates().items()},
            },
        }, headers={"Cache-Control": "no-store"})

    async def act(request: Request) -> Response:
        operator = _operator(request, role)
        if not isinstance(operator, Passport):
            return _refused(*operator)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return _refused("json_required", "ops actions are POSTs with a JSON body", 415)
        letter_id = _letter_id(request)
        if letter_id is None:
            return _refused("bad_id", "not a dead letter id", 400)
        action = request.path_params["action"]
        if action == "discard":
            deleted = await engine.dead_letters.discard(letter_id)
            _audited(operator, "discard", letter_id, "discarded" if deleted else "not_found")
            if not deleted:
                return _refused("dead_letter_not_found", f"no dead letter {letter_id}", 404)
            return JSONResponse({"id": str(letter_id), "outcome": "discarded"})
        if action != "retry":
            return _refused("unknown_action", f"no ops action {action!r}", 404)
        letter = await engine.dead_letters.get(letter_id)
        if letter is None:
            _audited(operator, "retry", letter_id, "not_found")
            return _refused("dead_letter_not_found", f"no dead letter {letter_id}", 404)
        if letter.subject is None or letter.payload is None:
            _audited(operator, "retry", letter_id, "not_retryable")
            return _refused("not_retryable", f"{letter.source.value} {letter.work!r} is not a "
                            "message: fix the cause, then discard it", 409)
        if engine.nats is None:
            _audited(operator, "retry", letter_id, "no_nats")
            return _refused("nats_unavailable", "this pod has no NATS connection", 503)
        outcome = await engine.dead_letters.retry(letter_id, engine.nats)
        name = type(outcome).__name__
        _audited(operator, "retry", letter_id, name)
        if isinstance(outcome, Acked | Duplicate):
            return JSONResponse({"id": str(letter_id), "outcome": name})
        return _refused("retry_not_acknowledged",
                        f"{name}: {getattr(outcome, 'detail', '')}; the dead letter stays", 502)

    base = path.rstrip("/")
    return [
        Route(base, page, methods=["GET"]),
        Route(base + "/static/{name}", static, methods=["GET"]),
        Route(base + "/api/state", api_state, methods=["GET"]),
        Route(base + "/api/dead-letters/{letter_id}/{action}", act, methods=["POST"]),
    ]

