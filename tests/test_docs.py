"""The documentation cannot rot silently.

* Every relative link in ``README.md`` and ``docs/`` names a file that
  exists and, for a link to a heading of a docs page, a heading that does.
* Every engine name a page mentions in inline code exists: a dotted
  ``service_engine...`` path (a module or one of its attributes; else a
  table the engine's migrations create, a logger the engine names, or a
  literal the engine's source holds), ``Name.member`` for a public name of
  ``service_engine`` or its public sub-packages, ``Engine``'s and
  ``EngineConfig``'s members, and the verbs ``cx.<verb>`` of the handler and
  populate contexts.

No server, no network, no build: the files are read and the engine is
imported.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import service_engine
from service_engine import Bulk, Engine, EngineConfig, Erase, Mutation, Populate, Reaction

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PUBLIC = ("service_engine", "service_engine.errors", "service_engine.graphql",
          "service_engine.server", "service_engine.integration", "service_engine.lanes",
          "service_engine.blobs", "service_engine.offers", "service_engine.mirrors",
          "service_engine.erasure", "service_engine.scopes", "service_engine.commands",
          "service_engine.props", "service_engine.persistence")
CONTEXTS = (Mutation, Bulk, Reaction, Erase, Populate)
"""What a ``cx`` is, in a handler, an erasure or a populate."""

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"service_engine(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_MEMBER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def prose(path: Path) -> str:
    """The page without its fenced code blocks (examples quote the
    reference service, not the engine)."""
    return _FENCE.sub("", path.read_text(encoding="utf-8"))


def inline_code(path: Path) -> Iterator[str]:
    for span in _CODE.findall(prose(path)):
        yield span.strip()


def slug(heading: str) -> str:
    """The anchor MkDocs' toc extension gives a heading."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"[\s-]+", "-", text).strip("-")


def anchors(path: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", prose(path), re.M)}


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    """A relative link names an existing file (and an existing heading)."""
    broken = []
    for target in _LINK.findall(prose(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            continue  # an absolute URL (http:, mailto:) is not the repository's
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        missing_heading = (
            anchor and resolved.suffix == ".md" and resolved.exists()
            and anchor not in anchors(resolved)
        )
        if not resolved.exists() or missing_heading:
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: {broken}"


# -- names --------------------------------------------------------------------------


@cache
def engine_sql() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "migrations").glob("*.sql"))


@cache
def engine_source() -> str:
    return "\n".join(
        p.read_text(encoding="utf-8") for p in (ROOT / "service_engine").rglob("*.py")
    )


def resolves(dotted: str) -> bool:
    """``dotted`` is a module of the engine or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if isinstance(obj, type) and has_member(obj, name):
                obj = getattr(obj, name, None)
                continue
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def engine_names(dotted: str) -> bool:
    """``dotted`` is an engine object, table, logger or literal."""
    if resolves(dotted):
        return True
    table = dotted.removeprefix("service_engine.")
    if re.search(rf"\bTABLE\s+(IF NOT EXISTS\s+)?service_engine\.{table}\b", engine_sql(), re.I):
        return True
    return f'"{dotted}"' in engine_source()


def has_member(cls: type, name: str) -> bool:
    """``name`` is an attribute of ``cls``: on the class, annotated, or
    assigned to ``self`` in the source of one of its engine classes."""
    if hasattr(cls, name):
        return True
    for base in cls.__mro__:
        if name in getattr(base, "__annotations__", {}):
            return True
        if base.__module__.startswith("service_engine") and re.search(
            rf"\bself\.{name}\s*[:=]", inspect.getsource(base)
        ):
            return True
    return False


@cache
def public_names() -> dict[str, Any]:
    names: dict[str, Any] = {}
    for module_name in PUBLIC:
        module: ModuleType = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            names.setdefault(name, getattr(module, name))
    return names


def unknown_names(page: Path) -> list[str]:
    unknown = []
    for span in inline_code(page):
        head = re.split(r"[\s(\[{,=]", span, maxsplit=1)[0]
        if span.startswith("service_engine."):
            if _DOTTED.fullmatch(head):
                if not engine_names(head):
                    unknown.append(span)
            elif f'"{span}"' not in engine_source():  # a schema id, say
                unknown.append(span)
            continue
        member = _MEMBER.match(head)
        if member is None:
            continue
        owner, name = member.groups()
        if owner == "cx":
            if not any(has_member(cls, name) for cls in CONTEXTS):
                unknown.append(span)
        elif owner in ("engine", "Engine"):
            if not has_member(Engine, name):
                unknown.append(span)
        elif owner == "EngineConfig":
            if name not in EngineConfig.model_fields and not hasattr(EngineConfig, name):
                unknown.append(span)
        elif owner in public_names():
            obj = public_names()[owner]
            ok = has_member(obj, name) if isinstance(obj, type) else hasattr(obj, name)
            if not ok:
                unknown.append(span)
    return unknown


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_engine_name_a_page_mentions_exists(page: Path) -> None:
    """Each engine name in a page's inline code names something that exists."""
    unknown = unknown_names(page)
    assert not unknown, f"{page.relative_to(ROOT)} names what the engine lacks: {unknown}"


def test_the_checks_see_the_names() -> None:
    """The name check reads what it claims to: the pages mention engine
    names, and a misspelt one is caught."""
    mentioned = [s for p in pages() for s in inline_code(p) if s.startswith("service_engine.")]
    assert len(mentioned) > 50
    assert engine_names("service_engine.EngineConfig")
    assert engine_names("service_engine.person_erasure")  # a table of the engine
    assert not engine_names("service_engine.EngineConfg")
    assert has_member(Erase, "person") and not has_member(Erase, "persn")
    assert has_member(Engine, "register_projector") and not has_member(Engine, "register_view")
    assert service_engine.Projector.__name__ in public_names()
