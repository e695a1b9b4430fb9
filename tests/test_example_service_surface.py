"""The reference service is built only on the engine's public surface: no
test-support seam, no private module, nothing from the test batteries; and
its kernel and slice-agnostic modules name no slice."""

from __future__ import annotations

import ast
from pathlib import Path

import example_service
from example_service.slices import SLICES

PACKAGE = Path(example_service.__file__).parent

PUBLIC = frozenset({
    "service_engine",
    "service_engine.db",
    "service_engine.embedded",
    "service_engine.graphql",
    "service_engine.host",
    "service_engine.integration",
    "service_engine.persistence",
    "service_engine.view",
})
"""The engine modules a service may import: the root re-exports, the public
subpackages, the dev-infrastructure and host modules."""


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


def test_the_service_imports_only_the_public_surface() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        for module in imported_modules(path):
            top = module.split(".")[0]
            assert top not in {"conformance", "tests", "bench"}, (path, module)
            if top == "service_engine":
                assert module in PUBLIC, f"{path.relative_to(PACKAGE)} imports {module}"


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
