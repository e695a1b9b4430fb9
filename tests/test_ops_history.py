"""The ops page's rates: counters sampled on the beat, as per-second rates."""

from __future__ import annotations

from service_engine.ops import RateHistory


def test_rates_are_per_second_between_samples() -> None:
    """The ops page's rates are per second between samples taken at least a step apart."""
    history = RateHistory(window=60, step=5)
    assert history.observe(100.0, {"impacts": 0, "deltas": 0})
    assert not history.observe(102.0, {"impacts": 50, "deltas": 10})  # within the step
    assert history.observe(105.0, {"impacts": 50, "deltas": 10})
    assert history.observe(115.0, {"impacts": 150, "deltas": 10})
    assert history.rates() == {
        "impacts": [(105.0, 10.0), (115.0, 10.0)],
        "deltas": [(105.0, 2.0), (115.0, 0.0)],
    }


def test_old_samples_leave_the_window_and_a_reset_counter_counts_from_zero() -> None:
    """Samples older than the window leave it, and a counter that went down (a restart) counts from
    zero."""
    history = RateHistory(window=20, step=5)
    for t, value in ((0, 0), (10, 100), (20, 200), (30, 30)):
        history.observe(float(t), {"impacts": float(value)})
    # t=0 left the window; 200 -> 30 is a restarted counter: 30 in 10 s.
    assert history.rates() == {"impacts": [(20.0, 10.0), (30.0, 3.0)]}
    assert RateHistory().rates() == {}
