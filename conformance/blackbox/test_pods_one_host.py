"""N pods on one host: ``python -m example_service --pods 2`` behind one port.

The parent binds the port with SO_REUSEPORT and spawns two children, each a
whole pod (its own engine, listener and sessions) bound to the same port.
Observed only through the public port: which pod answered is read from its
``/metrics`` (every series carries the ``pod`` label), a fresh connection
per request so the kernel spreads them.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import httpx
import pytest

from service_engine.graphql import PASSPORT_HEADER
from service_engine.server import bind_listener

from .harness import ADMIN, BOARDS_SUBSCRIPTION, RENAME, Pod, Pods, create_board, key

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

SOCKETS = 16
"""Sockets opened: the kernel hashes each connection to one of the two
listeners, so all 16 landing on one pod has probability 2**-15."""
SCRAPES = 64
"""Fresh connections tried to reach both pods' /metrics."""

_LIVE = "service_engine_live_sessions"
_COMMITTED = "service_engine_impacts_committed_total"
_SERIES = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


async def _scrape_both(pod: Pod) -> dict[str, str]:
    """Each pod's /metrics text, by its pod label, over fresh connections."""
    found: dict[str, str] = {}
    for _ in range(SCRAPES):
        async with httpx.AsyncClient(base_url=pod.url, timeout=10) as http:
            text = (await http.get("/metrics", headers={"Connection": "close"})).text
        labels = set(re.findall(r'pod="([^"]+)"', text))
        for label in labels:
            found[label] = text
        if len(found) >= 2:
            return found
    raise AssertionError(f"only pods {sorted(found)} answered {SCRAPES} fresh connections")


def _by_pod(metric: str, texts: dict[str, str], **match: str) -> dict[str, float]:
    """``metric`` summed per pod over the series matching ``match``, each
    pod's figures from its own /metrics."""
    out: dict[str, float] = {}
    for label, text in texts.items():
        for name, labels, value in _SERIES.findall(text):
            found = dict(_LABEL.findall(labels))
            if name == metric and found.get("pod") == label and all(
                    found.get(k) == v for k, v in match.items()):
                out[label] = out.get(label, 0.0) + float(value)
    return out


@pytest.mark.timeout(180)
async def test_two_pods_behind_one_port_both_serve(pods: Pods, tmp_path: Path) -> None:
    """Two processes behind one port both serve: sockets land on both (each
    pod holds live sessions of its own), and a write served by either pod
    reaches every subscriber on both."""
    pod = await pods.spawn("two", env={"EXAMPLE_SERVICE_PODS": "2",
                                       "EXAMPLE_SERVICE_DATA": str(tmp_path / "data")})
    await create_board(pod, "b-pods", "start")
    async with contextlib.AsyncExitStack() as stack:
        sockets = [await stack.enter_async_context(pod.socket(ADMIN)) for _ in range(SOCKETS)]
        for ws in sockets:
            await ws.init()
            await ws.subscribe("boards", BOARDS_SUBSCRIPTION)
            reset = (await ws.next("boards"))["boards"]
            assert reset["__typename"] == "BoardsReset" and key("b-pods") in reset["keys"]
        live = _by_pod(_LIVE, await _scrape_both(pod), projector="boards")
        assert len(live) == 2, live
        assert all(count >= 1 for count in live.values()), f"a pod holds no session: {live}"
        assert sum(live.values()) == SOCKETS, live

        served: set[str] = set()
        for n in range(12):  # fresh connections: writes land on both pods
            before = _by_pod(_COMMITTED, await _scrape_both(pod))
            async with httpx.AsyncClient(base_url=pod.url, timeout=10) as http:
                response = await http.post(
                    "/graphql", json={"query": RENAME, "variables": {"id": "b-pods",
                                                                     "title": f"w{n}"}},
                    headers={PASSPORT_HEADER: ADMIN.to_header(), "Connection": "close"})
            assert response.json()["data"]["renameBoard"]["success"], response.text
            after = _by_pod(_COMMITTED, await _scrape_both(pod))
            served |= {p for p in after if after[p] > before.get(p, 0.0)}
            for ws in sockets:  # every subscriber, on either pod, gets the write
                upsert = (await ws.next("boards"))["boards"]
                assert upsert["__typename"] == "BoardsUpsert", upsert
                assert upsert["view"]["title"] == f"w{n}"
            if len(served) == 2 and n >= 1:
                break
        assert len(served) == 2, f"every write was served by {served}"


def test_bind_listener_reuse_port_shares_one_port() -> None:
    """``bind_listener(addr, reuse_port=True)`` lets a second socket bind the
    port a first one holds (both listen; the kernel spreads connections);
    without it the second bind is refused."""
    first = bind_listener("127.0.0.1:0", reuse_port=True)
    try:
        addr = f"127.0.0.1:{first.getsockname()[1]}"
        second = bind_listener(addr, reuse_port=True)
        try:
            first.listen()
            second.listen()
        finally:
            second.close()
        with pytest.raises(OSError):
            bind_listener(addr).close()
    finally:
        first.close()
