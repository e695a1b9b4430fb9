"""The reference service's properties on the embedded (single-account)
nats-server, as `python -m example_service` runs them: the README's set,
get and watch, the secret nulled for a development caller, the logging
bridge live."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import nats
import pytest

from conformance.support.harness import wait_until
from example_service.props import NOTIFICATIONS, open_props
from service_engine import open_nats
from service_engine.embedded import EmbeddedNats
from service_engine.errors import ConfigError
from service_engine.props import PropsClient, PropsError, PropsUnanswered, open_watch


class Workers:
    """Stands in for the engine's worker registration: runs what is registered."""

    def __init__(self) -> None:
        self.workers: dict[str, Callable[[], Awaitable[None]]] = {}

    def register_worker(self, name: str, worker: Callable[[], Awaitable[None]]) -> None:
        self.workers[name] = worker


@pytest.fixture
async def running(nats_server: EmbeddedNats, tmp_path: Path) -> AsyncIterator[str]:
    engine_nats = await open_nats(nats_server.url)
    workers = Workers()
    saved = logging.getLogger().level
    try:
        started = await open_props(workers, engine_nats, tmp_path / "props", "example", True)  # type: ignore[arg-type]
        assert started is not None and list(workers.workers) == ["props"]
        task = asyncio.ensure_future(workers.workers["props"]())
        try:
            yield nats_server.url
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await engine_nats.aclose()
        logging.getLogger().setLevel(saved)


async def test_readme_set_get_watch_and_log_level(running: str) -> None:
    """set, get (webhook_secret null without the secrets capability), watch
    replay then live, and a log level applied to the root logger."""
    nc = await nats.connect(running)
    try:
        props = PropsClient(nc, "example")

        async def answered() -> bool:
            try:
                await props.request("describe", "notifications")
                return True
            except PropsUnanswered:
                return False

        await wait_until(answered, timeout=5, what="the props worker subscribed")
        created = await props.set("notifications", {"channel": "webhook", "webhook_secret": "s3"}, key="acme")
        assert (created["version"], created["created"]) == (1, True)
        got = await props.get("notifications", key="acme")
        assert got["fields"] == {"channel": "webhook", "webhook_secret": None}
        watch = await open_watch(nc, "example", "notifications")
        try:
            replayed = await watch.next()
            assert (replayed["nseq"], replayed["actor"], replayed["secret_fields_changed_count"]) == (1, "anonymous", 1)
            assert (await watch.next())["event_type"] == "caught_up"
            await props.set("notifications", {"channel": "none"}, key="acme")
            live = await watch.next()
            assert (live["nseq"], live["fields_changed"]) == (2, ["channel"])
        finally:
            await watch.aclose()
        with pytest.raises(PropsError) as bad:
            await props.set("notifications", {"channel": "pigeon"}, key="acme")
        assert "one_of_channels" in bad.value.message
        await props.set("log", {"level": "debug"})
        await wait_until(lambda: logging.getLogger().level == logging.DEBUG, timeout=5, what="DEBUG applied")
    finally:
        await nc.close()


async def test_bound_mode_is_opt_in(nats_server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against real infrastructure props are off unless a store file is
    configured, and malformed grants are a configuration error."""
    engine_nats = await open_nats(nats_server.url)
    try:
        monkeypatch.delenv("EXAMPLE_SERVICE_PROPS_DB", raising=False)
        assert await open_props(Workers(), engine_nats, tmp_path, "example", False) is None  # type: ignore[arg-type]
        monkeypatch.setenv("EXAMPLE_SERVICE_PROPS_DB", str(tmp_path / "p.db"))
        monkeypatch.setenv("EXAMPLE_SERVICE_PROPS_GRANTS", '{"A": "props.read:example.notifications"}')
        with pytest.raises(ConfigError):
            await open_props(Workers(), engine_nats, tmp_path, "example", False)  # type: ignore[arg-type]
    finally:
        await engine_nats.aclose()
    assert NOTIFICATIONS.secret_fields == {"webhook_secret"}


