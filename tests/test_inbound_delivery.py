"""The inbound loop reads a frame's delivery count and stored time from its
JetStream ack subject itself; it must read what nats-py's ``Msg.metadata``
reads, for both ack subject layouts, and refuse what it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from service_engine.messaging.nats import delivery_of


def _metadata(reply: str) -> tuple[int, object] | None:
    try:
        meta = Msg(None, subject="s", reply=reply, data=b"", headers=None).metadata  # type: ignore[arg-type]
    except (NotJSMessageError, ValueError, OverflowError, OSError):
        return None
    return meta.num_delivered, meta.timestamp


V1 = "$JS.ACK.INTEGRATION_CMD.orders-place_order.{d}.12345.6789.{ts}.12"
V2 = "$JS.ACK.{domain}.ACCHASH.INTEGRATION_CMD.orders-place_order.{d}.12345.6789.{ts}.12{tail}"


@pytest.mark.parametrize(
    "reply",
    [
        V1.format(d=1, ts=1764601234123456789),
        V1.format(d=7, ts=0),
        V2.format(domain="_", d=3, ts=1764601234123456789, tail=""),
        V2.format(domain="hub", d=2, ts=1764601234000000000, tail=".r4nd0m"),
    ],
)
def test_delivery_is_what_nats_py_reads(reply: str) -> None:
    """Both layouts: the same delivery count and the same aware timestamp."""
    assert delivery_of(reply) == _metadata(reply)
    assert delivery_of(reply) is not None


@pytest.mark.parametrize(
    "reply",
    [None, "", "_INBOX.abc.1", "$JS.ACK.a.b.1.2.3", "$JS.NAK.S.C.1.2.3.4.5",
     V1.format(d="x", ts=1), V1.format(d=1, ts="soon")],
)
def test_a_reply_that_is_no_ack_subject_has_no_delivery(reply: str | None) -> None:
    """Not a JetStream frame (or a malformed one): None, never an exception."""
    assert delivery_of(reply) is None


@given(
    st.sampled_from([V1, V2]),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=4 * 10**18),
    st.sampled_from(["_", "hub"]),
    st.sampled_from(["", ".tok"]),
)
def test_delivery_agrees_with_nats_py_on_every_ack_subject(
    layout: str, delivered: int, stamp: int, domain: str, tail: str
) -> None:
    """Any delivery count and stored time, either layout: read as nats-py reads it."""
    reply = layout.format(d=delivered, ts=stamp, domain=domain, tail=tail)
    assert delivery_of(reply) == _metadata(reply)


@given(st.lists(st.text(alphabet="$JSACK_abc0123456789-", max_size=12), max_size=13))
def test_delivery_never_reads_what_nats_py_refuses(tokens: list[str]) -> None:
    """Any dotted subject: read the same as nats-py, or refused by both."""
    reply = ".".join(tokens)
    ours = delivery_of(reply)
    if ours is not None:
        assert ours == _metadata(reply)
