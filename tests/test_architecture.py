"""``ARCHITECTURE.md`` stays true to the tree it maps.

Every path it names in inline code exists (a path with a slash from the
repository root or from ``service_engine/``; a bare file name as a module
somewhere in ``service_engine/``), and every folder of ``service_engine/``
is named in it, so a folder added, moved or removed shows up here first.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "service_engine"
MAP = ROOT / "ARCHITECTURE.md"

_CODE = re.compile(r"`([^`\n]+)`")
_PATHLIKE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$")
_SUFFIXES = (".py", ".md", ".sql", ".toml", ".yml", ".yaml", ".json")


def named_paths(text: str) -> list[str]:
    """The inline-code spans that name a file or folder: a span with a slash
    (not a URL route such as ``/readyz``) or a bare file name."""
    spans = (span.strip() for span in _CODE.findall(text))
    return [
        span for span in spans
        if _PATHLIKE.match(span) and ("/" in span or span.endswith(_SUFFIXES))
    ]


def exists(path: str) -> bool:
    if "/" in path:
        return any((base / path).exists() for base in (ROOT, PACKAGE))
    return any(p.name == path for p in PACKAGE.rglob(path))


def folders() -> list[str]:
    """Every folder of ``service_engine/``, from it, with a trailing slash."""
    return sorted(
        f"{path.relative_to(PACKAGE).as_posix()}/"
        for path in PACKAGE.rglob("*")
        if path.is_dir() and path.name != "__pycache__"
    )


def test_every_path_the_map_names_exists() -> None:
    """A file or folder named in ARCHITECTURE.md is in the tree."""
    names = named_paths(MAP.read_text())
    assert names, "no path found: the scan itself is broken"
    missing = sorted({name for name in names if not exists(name)})
    assert not missing, "ARCHITECTURE.md names paths that do not exist: " + ", ".join(missing)


def test_every_folder_of_the_package_is_on_the_map() -> None:
    """Each folder of service_engine/ is named (as ``folder/`` or a module in it)."""
    names = named_paths(MAP.read_text())
    unnamed = [
        folder for folder in folders()
        if not any(name == folder or name.startswith(folder) for name in names)
    ]
    assert not unnamed, "folders of service_engine/ ARCHITECTURE.md does not name: " + ", ".join(unnamed)


def test_the_scan_reads_paths_and_skips_the_rest() -> None:
    """The scan itself: paths with a slash and bare file names count; a URL
    route, a call, a dotted name or a name with spaces does not."""
    text = "`render/session.py` `db/` `errors.py` `/readyz` `cx.load` `Engine._beat` `a b/c`"
    assert named_paths(text) == ["render/session.py", "db/", "errors.py"]
    assert exists("render/session.py") and exists("errors.py") and exists("tests/")
    assert not exists("view.py") and not exists("render/view.py")
