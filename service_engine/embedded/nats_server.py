"""`EmbeddedNats`, a real ``nats-server -js`` (`EmbeddedNatsCluster`, three
routed into one), and what operators declare on it: the integration
streams, a lane's stream, the presence bucket, the key-value buckets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..failures import ConfigError
from .process import ServerProcess, free_port, server_binary

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import StreamConfig


INTEGRATION_STREAMS: dict[str, list[str]] = {
    "INTEGRATION_CMD": ["integration.cmd.>"],
    "INTEGRATION_EVT": ["integration.evt.>"],
}
"""The gitops-declared integration streams, by name and subjects."""

INTEGRATION_STREAM_MAX_AGE = timedelta(days=1)
"""How long the embedded integration streams keep a message. Bounded: the
engine refuses to bind a reaction to a stream that keeps messages forever,
or longer than its ``message_retention`` (7 days by default)."""


class EmbeddedNats:
    """A real ``nats-server -js`` under ``data_dir`` on a free loopback port.

    ``sync_always`` provisions ``jetstream { sync_interval: always }`` so an
    acknowledged publish is on disk, as production should run it.
    """

    def __init__(
        self, data_dir: Path, *, sync_always: bool = True, port: int | None = None
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.sync_always = sync_always
        self.port = port or 0
        self._process = ServerProcess("nats-server")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @staticmethod
    def binary() -> str:
        return server_binary("nats-server", "the 'embedded' extra")

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        store = self.data_dir / "jetstream"
        sync = "\n  sync_interval: always" if self.sync_always else ""
        config = self.data_dir / "nats.conf"
        config.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'jetstream {{\n  store_dir: "{store}"{sync}\n}}\n'
        )
        self._process.start(
            [self.binary(), "-c", str(config)], log=self.data_dir / "nats.log",
            port=self.port, within=15,
        )

    def stop(self) -> None:
        self._process.stop()

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing flushed on the way out)."""
        self._process.kill()

    @property
    def running(self) -> bool:
        return self._process.running


class EmbeddedNatsCluster:
    """Three (or ``size``) real ``nats-server -js`` processes on loopback,
    routed into one cluster, each under ``data_dir/n{i}`` with ``sync_interval:
    always``: where R3 streams and buckets live and a node can be killed.

    Node ``i`` keeps its client and route ports across restarts, so a killed
    node comes back at the same address with its store. `url` names the
    first node; a client learns the others from the cluster (or pass
    `urls`).
    """

    NAME = "service-engine"

    def __init__(self, data_dir: Path, *, size: int = 3) -> None:
        if size < 1:
            raise ConfigError("an embedded NATS cluster has at least one node")
        self.data_dir = Path(data_dir).resolve()
        self.size = size
        self.ports = [free_port() for _ in range(size)]
        self.route_ports = [free_port() for _ in range(size)]
        self.monitor_ports = [free_port() for _ in range(size)]
        self._processes = [
            ServerProcess(f"nats-server node {self.server_name(i)}") for i in range(size)
        ]

    @property
    def url(self) -> str:
        return self.node_url(0)

    @property
    def urls(self) -> list[str]:
        return [self.node_url(i) for i in range(self.size)]

    def node_url(self, i: int) -> str:
        return f"nats://127.0.0.1:{self.ports[i]}"

    @staticmethod
    def server_name(i: int) -> str:
        return f"n{i}"

    def node_of(self, server_name: str) -> int:
        """The index of the node a stream's ``cluster.leader`` names."""
        return int(server_name.removeprefix("n"))

    def start(self) -> None:
        """Start every node that is not running; wait for their client ports."""
        for i in range(self.size):
            if not self.running(i):
                self.start_node(i)

    def start_node(self, i: int) -> None:
        folder = self.data_dir / self.server_name(i)
        folder.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(
            f'"nats-route://127.0.0.1:{port}"'
            for j, port in enumerate(self.route_ports) if j != i
        )
        config = folder / "nats.conf"
        config.write_text(
            f'server_name: "{self.server_name(i)}"\n'
            f'listen: "127.0.0.1:{self.ports[i]}"\n'
            f'http: "127.0.0.1:{self.monitor_ports[i]}"\n'
            f'jetstream {{\n  store_dir: "{folder / "jetstream"}"\n  sync_interval: always\n}}\n'
            f'cluster {{\n  name: "{self.NAME}"\n  listen: "127.0.0.1:{self.route_ports[i]}"\n'
            f"  routes: [{routes}]\n}}\n"
        )
        self._processes[i].start(
            [EmbeddedNats.binary(), "-c", str(config)], log=folder / "nats.log",
            port=self.ports[i], within=15,
        )

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i`` (a crash)."""
        self._processes[i].kill()

    def stop(self) -> None:
        for process in self._processes:
            process.stop()

    def running(self, i: int) -> bool:
        return self._processes[i].running

    async def wait_ready(self, within: float = 30.0) -> None:
        """Wait until the cluster can place a stream on every node: the
        JetStream meta leader (read from its monitoring endpoint, ``/jsz``)
        counts every other node as a current peer. A meta leader alone
        answers JetStream requests earlier, but refuses an R3 stream with "no
        suitable peers for placement" until its peers have caught up.
        `RuntimeError` past ``within`` seconds."""
        deadline = time.monotonic() + within
        seen = "no node answered"
        while True:
            for i in range(self.size):
                meta = await asyncio.to_thread(self._meta_cluster, i)
                if meta is None:
                    continue
                seen = f"node {self.server_name(i)} sees {meta}"
                current = [peer for peer in meta.get("replicas") or () if peer.get("current")]
                if meta.get("leader") == self.server_name(i) and len(current) >= self.size - 1:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the NATS cluster's meta group did not form: {seen}")
            await asyncio.sleep(0.1)

    def _meta_cluster(self, i: int) -> dict[str, Any] | None:
        """Node ``i``'s view of the JetStream meta group, or None while it
        does not answer."""
        url = f"http://127.0.0.1:{self.monitor_ports[i]}/jsz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                meta = json.load(answer).get("meta_cluster")
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    async def provision(
        self, streams: dict[str, list[str]] | None = None, buckets: Iterable[str] = (),
        *, replicas: int = 3,
    ) -> None:
        """Declare the integration streams and ``buckets`` with ``replicas``
        copies (R3 by default) across the cluster."""
        await self.wait_ready()
        await provision_streams(self.url, streams, replicas=replicas)
        await provision_buckets(self.url, buckets, replicas=replicas)


PRESENCE_MAX_AGE = timedelta(minutes=10)
"""The provisioned presence bucket's TTL ceiling (at least the longest lane's ttl)."""
PRESENCE_MARKER_TTL = timedelta(minutes=1)
"""How long an expiry marker of the presence bucket is kept."""


@contextlib.asynccontextmanager
async def _jetstream(nats_url: str) -> AsyncIterator[JetStreamContext]:
    """An operator's short connection to the JetStream at ``nats_url``."""
    import nats

    client = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        yield client.jetstream()
    finally:
        await client.close()


async def _declare_stream(js: JetStreamContext, name: str, config: StreamConfig) -> None:
    """Update stream ``name`` to ``config``, adding it when absent."""
    try:
        await js.stream_info(name)
        await js.update_stream(config)
    except Exception:
        await js.add_stream(config)


async def provision_presence_bucket(
    nats_url: str,
    service: str,
    *,
    max_age: timedelta = PRESENCE_MAX_AGE,
    marker_ttl: timedelta = PRESENCE_MARKER_TTL,
) -> None:
    """Declare ``service``'s presence bucket ``EPHEMERAL_{service}`` the way an
    operator does (idempotent; the engine only binds it): one value per key,
    a ``max_age`` ceiling, expiry markers (``limit_marker_ttl``) so an
    expired key raises a watch event, and per-message TTL (which markers
    imply), so each lane's writes expire at the lane's own ttl."""
    from nats.js.api import KeyValueConfig

    config = KeyValueConfig(
        bucket=f"EPHEMERAL_{service}", history=1, ttl=max_age.total_seconds(),
        limit_marker_ttl=marker_ttl.total_seconds(),
    )
    async with _jetstream(nats_url) as js:
        try:
            await js.stream_info(f"KV_{config.bucket}")
        except Exception:
            await js.create_key_value(config)


async def provision_streams(
    nats_url: str, streams: dict[str, list[str]] | None = None, *, replicas: int = 1
) -> None:
    """Declare the gitops-owned JetStream streams (idempotent); ``replicas``
    copies each on a cluster."""
    from nats.js.api import StreamConfig

    async with _jetstream(nats_url) as js:
        for name, subjects in (streams or INTEGRATION_STREAMS).items():
            config = StreamConfig(
                name=name, subjects=subjects, max_age=INTEGRATION_STREAM_MAX_AGE.total_seconds(),
                num_replicas=replicas,
            )
            await _declare_stream(js, name, config)


LANE_STREAM_MAX_AGE = timedelta(days=1)
"""How long the provisioned ``STREAMING_{service}`` stream keeps a chunk
(below `EngineConfig.seal_retention`, 7 days by default, as boot requires)."""


async def provision_lane_stream(
    nats_url: str, service: str, *, max_age: timedelta | None = LANE_STREAM_MAX_AGE
) -> None:
    """Declare ``service``'s accumulated-lane stream ``STREAMING_{service}``
    over ``stream.{service}.>`` the way an operator does (idempotent; the
    engine only binds it). ``max_age`` None keeps chunks forever (a boot
    with an accumulator refuses that)."""
    from nats.js.api import StreamConfig

    name = f"STREAMING_{service}"
    config = StreamConfig(
        name=name, subjects=[f"stream.{service}.>"],
        max_age=max_age.total_seconds() if max_age is not None else None,
    )
    async with _jetstream(nats_url) as js:
        await _declare_stream(js, name, config)


async def provision_buckets(
    nats_url: str, buckets: Iterable[str], *, replicas: int = 1
) -> None:
    """Declare the gitops-owned key-value buckets (the published-language
    buckets offers drain into and mirrors read; idempotent). One value per
    key (``history=1``): a reader wants the current image, not its past."""
    from nats.js.api import KeyValueConfig

    async with _jetstream(nats_url) as js:
        for name in buckets:
            try:
                await js.key_value(name)
            except Exception:
                await js.create_key_value(
                    KeyValueConfig(bucket=name, history=1, replicas=replicas)
                )


async def seed_bucket(nats_url: str, bucket: str, values: Mapping[str, bytes]) -> int:
    """Put each of ``values`` into ``bucket`` unless its key already holds
    one (development data, e.g. a roster a twin would publish); returns how
    many were written."""
    import nats.js.errors

    written = 0
    async with _jetstream(nats_url) as js:
        kv = await js.key_value(bucket)
        for key, value in values.items():
            try:
                await kv.create(key, value)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            written += 1
    return written
