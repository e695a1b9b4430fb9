"""The host's N pods behind one port (`run_pods`, `PodSlot`), with real child
processes: each child binds the parent's port through its slot and answers
with its index, so which pod took a connection is seen from outside."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from service_engine.errors import WorkerStopped
from service_engine.server import PodSlot, bind_listener, run_pods
from service_engine.server.host import write_addr_file

from ..support.harness import wait_until

# Spawns processes: started first in a parallel run.
pytestmark = pytest.mark.slow

POD = """
import os, socket, sys, time
from service_engine.server import PodSlot
from service_engine.server.host import write_addr_file

slot = PodSlot.from_env()
sock = slot.bind()
sock.listen(64)
write_addr_file(slot.ready_file, sock)
if slot.index == int(os.environ.get("POD_FAILS", "-1")):
    sys.exit(3)
while True:
    conn, _ = sock.accept()
    conn.sendall(f"{slot.index} {os.environ['SHARED']} {os.environ.get('SERVICE_ENGINE_POD_ID')}".encode())
    conn.close()
"""
"""A child pod: binds its slot, says it is ready, answers each connection
with its index, the environment the parent shared and its pod id."""


def _ask(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        return conn.recv(100).decode()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie is a stopped child
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    return False


def _pods_of(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children
            if "-c" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]


async def test_two_pods_serve_behind_one_port_and_stop_on_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run_pods` starts two children that each bind the parent's port
    through their `PodSlot`, calls ``on_ready`` once both are ready, shares
    its ``env`` and gives each a pod id of its own; connections reach both;
    on SIGTERM it stops them and returns."""
    monkeypatch.setenv("SERVICE_ENGINE_POD_ID", "host")
    sock = bind_listener("127.0.0.1:0", reuse_port=True)
    port = sock.getsockname()[1]
    ready = asyncio.Event()
    running = asyncio.create_task(run_pods(
        2, sock, [sys.executable, "-c", POD], state_dir=tmp_path, env={"SHARED": "yes"},
        on_ready=ready.set, stop_grace=10))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        answers = {await asyncio.to_thread(_ask, port) for _ in range(64)}
        assert answers == {"0 yes host-0", "1 yes host-1"}
        pods = _pods_of(os.getpid())
        assert len(pods) == 2
        os.kill(os.getpid(), signal.SIGTERM)  # run_pods holds the signal while it runs
        await asyncio.wait_for(running, 30)
        assert not any(_alive(pid) for pid in pods)
    finally:
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        sock.close()


async def test_a_pod_that_stops_stops_the_rest(tmp_path: Path) -> None:
    """A pod that exits on its own makes `run_pods` stop the others and
    raise `WorkerStopped` naming it and its exit code."""
    sock = bind_listener("127.0.0.1:0", reuse_port=True)
    seen: list[int] = []

    async def watch() -> None:
        await wait_until(lambda: len(_pods_of(os.getpid())) >= 1, timeout=60, what="pods")
        seen.extend(_pods_of(os.getpid()))

    watching = asyncio.create_task(watch())
    try:
        with pytest.raises(WorkerStopped, match=r"pod 1 \(exit code 3\)"):
            await asyncio.wait_for(run_pods(
                2, sock, [sys.executable, "-c", POD], state_dir=tmp_path,
                env={"SHARED": "x", "POD_FAILS": "1"}, stop_grace=10), 60)
        await watching
        assert seen and not any(_alive(pid) for pid in seen)
    finally:
        watching.cancel()
        sock.close()


def test_a_slot_is_read_from_the_environment(tmp_path: Path) -> None:
    """A process `run_pods` did not start has no slot; a child's slot is
    its index, the shared address and its ready file, which
    `write_addr_file` writes whole."""
    assert PodSlot.from_env({}) is None
    slot = PodSlot.from_env({"SERVICE_ENGINE_POD_INDEX": "1",
                             "SERVICE_ENGINE_POD_ADDR": "127.0.0.1:0",
                             "SERVICE_ENGINE_POD_READY_FILE": str(tmp_path / "ready")})
    assert slot == PodSlot(1, "127.0.0.1:0", tmp_path / "ready")
    sock = slot.bind()
    try:
        write_addr_file(slot.ready_file, sock)
        assert slot.ready_file.read_text() == f"127.0.0.1:{sock.getsockname()[1]}\n"
    finally:
        sock.close()
