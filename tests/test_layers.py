"""The import graph of service_engine keeps its floors: arrows one way.

Every module under ``service_engine`` is parsed with `ast` (no import runs);
every import is an arrow, relative or absolute, at module level, inside a
function or under ``if TYPE_CHECKING:`` alike. The graph holds when

* no two modules reach each other (no cycle of any length);
* no two feature folders reach each other (the graph folded onto the
  folders of ``service_engine/``, a sub-folder counted as its folder);
* a module never imports a module on a higher floor (`FLOORS`).

`FLOORS` is the floor table, from the ground up: it places folders, and a
module only where a feature folder's model or staging sits below its loop;
extend it when a folder is added. A
module's floor is that of the longest prefix naming it (the bare package
name names only ``service_engine/__init__.py``); a module no prefix names
fails the test, so a new room has to be placed on purpose, and a prefix that
names no module or folder fails it too, so a room moved or removed leaves no
stale entry behind.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping, Set
from pathlib import Path

import pytest

PACKAGE = "service_engine"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("values", (
        "service_engine.clock",
        "service_engine.failures",
        "service_engine.config",
        "service_engine.readiness",
        "service_engine.metrics",
        "service_engine.resources",
        "service_engine.gates",
        "service_engine.supervisor",
        "service_engine.beat.component",
        "service_engine.logs",
        "service_engine.memory",
        "service_engine.principal_facts",
        "service_engine.blobs.sigv4",
        "service_engine.scopes.manifest",
        "service_engine.scopes.handshake_wire",
    )),
    ("adapters", (
        "service_engine.db",
        "service_engine.messaging.nats",
        "service_engine.beat.leader",
        "service_engine.embedded",
    )),
    ("impacts", ("service_engine.impacts",)),
    # What a transaction writes: a feature folder's model and staging sit
    # here, its loop on the loops floor.
    ("staging", (
        "service_engine.persistence",
        "service_engine.messaging",
        "service_engine.outbox.staging",
        "service_engine.outbox.gestures",
        "service_engine.scheduled.staging",
        "service_engine.offers.model",
        "service_engine.offers.staging",
        "service_engine.mirrors",
        "service_engine.blobs",
        "service_engine.lanes.accumulated",
    )),
    ("pipeline", ("service_engine.pipeline",)),
    ("commands", ("service_engine.commands",)),
    ("render", ("service_engine.render",)),
    ("loops", (
        "service_engine.outbox",
        "service_engine.scheduled",
        "service_engine.inbound",
        "service_engine.integration",
        "service_engine.beat",
        "service_engine.offers",
        "service_engine.mirrors.worker",
        "service_engine.mirrors.component",
        "service_engine.blobs.reaper",
        "service_engine.blobs.runtime",
        "service_engine.lanes",
        "service_engine.lanes.accumulated.runtime",
        "service_engine.lanes.accumulated.ingress",
        "service_engine.scopes",
        "service_engine.props",
        "service_engine.ops",
        "service_engine.erasure",
        "service_engine.preflight",
    )),
    ("engine", ("service_engine.engine",)),
    # The author's kit never imports the server that serves what it composed.
    ("kit", ("service_engine.graphql",)),
    ("surface", (
        "service_engine.server",
        "service_engine.testing",
        "service_engine.cli",
        "service_engine.__main__",
        "service_engine.errors",
        "service_engine",
    )),
]
"""Floors from the ground up; a module imports only its own floor and below."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _target(candidates: Iterable[str], modules: Iterable[str]) -> str | None:
    """The first of ``candidates`` that is a module (``from pkg import x``:
    the module ``pkg.x`` when there is one, else ``pkg``)."""
    known = set(modules)
    return next((name for name in candidates if name in known), None)


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module -> the service_engine modules it imports (itself excluded);
    parsed once per run."""
    modules = _modules()
    graph: dict[str, frozenset[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            imported: list[list[str]] = []
            if isinstance(node, ast.Import):
                imported = [[alias.name] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node)
                imported = [[f"{base}.{alias.name}", base] for alias in node.names]
            for candidates in imported:
                if candidates[-1].split(".")[0] != PACKAGE:
                    continue
                target = _target(candidates, modules)
                if target is not None and target != module:
                    edges.add(target)
        graph[module] = frozenset(edges)
    return graph


def floor_of(module: str) -> int:
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            named = module == prefix or (
                prefix != PACKAGE and module.startswith(prefix + ".")
            )
            if named and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    if best is None:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS")
    return best[1]


def folder_of(module: str) -> str:
    """The feature folder a module lives in: the folder of the package it is
    in (a package's __init__ is its folder), its sub-folders folded into it
    (the two lanes are rooms of ``lanes/``); the package for a top-level
    module."""
    path = _modules()[module]
    folder = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return ".".join(folder.split(".")[:2])


def find_cycle(graph: Mapping[str, Set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_every_module_is_on_a_floor() -> None:
    """A module no floor names is a room nobody placed."""
    for module in _modules():
        floor_of(module)


def names_something(prefix: str, modules: Iterable[str]) -> bool:
    """Whether a floor entry names a module or a folder of the package (the
    bare package name names its ``__init__``)."""
    return any(
        module == prefix or (prefix != PACKAGE and module.startswith(prefix + "."))
        for module in modules
    )


def test_every_floor_entry_names_a_module_or_folder() -> None:
    """Every prefix in `FLOORS` names an existing module or folder, and none
    is listed twice: a moved or deleted room cannot linger in the table."""
    modules = set(_modules())
    entries = [prefix for _, prefixes in FLOORS for prefix in prefixes]
    stale = [prefix for prefix in entries if not names_something(prefix, modules)]
    assert not stale, "floor entries naming nothing: " + ", ".join(stale)
    twice = sorted({prefix for prefix in entries if entries.count(prefix) > 1})
    assert not twice, "floor entries listed twice: " + ", ".join(twice)


def test_a_floor_entry_naming_nothing_is_caught() -> None:
    """The check itself: a folder and a module are named, a missing module or a
    bare prefix of a module's name (``service_engine.rend``) is not."""
    modules = {"service_engine", "service_engine.render.session", "service_engine.clock"}
    assert names_something("service_engine.render", modules)
    assert names_something("service_engine.clock", modules)
    assert names_something("service_engine", modules)
    assert not names_something("service_engine.view", modules)
    assert not names_something("service_engine.rend", modules)


def test_no_module_cycle() -> None:
    """No two modules import each other, directly or through others."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "module import cycle: " + " -> ".join(cycle or [])


def test_no_folder_cycle() -> None:
    """No feature folder imports a folder that imports it back. The package
    root (``service_engine/__init__.py`` and the top-level modules)
    re-exports the surface, so it is left out of the folded graph; a
    folder's sub-folders count as the folder (their modules still form no
    cycle: `test_no_module_cycle`)."""
    graph = import_graph()
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        src = folder_of(module)
        if src == PACKAGE:
            continue
        for target in targets:
            dst = folder_of(target)
            if dst != src and dst != PACKAGE:
                folders.setdefault(src, set()).add(dst)
    cycle = find_cycle(folders)
    assert cycle is None, "folder import cycle: " + " -> ".join(cycle or [])


def test_floors_point_down() -> None:
    """A module on a lower floor never imports a module on a higher one."""
    upward = [
        f"{module} ({FLOORS[floor_of(module)][0]}) -> {target} ({FLOORS[floor_of(target)][0]})"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if floor_of(target) > floor_of(module)
    ]
    assert not upward, "imports up a floor:\n" + "\n".join(upward)


def test_the_graph_sees_local_and_relative_imports() -> None:
    """The parser itself: a function-local import and a relative import are
    arrows (so a lazy import cannot hide a cycle)."""
    graph = import_graph()
    assert "service_engine.db.errors" in graph["service_engine.pipeline.run"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_sub_folder_counts_as_its_feature_folder() -> None:
    """The fold itself: a module of a lane is in ``lanes``, a top-level module
    in the package, a package's __init__ in its own folder."""
    assert folder_of("service_engine.lanes.presence.model") == "service_engine.lanes"
    assert folder_of("service_engine.lanes") == "service_engine.lanes"
    assert folder_of("service_engine.outbox.relay") == "service_engine.outbox"
    assert folder_of("service_engine.engine") == PACKAGE


@pytest.mark.parametrize("module", ["service_engine.inbound.dispatch"])
def test_dispatch_and_the_pull_loop_stay_apart(module: str) -> None:
    """The reaction runner never reaches the pull loop that feeds it."""
    assert "service_engine.inbound.consumer" not in import_graph()[module]
