"""Pure parts of the integration layer: publish classification, the nats
grace tracker, the relay's bounds and the retention rule."""

from __future__ import annotations

from datetime import timedelta

import nats.errors
import nats.js.errors
import pytest

from service_engine.errors import ConfigError
from service_engine.messaging.nats import Rejected, Unanswered, classify_publish_failure
from service_engine.messaging.nats_health import GraceTracker
from service_engine.outbox.relay import OutboxBounds, retention_problems
from service_engine.scheduled.publisher import ScheduledBounds


@pytest.mark.parametrize(
    "exc",
    [
        nats.errors.TimeoutError(),
        TimeoutError(),
        BrokenPipeError(),
        ConnectionResetError(),
        nats.errors.NoRespondersError(),
        nats.js.errors.NoStreamResponseError(),
        nats.errors.ConnectionClosedError(),
        nats.errors.ConnectionReconnectingError(),
        nats.js.errors.ServiceUnavailableError(code=503, description="JetStream not enabled"),
        nats.js.errors.ServerError(code=500, description="internal"),
        nats.errors.Error("something new"),
    ],
)
def test_a_broker_that_cannot_answer_is_unanswered(exc: BaseException) -> None:
    """A timeout, a lost or reconnecting connection, no responders, an unavailable or failing
    JetStream, or an unknown NATS error classifies a publish as Unanswered (retry), not Rejected."""
    assert isinstance(classify_publish_failure(exc), Unanswered)


@pytest.mark.parametrize(
    ("exc", "err_code"),
    [
        (nats.js.errors.BadRequestError(code=400, err_code=10054, description="message size exceeds maximum allowed"), 10054),
        (nats.js.errors.BadRequestError(code=400, err_code=10071, description="wrong last sequence: 3"), 10071),
        (nats.errors.MaxPayloadError(), None),
        (nats.errors.BadSubjectError(), None),
    ],
)
def test_a_genuine_refusal_is_rejected(exc: BaseException, err_code: int | None) -> None:
    """A genuine refusal (message too large, wrong last sequence, payload over the maximum, bad
    subject) classifies as Rejected with its error code."""
    outcome = classify_publish_failure(exc)
    assert isinstance(outcome, Rejected)
    assert outcome.err_code == err_code


def test_grace_tracker_stays_up_through_a_short_outage() -> None:
    """An outage shorter than the grace never reports down, and a new outage starts its own clock."""
    tracker = GraceTracker(1.0)
    assert not tracker.observe(True, 0.0).down
    assert not tracker.observe(False, 10.0).down
    assert not tracker.observe(False, 10.9).down
    assert not tracker.observe(True, 10.95).down
    # a fresh outage starts its own clock
    assert not tracker.observe(False, 11.0).down
    assert not tracker.observe(False, 11.5).down


def test_grace_tracker_goes_down_past_the_grace_and_up_on_recovery() -> None:
    """An outage reaching the grace reports down with its length and detail; recovery reports up at
    once."""
    tracker = GraceTracker(1.0)
    tracker.observe(False, 5.0, "closed")
    verdict = tracker.observe(False, 6.0, "closed")
    assert verdict.down and verdict.outage_for == pytest.approx(1.0) and verdict.detail == "closed"
    recovered = tracker.observe(True, 6.1)
    assert not recovered.down and recovered.outage_for == 0.0


def test_outbox_bounds_are_validated() -> None:
    """The outbox and scheduled bounds refuse a zero drain bound, a backoff above its cap and zero
    attempts."""
    OutboxBounds()
    with pytest.raises(ConfigError, match="drain_bound > 0"):
        OutboxBounds(drain_bound=0)
    with pytest.raises(ConfigError, match="unanswered_backoff_cap"):
        OutboxBounds(unanswered_backoff=timedelta(seconds=2), unanswered_backoff_cap=timedelta(seconds=1))
    with pytest.raises(ConfigError):
        ScheduledBounds(max_attempts=0)


def test_retention_must_cover_every_bound_stream() -> None:
    """The engine's message retention must not be below any bound stream's, nor the stream
    unlimited; each problem names the stream."""
    week, day = timedelta(days=7), timedelta(days=1)
    assert retention_problems(week, {"INTEGRATION_CMD": day, "INTEGRATION_EVT": week}) == []
    below = retention_problems(day, {"INTEGRATION_EVT": week})
    assert len(below) == 1 and "INTEGRATION_EVT" in below[0]
    unlimited = retention_problems(week, {"INTEGRATION_CMD": None})
    assert len(unlimited) == 1 and "unlimited" in unlimited[0]
