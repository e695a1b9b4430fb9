"""A nats-server with accounts for the props conformance tests, and the
stack on it: the props service in its own account, the development granter
in ``NODED``, callers in ``A`` and ``B``.

The topology is the attestation the service relies on: callers reach the
verbs only through service imports with ``share: true``, so the server
writes ``Nats-Request-Info`` (account and user) on every request; the
service account's own users may not publish to the verb subjects; the
reserved topics are exported to ``NODED`` alone; deliveries reach a peer
through a service its account exports to ``NODED``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
from nats.aio.client import Client

from service_engine.embedded import EmbeddedNats, ServerProcess, free_port
from service_engine.props import (
    VERBS,
    DevGranter,
    MemoryStore,
    Namespace,
    Policy,
    PropsClient,
    PropsService,
    Store,
    open_sqlite_store,
)

SERVICE = "demo"
SERVICE_ACCOUNT = "SVC"
GRANTER_ACCOUNT = "NODED"
PASSWORD = "pwd"
PEERS: Mapping[str, Sequence[str]] = {"A": ("alice",), "B": ("bob",)}


def _list(items: Iterable[str]) -> str:
    return "[" + ", ".join(items) + "]"


def accounts_config(port: int, service: str = SERVICE, peers: Mapping[str, Sequence[str]] = PEERS) -> str:
    """The server configuration of the props topology."""
    verbs = [f"{service}.props.{v}" for v in VERBS]
    topics = [f"{service}.props.records.changed", f"{service}.props.audit"]
    svc_exports = [f'{{service: "{s}", response_type: singleton}}' for s in verbs]
    svc_exports += [f'{{stream: "{t}", accounts: [{GRANTER_ACCOUNT}]}}' for t in topics]
    noded_imports = [f'{{stream: {{account: {SERVICE_ACCOUNT}, subject: "{t}"}}}}' for t in topics]
    noded_imports += [f'{{service: {{account: {acc}, subject: "noded.deliver.{acc}.>"}}}}' for acc in peers]
    accounts = [
        f"""  {SERVICE_ACCOUNT}: {{
    users: [{{user: svc, password: {PASSWORD}, permissions: {{publish: {{allow: [">"], deny: {_list(f'"{s}"' for s in verbs)}}}}}}}]
    exports: {_list(svc_exports)}
    imports: [
      {{service: {{account: {GRANTER_ACCOUNT}, subject: "noded.props.subscribe_grant"}}, share: true}}
      {{service: {{account: {GRANTER_ACCOUNT}, subject: "noded.props.unsubscribe_grant"}}, share: true}}
    ]
  }}""",
        f"""  {GRANTER_ACCOUNT}: {{
    users: [{{user: noded, password: {PASSWORD}}}]
    exports: [
      {{service: "noded.props.subscribe_grant", accounts: [{SERVICE_ACCOUNT}]}}
      {{service: "noded.props.unsubscribe_grant", accounts: [{SERVICE_ACCOUNT}]}}
      {{service: "noded.peers.register"}}
      {{service: "noded.topic.subscribe"}}
    ]
    imports: {_list(noded_imports)}
  }}""",
    ]
    for acc, users in peers.items():
        user_entries = [
            f'{{user: {u}, password: {PASSWORD}, permissions: {{subscribe: {{allow: '
            f'["_INBOX.>", "noded.deliver.{acc}.{u}.>", "{service}.props.>"]}}}}}}'
            for u in users
        ]
        imports = [f'{{service: {{account: {SERVICE_ACCOUNT}, subject: "{s}"}}, share: true}}' for s in verbs]
        imports += [
            f'{{service: {{account: {GRANTER_ACCOUNT}, subject: "noded.peers.register"}}, share: true}}',
            f'{{service: {{account: {GRANTER_ACCOUNT}, subject: "noded.topic.subscribe"}}, share: true}}',
        ]
        accounts.append(f"""  {acc}: {{
    users: {_list(user_entries)}
    exports: [{{service: "noded.deliver.{acc}.>", accounts: [{GRANTER_ACCOUNT}]}}]
    imports: {_list(imports)}
  }}""")
    return f'listen: "127.0.0.1:{port}"\naccounts: {{\n' + "\n".join(accounts) + "\n}\n"


@dataclass
class AccountsNats:
    """A nats-server started from `accounts_config`."""

    data_dir: Path
    port: int = 0
    _process: ServerProcess = field(default_factory=lambda: ServerProcess("the accounts nats-server"))

    def url(self, user: str) -> str:
        return f"nats://{user}:{PASSWORD}@127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = self.data_dir / "accounts.conf"
        config.write_text(accounts_config(self.port))
        self._process.start(
            [EmbeddedNats.binary(), "-c", str(config)], log=self.data_dir / "nats.log", port=self.port, within=15
        )

    def stop(self) -> None:
        self._process.stop()


async def connect(server: AccountsNats, user: str) -> Client:
    return await nats.connect(server.url(user), name=f"{user}-conn", connect_timeout=5, max_reconnect_attempts=0)


@dataclass
class PropsStack:
    server: AccountsNats
    service: PropsService
    granter: DevGranter
    store: Store
    clients: dict[str, Client] = field(default_factory=dict)

    def caller(self, user: str) -> PropsClient:
        return PropsClient(self.clients[user], SERVICE, timeout=5)


async def _answered(client: Client, subj: str, headers: dict[str, str]) -> None:
    async with asyncio.timeout(5):
        while True:
            try:
                await client.request(subj, b"", timeout=2, headers=headers)
                return
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.005)


async def _reachable(clients: Mapping[str, Client], *, granter: bool) -> None:
    # Right after start-up nats-server may answer the first request crossing a
    # service import with no-responders although the responder is subscribed
    # (observed: once, within ~10 ms). Wait until every import path answers.
    for user in ("alice", "bob"):
        await _answered(clients[user], f"{SERVICE}.props.describe", {"namespace": "_probe"})
        if granter:
            await _answered(clients[user], "noded.topic.subscribe", {"topic": "_probe"})
    if granter:
        await _answered(clients["svc"], "noded.props.subscribe_grant", {})
        await _answered(clients["svc"], "noded.props.unsubscribe_grant", {})


@contextlib.asynccontextmanager
async def props_stack(
    tmp_path: Path,
    namespaces: Sequence[Namespace],
    policy: Policy,
    *,
    granter: bool = True,
    memory: bool = False,
) -> AsyncIterator[PropsStack]:
    """The server, the granter (unless ``granter=False``), the service on an
    on-disk SQLite store (the in-memory store with ``memory=True``) with
    ``namespaces``, and connections for ``svc``, ``noded``, ``alice`` and ``bob``."""
    server = AccountsNats(tmp_path / "nats")
    await asyncio.to_thread(server.start)
    clients: dict[str, Client] = {}
    store: Store = MemoryStore() if memory else await open_sqlite_store(tmp_path / "props.db")
    try:
        for user in ("svc", "noded", "alice", "bob"):
            clients[user] = await connect(server, user)
        dev = DevGranter(clients["noded"], {SERVICE: SERVICE_ACCOUNT}, granter_account=GRANTER_ACCOUNT, probe_timeout=0.5)
        if granter:
            await dev.start()
        service = PropsService(clients["svc"], SERVICE, store, policy, service_account=SERVICE_ACCOUNT)
        for ns in namespaces:
            await service.register(ns)
        await service.start()
        try:
            await _reachable(clients, granter=granter)
            yield PropsStack(server, service, dev, store, clients)
        finally:
            await service.aclose()
            await dev.aclose()
    finally:
        for client in clients.values():
            with contextlib.suppress(Exception):
                await client.close()
        await store.aclose()
        await asyncio.to_thread(server.stop)
