"""Fixtures of the black-box battery: the pods spawned on the parent
conftest's per-test ``store`` (engine + example migrations) and
``nats_server``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service_engine.embedded import EmbeddedNats, ProvisionedDatabase

from .harness import Pods


@pytest.fixture
async def pods(store: ProvisionedDatabase, nats_server: EmbeddedNats, tmp_path: Path
               ) -> AsyncIterator[Pods]:
    spawned = Pods(store.app_url, nats_server.url, tmp_path)
    try:
        yield spawned
    finally:
        await spawned.aclose()
