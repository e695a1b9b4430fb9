"""The debug loop watch (`bench/loopwatch.py`): off unless asked for;
once installed it names what held the loop, counts collections by
generation and how late timers ran; uninstalled, asyncio is as it was."""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from service_engine.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
_watch: Any = importlib.import_module("loopwatch")  # a diagnostic of bench/, not the library
ENV_GC_THRESHOLDS, ENV_LOOP_WATCH = _watch.ENV_GC_THRESHOLDS, _watch.ENV_LOOP_WATCH
LoopWatch, await_chain = _watch.LoopWatch, _watch.await_chain


def test_off_unless_a_threshold_is_given() -> None:
    """Unset, empty or a false word: no watch; a number: that threshold;
    anything else: a typed `ConfigError` naming the variable."""
    assert LoopWatch.from_env({}) is None
    for off in ("", " ", "0", "off", "false"):
        assert LoopWatch.from_env({ENV_LOOP_WATCH: off}) is None
    watch = LoopWatch.from_env({ENV_LOOP_WATCH: "5"})
    assert watch is not None and watch.threshold == pytest.approx(0.005)
    assert watch.gc_thresholds is None
    with pytest.raises(ConfigError, match=ENV_LOOP_WATCH):
        LoopWatch.from_env({ENV_LOOP_WATCH: "fast"})
    tuned = LoopWatch.from_env({ENV_LOOP_WATCH: "5", ENV_GC_THRESHOLDS: "2000,10,100"})
    assert tuned is not None and tuned.gc_thresholds == (2000, 10, 100)
    with pytest.raises(ConfigError, match=ENV_GC_THRESHOLDS):
        LoopWatch.from_env({ENV_LOOP_WATCH: "5", ENV_GC_THRESHOLDS: "2000"})


async def _hold(seconds: float) -> None:
    await asyncio.sleep(0)
    time.sleep(seconds)  # noqa: ASYNC251 - the step that holds the loop
    gc.collect(0)
    await asyncio.sleep(0)


def test_names_the_step_that_held_the_loop_and_the_collections() -> None:
    """A task step that blocks 300 ms is one slow callback of that task's
    coroutine (where it then waited is named), one long iteration, and its
    collection is counted with the generation; short steps are not
    listed; a timer's lateness is recorded; uninstall restores asyncio.

    The threshold (100 ms) sits far from both kinds of step: a step of a
    few microseconds is not listed even when a loaded machine deschedules
    it for tens of milliseconds."""
    original = asyncio.events.Handle._run
    loop = asyncio.new_event_loop()
    watch = LoopWatch(threshold_ms=100)
    try:
        watch.install(loop)
        assert asyncio.events.Handle._run is not original
        watch.reset()
        loop.run_until_complete(_hold(0.3))
        loop.run_until_complete(asyncio.sleep(0.01))
        report = watch.snapshot()
    finally:
        watch.uninstall()
        loop.close()
    assert asyncio.events.Handle._run is original
    kinds = {k["kind"]: k for k in report["slow_callbacks"]}
    assert list(kinds) == ["task _hold"]
    slow = kinds["task _hold"]
    assert slow["count"] == 1 and slow["max_ms"] >= 300
    assert any("_hold" in where for where in slow["where"])
    assert report["long_iterations"]["count"] == 1
    assert report["long_iterations"]["kinds"][0]["kind"] == "task _hold"
    assert report["gc"]["0"]["n"] >= 1
    assert report["timer_lag"]["n"] >= 1
    assert report["iterations"] >= 3 and report["busy_ms"] >= 300


def test_await_chain_names_the_innermost_frames() -> None:
    """A suspended coroutine's chain ends in the coroutine it awaits."""
    async def inner() -> None:
        await asyncio.sleep(1)

    async def outer() -> None:
        await inner()

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(outer())
        loop.run_until_complete(asyncio.sleep(0))
        assert "inner" in await_chain(task.get_coro())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(task)
    finally:
        loop.close()
