"""EngineConfig: every bound refused with a message naming the relation."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service_engine import EngineConfig
from service_engine.config import default_ws_max_sockets
from service_engine.errors import ConfigError

S = timedelta(seconds=1)


def test_defaults_are_valid() -> None:
    """EngineConfig's defaults construct and hold the documented values (ack wait, ack pending,
    publish timeout, liveness; no service)."""
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
    """Each bound relation broken is a ConfigError (a ValueError) naming the relation."""
    with pytest.raises(ConfigError) as refused:
        EngineConfig(**fields)
    assert relation in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_several_violations_are_named_together() -> None:
    """Several broken relations are named in one refusal."""
    with pytest.raises(ConfigError) as refused:
        EngineConfig(lock_timeout=40 * S, window_capacity=0)
    assert "lock_timeout < ack_wait" in str(refused.value)
    assert "window_capacity > 0" in str(refused.value)


def test_unknown_and_mistyped_fields_are_refused() -> None:
    """An unknown field and a mistyped value are refused naming the field."""
    with pytest.raises(ConfigError, match="ack_wiat"):
        EngineConfig(ack_wiat=S)
    with pytest.raises(ConfigError, match="max_ack_pending"):
        EngineConfig(max_ack_pending="many")


def test_from_environment_in_seconds() -> None:
    """from_env reads SERVICE_ENGINE_* variables (durations in seconds), ignores others, and
    validates the result."""
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
    """with_service_version returns a copy with the version (and the same pod id), leaving the
    original unchanged."""
    base = EngineConfig(service="svc")
    versioned = base.with_service_version("2.0.0")
    assert versioned.service_version == "2.0.0" and base.service_version is None
    assert versioned.pod_id == base.pod_id


def test_inbound_supervision_bounds() -> None:
    """The inbound supervision bounds have their defaults and refuse a zero threshold, a zero
    backoff and a cap below the backoff."""
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


def test_edge_bounds_have_sane_defaults() -> None:
    """The edge bounds default to the documented sizes, ws_max_sockets to what the open-file limit
    holds (at least 10,000)."""
    config = EngineConfig()
    assert config.http_max_body_bytes == 1024 * 1024
    assert config.query_max_tokens == 2000
    assert config.query_max_aliases == 30
    assert config.query_max_depth == 12
    assert config.graphql_introspection is True
    assert config.ws_max_message_bytes == 256 * 1024
    assert config.ws_max_subscriptions_per_socket == 100
    assert config.ws_max_sockets == default_ws_max_sockets() >= 10_000
    assert config.graphiql_asset_base_url == "https://unpkg.com"


@pytest.mark.parametrize(
    "name",
    [
        "http_max_body_bytes", "query_max_tokens", "query_max_aliases", "query_max_depth",
        "ws_max_message_bytes", "ws_max_subscriptions_per_socket", "ws_max_sockets",
    ],
)
def test_each_edge_bound_must_be_positive(name: str) -> None:
    """Each edge bound refuses 0 and negatives, naming itself."""
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=f"{name} > 0"):
            EngineConfig(**{name: bad})


@pytest.mark.parametrize(
    ("base", "ok"),
    [
        ("https://unpkg.com", True),
        ("http://mirror.internal:8080/npm", True),
        ("/static/npm", True),
        ("//cdn.example.com", False),
        ("ftp://mirror.internal", False),
        ("unpkg.com", False),
        ("https://", False),
        ("", False),
    ],
)
def test_graphiql_asset_base_is_a_url_or_an_absolute_path(base: str, ok: bool) -> None:
    """The GraphiQL asset base is an http(s) URL with a host or an absolute path; anything else is
    refused."""
    if ok:
        assert EngineConfig(graphiql_asset_base_url=base).graphiql_asset_base_url == base
    else:
        with pytest.raises(ConfigError, match="graphiql_asset_base_url is an http"):
            EngineConfig(graphiql_asset_base_url=base)


def test_edge_bounds_from_the_environment() -> None:
    """Edge bounds and the introspection switch are read from the environment; a non-integer is
    refused naming the field."""
    config = EngineConfig.from_env({
        "SERVICE_ENGINE_HTTP_MAX_BODY_BYTES": "2048",
        "SERVICE_ENGINE_GRAPHQL_INTROSPECTION": "false",
        "SERVICE_ENGINE_WS_MAX_SOCKETS": "5",
        "SERVICE_ENGINE_GRAPHIQL_ASSET_BASE_URL": "/assets",
    })
    assert config.http_max_body_bytes == 2048
    assert config.graphql_introspection is False
    assert config.ws_max_sockets == 5
    assert config.graphiql_asset_base_url == "/assets"
    with pytest.raises(ConfigError, match="ws_max_sockets"):
        EngineConfig.from_env({"SERVICE_ENGINE_WS_MAX_SOCKETS": "lots"})


def test_a_duration_that_is_not_a_number_is_a_config_error() -> None:
    """A duration variable that is not a number is a ConfigError naming the variable and its value."""
    with pytest.raises(ConfigError, match="SERVICE_ENGINE_ACK_WAIT='soon' is not a number"):
        EngineConfig.from_env({"SERVICE_ENGINE_ACK_WAIT": "soon"})


def test_check_environment_lists_every_problem_without_booting() -> None:
    """check_environment reports a good environment's config, and every problem of a bad one
    (unknown variables, broken relations, mistyped values) without raising."""
    from service_engine.config import check_environment, describe_config

    good = check_environment({"SERVICE_ENGINE_ACK_WAIT": "45", "SERVICE_ENGINE_LOG_FORMAT": "json"})
    assert good.ok and good.config is not None and good.problems == ()
    assert describe_config(good.config)["ack_wait"] == 45.0
    bad = check_environment({
        "SERVICE_ENGINE_LOCK_TIMEOUT": "60",
        "SERVICE_ENGINE_WINDOW_CAPACITY": "0",
        "SERVICE_ENGINE_ACK_WIAT": "30",
    })
    assert not bad.ok and bad.config is None
    assert bad.problems == (
        "SERVICE_ENGINE_ACK_WIAT: no EngineConfig field reads this variable",
        "violated: window_capacity > 0",
        "violated: lock_timeout < ack_wait",
    )
    typed = check_environment({"SERVICE_ENGINE_MAX_ACK_PENDING": "many"})
    assert len(typed.problems) == 1 and typed.problems[0].startswith("max_ack_pending: ")


def test_the_default_socket_bound_follows_the_open_file_limit() -> None:
    """The default ``ws_max_sockets`` is what the hard open-file limit holds
    less the files kept for the rest, never under 10,000 nor over 100,000."""
    import resource

    assert default_ws_max_sockets((1024, 1024)) == 10_000
    assert default_ws_max_sockets((1024, 20_000)) == 20_000 - 1024
    assert default_ws_max_sockets((1024, 1_048_576)) == 100_000 - 1024
    infinite = resource.RLIM_INFINITY
    assert default_ws_max_sockets((infinite, infinite)) == 100_000
    assert default_ws_max_sockets((50_000, infinite)) == 50_000 - 1024


def test_check_environment_accepts_the_blob_store_variables() -> None:
    """``SERVICE_ENGINE_S3_*`` configure the blob store (not `EngineConfig`):
    a correct blob-store setup passes the check."""
    from service_engine.blobs.s3 import BlobStoreConfig
    from service_engine.config import check_environment

    environ = {
        "SERVICE_ENGINE_S3_ENDPOINT": "http://127.0.0.1:9000",
        "SERVICE_ENGINE_S3_BUCKET": "blobs",
        "SERVICE_ENGINE_S3_REGION": "us-east-1",
        "SERVICE_ENGINE_S3_ACCESS_KEY": "engine",
        "SERVICE_ENGINE_S3_SECRET_KEY": "secret",
    }
    assert BlobStoreConfig.from_env(environ) is not None
    checked = check_environment(environ)
    assert not checked.problems and checked.config is not None
