"""``python -m example_service``: run the reference service.

With no configuration it starts embedded Postgres and NATS under ``.data/``
(or ``EXAMPLE_SERVICE_DATA``), provisions them (roles, the engine's and the
service's migrations, the integration streams, the published-language
buckets, and a development roster as the twin would publish it) and serves
http://127.0.0.1:8000/graphql. With ``DATABASE_URL`` and ``NATS_URL`` it binds
to that infrastructure and provisions nothing: the operator applied the
migrations and declared the streams and buckets.

Environment:

* ``EXAMPLE_SERVICE_HTTP_ADDR`` (else ``SERVICE_ENGINE_HTTP_ADDR``, else
  ``127.0.0.1:8000``): where to listen; port 0 picks a free port;
* ``EXAMPLE_SERVICE_ADDR_FILE``: once serving, the bound ``host:port`` is
  written there (it is also printed: ``listening on http://host:port``);
* ``EXAMPLE_SERVICE_PASSPORT_FROM_CONNECTION_PARAMS`` (``1``/``0``): accept
  the passport from the socket's ``connection_init`` payload, which is how
  GraphiQL in a browser sends it; on by default with embedded
  infrastructure only (a development machine), never behind a gateway;
* ``EXAMPLE_SERVICE_LOG_LEVEL`` (default ``INFO``);
* ``EXAMPLE_SERVICE_PODS`` (or ``--pods N``): run N pods as N processes on
  this host behind the one port (see below);
* ``SERVICE_ENGINE_<FIELD>``: the engine's configuration (`EngineConfig`);
* ``EXAMPLE_SERVICE_MEMORY_PROBE`` (debug only, ``bench/idle_return.py``): a
  folder; on SIGUSR1 the pod writes memory figures there for the step named
  in its ``step`` file (see `_memory_probe`);
  ``EXAMPLE_SERVICE_MEMORY_PROBE_FRAMES`` (default 0): with N > 0 the step
  ``mark`` starts tracemalloc with N frames and ``report`` reports it;
  ``EXAMPLE_SERVICE_MEMORY_PROBE_PINS`` and ``..._SURVIVORS`` (set: on) add
  the reports of what keeps pymalloc's arenas (`example_service.memory_pins`).

SIGINT (Ctrl-C) or SIGTERM stops the engine, the HTTP server and then the
embedded servers, in that order.

N pods on one host (``--pods N``, N > 1): this process binds the port with
SO_REUSEPORT, starts and provisions the embedded servers once (or takes
``DATABASE_URL`` / ``NATS_URL``), then spawns N children, each a whole pod
(its own engine, listener and sessions) bound to the same port; the kernel
spreads connections over them and the pods meet in Postgres and NATS as pods
on separate hosts do. The address is announced (and ``EXAMPLE_SERVICE_ADDR_FILE``
written) once every pod is ready. A signal stops the children, then the
embedded servers; a child that dies stops the rest. Pod 0 alone serves props.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from service_engine import (
    Engine,
    EngineConfig,
    ReadinessHandle,
    connect_pool,
    open_nats,
    run_on_allocator,
    service_migrations,
)
from service_engine.errors import ConfigError
from service_engine.server import bind_listener, run_with_listener

from .graphql import build_app
from .kernel import ConfigurationError
from .props import open_props
from .register import register

if TYPE_CHECKING:
    from service_engine.embedded import EmbeddedInfra

SERVICE = "example"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
DEFAULT_ADDR = "127.0.0.1:8000"
BUCKETS = ("PUBLISHED_example", "PUBLISHED_twin")
"""The gitops-declared key-value buckets: the service's published languages
and the twin's (which the service mirrors)."""
DEV_ROSTER = Path(__file__).resolve().parent / "dev_roster.json"
"""The roster seeded on embedded infrastructure, where no twin publishes one."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
POD_STOP_GRACE = 30.0
"""Seconds a child pod has to stop after SIGTERM before it is killed."""

# Set by the parent of N pods on each child (internal to this module).
_ENV_POD_INDEX = "EXAMPLE_SERVICE_POD_INDEX"
_ENV_REUSE_PORT = "EXAMPLE_SERVICE_REUSE_PORT"
_ENV_EMBEDDED = "EXAMPLE_SERVICE_EMBEDDED"
"""The URLs name embedded servers the parent started: a development pod."""
_ENV_MEMORY_PROBE = "EXAMPLE_SERVICE_MEMORY_PROBE"
_ENV_MEMORY_PROBE_FRAMES = "EXAMPLE_SERVICE_MEMORY_PROBE_FRAMES"
_ENV_MEMORY_PROBE_SURVIVORS = "EXAMPLE_SERVICE_MEMORY_PROBE_SURVIVORS"
_ENV_MEMORY_PROBE_PINS = "EXAMPLE_SERVICE_MEMORY_PROBE_PINS"

EXAMPLE_PASSPORT = {"sub": "alice", "org": "acme", "roles": ["board:archive"]}
"""Printed at start-up for GraphiQL's Headers tab (the README shows it too)."""

_log = logging.getLogger("example_service")


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    return raw in {"1", "true", "yes", "on"}


def _data_dir() -> Path:
    return Path(os.environ.get("EXAMPLE_SERVICE_DATA", ".data")).resolve()


def _listen(addr: str, *, reuse_port: bool = False) -> socket.socket:
    try:
        return bind_listener(addr, reuse_port=reuse_port)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot listen on {addr!r}: {exc}") from exc


def _pods(argv: list[str]) -> int:
    """How many pods to run: ``--pods N`` (or ``--pods=N``), else
    ``EXAMPLE_SERVICE_PODS``, else 1."""
    raw = os.environ.get("EXAMPLE_SERVICE_PODS", "").strip() or "1"
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--pods" and args:
            raw = args.pop(0)
        elif arg.startswith("--pods="):
            raw = arg.removeprefix("--pods=")
        else:
            raise ConfigurationError(f"unknown argument {arg!r} (usage: [--pods N])")
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigurationError(f"the number of pods is a positive integer, got {raw!r}")
    return int(raw)


def _addr_text(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _announce(sock: socket.socket, passport_in_params: bool, pods: int = 1) -> None:
    base = f"http://{_addr_text(sock)}"
    header = json.dumps({"X-Passport": json.dumps(EXAMPLE_PASSPORT, separators=(",", ":"))})
    lines = [
        f"listening on {base}" + (f" ({pods} pods)" if pods > 1 else ""),
        f"GraphiQL:  {base}/graphql   (readiness: {base}/readyz)",
        f"In GraphiQL's Headers tab, set a passport, e.g.:  {header}",
    ]
    if not passport_in_params:
        lines.append("Subscriptions take the passport from the X-Passport header of the upgrade.")
    print("\n".join(lines), flush=True)
    addr_file = os.environ.get("EXAMPLE_SERVICE_ADDR_FILE")
    if addr_file:
        _write_addr(Path(addr_file), sock)


def _write_addr(target: Path, sock: socket.socket) -> None:
    partial = target.with_name(target.name + ".partial")
    partial.write_text(f"{_addr_text(sock)}\n")
    partial.replace(target)  # a reader never sees half a line


async def _announce_pod(engine: Engine, sock: socket.socket, target: Path) -> None:
    """A child pod: write its address file once it is ready to serve."""
    while not engine.readiness.is_up:  # noqa: ASYNC110 - readiness is polled, not awaited
        await asyncio.sleep(0.05)
    _write_addr(target, sock)
    _log.info("pod %s serving on %s", os.environ.get(_ENV_POD_INDEX), _addr_text(sock))


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
    mapped (`example_service.memory_pins`); with
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
    if os.environ.get(_ENV_MEMORY_PROBE_SURVIVORS) and frames == 0:
        from example_service import memory_pins

        if step in ("mark", "held"):
            memory_pins.remember(step)
        elif step == "report":
            memory_pins.survivors_report(folder / "report.survivors.txt")
            memory_pins.remember(step)
        elif step == "linger":
            memory_pins.survivors_report(folder / "linger.survivors.txt", also=("report",))
    if step in ("mark", "report") and os.environ.get(_ENV_MEMORY_PROBE_PINS) and frames == 0:
        import traceback

        from example_service.memory_pins import pin_report

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

    from example_service.memory_pins import cyclic_garbage

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

    from example_service.memory_pins import walk

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


def _install_memory_probe(loop: asyncio.AbstractEventLoop) -> None:
    folder = os.environ.get(_ENV_MEMORY_PROBE)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        frames = int(os.environ.get(_ENV_MEMORY_PROBE_FRAMES) or 0)
        import faulthandler

        faulthandler.enable((Path(folder) / "fault.txt").open("w"))
        loop.add_signal_handler(signal.SIGUSR1, _memory_probe, Path(folder), frames)


async def _start_embedded(data_dir: Path) -> EmbeddedInfra:
    from service_engine.embedded import (
        EmbeddedInfra,
        provision_lane_stream,
        provision_presence_bucket,
        seed_bucket,
    )

    _log.info("starting embedded Postgres and NATS under %s", data_dir)
    # Start-up runs the servers' blocking starts in threads, which a
    # cancellation cannot stop: shielded, it completes, then what it
    # started is stopped, so a Ctrl-C never leaves an orphaned server.
    start = asyncio.ensure_future(EmbeddedInfra.start(
        data_dir, database=SERVICE, extra_migrations=service_migrations(MIGRATIONS),
        buckets=BUCKETS,
    ))
    try:
        infra = await asyncio.shield(start)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await (await start).aclose()
        raise
    try:
        roster = {k: json.dumps(v).encode() for k, v in json.loads(DEV_ROSTER.read_text()).items()}
        await seed_bucket(infra.nats.url, "PUBLISHED_twin", roster)
        # The reply slice's lanes, declared the way an operator would.
        await provision_lane_stream(infra.nats.url, SERVICE)
        await provision_presence_bucket(infra.nats.url, SERVICE)
    except BaseException:
        await infra.aclose()
        raise
    return infra


async def main() -> None:
    config = EngineConfig.from_env(service=os.environ.get("SERVICE_ENGINE_SERVICE", SERVICE))
    database_url = os.environ.get("DATABASE_URL")
    nats_url = os.environ.get("NATS_URL")
    if (database_url is None) != (nats_url is None):
        raise ConfigurationError(
            "set both DATABASE_URL and NATS_URL to bind real infrastructure, "
            "or neither to run on embedded servers"
        )
    pod_index = os.environ.get(_ENV_POD_INDEX)
    embedded = database_url is None or _flag(_ENV_EMBEDDED, False)
    passport_in_params = _flag("EXAMPLE_SERVICE_PASSPORT_FROM_CONNECTION_PARAMS", embedded)
    # Bound first: a busy port fails before anything is started.
    sock = _listen(os.environ.get("EXAMPLE_SERVICE_HTTP_ADDR") or config.http_addr or DEFAULT_ADDR,
                   reuse_port=_flag(_ENV_REUSE_PORT, False))

    # Until the host owns the signals, SIGINT and SIGTERM cancel the
    # start-up, and the embedded servers started so far are stopped.
    loop = asyncio.get_running_loop()
    starting = asyncio.current_task()
    assert starting is not None
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, starting.cancel)
    infra = None
    try:
        if database_url is None or nats_url is None:
            infra = await _start_embedded(_data_dir())
            database_url, nats_url = infra.database.app_url, infra.nats.url
        db = await connect_pool(database_url)
        try:
            nats = await open_nats(nats_url, name=f"{config.service}-{config.pod_id}")
            try:
                engine = await Engine.boot(config, db, nats, ReadinessHandle())
                if pod_index in (None, "0"):  # one props store: pod 0's
                    await open_props(engine, nats, _data_dir() / "props", config.service,
                                     embedded)
                register(engine)
                if not embedded:
                    # Identity confirms the slices' scopes before the pod is UP.
                    engine.declare_contributed_scopes()
                else:
                    _log.info("embedded development: no Identity, the scopes are not declared")
                app = build_app(engine, passport_from_connection_params=passport_in_params)
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)
                _install_memory_probe(loop)
                if pod_index is None:
                    _announce(sock, passport_in_params)
                    await run_with_listener(engine, app, sock)
                else:
                    # Listening now: the kernel queues this pod's share of
                    # connections until the server accepts them.
                    sock.listen(1024)
                    announced = asyncio.create_task(_announce_pod(
                        engine, sock, Path(os.environ["EXAMPLE_SERVICE_ADDR_FILE"])))
                    try:
                        await run_with_listener(engine, app, sock)
                    finally:
                        announced.cancel()
            finally:
                await nats.aclose()
        finally:
            await db.aclose()
    finally:
        sock.close()
        if infra is not None:
            await infra.aclose()
            _log.info("embedded servers stopped")


async def supervise(pods: int) -> None:
    """Run ``pods`` child pods behind one port (see the module's docstring)."""
    config = EngineConfig.from_env(service=os.environ.get("SERVICE_ENGINE_SERVICE", SERVICE))
    database_url = os.environ.get("DATABASE_URL")
    nats_url = os.environ.get("NATS_URL")
    if (database_url is None) != (nats_url is None):
        raise ConfigurationError(
            "set both DATABASE_URL and NATS_URL to bind real infrastructure, "
            "or neither to run on embedded servers"
        )
    embedded = database_url is None
    passport_in_params = _flag("EXAMPLE_SERVICE_PASSPORT_FROM_CONNECTION_PARAMS", embedded)
    # Bound (never listening) for as long as the pods run: it holds the
    # port, a port 0 becomes the one every child binds, and a busy port
    # fails before anything is started.
    sock = _listen(os.environ.get("EXAMPLE_SERVICE_HTTP_ADDR") or config.http_addr or DEFAULT_ADDR,
                   reuse_port=True)
    loop = asyncio.get_running_loop()
    supervising = asyncio.current_task()
    assert supervising is not None
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, supervising.cancel)
    infra = None
    children: list[asyncio.subprocess.Process] = []
    try:
        if database_url is None or nats_url is None:
            infra = await _start_embedded(_data_dir())
            database_url, nats_url = infra.database.app_url, infra.nats.url
        pods_dir = _data_dir() / "pods"
        pods_dir.mkdir(parents=True, exist_ok=True)
        addr_files = [pods_dir / f"pod-{i}.addr" for i in range(pods)]
        for path in addr_files:
            path.unlink(missing_ok=True)
        for i in range(pods):
            env = {
                **os.environ, "DATABASE_URL": database_url, "NATS_URL": nats_url,
                "EXAMPLE_SERVICE_DATA": str(_data_dir()),
                "EXAMPLE_SERVICE_HTTP_ADDR": _addr_text(sock),
                "EXAMPLE_SERVICE_ADDR_FILE": str(addr_files[i]),
                "EXAMPLE_SERVICE_PASSPORT_FROM_CONNECTION_PARAMS": str(int(passport_in_params)),
                _ENV_POD_INDEX: str(i), _ENV_REUSE_PORT: "1",
                _ENV_EMBEDDED: "1" if embedded else "0",
            }
            env.pop("EXAMPLE_SERVICE_PODS", None)
            if os.environ.get("SERVICE_ENGINE_POD_ID"):  # one identity per pod
                env["SERVICE_ENGINE_POD_ID"] = f"{os.environ['SERVICE_ENGINE_POD_ID']}-{i}"
            children.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "example_service", env=env))
        exits = [asyncio.ensure_future(child.wait()) for child in children]
        while not all(path.exists() for path in addr_files):
            if any(done.done() for done in exits):
                raise ConfigurationError("a pod stopped while starting (see its log above)")
            await asyncio.sleep(0.1)
        _announce(sock, passport_in_params, pods)
        await asyncio.wait(exits, return_when=asyncio.FIRST_COMPLETED)
        stopped = next(i for i, done in enumerate(exits) if done.done())
        raise ConfigurationError(
            f"pod {stopped} stopped (exit code {children[stopped].returncode}): stopping the rest")
    finally:
        await _stop_pods(children)
        sock.close()
        if infra is not None:
            await infra.aclose()
            _log.info("embedded servers stopped")


async def _stop_pods(children: list[asyncio.subprocess.Process]) -> None:
    """SIGTERM every running child, then wait; kill one past the grace."""
    for child in children:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.terminate()
    for child in children:
        try:
            await asyncio.wait_for(asyncio.shield(child.wait()), POD_STOP_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()


def run(argv: list[str] | None = None) -> int:
    """Run until stopped; the process exit code."""
    try:
        # Before anything else runs: the process is executed again on
        # mimalloc unless SERVICE_ENGINE_ALLOCATOR=pymalloc.
        allocator = run_on_allocator()
    except ConfigError as exc:
        print(f"example_service: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=os.environ.get("EXAMPLE_SERVICE_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    _log.info("Python's objects on %s", allocator)
    try:
        pods = _pods(sys.argv[1:] if argv is None else argv)
        asyncio.run(main() if pods == 1 else supervise(pods))
    except (ConfigurationError, ConfigError) as exc:
        print(f"example_service: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(run())
