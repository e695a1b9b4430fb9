"""The conformance battery's shared fixtures are written once, in its conftest,
and its layout holds: test modules in one folder per flow (`FLOWS`), support
code in its ``support/`` package, no module over `MAX_LINES`.

A module that needs the database a fixture gives takes the fixture; it does
not define its own copy (which drifts: one scope, one template, one set of
migrations changed and not the others).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT / "conformance"
SHARED = ("store", "database", "db", "pg_server", "nats_server", "streams")
"""The fixtures `conformance/conftest.py` defines for the whole battery."""

SUPPORT = CONFORMANCE / "support"
MAX_LINES = 700
"""No conformance module is longer: a longer one is split by what it proves."""
TOP_LEVEL = frozenset({"__init__.py", "conftest.py"})
"""The modules at the top of conformance/ that are not test modules."""
FLOWS = frozenset({
    "write", "deliver", "integrate", "beat", "serve", "props", "reference", "faults", "blackbox",
})
"""The battery's test folders, one per flow (``ARCHITECTURE.md`` says which
holds what); ``blackbox/`` spawns the real service."""
NOT_TESTS = frozenset({"support", "migrations", "__pycache__"})
"""The folders of conformance/ that hold no test module."""

def fixture_definitions(source: str) -> list[str]:
    """The names of the functions decorated as pytest fixtures in ``source``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if ast.unparse(target) in {"pytest.fixture", "fixture"}:
                names.append(node.name)
    return names


def shared_copies() -> set[str]:
    """Every definition of a shared fixture outside conformance/conftest.py."""
    copies = set()
    for path in sorted(CONFORMANCE.rglob("*.py")):
        if path == CONFORMANCE / "conftest.py":
            continue
        for name in fixture_definitions(path.read_text()):
            if name in SHARED:
                copies.add(f"{path.relative_to(ROOT)}::{name}")
    return copies


def test_the_shared_fixtures_are_defined_in_the_conftest() -> None:
    """conformance/conftest.py defines every shared fixture."""
    defined = set(fixture_definitions((CONFORMANCE / "conftest.py").read_text()))
    assert set(SHARED) <= defined, sorted(set(SHARED) - defined)


def test_no_module_defines_its_own_copy_of_a_shared_fixture() -> None:
    """No other conformance module (the black-box conftest included) defines
    a fixture of a shared name."""
    copies = shared_copies()
    assert not copies, "define these once, in conformance/conftest.py: " + ", ".join(
        sorted(copies))


def test_the_scan_reads_plain_and_called_fixture_decorators() -> None:
    """The scan itself: ``@pytest.fixture`` and ``@pytest.fixture(...)`` mark a
    fixture, other decorators and plain functions do not."""
    source = (
        "import pytest\n"
        "@pytest.fixture\nasync def store(pg_server): ...\n"
        "@pytest.fixture(scope='session')\ndef pg_server(): ...\n"
        "@pytest.mark.slow\ndef test_x(): ...\n"
        "def db(): ...\n"
    )
    assert fixture_definitions(source) == ["store", "pg_server"]


def test_the_top_of_the_battery_holds_no_module_of_its_own() -> None:
    """The top of conformance/ holds its conftest and package marker only;
    every other module lives in conformance/support/ or a flow folder."""
    strays = sorted(
        path.relative_to(ROOT).as_posix()
        for path in CONFORMANCE.glob("*.py")
        if path.name not in TOP_LEVEL
    )
    assert not strays, "move into conformance/support/ or a flow folder: " + ", ".join(strays)


def test_the_battery_folders_are_the_flows() -> None:
    """Each folder of conformance/ is a flow (or support code, or the sample
    migrations), and a flow folder holds test modules only: its package
    marker and, for the black box, its conftest and harness aside."""
    folders = {path.name for path in CONFORMANCE.iterdir() if path.is_dir()}
    assert folders - NOT_TESTS == FLOWS
    strays = sorted(
        path.relative_to(ROOT).as_posix()
        for flow in sorted(FLOWS - {"blackbox"})
        for path in (CONFORMANCE / flow).glob("*.py")
        if not path.name.startswith("test_") and path.name != "__init__.py"
    )
    assert not strays, "move into conformance/support/: " + ", ".join(strays)


def test_the_support_package_holds_no_tests() -> None:
    """No module under conformance/support/ is a test module (pytest would
    collect it; its helpers belong beside the tests that share them)."""
    tests = sorted(p.relative_to(ROOT).as_posix() for p in SUPPORT.rglob("test_*.py"))
    assert (SUPPORT / "__init__.py").exists()
    assert not tests, "conformance/support/ holds test modules: " + ", ".join(tests)


def test_no_conformance_module_is_over_the_line_bound() -> None:
    """Every conformance module is at most `MAX_LINES` lines."""
    long = {
        path.relative_to(ROOT).as_posix()
        for path in CONFORMANCE.rglob("*.py")
        if len(path.read_text().splitlines()) > MAX_LINES
    }
    assert not long, f"split by what they prove (at most {MAX_LINES} lines): " + ", ".join(
        sorted(long))
