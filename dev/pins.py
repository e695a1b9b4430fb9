"""The pinned dependency set: what `dev/pins.txt` holds and how it moves.

`dev/bootstrap.sh` installs from `dev/pins.txt`, so a fresh clone gets the
versions CI last ran. `dev/move-pins` moves them: it installs the newest
releases with the upper bounds of `pyproject.toml` lifted, runs the whole
suite on them, and only when it passes rewrites `dev/pins.txt` and each
bound to the next minor release after the one that passed.

    python dev/pins.py unbounded            # requirements without upper bounds
    python dev/pins.py write VENV           # pins and bounds from VENV's versions
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
PINS = ROOT / "dev" / "pins.txt"
HEADER = (
    "# The versions the whole suite last passed on (dev/move-pins writes this file;\n"
    "# dev/bootstrap.sh installs from it). Do not edit by hand.\n"
)


def declared() -> list[str]:
    """Every requirement string of the project: runtime, extras, build."""
    data = tomllib.loads(PYPROJECT.read_text())
    found = list(data["project"]["dependencies"])
    for extra in data["project"]["optional-dependencies"].values():
        found += [r for r in extra if not r.startswith("service-engine")]
    found += data["build-system"]["requires"]
    return found


def without_upper_bound(text: str) -> str:
    """``text`` with its ``<`` / ``<=`` specifiers removed."""
    req = Requirement(text)
    return spelled(req, [s for s in lower_bounds(req)])


def next_minor(version: Version) -> str:
    """The first release not yet tested: the next minor (``0.55.0`` -> ``0.56``)."""
    major, minor = (*version.release, 0)[:2]
    return f"{major}.{minor + 1}"


def bounded(text: str, installed: dict[str, Version]) -> str:
    """``text`` with its upper bound set just past the installed version."""
    req = Requirement(text)
    version = installed.get(canonical(req.name))
    if version is None:
        return text
    return spelled(req, [*lower_bounds(req), f"<{next_minor(version)}"])


def lower_bounds(req: Requirement) -> list[str]:
    return sorted(str(s) for s in req.specifier if s.operator not in ("<", "<="))


def spelled(req: Requirement, specifiers: list[str]) -> str:
    """``req`` written back as the project writes it: its specifiers in the
    order given, a marker after ``; `` in single quotes (TOML strings)."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    marker = f"; {str(req.marker).replace(chr(34), chr(39))}" if req.marker else ""
    return f"{req.name}{extras}{','.join(specifiers)}{marker}"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def freeze(venv: Path) -> dict[str, Version]:
    out = subprocess.run(
        [str(venv / "bin" / "uv"), "pip", "freeze", "--exclude-editable",
         "--python", str(venv / "bin" / "python")],
        check=True, capture_output=True, text=True,
    ).stdout
    pins: dict[str, Version] = {}
    for line in out.splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[canonical(name)] = Version(version)
    return pins


def write(venv: Path) -> None:
    installed = freeze(venv)
    PINS.write_text(HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(installed.items())))
    text = PYPROJECT.read_text()
    for requirement in declared():
        # Rewrite each quoted requirement in place, comments and order kept.
        text = text.replace(f'"{requirement}"', f'"{bounded(requirement, installed)}"', 1)
    PYPROJECT.write_text(text)


def main(argv: list[str]) -> int:
    if argv[:1] == ["unbounded"]:
        print("\n".join(without_upper_bound(r) for r in declared()))
        return 0
    if len(argv) == 2 and argv[0] == "write":
        write(Path(argv[1]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
