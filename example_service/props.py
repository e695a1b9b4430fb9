"""The reference service's properties over NATS (the property contract).

It registers one namespace of its own, ``notifications`` (a collection
keyed by organisation, with a secret ``webhook_secret``), and the logging
bridge's ``log`` singleton, on a SQLite store beside the service's data,
and answers ``<service>.props.<verb>`` on the engine's NATS connection.

With embedded infrastructure (a development machine) the store is
``props/props.db`` under the data folder and the NATS server has
one account, so nothing attests a requester: every caller is ``anonymous``
and is granted the example's capabilities but the secrets one, and a development granter runs
in process so ``watch`` works. Against a real NATS (``NATS_URL``) the
service trusts only what the server attests: set ``EXAMPLE_SERVICE_PROPS_DB``
to the store's file (props are off without it),
``EXAMPLE_SERVICE_NATS_ACCOUNT`` to the account it connects in and
``EXAMPLE_SERVICE_PROPS_GRANTS`` to a JSON object of peer id (``account`` or
``account/user``) to capability strings; the broker grants watches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from service_engine import Engine, Nats
from service_engine.errors import ConfigError
from service_engine.props import (
    DevGranter,
    FieldSpec,
    LogBridge,
    Namespace,
    PropsService,
    SqliteStore,
    StaticPolicy,
    Validator,
    all_caps,
    capability_name,
    open_log_bridge,
    open_sqlite_store,
    secrets_cap,
)

_log = logging.getLogger(__name__)

DEFAULT_SERVICE = "example"

CHANNELS = ("email", "webhook", "none")


def _one_of_channels(value: Any) -> str | None:
    return None if value in CHANNELS else f"one of {', '.join(CHANNELS)}"


def _https(value: Any) -> str | None:
    return None if value == "" or str(value).startswith("https://") else "an https:// URL"


NOTIFICATIONS = Namespace(
    "notifications",
    (
        FieldSpec("channel", "string", default="email", help="email, webhook or none",
                  validators=(Validator("one_of_channels", _one_of_channels),)),
        FieldSpec("webhook_url", "string", default="", help="where webhook notifications go",
                  validators=(Validator("https_only", _https),)),
        FieldSpec("webhook_secret", "string", secret=True,
                  help="signs webhook bodies; readable only with the secrets capability"),
    ),
)
"""Per-organisation notification settings (key: the organisation)."""


def _policy(service: str, development: bool) -> StaticPolicy:
    if development:
        # Everything but the secrets: a development caller sees
        # webhook_secret as null, as any caller without the capability would.
        caps: set[str] = set()
        for ns in (NOTIFICATIONS.name, "log"):
            cap = capability_name(service, ns)
            caps |= all_caps(cap) - {secrets_cap(cap)}
        return StaticPolicy({"anonymous": caps})
    raw = os.environ.get("EXAMPLE_SERVICE_PROPS_GRANTS", "{}")
    try:
        grants = json.loads(raw)
    except ValueError as exc:
        raise ConfigError("EXAMPLE_SERVICE_PROPS_GRANTS is not JSON") from exc
    valid = isinstance(grants, dict) and all(
        isinstance(caps, list) and all(isinstance(c, str) for c in caps) for caps in grants.values()
    )
    if not valid:
        raise ConfigError("EXAMPLE_SERVICE_PROPS_GRANTS maps peer ids to lists of capabilities")
    typed: Mapping[str, list[str]] = grants
    return StaticPolicy(typed)


class ExampleProps:
    """The responder, the logging bridge and (in development) the granter,
    run as one supervised worker; the store closes after all of them."""

    def __init__(
        self, service: PropsService, bridge: LogBridge, store: SqliteStore,
        granter: DevGranter | None,
    ) -> None:
        self.service = service
        self.bridge = bridge
        self.store = store
        self.granter = granter

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.service.run())
                group.create_task(self.bridge.run())
                if self.granter is not None:
                    group.create_task(self.granter.run())
        finally:
            await self.store.aclose()


async def open_props(
    engine: Engine, nats: Nats, data_dir: Path, service: str | None, development: bool
) -> ExampleProps | None:
    """Open the store, register the namespaces and put the props worker under
    the engine's supervisor (it runs while the engine runs).

    ``development`` (embedded, single-account infrastructure): the store is
    ``data_dir/props.db``. Otherwise props are served only when
    ``EXAMPLE_SERVICE_PROPS_DB`` names the store's file (None is returned when
    it does not)."""
    service = service or DEFAULT_SERVICE
    configured = os.environ.get("EXAMPLE_SERVICE_PROPS_DB")
    if development:
        await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
        path = data_dir / "props.db"
    elif configured:
        path = Path(configured)
    else:
        _log.info("props: off (set EXAMPLE_SERVICE_PROPS_DB to serve them)")
        return None
    store = await open_sqlite_store(path)
    client = nats.client
    account = None if development else os.environ.get("EXAMPLE_SERVICE_NATS_ACCOUNT")
    props = PropsService(
        client, service, store, _policy(service, development), service_account=account
    )
    await props.register(NOTIFICATIONS)
    bridge = await open_log_bridge(props)
    granter = DevGranter(client, {service: None}) if development else None
    worker = ExampleProps(props, bridge, store, granter)
    engine.register_worker("props", worker.run)
    _log.info(
        "props: %s.props.<verb> on %s (namespaces %s, log)",
        service, client.connected_url.geturl() if client.connected_url else "?",
        NOTIFICATIONS.name,
    )
    return worker
