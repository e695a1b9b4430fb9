"""What an idle session keeps, held small without changing what it does: a
passport's shared strings and empty claims (`passport.parse_passport`), the
endpoint's deadlines in one timer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.frames import Close as CloseFrame
from websockets.frames import Frame, Opcode

from service_engine.server.passport import Passport, parse_passport


def _handshake(conn: Any) -> None:
    from websockets.http11 import Request

    conn.receive_data(
        b"GET /graphql/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    [request] = conn.events_received()
    assert isinstance(request, Request)
    conn.send_response(conn.accept(request))
    conn.data_to_send()


def _frames() -> bytes:
    messages = [Frame(Opcode.TEXT, json.dumps({"type": "ping", "n": i, "pad": "x" * (i * 50)}).encode())
                for i in range(6)]
    messages.insert(3, Frame(Opcode.PING, b"p"))
    messages.insert(4, Frame(Opcode.TEXT, b"part", fin=False))
    messages.insert(5, Frame(Opcode.CONT, b"-end"))
    messages.append(Frame(Opcode.CLOSE, CloseFrame(1000, "bye").serialize()))
    return b"".join(frame.serialize(mask=True) for frame in messages)


def _header(**document: Any) -> str:
    return json.dumps({"v": 1, **document})


def test_passports_share_their_org_roles_kind_and_empty_claims() -> None:
    """Two sockets' passports of one org hold one string per org, role and
    kind, and one empty claims mapping; claims given are kept, read-only."""
    one = parse_passport(_header(sub="u-1", org="".join(["ac", "me"]), roles=["board:" + "archive"]))
    two = parse_passport(_header(sub="u-2", org="".join(["a", "cme"]), roles=["board:arc" + "hive"]))
    assert one.org == two.org == "acme" and one.org is two.org
    assert one.roles == two.roles == ("board:archive",) and one.roles[0] is two.roles[0]
    assert one.kind is two.kind
    assert dict(one.claims) == {} and one.claims is two.claims
    assert Passport(sub="x").claims is one.claims
    with pytest.raises(TypeError):
        one.claims["x"] = 1  # type: ignore[index]

    with_claims = parse_passport(_header(sub="u-3", org=None, tenant="t-9"))
    assert with_claims.org is None
    assert dict(with_claims.claims) == {"tenant": "t-9"}
    assert with_claims.claims is not one.claims
    assert parse_passport(with_claims.to_header()) == with_claims


class _Waiter:
    """A socket stand-in: records when its deadline came, may wait again."""

    def __init__(self, deadlines: Any, loop: asyncio.AbstractEventLoop,
                 again: float | None = None) -> None:
        self.deadlines, self.loop, self.again = deadlines, loop, again
        self.called: list[float] = []
        self.event = asyncio.Event()

    def _on_timer(self) -> None:
        self.called.append(self.loop.time())
        self.event.set()
        if self.again is not None:
            at, self.again = self.loop.time() + self.again, None
            self.deadlines.add(self, at)


async def test_the_endpoint_deadlines_call_each_socket_at_its_own_with_one_timer() -> None:
    """`wire_deadlines.DeadlineWheel`: every socket is called once its deadline passed
    (never before, within a few `TICK`s after), the loop holds one timer for
    them all, a removed socket is not called, a socket that waits again
    from inside a call is called again at its new deadline (also when an
    earlier step is still pending), and once idle the tables are emptied."""
    from service_engine.server.wire_deadlines import TICK, DeadlineWheel

    loop: Any = asyncio.get_running_loop()
    deadlines = DeadlineWheel(loop)
    now = loop.time()
    late = _Waiter(deadlines, loop)
    early = _Waiter(deadlines, loop, again=0.15)
    removed = _Waiter(deadlines, loop)
    middle = _Waiter(deadlines, loop)
    at = {late: now + 0.3, early: now + 0.02, removed: now + 0.05, middle: now + 0.1}
    steps = {waiter: deadlines.add(waiter, when) for waiter, when in at.items()}
    deadlines.remove(removed, steps[removed])
    mine = [h for h in loop._scheduled if not h.cancelled()
            and getattr(h._callback, "__self__", None) is deadlines]
    assert len(mine) == 1
    await asyncio.wait_for(late.event.wait(), 5)  # the last deadline (early's second is sooner)
    assert len(early.called) == 2
    assert removed.called == []
    for waiter in (late, middle):
        assert len(waiter.called) == 1
        assert at[waiter] <= waiter.called[0] < at[waiter] + 5 * TICK + 0.05
    assert early.called[0] >= at[early] and early.called[1] >= early.called[0] + 0.15
    assert deadlines._steps == {} and deadlines._heap == []
