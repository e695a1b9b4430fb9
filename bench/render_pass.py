"""The render pass alone, in process: CPU per session-delta, no sockets, no database.

    python bench/render_pass.py [--sessions 1000] [--orgs 1,50] [--passes 200]
                                [--views boards,plain] [--rounds 3] [--before TREE]

``--sessions`` live sessions (each its own principal, as one subscriber per
socket is) over the reference service's ``boards`` projector (its real
``project``: the board's view with the caller's affordances, every gate
evaluated for the principal) or a ``plain`` one (a cheap view, the pass's own
per-session cost), spread over ``--orgs`` orgs of five boards each. Each pass
renders one committed rename (a caused impact, as a ``renameBoard`` mutation
stages it) through `RenderRuntime.render_pass`: route, plan, the cohort
index's discovery, the load (an in-memory store behind a stand-in pool: one
``read_many`` per pass, no I/O), projection, diff, the stream put. Between
passes every stream is drained outside the timed part, as a subscriber that
keeps up would. ``--direct``: every stream has a callback-mode subscriber
that takes each caught-up delta as it is put (the fused write's side of the
pass; the write itself costs nothing here); a tree without it wakes.

Reported per variant: process CPU per session-delta (the pass's time over the
deltas it enqueued), per pass, deltas per pass, and the Python memory each
attached session holds once its snapshot was taken (tracemalloc, the
session's window, stream and registry records included; the attach is timed
out of the passes; sessions attach in bursts of 100, as sockets open). ``--before TREE`` runs
the same passes against another checkout of the engine (a worktree of an
earlier commit) in a child process, interleaved round by round with this
tree, so both share the machine's load; the best round of each is printed
side by side with their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

TREE = os.environ.get("RENDER_PASS_TREE") or str(Path(__file__).resolve().parents[1])
sys.path.insert(0, TREE)

from example_service.kernel import Principal  # noqa: E402
from example_service.slices.board.domain import Board  # noqa: E402
from example_service.slices.board.views import BoardsQuery, BoardsView  # noqa: E402
from service_engine import EngineConfig, Query, WindowSpec  # noqa: E402
from service_engine.impacts.model import Cause, Impact  # noqa: E402
from service_engine.impacts.transport import ImpactChannel  # noqa: E402
from service_engine.metrics import Metrics  # noqa: E402
from service_engine.render.runtime import RenderRuntime  # noqa: E402

BOARDS_PER_ORG = 5


class MemoryStore:
    """The rows, as a store's ``read_many`` / ``key_of`` serve them."""

    def __init__(self) -> None:
        self.rows: dict[str, Board] = {}

    async def read_many(self, conn: object, keys: Sequence[Any]) -> list[Board]:
        rows = self.rows
        return [rows[k] for k in keys if k in rows]

    @staticmethod
    def key_of(row: Board) -> str:
        return row.id


STORE = MemoryStore()


class _Conn:
    @contextlib.asynccontextmanager
    async def transaction(self, **_: object) -> AsyncIterator[None]:
        yield


class _Pool:
    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[_Conn]:
        yield _Conn()


@dataclass
class _Db:
    """`Database`'s read entries as the registry takes them (`connection`,
    `plain`), over the stand-in pool."""

    pool: _Pool

    @contextlib.asynccontextmanager
    async def connection(self, entry: str, bound: float | None = None) -> AsyncIterator[_Conn]:
        async with self.pool.acquire() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def plain(self, bound: float | None = None) -> AsyncIterator[_Conn]:
        async with self.pool.acquire() as conn:
            yield conn


def _ids_in(cx: Any) -> list[str]:
    orgs = {value for kind, value in (c for c in cx.cohorts or () if isinstance(c, tuple))
            if kind == "org"}
    return sorted(k for k, row in STORE.rows.items() if row.org in orgs)


class Boards(BoardsView):
    """The reference projector over the in-memory rows."""

    NAME = "boards"
    STORE: ClassVar[Any] = STORE

    async def populate(self, cx: Any, query: BoardsQuery) -> Sequence[Any]:
        return _ids_in(cx)


@dataclass(frozen=True, slots=True)
class PlainView:
    id: str
    title: str
    archived: bool


class Plain(BoardsView):
    """The same rows and visibility with a cheap view."""

    NAME = "plain"
    STORE: ClassVar[Any] = STORE

    async def populate(self, cx: Any, query: BoardsQuery) -> Sequence[Any]:
        return _ids_in(cx)

    def project(self, row: Board, principal: Any) -> Any:
        return PlainView(row.id, row.title, row.archived)


def _direct(stream: Any) -> bool:
    """Give ``stream`` a callback-mode subscriber whose caught-up deltas are
    written as they are put (a ``direct`` that takes each at no cost of its
    own: the pass's side of the fused write). A tree whose streams take no
    ``direct`` gets the waker alone (its puts queue and wake, as before);
    False then."""
    try:
        stream.set_waker(_noop, _taken)
    except TypeError:
        stream.set_waker(_noop)
        return False
    return True


def _noop() -> None:
    pass


def _taken(delta: object, revision: int) -> bool:
    return True


async def _measure(view: str, sessions: int, orgs: int, passes: int,
                   direct: bool = False) -> dict[str, float]:
    config = EngineConfig()
    runtime = RenderRuntime(
        _Db(_Pool()), config, ImpactChannel(1 << 16),  # type: ignore[arg-type]
        metrics=Metrics("bench", "render-pass"),
    )
    proj = Boards() if view == "boards" else Plain()
    runtime.registry.register_projector(proj)
    STORE.rows.clear()
    for o in range(orgs):
        for b in range(BOARDS_PER_ORG):
            board = Board(id=f"b{o}-{b}", org=f"o{o}", title="t0", owner="w")
            STORE.rows[board.id] = board
    streams = []
    gc.collect()
    tracemalloc.start()
    held_before = tracemalloc.get_traced_memory()[0]
    principals = [Principal(id=f"s{i}", actor=f"s{i}", org=f"o{i % orgs}",
                            roles=frozenset({"board:archive"})) for i in range(sessions)]
    for at in range(0, sessions, 100):  # in bursts, as sockets open
        streams.extend(await asyncio.gather(*(
            runtime.registry.attach(p, proj.NAME, WindowSpec(Query(BoardsQuery(100))))
            for p in principals[at:at + 100])))
    await asyncio.sleep(0)
    for stream in streams:
        while stream.get_nowait() is not None:
            pass
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] - held_before) / sessions
    tracemalloc.stop()
    if direct:
        for stream in streams:
            _direct(stream)
    keys = list(STORE.rows)
    gc.collect()
    gc.freeze()
    cpu = 0.0
    deltas = 0
    for n in range(passes + 20):
        key = keys[n % len(keys)]
        STORE.rows[key] = replace(STORE.rows[key], title=f"t{n + 1}")
        cause = Cause("board.renamed", {"board": key, "by": "w"})
        delivery = [Impact.entity("board", key, cause)]
        started = time.process_time()
        report = await runtime.render_pass([delivery])
        spent = time.process_time() - started
        if n >= 20:  # the first passes warm the caches
            cpu += spent
            deltas += report.deltas
        for stream in streams:
            while stream.get_nowait() is not None:
                pass
    gc.unfreeze()
    runtime.registry.end_all("done")
    return {
        "us_per_delta": cpu / max(deltas, 1) * 1e6,
        "us_per_pass": cpu / passes * 1e6,
        "deltas_per_pass": deltas / passes,
        "bytes_per_session": held,
    }


def _child(args: argparse.Namespace) -> None:
    out = {}
    for view in args.views.split(","):
        for orgs in [int(o) for o in args.orgs.split(",")]:
            out[f"{view}/{orgs}"] = asyncio.run(
                _measure(view, args.sessions, orgs, args.passes, args.direct))
    print(json.dumps(out))


def _run(tree: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    env = {**os.environ, "RENDER_PASS_TREE": tree, "PYTHONPATH": tree}
    command = [sys.executable, __file__, "--child", "--sessions", str(args.sessions),
               "--orgs", args.orgs, "--passes", str(args.passes), "--views", args.views,
               *(["--direct"] if args.direct else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr}")
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _best(runs: Iterable[Mapping[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = {}
    for run in runs:
        for cell, figures in run.items():
            if cell not in best or figures["us_per_delta"] < best[cell]["us_per_delta"]:
                best[cell] = figures
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--orgs", default="1,50")
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--views", default="boards,plain")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default="", help="another checkout to run beside this one")
    parser.add_argument("--direct", action="store_true",
                        help="every subscriber in callback mode, caught up: a tree with the "
                             "fused write takes each delta as it is put, one without wakes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    trees = {"this": TREE} | ({"before": args.before} if args.before else {})
    runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in trees}
    load = os.getloadavg()[0]
    for _ in range(args.rounds):
        for name in reversed(list(trees)):
            runs[name].append(_run(trees[name], args))
    best = {name: _best(found) for name, found in runs.items()}
    print(f"{args.sessions} sessions, {args.passes} passes, best of {args.rounds}; "
          f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
    header = (f"{'view / orgs':<12} {'tree':<7} {'us/delta':>9} {'us/pass':>10} "
              f"{'deltas/pass':>12} {'KB/session':>11}")
    print(header)
    for cell in best["this"]:
        for name in trees:
            f = best[name][cell]
            print(f"{cell:<12} {name:<7} {f['us_per_delta']:>9.2f} {f['us_per_pass']:>10.0f}"
                  f" {f['deltas_per_pass']:>12.1f} {f['bytes_per_session'] / 1024:>11.2f}")
        if "before" in best:
            ratio = best["before"][cell]["us_per_delta"] / best["this"][cell]["us_per_delta"]
            print(f"{'':<12} {'ratio':<7} {ratio:>8.2f}x")


if __name__ == "__main__":
    main()
