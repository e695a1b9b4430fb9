"""Where the event loop's time goes: a debug-only watch of one pod's loop.

Off unless the service runs under `main` (``python bench/loopwatch.py
example_service``; ``bench/e2e.py --loop-watch MS``), whose `Engine.run`
starts one when ``SERVICE_ENGINE_DEBUG_LOOP_WATCH`` names a threshold in
milliseconds. It
patches the process's asyncio ``Handle._run`` and the loop's ``_run_once``
and selector, so it costs ~1 µs per callback: never on in production.

What it records, from `reset` to `snapshot`:

* every callback (a task step, a transport's read, a ``call_soon``) that
  ran for the threshold or more, by kind (the task's coroutine, the
  transport's protocol, the callback's name), with where a task step
  suspended (its await chain's innermost engine frame) and the collector
  time inside it; and, of those, the ones whose own CPU (``time.thread_time``)
  reached the threshold (on a loaded machine wall time includes the waits
  for a core);
* every collection (``gc.callbacks``) by generation, and those that took the
  threshold or more;
* every loop iteration whose busy time (the iteration less its selector
  wait) reached the threshold, with the kinds that filled it;
* how late timer wakes ran (``loop.time()`` against the handle's deadline);
* the delivery timeline: a pipeline COMMIT sent (`Database.commit`) to its
  NOTIFY's group handed to the render side (``ImpactChannel.put``, matched
  first in, first out), to the render pass that took it, to the pass's end,
  to the last frame written after it (a subscriber socket's transport
  write); a pass's own CPU and the loop turns it spans;
* on each `dump`, which GC-tracked types grew since the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ENV_LOOP_WATCH", "LoopWatch", "dump_path"]

ENV_LOOP_WATCH = "SERVICE_ENGINE_DEBUG_LOOP_WATCH"
"""The switch: a threshold in milliseconds (e.g. ``5``); unset or empty: off.
With it on, SIGUSR2 writes what was recorded to `dump_path` and starts anew."""

ENV_GC_THRESHOLDS = "SERVICE_ENGINE_DEBUG_GC_THRESHOLDS"
"""With the watch on, ``T0,T1,T2`` replaces the collector's thresholds (after
``host.tune_gc``), to measure a setting side by side with the shipped one."""

_installed: list[LoopWatch] = []
"""The one watch of this process (the patches are process-wide)."""


def dump_path(pid: int) -> Path:
    """Where the pod ``pid``'s watch writes on SIGUSR2."""
    return Path(tempfile.gettempdir()) / f"service-engine-loopwatch-{pid}.json"


_ENGINE_FILES = ("service_engine", "example_service")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(values: list[float]) -> dict[str, float]:
    """p50 / p99 / max in milliseconds, and the count."""
    return {"n": len(values), "p50_ms": _pct(values, 0.5) * 1e3,
            "p99_ms": _pct(values, 0.99) * 1e3, "max_ms": max(values, default=0.0) * 1e3}


def _frame_text(frame: Any) -> str:
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    return f"{name}:{frame.f_lineno}"


def await_chain(coro: Any) -> str:
    """Where a suspended coroutine waits: its innermost engine frames."""
    frames: list[Any] = []
    node = coro
    for _ in range(64):
        frame = getattr(node, "cr_frame", None) or getattr(node, "ag_frame", None) \
            or getattr(node, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        node = getattr(node, "cr_await", None) or getattr(node, "ag_await", None) \
            or getattr(node, "gi_yieldfrom", None)
        if node is None:
            break
    if not frames:
        return "(finished)"
    ours = [f for f in frames if any(p in f.f_code.co_filename for p in _ENGINE_FILES)]
    chosen = ours[-2:] if ours else [frames[0], frames[-1]] if len(frames) > 1 else frames
    return " > ".join(_frame_text(f) for f in chosen)


def describe(callback: Any) -> tuple[str, Any]:
    """A callback's kind (a stable label) and, for a task step, its task."""
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        name = getattr(coro, "__qualname__", type(coro).__name__)
        return f"task {name}", owner
    protocol = getattr(owner, "_protocol", None)
    name = getattr(callback, "__qualname__", None) or type(callback).__name__
    if protocol is not None:
        return f"{name} -> {type(protocol).__qualname__}", None
    inner = getattr(callback, "__func__", None) or getattr(callback, "func", None)
    if inner is not None and name in {"partial", "method"}:
        name = getattr(inner, "__qualname__", name)
    return name, None


def _is_socket(transport: Any) -> bool:
    """A subscriber's WebSocket (the engine's wire or uvicorn's protocol)."""
    name = type(getattr(transport, "_protocol", None)).__name__
    return "WebSocket" in name or "Wire" in name


class _Kind:
    __slots__ = ("count", "cpu", "gc", "max", "max_cpu", "total", "where")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.cpu = 0.0
        self.max = 0.0
        self.max_cpu = 0.0
        self.gc = 0.0
        self.where: Counter[str] = Counter()

    def add(self, seconds: float, cpu: float, gc_seconds: float, where: str | None) -> None:
        self.count += 1
        self.total += seconds
        self.cpu += cpu
        self.max = max(self.max, seconds)
        self.max_cpu = max(self.max_cpu, cpu)
        self.gc += gc_seconds
        if where is not None:
            self.where[where] += 1

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "total_ms": round(self.total * 1e3, 1),
                "cpu_ms": round(self.cpu * 1e3, 1),
                "max_ms": round(self.max * 1e3, 1), "max_cpu_ms": round(self.max_cpu * 1e3, 1),
                "gc_ms": round(self.gc * 1e3, 1),
                "where": dict(self.where.most_common(4))}


class LoopWatch:
    """The watch (see the module docstring); one per process."""

    def __init__(self, threshold_ms: float) -> None:
        self.threshold = threshold_ms / 1e3
        self._undo: list[Callable[[], object]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gc_started = 0.0
        self._gc_cpu_started = 0.0
        self._gc_young = 0
        self._gc_in_callback = 0.0
        self._gc_in_iteration = 0.0
        self._select = 0.0
        self._iteration_slow: list[str] = []
        self._iteration_callbacks = 0
        self.gc_thresholds: tuple[int, int, int] | None = None
        self._census: Counter[str] | None = None
        self.reset()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LoopWatch | None:
        """The watch `ENV_LOOP_WATCH` asks for, or None (off, the default)."""
        raw = (os.environ if environ is None else environ).get(ENV_LOOP_WATCH, "").strip()
        if not raw or raw.lower() in {"0", "false", "off", "no"}:
            return None
        try:
            threshold = float(raw)
        except ValueError:
            from service_engine.errors import ConfigError

            raise ConfigError(
                f"{ENV_LOOP_WATCH}={raw!r}: give a threshold in milliseconds, e.g. 5"
            ) from None
        watch = cls(threshold)
        thresholds = (os.environ if environ is None else environ).get(ENV_GC_THRESHOLDS, "")
        if thresholds.strip():
            try:
                t0, t1, t2 = (int(x) for x in thresholds.split(","))
            except ValueError:
                from service_engine.errors import ConfigError

                raise ConfigError(f"{ENV_GC_THRESHOLDS}={thresholds!r}: give T0,T1,T2") from None
            watch.gc_thresholds = (t0, t1, t2)
        return watch

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """`install` on ``loop`` and dump on SIGUSR2 (a second watch in the
        process is a no-op: the patches are process-wide)."""
        if _installed:
            return
        _installed.append(self)
        if self.gc_thresholds is not None:
            gc.set_threshold(*self.gc_thresholds)
        self.install(loop)
        path = dump_path(os.getpid())
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGUSR2, self.dump, path)
            self._undo.append(lambda: loop.remove_signal_handler(signal.SIGUSR2))

    def stop(self) -> None:
        """Undo `start`."""
        if self in _installed:
            _installed.remove(self)
            self.uninstall()

    # -- recording ----------------------------------------------------------

    def reset(self) -> None:
        """Start a new recording window."""
        self.started = time.perf_counter()
        self.iterations = 0
        self.busy = 0.0
        self.cpu = 0.0
        self.callbacks = 0
        self.slow: dict[str, _Kind] = {}
        self.long_iterations: dict[str, _Kind] = {}
        self.slow_cpu: dict[str, _Kind] = {}
        self.long_cpu_iterations: dict[str, _Kind] = {}
        """As `slow` and `long_iterations`, counting only the loop thread's
        CPU (on a loaded machine wall time includes the waits for a core)."""
        self.iteration_busy: list[float] = []
        self.gc: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.gc_cpu: dict[int, float] = {}
        self.gc_young: dict[int, list[int]] = {}
        """Per generation: the objects counted young at each collection's start."""
        self.timer_lag: list[float] = []
        self._commits: deque[float] = deque(maxlen=10_000)
        self._put_at: dict[int, float] = {}
        self.commit_to_notify: list[float] = []
        self.notify_to_pass: list[float] = []
        self.pass_duration: list[float] = []
        self.pass_to_write: list[float] = []
        self._pass_end: float | None = None
        self._last_write: float | None = None
        self.pass_cpu: list[float] = []
        self.pass_turns: list[float] = []
        self._pass_cpu = 0.0
        self._callback_cpu_started = 0.0
        self._render_task: Any = None

    def _gc_callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_young = sum(gc.get_count())
            self._gc_cpu_started = time.thread_time()
            self._gc_started = time.perf_counter()
            return
        took = time.perf_counter() - self._gc_started
        cpu = time.thread_time() - self._gc_cpu_started
        self._gc_in_callback += took
        self._gc_in_iteration += took
        generation = info.get("generation", -1)
        self.gc.setdefault(generation, []).append(took)
        self.gc_cpu[generation] = self.gc_cpu.get(generation, 0.0) + cpu
        self.gc_young.setdefault(generation, []).append(self._gc_young)

    def _ran(self, handle: Any, took: float, cpu: float, gc_seconds: float) -> None:
        kind, task = describe(handle._callback)
        where = None
        if task is not None:
            where = "(finished)" if task.done() else await_chain(task.get_coro())
        entry = self.slow.get(kind)
        if entry is None:
            entry = self.slow[kind] = _Kind()
        entry.add(took, cpu, gc_seconds, where)
        self._iteration_slow.append(kind)
        if cpu >= self.threshold:  # its own work, not the machine's other processes
            entry = self.slow_cpu.get(kind)
            if entry is None:
                entry = self.slow_cpu[kind] = _Kind()
            entry.add(took, cpu, gc_seconds, where)

    def _finish_pass(self) -> None:
        if self._pass_end is not None and self._last_write is not None:
            self.pass_to_write.append(self._last_write - self._pass_end)
        self._pass_end = self._last_write = None

    # -- installing ----------------------------------------------------------

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Patch the process's asyncio handles and ``loop``; `uninstall` undoes it."""
        if self._undo:
            return
        self._loop = loop
        watch = self
        handle_cls: Any = asyncio.events.Handle
        original_run = handle_cls._run
        timer_cls = asyncio.events.TimerHandle
        threshold = self.threshold
        clock = time.perf_counter
        cpu_clock = time.thread_time

        def _run(handle: Any) -> None:
            watch._gc_in_callback = 0.0
            if type(handle) is timer_cls:
                timer: Any = handle
                watch.timer_lag.append(loop.time() - timer._when)
            cpu_started = watch._callback_cpu_started = cpu_clock()
            started = clock()
            try:
                original_run(handle)
            finally:
                took = clock() - started
                watch._iteration_callbacks += 1
                if watch._render_task is not None and \
                        getattr(handle._callback, "__self__", None) is watch._render_task:
                    watch._pass_cpu += cpu_clock() - cpu_started
                if took >= threshold:
                    watch._ran(handle, took, cpu_clock() - cpu_started, watch._gc_in_callback)

        handle_cls._run = _run
        self._undo.append(lambda: setattr(handle_cls, "_run", original_run))

        gc.callbacks.append(self._gc_callback)
        self._undo.append(lambda: gc.callbacks.remove(self._gc_callback))

        base: Any = loop
        run_once = base._run_once
        selector: Any = base._selector
        select = selector.select

        def _select(timeout: float | None = None) -> Any:
            started = clock()
            try:
                return select(timeout)
            finally:
                watch._select += clock() - started

        def _run_once() -> None:
            watch._select = 0.0
            watch._gc_in_iteration = 0.0
            watch._iteration_slow = []
            watch._iteration_callbacks = 0
            cpu_started = cpu_clock()
            started = clock()
            run_once()
            busy = clock() - started - watch._select
            cpu = cpu_clock() - cpu_started
            watch.cpu += cpu
            watch.iterations += 1
            watch.busy += busy
            watch.callbacks += watch._iteration_callbacks
            watch.iteration_busy.append(busy)
            if busy >= threshold:
                kinds = sorted(set(watch._iteration_slow))
                label = " + ".join(kinds) if kinds else "many short callbacks"
                if not kinds and watch._gc_in_iteration >= threshold / 2:
                    label = "gc between callbacks"
                where = f"{watch._iteration_callbacks} callbacks"
                for table, keep in ((watch.long_iterations, True),
                                    (watch.long_cpu_iterations, cpu >= threshold)):
                    if keep:
                        entry = table.get(label)
                        if entry is None:
                            entry = table[label] = _Kind()
                        entry.add(busy, cpu, watch._gc_in_iteration, where)

        selector.select = _select
        base._run_once = _run_once
        self._undo.append(lambda: delattr(selector, "select"))
        self._undo.append(lambda: delattr(base, "_run_once"))
        self._install_timeline()

    def _install_timeline(self) -> None:
        from asyncio import selector_events

        from service_engine.db.pool import Database
        from service_engine.impacts.transport import ImpactChannel
        from service_engine.render.runtime import RenderRuntime

        watch = self
        clock = time.perf_counter

        def patch(cls: Any, name: str, make: Callable[[Any], Any]) -> None:
            original = cls.__dict__[name]
            setattr(cls, name, make(original))
            self._undo.append(lambda: setattr(cls, name, original))

        def commit(original: Any) -> Any:
            async def _commit(db: Any, conn: Any, *, before: str = "") -> None:
                watch._commits.append(clock())
                await original(db, conn, before=before)
            return _commit

        def put(original: Any) -> Any:
            def _put(channel: Any, item: Any) -> None:
                now = clock()
                if watch._commits:
                    watch.commit_to_notify.append(now - watch._commits.popleft())
                if len(watch._put_at) < 100_000:
                    watch._put_at[id(item)] = now
                original(channel, item)
            return _put

        def render_pass(original: Any) -> Any:
            async def _render_pass(runtime: Any, deliveries: Any) -> Any:
                watch._finish_pass()
                watch._render_task = asyncio.current_task()
                watch._pass_cpu = 0.0
                turns = watch.iterations
                cpu_started = time.thread_time()
                started = clock()
                for item in deliveries:
                    at = watch._put_at.pop(id(item), None)
                    if at is not None:
                        watch.notify_to_pass.append(started - at)
                try:
                    return await original(runtime, deliveries)
                finally:
                    watch._pass_end = clock()
                    watch.pass_duration.append(watch._pass_end - started)
                    # The step running now is not counted by _run yet: add its part.
                    partial = time.thread_time() - max(cpu_started, watch._callback_cpu_started)
                    watch.pass_cpu.append(watch._pass_cpu + partial)
                    watch.pass_turns.append(float(watch.iterations - turns + 1))
            return _render_pass

        def write(original: Any) -> Any:
            def _write(transport: Any, data: Any) -> None:
                original(transport, data)
                if watch._pass_end is not None and _is_socket(transport):
                    watch._last_write = clock()
            return _write

        patch(Database, "commit", commit)
        patch(ImpactChannel, "put", put)
        patch(RenderRuntime, "render_pass", render_pass)
        patch(getattr(selector_events, "_SelectorSocketTransport"), "write", write)  # noqa: B009

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    # -- reporting ------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What was recorded since `reset` (times in milliseconds)."""
        self._finish_pass()
        seconds = time.perf_counter() - self.started

        def ranked(kinds: dict[str, _Kind]) -> list[dict[str, Any]]:
            ordered = sorted(kinds.items(), key=lambda kv: -kv[1].total)
            return [{"kind": k, **v.as_dict()} for k, v in ordered]

        long_busy = [b for b in self.iteration_busy if b >= self.threshold]
        return {
            "threshold_ms": self.threshold * 1e3,
            "gc_thresholds": gc.get_threshold(),
            "seconds": round(seconds, 2),
            "iterations": self.iterations,
            "callbacks": self.callbacks,
            "busy_ms": round(self.busy * 1e3, 1),
            "cpu_ms": round(self.cpu * 1e3, 1),
            "iteration_busy": _summary(self.iteration_busy),
            "long_iterations": {"count": len(long_busy), "total_ms": round(sum(long_busy) * 1e3, 1),
                                "kinds": ranked(self.long_iterations)},
            "slow_callbacks": ranked(self.slow),
            "long_cpu_iterations": ranked(self.long_cpu_iterations),
            "slow_cpu_callbacks": ranked(self.slow_cpu),
            "gc": {str(gen): {**_summary(times), "total_ms": round(sum(times) * 1e3, 1),
                              "cpu_ms": round(self.gc_cpu.get(gen, 0.0) * 1e3, 1),
                              "young_max": max(self.gc_young.get(gen, []), default=0),
                              "long": sum(t >= self.threshold for t in times)}
                   for gen, times in sorted(self.gc.items())},
            "timer_lag": _summary(self.timer_lag),
            "commit_to_notify": _summary(self.commit_to_notify),
            "notify_to_pass": _summary(self.notify_to_pass),
            "pass_duration": _summary(self.pass_duration),
            "pass_cpu": _summary(self.pass_cpu),
            "pass_turns": {"n": len(self.pass_turns), "p50": _pct(self.pass_turns, 0.5),
                           "p99": _pct(self.pass_turns, 0.99),
                           "max": max(self.pass_turns, default=0.0)},
            "pass_to_last_write": _summary(self.pass_to_write),
        }

    def dump(self, path: Path) -> None:
        """Write `snapshot` as JSON to ``path`` (atomically), then `reset`.

        The report also says which types of GC-tracked objects grew since
        the last dump (a census of ``gc.get_objects()``: a few hundred ms
        at a million objects, taken before the file is written, so a caller
        waiting on the file starts after it)."""
        report = self.snapshot()
        census = Counter(type(o).__qualname__ for o in gc.get_objects())
        if self._census is not None:
            grown = census.copy()
            grown.subtract(self._census)
            report["tracked_growth"] = {
                "total": sum(census.values()) - sum(self._census.values()),
                "types": dict(grown.most_common(15)),
            }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        self.reset()
        self._census = census
        tmp.replace(path)




def main() -> None:
    """``python bench/loopwatch.py MODULE [ARGS...]``: run MODULE as
    ``__main__`` (e.g. ``example_service``) with `Engine.run` starting the
    watch `ENV_LOOP_WATCH` asks for. Diagnostics only: it patches the
    engine's run and the loop, which the library never does."""
    import runpy
    import sys

    from service_engine.engine import Engine

    original = Engine.run

    async def run(self: Engine) -> None:
        watch = LoopWatch.from_env()
        if watch is not None:
            watch.start(asyncio.get_running_loop())
        try:
            await original(self)
        finally:
            if watch is not None:
                watch.stop()

    Engine.run = run  # type: ignore[method-assign]
    sys.path.insert(0, os.getcwd())  # the tree the service runs from
    module = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
