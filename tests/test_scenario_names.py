"""Every conformance test states the property it proves, and a test that
proves a numbered scenario carries the number in its name."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

CONFORMANCE = Path(__file__).resolve().parent.parent / "conformance"
SCENARIO = re.compile(r"\b(s\d{3}|bb\d{2})\b")


def scenario_tests() -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every ``test_*`` function (module level or in a class) of every
    conformance test file, with its file's path relative to conformance/."""
    for path in sorted(CONFORMANCE.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                yield str(path.relative_to(CONFORMANCE)), node


def named_scenarios(docstring: str) -> set[str]:
    return set(SCENARIO.findall(docstring))


def problems() -> list[str]:
    found = []
    for where, node in scenario_tests():
        docstring = ast.get_docstring(node)
        if not docstring or not docstring.strip():
            found.append(f"{where}::{node.name} has no docstring stating its property")
            continue
        carried = set(node.name.split("_"))
        missing = sorted(named_scenarios(docstring) - carried)
        if missing:
            found.append(f"{where}::{node.name} proves {', '.join(missing)} but its name does not say so")
    return found


def test_the_check_sees_the_conformance_battery() -> None:
    """The scenario check reads the whole conformance battery (over 100 tests, black-box ones
    included)."""
    names = {node.name for _, node in scenario_tests()}
    assert len(names) > 100
    assert any(name.startswith("test_bb") for name in names)


def test_every_conformance_test_states_its_property_and_carries_its_scenarios() -> None:
    """Every conformance test has a docstring, and a test proving a numbered scenario carries its
    number in its name."""
    assert problems() == []


def test_the_check_reads_scenario_numbers_as_whole_words() -> None:
    """Scenario numbers are read as whole words (s129, bb03), not as parts of longer tokens."""
    assert named_scenarios("s129 (engine level) and bb03; not s12 nor ss1290 nor xbb031") == {"s129", "bb03"}
    assert named_scenarios("s162-s168") == {"s162", "s168"}
