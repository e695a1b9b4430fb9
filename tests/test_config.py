"""EngineConfig: every bound refused with a message naming the relation."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service_engine import ConfigError, EngineConfig

S = timedelta(seconds=1)


def test_defaults_are_valid() -> None:
    config = EngineConfig()
    assert config.ack_wait == 30 * S
    assert config.max_ack_pending == 256
    assert config.publish_ack_timeout == 2 * S
    assert config.schema_version_liveness == 30 * S
    assert config.service is None and config.service_version is None and config.http_addr is None


@pytest.mark.parametrize(
    ("fields", "relation"),
    [
        ({"session_ttl": 10 * S, "session_max_age": 10 * S}, "session_max_age > session_ttl"),
        ({"lock_timeout": 30 * S}, "lock_timeout < ack_wait"),
        ({"publish_ack_timeout": 31 * S}, "publish_ack_timeout < ack_wait"),
        ({"lease": 1 * S, "beat_interval": 1 * S}, "lease > beat_interval"),
        ({"listener_queue_threshold": 0.0}, "listener_queue_threshold in (0.0, 1.0]"),
        ({"listener_queue_threshold": 1.5}, "listener_queue_threshold in (0.0, 1.0]"),
        ({"max_ack_pending": 0}, "max_ack_pending > 0"),
        ({"window_capacity": 0}, "window_capacity > 0"),
        ({"impacts_per_commit": -1}, "impacts_per_commit > 0"),
        ({"listener_channel_capacity": 0}, "listener_channel_capacity > 0"),
        ({"fold_cache_capacity": 0}, "fold_cache_capacity > 0"),
        ({"repair_attempts": 0}, "repair_attempts > 0"),
        ({"reset_threshold": 0}, "reset_threshold > 0"),
        ({"nats_grace": timedelta(0)}, "nats_grace > 0"),
        ({"schema_version_liveness": -S}, "schema_version_liveness > 0"),
    ],
)
def test_each_relation_is_refused_by_name(fields: dict[str, object], relation: str) -> None:
    with pytest.raises(ConfigError) as refused:
        EngineConfig(**fields)
    assert relation in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_several_violations_are_named_together() -> None:
    with pytest.raises(ConfigError) as refused:
        EngineConfig(lock_timeout=40 * S, window_capacity=0)
    assert "lock_timeout < ack_wait" in str(refused.value)
    assert "window_capacity > 0" in str(refused.value)


def test_unknown_and_mistyped_fields_are_refused() -> None:
    with pytest.raises(ConfigError, match="ack_wiat"):
        EngineConfig(ack_wiat=S)
    with pytest.raises(ConfigError, match="max_ack_pending"):
        EngineConfig(max_ack_pending="many")


def test_from_environment_in_seconds() -> None:
    config = EngineConfig.from_env(
        {
            "SERVICE_ENGINE_ACK_WAIT": "45",
            "SERVICE_ENGINE_SERVICE_VERSION": "1.4.2",
            "SERVICE_ENGINE_WINDOW_CAPACITY": "50",
            "UNRELATED": "x",
        }
    )
    assert config.ack_wait == 45 * S
    assert config.service_version == "1.4.2"
    assert config.window_capacity == 50
    with pytest.raises(ConfigError, match="lock_timeout < ack_wait"):
        EngineConfig.from_env({"SERVICE_ENGINE_LOCK_TIMEOUT": "60"})


def test_with_service_version_revalidates_and_copies() -> None:
    base = EngineConfig(service="svc")
    versioned = base.with_service_version("2.0.0")
    assert versioned.service_version == "2.0.0" and base.service_version is None
    assert versioned.pod_id == base.pod_id


def test_inbound_supervision_bounds() -> None:
    config = EngineConfig()
    assert config.inbound_failure_threshold == 3
    assert config.inbound_restart_backoff == timedelta(milliseconds=500)
    assert config.inbound_restart_backoff_cap == 30 * S
    with pytest.raises(ConfigError, match="inbound_failure_threshold > 0"):
        EngineConfig(inbound_failure_threshold=0)
    with pytest.raises(ConfigError, match="inbound_restart_backoff > 0"):
        EngineConfig(inbound_restart_backoff=timedelta(0))
    with pytest.raises(ConfigError, match="inbound_restart_backoff_cap >= inbound_restart_backoff"):
        EngineConfig(inbound_restart_backoff=2 * S, inbound_restart_backoff_cap=S)
