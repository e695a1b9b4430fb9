"""The one server-process helper every embedded server starts and stops with."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from service_engine.embedded import ServerProcess, free_port

LISTEN = """
import signal, socket, sys, time
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("listening", flush=True)
with socket.create_server(("127.0.0.1", int(sys.argv[1]))) as server:
    while True:
        time.sleep(1)
"""


def _args(port: int, term: str = "obey-term") -> list[str]:
    return [sys.executable, "-c", LISTEN, str(port), term]


def test_start_waits_for_the_port_and_stop_terminates(tmp_path: Path) -> None:
    """`start` returns once the port accepts, with the output in the log
    file; `stop` ends the process with SIGTERM; a second `stop` is a no-op."""
    process = ServerProcess("a listener")
    port = free_port()
    process.start(_args(port), log=tmp_path / "out.log", port=port, within=15)
    popen = process._popen
    assert process.running and popen is not None
    process.stop()
    assert not process.running
    assert popen.returncode == -signal.SIGTERM
    assert "listening" in (tmp_path / "out.log").read_text()
    process.stop()


def test_stop_kills_a_process_that_outlasts_the_grace(tmp_path: Path) -> None:
    """A process that ignores SIGTERM is killed once ``grace`` has passed."""
    process = ServerProcess("a stubborn listener", grace=0.2)
    port = free_port()
    process.start(_args(port, "ignore-term"), log=tmp_path / "out.log", port=port, within=15)
    popen = process._popen
    assert popen is not None
    process.stop()
    assert not process.running
    assert popen.returncode == -signal.SIGKILL


def test_kill_is_a_crash(tmp_path: Path) -> None:
    """`kill` SIGKILLs at once, and the helper can start the server again."""
    process = ServerProcess("a listener")
    port = free_port()
    process.start(_args(port), log=tmp_path / "out.log", port=port, within=15)
    popen = process._popen
    assert popen is not None
    process.kill()
    assert popen.returncode == -signal.SIGKILL and not process.running
    process.start(_args(port), log=tmp_path / "out.log", port=port, within=15)
    assert process.running
    process.stop()


def test_a_port_that_never_opens_names_the_server(tmp_path: Path) -> None:
    """A server that never accepts fails the start with a `RuntimeError`
    naming it; `stop` still ends the process."""
    process = ServerProcess("the silent server")
    script = "import time; time.sleep(60)"
    with pytest.raises(RuntimeError, match="the silent server"):
        process.start(
            [sys.executable, "-c", script], log=tmp_path / "out.log", port=free_port(), within=0.3
        )
    assert process.running
    process.stop()
    assert not process.running
