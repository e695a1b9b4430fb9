"""``ws_max_attaching``: its bound and its typed refusal."""

from __future__ import annotations

import pytest

from service_engine.config import EngineConfig
from service_engine.errors import ConfigError


def test_ws_max_attaching_defaults_to_a_small_positive_gate() -> None:
    """The default admits a few dozen inits at once, not a burst's thousands."""
    assert 0 < EngineConfig().ws_max_attaching <= 256


@pytest.mark.parametrize("value", [0, -1])
def test_ws_max_attaching_below_one_is_a_config_error(value: int) -> None:
    """A gate that admits nobody is refused by name, as a ConfigError."""
    with pytest.raises(ConfigError, match="ws_max_attaching > 0"):
        EngineConfig(ws_max_attaching=value)


def test_ws_max_attaching_reads_from_the_environment() -> None:
    """SERVICE_ENGINE_WS_MAX_ATTACHING sets it; a non-number is a ConfigError."""
    assert EngineConfig.from_env({"SERVICE_ENGINE_WS_MAX_ATTACHING": "8"}).ws_max_attaching == 8
    with pytest.raises(ConfigError, match="ws_max_attaching"):
        EngineConfig.from_env({"SERVICE_ENGINE_WS_MAX_ATTACHING": "many"})
