"""The reference service and its twin are built only on the engine's public
surface: the package and the public sub-packages its docstring lists, no
test-support seam, no private module, nothing from the test batteries; and
the service's kernel and slice-agnostic modules name no slice."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import example_service
import example_twin
import service_engine
from example_service.slices import SLICES

PACKAGE = Path(example_service.__file__).parent
TWIN = Path(example_twin.__file__).parent

PUBLIC = frozenset({
    "service_engine",
    "service_engine.commands",
    "service_engine.embedded",
    "service_engine.graphql",
    "service_engine.persistence",
    "service_engine.props",
    "service_engine.server",
})
"""The engine modules a service may import: the root re-exports, the GraphQL
kit and its server, the persistence kit's helpers and the development infrastructure (the
list `service_engine`'s docstring gives)."""

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


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # the parent is no package
        return False


def test_the_service_and_the_twin_import_only_the_public_surface() -> None:
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


def test_the_public_list_is_the_packages_documented_list() -> None:
    doc = service_engine.__doc__ or ""
    for module in PUBLIC - {"service_engine"}:
        assert f"``{module}``" in doc, module
        __import__(module)


def test_the_kernel_register_and_graphql_name_no_slice() -> None:
    agnostic = [*sorted((PACKAGE / "kernel").rglob("*.py")),
                PACKAGE / "register.py", PACKAGE / "graphql.py"]
    for path in agnostic:
        for module in imported_modules(path, relative=True):
            assert module.lstrip(".").split(".")[:1] != ["slices"] or module.lstrip(".") == "slices", (
                path, module)
        text = path.read_text()
        for name in SLICES:
            assert f"slices.{name}" not in text and f"import {name}" not in text, (path, name)
