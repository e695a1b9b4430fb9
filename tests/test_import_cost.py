"""What a process imports before it does anything: ``import service_engine``
loads no engine module (the root exports lazily, PEP 562), the operator CLI
imports per command, and the reference service's first process (the one
`run_on_allocator` executes again) loads none of the service.

Each check runs a fresh interpreter and reads its ``sys.modules``; the
root's lazy table is held to its ``TYPE_CHECKING`` imports by parsing."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import service_engine

ROOT = Path(__file__).resolve().parent.parent

HEAVY = (
    "service_engine.config", "service_engine.db", "service_engine.pipeline",
    "service_engine.integration", "service_engine.engine", "service_engine.metrics",
    "service_engine.commands", "service_engine.graphql", "service_engine.server",
    "asyncpg", "nats", "pydantic", "opentelemetry", "strawberry",
)
"""Modules an operator's ``--help`` or a pod's first process never needs."""


def loaded_modules(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``
    (``SystemExit`` included: a CLI exits)."""
    script = (
        "import json, sys\n"
        f"try:\n    exec({code!r})\nexcept SystemExit:\n    pass\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SERVICE_ENGINE_", "DATABASE_URL", "NATS_URL"))}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(done.stderr.splitlines()[-1]))


def heavy(modules: set[str], *, allowed: tuple[str, ...] = ()) -> list[str]:
    """The `HEAVY` modules (and their sub-modules) among ``modules``, but ``allowed``."""
    return sorted(m for m in modules for h in HEAVY
                  if (m == h or m.startswith(h + ".")) and h not in allowed)


def run_cli(*args: str) -> str:
    return ("import runpy, sys\n"
            f"sys.argv = ['service_engine', *{list(args)!r}]\n"
            "runpy.run_module('service_engine', run_name='__main__', alter_sys=True)\n")


def test_the_lazy_table_is_the_type_checking_imports() -> None:
    """Each name of the root's ``__all__`` is in its lazy table under the
    module its ``TYPE_CHECKING`` import names, and nothing else is."""
    tree = ast.parse((ROOT / "service_engine" / "__init__.py").read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    imported = {
        alias.name: "." * node.level + (node.module or "")
        for node in guarded.body if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == service_engine._EXPORTS
    assert set(imported) == set(service_engine.__all__)


def test_importing_the_root_loads_no_engine_module() -> None:
    """``import service_engine`` loads the root alone; a name is imported on
    first use and is the object its module defines."""
    modules = loaded_modules("import service_engine")
    assert sorted(m for m in modules if m.startswith("service_engine.")) == []
    from service_engine.render.projector import Projector
    assert service_engine.Projector is Projector
    assert "Projector" in dir(service_engine)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = service_engine.Nothing


@pytest.mark.parametrize("args", [
    ["--help"], ["migrate", "--help"], ["check-config", "--help"], ["ready", "--help"],
    ["dead-letters", "list", "--help"], ["dead-letters", "retry", "--help"],
    ["outbox", "status", "--help"],
])
def test_a_help_page_loads_none_of_the_engine(args: list[str]) -> None:
    """The CLI's help pages load neither the engine's pipeline, database,
    configuration, NATS nor their libraries: each command imports what it
    runs on when it runs."""
    modules = loaded_modules(run_cli(*args))
    assert "service_engine.cli.commands" in modules
    assert heavy(modules) == []


def test_check_config_loads_the_configuration_alone() -> None:
    """``check-config`` (no DATABASE_URL to check) loads the configuration
    and pydantic, and no database driver, pipeline or metrics."""
    modules = loaded_modules(run_cli("check-config", "--json"))
    assert "service_engine.config" in modules
    assert heavy(modules, allowed=("service_engine.config", "pydantic")) == []


def test_the_reference_service_first_process_loads_no_service() -> None:
    """Importing ``example_service.__main__`` (what runs before
    `run_on_allocator` executes the process again) loads none of the engine
    beyond the allocator's module."""
    modules = loaded_modules("import example_service.__main__")
    assert heavy(modules) == []
    assert sorted(m for m in modules if m.startswith("service_engine.")) == [
        "service_engine.failures", "service_engine.memory"]
