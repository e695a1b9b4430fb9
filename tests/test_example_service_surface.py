"""The reference service and its twin are built only on the engine's public
surface: the package and the public sub-packages its docstring lists, no
test-support seam, no private module, nothing from the test batteries, and
on an engine only its public methods and documented attributes (never one
of its runtime parts: ``engine.blobs.config``, ``engine.render``); and the
service's kernel and slice-agnostic modules name no slice."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import example_service
import example_twin
import service_engine
from example_service.slices import SLICES
from service_engine import Engine

PACKAGE = Path(example_service.__file__).parent
TWIN = Path(example_twin.__file__).parent

PUBLIC = frozenset({
    "service_engine",
    "service_engine.blobs",
    "service_engine.commands",
    "service_engine.embedded",
    "service_engine.erasure",
    "service_engine.errors",
    "service_engine.graphql",
    "service_engine.integration",
    "service_engine.lanes",
    "service_engine.mirrors",
    "service_engine.offers",
    "service_engine.persistence",
    "service_engine.props",
    "service_engine.scopes",
    "service_engine.server",
})
"""The engine modules a service may import: the root re-exports, the
errors, the feature namespaces, the GraphQL kit and its server, the
persistence kit's helpers and the development infrastructure (the list
`service_engine`'s docstring gives)."""

TEST_ONLY = frozenset({"conformance", "tests", "bench"})


def imported_modules(path: Path, *, relative: bool = False) -> set[str]:
    """Absolute imports, or (``relative``) relative ones as ``.module``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and not relative:
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.level > 0) == relative:
            module = node.module or ""
            found.add("." * node.level + module if relative else module)
    return found


def engine_imports(path: Path) -> set[str]:
    """Every ``service_engine`` module ``path`` imports, at any depth
    (``TYPE_CHECKING`` blocks and function bodies included), a sub-module
    named in ``from service_engine import ...`` too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if _is_module(f"{node.module}.{alias.name}"))
    return {m for m in found if m.split(".")[0] == "service_engine"}


ENGINE_ATTRIBUTES = frozenset({"config", "db", "nats", "readiness", "metrics", "version"})
"""The engine's data attributes a service may read; every other one is a
runtime part of the engine (the render runtime, the blob runtime, the
lanes), whose shape is the engine's own business."""


def engine_surface() -> frozenset[str]:
    """What a service may touch on an `Engine`: its public methods and
    properties, and `ENGINE_ATTRIBUTES`."""
    public = {name for name in dir(Engine) if not name.startswith("_")}
    return frozenset(public) | ENGINE_ATTRIBUTES


def engine_attribute_uses(path: Path) -> set[str]:
    """Every attribute ``path`` reads on an engine, as ``line: name``: on a
    name ``engine``, a parameter annotated ``Engine``, a name assigned from
    an engine, or any ``<expr>.engine`` (``info.context.engine``)."""
    tree = ast.parse(path.read_text(), str(path))
    engines = {"engine"} | {
        node.arg for node in ast.walk(tree)
        if isinstance(node, ast.arg) and _names_engine_type(node.annotation)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_engine(node.value, engines):
            engines.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {
        f"{node.lineno}: {node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and _is_engine(node.value, engines)
    }


def _names_engine_type(annotation: ast.expr | None) -> bool:
    return (isinstance(annotation, ast.Name) and annotation.id == "Engine") or (
        isinstance(annotation, ast.Constant) and annotation.value == "Engine"
    )


def _is_engine(node: ast.expr, engines: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in engines
    return isinstance(node, ast.Attribute) and node.attr == "engine"


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # the parent is no package
        return False


def test_the_service_and_the_twin_import_only_the_public_surface() -> None:
    """The reference service and the twin import no test-only package and only the engine's public
    modules."""
    files = [*sorted(PACKAGE.rglob("*.py")), *sorted(TWIN.rglob("*.py"))]
    assert len(files) > 20
    outside: list[str] = []
    for path in files:
        for module in imported_modules(path):
            assert module.split(".")[0] not in TEST_ONLY, (path, module)
        outside += [f"{path.relative_to(PACKAGE.parent)} imports {m}"
                    for m in sorted(engine_imports(path) - PUBLIC)]
    assert outside == []


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    """The import check catches a private engine module imported plainly, by from-import or under
    TYPE_CHECKING."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "import service_engine.render.deltas\n"
        "from service_engine import Engine, clock\n"
        "if TYPE_CHECKING:\n"
        "    from service_engine.db.types import Conn\n"
    )
    assert engine_imports(probe) - PUBLIC == {
        "service_engine.render.deltas", "service_engine.db.types", "service_engine.clock",
    }


def test_the_service_and_the_twin_touch_only_the_engines_public_surface() -> None:
    """The reference service and the twin use only the Engine attributes of its public surface."""
    allowed = engine_surface()
    files = [*sorted(PACKAGE.rglob("*.py")), *sorted(TWIN.rglob("*.py"))]
    internal = [
        f"{path.relative_to(PACKAGE.parent)}:{use}"
        for path in files
        for use in sorted(engine_attribute_uses(path))
        if use.split(": ")[1] not in allowed
    ]
    assert internal == []


def test_the_check_sees_an_engine_internal(tmp_path: Path) -> None:
    """The attribute check finds every Engine attribute used (through a parameter, a context or an
    alias) and flags the internal ones."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def register(engine):\n"
        "    engine.register_projector(None)\n"
        "    if engine.blobs.config is not None:\n"
        "        engine.config.service\n"
        "async def resolve(info):\n"
        "    return info.context.engine.render.sessions\n"
        "def other(e: Engine):\n"
        "    kept = e\n"
        "    return kept.lanes, e.erase\n"
    )
    uses = engine_attribute_uses(probe)
    assert uses == {"2: register_projector", "3: blobs", "4: config", "6: render",
                    "9: lanes", "9: erase"}
    assert {u for u in uses if u.split(": ")[1] not in engine_surface()} == {
        "3: blobs", "6: render", "9: lanes",
    }


def test_the_public_list_is_the_packages_documented_list() -> None:
    """Each public module the check allows is named in the package's docstring and imports."""
    doc = service_engine.__doc__ or ""
    for module in PUBLIC - {"service_engine"}:
        assert f"``{module}``" in doc, module
        __import__(module)


def test_the_kernel_register_and_graphql_name_no_slice() -> None:
    """The reference service's kernel, register and graphql modules name no slice: slices plug in
    only through the slices package."""
    agnostic = [*sorted((PACKAGE / "kernel").rglob("*.py")),
                PACKAGE / "register.py", PACKAGE / "graphql.py"]
    for path in agnostic:
        for module in imported_modules(path, relative=True):
            assert module.lstrip(".").split(".")[:1] != ["slices"] or module.lstrip(".") == "slices", (
                path, module)
        text = path.read_text()
        for name in SLICES:
            assert f"slices.{name}" not in text and f"import {name}" not in text, (path, name)
