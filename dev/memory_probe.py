"""Debug only: a pod's memory figures on demand (``bench/idle_return.py``).

    python dev/memory_probe.py MODULE [ARGS...]     # e.g. example_service

runs MODULE as ``__main__`` with, when ``EXAMPLE_SERVICE_MEMORY_PROBE``
names a folder, a SIGUSR1 handler on the engine's loop (installed when
`Engine.run` starts): on each signal the pod writes memory figures there for
the step its ``step`` file names (see `_memory_probe`).
``EXAMPLE_SERVICE_MEMORY_PROBE_FRAMES`` (default 0): with N > 0 the step
``mark`` starts tracemalloc with N frames and ``report`` reports it;
``EXAMPLE_SERVICE_MEMORY_PROBE_PINS`` and ``..._SURVIVORS`` (set: on) add the
reports of what keeps pymalloc's arenas (`memory_pins`). A diagnostic: it
patches the engine's run, which the library never does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

ENV_PROBE = "EXAMPLE_SERVICE_MEMORY_PROBE"
ENV_FRAMES = "EXAMPLE_SERVICE_MEMORY_PROBE_FRAMES"
ENV_SURVIVORS = "EXAMPLE_SERVICE_MEMORY_PROBE_SURVIVORS"
ENV_PINS = "EXAMPLE_SERVICE_MEMORY_PROBE_PINS"


def _memory_probe(folder: Path, frames: int) -> None:
    """Debug only: after a full collection, write ``<step>.malloc.txt``
    (``sys._debugmallocstats()``) and ``<step>.types.json`` (live objects
    by type) to ``folder``, the step being what its ``step`` file names.
    The step ``trim`` first calls glibc's ``malloc_trim(0)``; ``garbage``
    first writes ``garbage.txt``: what a full collection frees, by type
    and, while tracemalloc traces, by allocation site.
    With ``frames``, the step ``mark`` starts tracemalloc and ``report``
    writes what was allocated since the mark and is still alive, then stops
    it: ``report.traces.txt`` (the top 30 by traceback) and
    ``report.objects.txt`` (those blocks that are objects reachable from
    the collector's, by type and allocation site, with a sample and the
    object it was reached from). Without tracemalloc and with
    ``EXAMPLE_SERVICE_MEMORY_PROBE_PINS`` set, ``mark`` and ``report`` write
    ``<step>.pins.txt``: the objects that keep the emptiest pymalloc arenas
    mapped (`memory_pins`); with
    ``EXAMPLE_SERVICE_MEMORY_PROBE_SURVIVORS`` set, ``mark`` and ``held``
    remember every reachable object's address and ``report`` writes
    ``report.survivors.txt``: what was allocated while the sessions were
    open and outlived them (``linger``: and is still alive then,
    ``linger.survivors.txt``). ``<step>.done`` is written last."""
    import collections
    import gc
    import tracemalloc

    step = (folder / "step").read_text().strip()
    if step == "garbage":
        _garbage_report(folder / "garbage.txt")
    gc.collect()
    if step == "trim":  # what glibc gives back of what it holds free
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    if step == "report" and tracemalloc.is_tracing():
        _trace_report(folder, frames)
        gc.collect()
    if os.environ.get(ENV_SURVIVORS) and frames == 0:
        import memory_pins

        if step in ("mark", "held"):
            memory_pins.remember(step)
        elif step == "report":
            memory_pins.survivors_report(folder / "report.survivors.txt")
            memory_pins.remember(step)
        elif step == "linger":
            memory_pins.survivors_report(folder / "linger.survivors.txt", also=("report",))
    if step in ("mark", "report") and os.environ.get(ENV_PINS) and frames == 0:
        import traceback

        from memory_pins import pin_report

        try:
            pin_report(folder / f"{step}.pins.txt")
        except Exception:  # a debug report: say why, write the rest
            (folder / f"{step}.pins.txt").write_text(traceback.format_exc())
        gc.collect()
    with (folder / f"{step}.malloc.txt").open("wb") as out:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()  # nothing while tracemalloc traces
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    counts = collections.Counter(
        f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
    (folder / f"{step}.types.json").write_text(json.dumps(dict(counts.most_common())))
    if step == "mark" and frames > 0:
        tracemalloc.start(frames)
    (folder / f"{step}.done").touch()


def _garbage_report(target: Path) -> None:
    """What a full collection would free now, by type and (with tracemalloc
    tracing) by allocation site."""
    import collections
    import tracemalloc

    from memory_pins import cyclic_garbage

    found = cyclic_garbage()
    kinds: collections.Counter[str] = collections.Counter()
    sites: collections.Counter[str] = collections.Counter()
    for obj in found:
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        kinds[kind] += 1
        where = tracemalloc.get_object_traceback(obj)
        if where is not None:
            sites[kind + " at " + " <- ".join(
                f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                for f in list(reversed(where))[:6])] += 1
    del found
    lines = [f"{sum(kinds.values())} objects in cycles", *(
        f"{n:7} {k}" for k, n in kinds.most_common(30)), "", "by site", *(
        f"{n:7} {k}" for k, n in sites.most_common(30))]
    target.write_text("\n".join(lines) + "\n")


def _trace_report(folder: Path, frames: int) -> None:
    import collections
    import tracemalloc

    from memory_pins import walk

    ignored = [tracemalloc.Filter(False, tracemalloc.__file__),
               tracemalloc.Filter(False, __file__),
               tracemalloc.Filter(False, "<frozen importlib._bootstrap*>")]
    # The snapshot first: what the walk below allocates is not in it.
    snapshot = tracemalloc.take_snapshot().filter_traces(ignored)
    sites: collections.Counter[tuple[str, str]] = collections.Counter()
    samples: dict[tuple[str, str], str] = {}
    holders: dict[tuple[str, str], str] = {}
    for obj, parent in walk():  # every reachable object, with what it was reached from
        where = tracemalloc.get_object_traceback(obj)
        if where is None or any(f.filename == __file__ for f in where):  # the probe's own
            continue
        site = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                           for f in list(reversed(where))[:4])
        key = (type(obj).__qualname__, site)
        sites[key] += 1
        if key not in samples:
            samples[key] = repr(obj)[:100]
            holders[key] = ("(a root)" if parent is None else
                            f"in {type(parent).__module__}.{type(parent).__qualname__}: "
                            f"{repr(parent)[:80]}")
    objects = [f"{n:7} {kind:28} {site}\n{'':36}{samples[key]}\n{'':36}{holders[key]}"
               for key, n in sites.most_common(60) for kind, site in [key]]
    (folder / "report.objects.txt").write_text("\n".join(objects) + "\n")
    tracemalloc.stop()
    stats = snapshot.statistics("traceback")
    lines = [f"total {sum(s.size for s in stats)} bytes in {sum(s.count for s in stats)} "
             f"blocks, {len(stats)} tracebacks"]
    for stat in stats[:30]:
        lines.append(f"\n{stat.size} bytes in {stat.count} blocks")
        lines += stat.traceback.format(limit=frames, most_recent_first=True)
    lines.append("\nby line (top 30)")
    lines += [str(s) for s in snapshot.statistics("lineno")[:30]]
    (folder / "report.traces.txt").write_text("\n".join(lines) + "\n")


def _install(loop: asyncio.AbstractEventLoop) -> None:
    folder = os.environ.get(ENV_PROBE)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        frames = int(os.environ.get(ENV_FRAMES) or 0)
        import faulthandler

        faulthandler.enable((Path(folder) / "fault.txt").open("w"))
        loop.add_signal_handler(signal.SIGUSR1, _memory_probe, Path(folder), frames)


def main() -> None:
    """Run ``sys.argv[1]`` as ``__main__`` with the probe installed."""
    import runpy

    from service_engine.engine import Engine

    original = Engine.run

    async def run(self: Engine) -> None:
        _install(asyncio.get_running_loop())
        await original(self)

    Engine.run = run  # type: ignore[method-assign]
    sys.path.insert(0, os.getcwd())  # the tree the service runs from
    module = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
