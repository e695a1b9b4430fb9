"""Per-message deflate is off unless configured: a compressed socket keeps
zlib state per connection and deflates every small JSON frame."""

from __future__ import annotations

import pytest
from websockets.asyncio.client import connect

from service_engine.graphql import PASSPORT_HEADER

from .harness import ADMIN, BOUND, PROTOCOL, Pods

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

EXTENSIONS = "Sec-WebSocket-Extensions"


async def _negotiated(addr: str) -> str | None:
    """The extensions the service accepted for a client offering permessage-deflate."""
    async with connect(
        f"ws://{addr}/graphql/ws", subprotocols=[PROTOCOL], compression="deflate",
        additional_headers={PASSPORT_HEADER: ADMIN.to_header()}, open_timeout=BOUND,
    ) as ws:
        assert ws.response is not None
        return ws.response.headers.get(EXTENSIONS)


async def test_per_message_deflate_is_off_by_default_and_a_switch_turns_it_on(
    pods: Pods,
) -> None:
    """A client offering permessage-deflate gets a plain socket from a default pod, and a
    compressed one from a pod with ws_per_message_deflate on."""
    plain = await pods.spawn("plain")
    assert await _negotiated(plain.addr) is None
    deflating = await pods.spawn(
        "deflating", env={"SERVICE_ENGINE_WS_PER_MESSAGE_DEFLATE": "true"})
    accepted = await _negotiated(deflating.addr)
    assert accepted is not None and "permessage-deflate" in accepted
