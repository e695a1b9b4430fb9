"""The run command's environment serves subscriptions.

``bash dev/serve`` installs the package with only the ``embedded`` extra
(``dev/bootstrap.sh embedded``) into a fresh ``.venv``. Without a WebSocket
library in that set uvicorn answers 404 on ``/graphql/ws``; this scenario
installs a copy of the tree exactly that way (uv links the packages from its
cache: seconds, once the cache holds them) and drives one live subscription
through the service it runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .harness import ADMIN, BOARDS_SUBSCRIPTION, REPO, Pods, create_board, key

INSTALL_BOUND = 600.0
"""The bound on installing the run command's environment (uv; downloads on a cold cache)."""

_SKIPPED = (".venv", ".data", ".git", "__pycache__", ".mypy_cache", ".ruff_cache",
            ".pytest_cache", "node_modules", "*.egg-info")


def _install_as_the_run_command(into: Path) -> Path:
    """Copy the tree to ``into`` and run ``dev/bootstrap.sh embedded`` there,
    as ``dev/serve`` does; the new environment's interpreter."""
    shutil.copytree(REPO, into, ignore=shutil.ignore_patterns(*_SKIPPED))
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(
        ["bash", "-c", 'source dev/bootstrap.sh embedded'], cwd=into, env=environ,
        capture_output=True, timeout=INSTALL_BOUND, check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    python = into / ".venv" / "bin" / "python"
    # Nothing of the test extra came along: the WebSocket library is there on its own merit.
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('pytest') is None)"],
        capture_output=True, check=True, timeout=60,
    )
    assert probe.stdout.strip() == b"True"
    return python


@pytest.mark.slow
@pytest.mark.timeout(INSTALL_BOUND + 180)
async def test_run_command_environment_serves_a_live_subscription(
    pods: Pods, tmp_path: Path
) -> None:
    """The environment ``dev/serve`` installs (the package and its ``embedded`` extra, nothing
    from the test extra) runs a service whose ``/graphql/ws`` accepts graphql-transport-ws and
    delivers a live subscription: the Reset, then the Upsert of a write. The service runs on
    mimalloc from that environment (`run_on_allocator`), and no other process does: its
    embedded Postgres and NATS run on their own allocators."""
    tree = tmp_path / "clone"
    python = await asyncio.to_thread(_install_as_the_run_command, tree)
    pod = await pods.spawn("fresh", command=[str(python), "-m", "example_service"], cwd=tree)
    async with pod.socket(ADMIN) as ws:
        await ws.init()
        await ws.subscribe("boards", BOARDS_SUBSCRIPTION)
        reset = (await ws.next("boards"))["boards"]
        assert (reset["__typename"], reset["revision"], reset["keys"]) == ("BoardsReset", 1, [])
        await create_board(pod, "b-fresh", "from a fresh clone")
        upsert = (await ws.next("boards"))["boards"]
        assert upsert["__typename"] == "BoardsUpsert"
        assert (upsert["revision"], upsert["key"]) == (2, key("b-fresh"))
        assert upsert["view"]["title"] == "from a fresh clone"
    assert _mapping(tree / ".venv", "libmimalloc") == [pod.process.pid]


def _mapping(venv: Path, library: str) -> list[int]:
    """The processes that map ``library`` from ``venv``."""
    found = []
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone, or not ours to read
            continue
        if any(library in line and str(venv) in line for line in text.splitlines()):
            found.append(int(maps.parent.name))
    return found
