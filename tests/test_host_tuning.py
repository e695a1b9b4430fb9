"""The collector tuning a pod applies after boot."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from service_engine.config import EngineConfig
from service_engine.server.host import GC_THRESHOLDS, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_tune_gc_freezes_the_boot_heap_and_raises_the_thresholds(restored_gc: None) -> None:
    """After tune_gc the objects alive at boot are frozen (never scanned again) and the
    thresholds are GC_THRESHOLDS, above Python's defaults."""
    tune_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] > 700


def test_tuning_and_deflate_defaults() -> None:
    """A pod tunes its collector and offers no per-message deflate unless configured."""
    config = EngineConfig(service="x")
    assert config.gc_tuned is True
    assert config.ws_per_message_deflate is False
