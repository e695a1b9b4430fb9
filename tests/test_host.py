"""The host's address handling: parse an address, bind a listener for it."""

from __future__ import annotations

import socket

import pytest

from service_engine.server.host import bind_listener, parse_addr


def test_an_address_parses_to_host_and_port() -> None:
    """An address parses to host and port (an empty host is loopback, IPv6 in brackets); a malformed
    one is refused."""
    assert parse_addr("0.0.0.0:8000") == ("0.0.0.0", 8000)
    assert parse_addr(":9000") == ("127.0.0.1", 9000)
    assert parse_addr("[::1]:0") == ("::1", 0)
    for bad in ("8000x", "localhost", "host:port"):
        with pytest.raises(ValueError):
            parse_addr(bad)


def test_a_listener_binds_a_free_port_as_tcp() -> None:
    """bind_listener binds a free port on a socket declared TCP, so accepted connections get
    TCP_NODELAY."""
    sock = bind_listener("127.0.0.1:0")
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
        # asyncio sets TCP_NODELAY on accepted connections only when the
        # listener says TCP; without it keep-alive responses wait ~40 ms.
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
