"""``bench/README.md`` holds today's figures, not a lab notebook.

It stays short (the history of every round is in git), it names every script
in ``bench/`` (how to run it and its latest figures), and every section that
code, configuration or docs cite by name (``bench/README.md, "Tails"``) is a
heading in it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
README = BENCH / "README.md"
MAX_LINES = 400

CITING = ["service_engine", "bench", "docs", "example_service", "pyproject.toml", "README.md"]
"""Where a section of the bench README may be cited by name."""

_CITATION = re.compile(r'bench/README\.md`{0,2},?\s*"([^"]+)"')


def scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py"))


def headings(text: str) -> list[str]:
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]


def citations(text: str) -> list[str]:
    """The section names cited as ``bench/README.md, "Name"`` in ``text``,
    read across line breaks and comment markers."""
    flat = re.sub(r"\s*\n\s*(#\s*)?", " ", text)
    return [" ".join(name.split()) for name in _CITATION.findall(flat)]


def citing_files() -> list[Path]:
    found: list[Path] = []
    for name in CITING:
        path = ROOT / name
        if path.is_file():
            found.append(path)
        else:
            found += sorted(p for p in path.rglob("*") if p.suffix in {".py", ".md", ".toml"})
    return found


def test_the_bench_readme_is_at_most_400_lines() -> None:
    """The README is today's figures and how to get them, at most 400 lines."""
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"bench/README.md has {len(lines)} lines (at most {MAX_LINES})"


def test_the_bench_readme_names_every_script() -> None:
    """Every script in ``bench/`` is named in the README (as ``name.py``)."""
    text = README.read_text()
    missing = [name for name in scripts() if f"`{name}`" not in text]
    assert not missing, "bench scripts the README does not name: " + ", ".join(missing)


def test_every_cited_section_of_the_bench_readme_is_a_heading() -> None:
    """A section cited elsewhere by name (a docstring, a comment in
    ``pyproject.toml``, a doc page) is the start of one of its headings."""
    known = headings(README.read_text())
    cited = {
        (str(path.relative_to(ROOT)), name)
        for path in citing_files()
        for name in citations(path.read_text())
    }
    assert cited, "no citation found: the scan itself is broken"
    dangling = sorted(
        f"{where}: {name!r}" for where, name in cited
        if not any(heading.startswith(name) for heading in known)
    )
    assert not dangling, "cited sections missing from bench/README.md:\n" + "\n".join(dangling)


def test_citations_are_read_across_lines_and_comments() -> None:
    """The scan itself: a name broken over lines, behind a comment marker or
    after a backquoted path is read whole; a bare mention cites nothing."""
    assert citations('(bench/README.md, "Back to\n    idle": RSS)') == ["Back to idle"]
    assert citations('# CPU (bench/README.md, "Back to idle on\n  # mimalloc")') == [
        "Back to idle on mimalloc"
    ]
    assert citations('(``bench/README.md``, "Tails")') == ["Tails"]
    assert citations('well under 200 MB (bench/README.md)."""') == []
