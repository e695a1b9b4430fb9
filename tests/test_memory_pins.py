"""The reference service's debug memory reports (`dev/memory_pins.py`):
what they name is what the process holds."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from dev import memory_pins

# Walks the whole heap for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow


class _Marker:
    """An object of a type nothing else in the process makes."""


def test_survivors_are_the_objects_made_between_the_marks_that_outlive_them(
    tmp_path: Path,
) -> None:
    """An object made after the first mark, alive at the second and still
    alive at the report, is listed; one made and dropped in between, or made
    before the first mark, is not."""
    before = _Marker()
    memory_pins.remember("mark")
    kept = [_Marker() for _ in range(3)]
    dropped = [_Marker() for _ in range(4)]
    memory_pins.remember("held")
    del dropped
    gc.collect()
    target = tmp_path / "survivors.txt"
    memory_pins.survivors_report(target)
    report = target.read_text()
    line = next(ln for ln in report.splitlines() if ln.endswith("test_memory_pins._Marker"))
    assert int(line.split()[0]) == len(kept), report
    assert before is not None


def test_cyclic_garbage_is_what_a_collection_frees() -> None:
    """`cyclic_garbage` returns the objects a full collection frees (a
    dropped reference cycle) and leaves the collector as it was."""
    gc.collect()
    cycle: list[object] = []
    cycle.append(cycle)
    marker = _Marker()
    cycle.append(marker)
    del cycle, marker
    found = memory_pins.cyclic_garbage()
    assert any(type(obj) is _Marker for obj in found)
    assert gc.get_debug() == 0
    assert not gc.garbage


def test_the_pin_report_finds_the_arenas_of_live_objects(tmp_path: Path) -> None:
    """The pool headers read for live objects name pymalloc arenas: the
    report finds at least the arenas of the interpreter's own objects and
    lists, among the sparse arenas, the objects that keep them."""
    target = tmp_path / "pins.txt"
    memory_pins.pin_report(target)
    first = target.read_text().splitlines()[0]
    arenas = int(first.split()[0])
    assert arenas > 0, first
    assert "whole scan" in target.read_text()
