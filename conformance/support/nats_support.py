"""Reading what actually reached a JetStream stream, with a raw client the
engine does not own, and the small NATS fixtures the integration tests share."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from service_engine.embedded import INTEGRATION_STREAMS, EmbeddedNats, wait_for_port
from service_engine.messaging.nats import Nats, open_nats


@dataclass(frozen=True, slots=True)
class StoredMessage:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


async def stream_messages(url: str, stream: str) -> list[StoredMessage]:
    """Every message stored in ``stream``, in stream order."""
    client = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = client.jetstream()
        info = await js.stream_info(stream)
        out = []
        if info.state.messages:
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(stream, seq)
                out.append(StoredMessage(seq, msg.subject or "", msg.data or b"", dict(msg.headers or {})))
        return out
    finally:
        await client.close()


async def stream_count(url: str, stream: str) -> int:
    """How many messages ``stream`` holds."""
    client = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        info = await client.jetstream().stream_info(stream)
        return int(info.state.messages)
    finally:
        await client.close()


async def set_stream(url: str, name: str, **config: object) -> None:
    """Redeclare integration stream ``name`` with extra ``config`` (an
    operator's change: a size limit, a max_age)."""
    client = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        await client.jetstream().update_stream(
            StreamConfig(name=name, subjects=INTEGRATION_STREAMS[name], **config)  # type: ignore[arg-type]
        )
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def engine_nats(
    server: EmbeddedNats, publish_ack_timeout: timedelta = timedelta(seconds=1)
) -> AsyncIterator[Nats]:
    conn = await open_nats(server.url, publish_ack_timeout=publish_ack_timeout, ping_interval=1)
    try:
        yield conn
    finally:
        await conn.aclose()


def _spawn_core_server(port: int, data_dir: Path) -> subprocess.Popen[bytes]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "core.log", "ab") as log:
        process = subprocess.Popen(
            [EmbeddedNats.binary(), "-a", "127.0.0.1", "-p", str(port)],
            stdout=log, stderr=log, start_new_session=True,
        )
    wait_for_port(port, 15, "nats-server (core)")
    return process


@contextlib.asynccontextmanager
async def core_nats_without_jetstream(port: int, data_dir: Path) -> AsyncIterator[None]:
    """A plain nats-server (no JetStream) on ``port``: a connected broker whose
    JetStream cannot answer."""
    process = await asyncio.to_thread(_spawn_core_server, port, data_dir)
    try:
        yield
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 10)


class SubjectTap:
    """Every message published on a subject, seen by a plain core NATS
    subscriber the engine does not own: each publish attempt a client makes
    (a JetStream publish is a core publish with a reply inbox), whether or
    not a stream stores or refuses it. ``seen`` holds their Nats-Msg-Id
    headers (or "" for a message without one), in arrival order."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def count(self, message_id: str | None = None) -> int:
        """How many attempts arrived (of ``message_id`` when given)."""
        if message_id is None:
            return len(self.seen)
        return self.seen.count(message_id)

    async def record(self, msg: Msg) -> None:
        self.seen.append((msg.headers or {}).get("Nats-Msg-Id", ""))


@contextlib.asynccontextmanager
async def tapped(url: str, subject: str) -> AsyncIterator[SubjectTap]:
    """A `SubjectTap` on ``subject`` (wildcards allowed) of the server at
    ``url``, subscribed (and flushed, so no later publish is missed) before
    the block runs."""
    tap = SubjectTap()
    client = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        await client.subscribe(subject, cb=tap.record)
        await client.flush()
        yield tap
    finally:
        await client.close()
