"""Every test says, in its docstring, the property it proves.

The test functions of ``tests/`` and ``conformance/`` (module level or in a
class) are read with `ast`; one without a docstring fails the check. A
reader of a failing test learns what broke from its first line, not from
its body.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATTERIES = (ROOT / "tests", ROOT / "conformance")

KNOWN_TO_FILL: frozenset[str] = frozenset()
"""Files whose tests are being written elsewhere while this check lands: their
docstrings come with that work. Each entry must still hold a test without a
docstring, so the list only shrinks."""


def defs_of_tests(source: str) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The ``test*`` functions of a module's source, at any depth."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            yield node


def undocumented(source: str) -> list[str]:
    """The names of the test functions in ``source`` without a docstring."""
    return [node.name for node in defs_of_tests(source) if not (ast.get_docstring(node) or "").strip()]


def battery_files() -> list[Path]:
    return [path for battery in BATTERIES for path in sorted(battery.rglob("test_*.py"))]


def test_every_test_has_a_docstring() -> None:
    """Every test function in tests/ and conformance/ has a docstring, except
    in the files listed as known to fill."""
    missing = [
        f"{path.relative_to(ROOT)}::{name}"
        for path in battery_files()
        if str(path.relative_to(ROOT)) not in KNOWN_TO_FILL
        for name in undocumented(path.read_text())
    ]
    assert not missing, "tests without a docstring stating their property:\n" + "\n".join(missing)


def test_every_file_known_to_fill_still_needs_it() -> None:
    """A file leaves the known-to-fill list once its tests all have docstrings
    (or once it is gone), so the exemption cannot outlive its reason."""
    done = sorted(
        name for name in KNOWN_TO_FILL
        if not (ROOT / name).is_file() or not undocumented((ROOT / name).read_text())
    )
    assert not done, "remove from KNOWN_TO_FILL: " + ", ".join(done)


def test_the_scan_finds_tests_at_any_depth_and_skips_helpers() -> None:
    """The scan itself: module-level, async and class-held tests count, a
    docstring of whitespace is none, and helpers are not tests."""
    source = (
        "def test_a():\n    '''Holds.'''\n"
        "async def test_b():\n    pass\n"
        "class TestC:\n    def test_c(self):\n        '''  '''\n"
        "def helper():\n    pass\n"
    )
    assert undocumented(source) == ["test_b", "test_c"]
    assert battery_files(), "no test file found: the scan itself is broken"
