"""`embedded.free_port` under a worker's port range (the parallel battery)."""

from __future__ import annotations

import itertools
import socket

import pytest

from service_engine.embedded import PORT_RANGE_ENV, free_port
from service_engine.errors import ConfigError


def _listening() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_a_port_comes_from_the_range_and_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every port handed out lies in the range, skips the one bound in it,
    and a call never hands out the port the call before it did (other
    processes may hold some of the range: only the order is asserted)."""
    sock, port = _listening()
    with sock:
        low = max(1024, port - 2)
        monkeypatch.setenv(PORT_RANGE_ENV, f"{low}-{low + 5}")
        ports = [free_port() for _ in range(5)]
    assert all(low <= p <= low + 5 and p != port for p in ports)
    assert all(a != b for a, b in itertools.pairwise(ports))


def test_a_bound_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port something is bound to is never handed out."""
    sock, port = _listening()
    with sock:
        monkeypatch.setenv(PORT_RANGE_ENV, f"{port}-{port}")
        with pytest.raises(ConfigError, match="no free port left"):
            free_port()


@pytest.mark.parametrize("text", ["bad", "2000", "3000-2000", "80-90", "60000-70000"])
def test_a_malformed_range_is_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """A range that is not LO-HI within 1024-65535 is a ConfigError naming it."""
    monkeypatch.setenv(PORT_RANGE_ENV, text)
    with pytest.raises(ConfigError, match=PORT_RANGE_ENV):
        free_port()


def test_without_a_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    """No range: a port the kernel gave, bindable now."""
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
