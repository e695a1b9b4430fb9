"""The black-box harness: the real service in its own process, observed only
through its public channels.

`Pods` spawns ``python -m example_service`` (or the command in
``EXAMPLE_SERVICE_BIN``) against a provisioned database and NATS server,
waits for the bound address it reports and for ``/readyz`` to answer UP,
and terminates every process it spawned. A `Pod` speaks GraphQL over HTTP
(httpx) and graphql-transport-ws over a real WebSocket (`GqlSocket`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from example_twin.roster import DEFAULT_ROSTER, publish_roster
from service_engine import open_nats
from service_engine.embedded import (
    provision_buckets,
    provision_lane_stream,
    provision_presence_bucket,
)
from service_engine.graphql import PASSPORT_HEADER, Passport
from service_engine.scopes.identity import ScopeIdentity, known_scopes

from ..support.harness import wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_MIGRATIONS = REPO / "example_service" / "migrations"
"""The service's own migrations, applied by the harness (the operator's job)."""

BUCKETS = ("PUBLISHED_example", "PUBLISHED_twin")
"""The gitops-declared buckets: the service's published languages and the twin's."""

BOUND = 10.0
"""The bound on any single wait for the service."""
START_BOUND = 90.0
"""The bound on a spawn reaching readiness UP: generous, since the battery's
parallel workers share the cores, and a pod's start (the allocator's
re-execution, the imports, a multi-pod supervisor's children) is CPU."""
PROTOCOL = Subprotocol("graphql-transport-ws")
SERVICE = "example"
IDENTITY_SCOPES = ("board:archive", "card:advance", "ledger:erase")
"""The scopes the harness's Identity knows: the reference slices' own."""


async def provision_lanes(nats_url: str) -> None:
    """Declare the reply slice's lanes as an operator would: the
    ``STREAMING_example`` stream and the ``EPHEMERAL_example`` bucket."""
    await provision_lane_stream(nats_url, SERVICE)
    await provision_presence_bucket(nats_url, SERVICE)


def service_command() -> list[str]:
    """``EXAMPLE_SERVICE_BIN`` (a command line) when set, else the module."""
    command = os.environ.get("EXAMPLE_SERVICE_BIN")
    if command:
        return shlex.split(command)
    return [sys.executable, "-m", "example_service"]


class GraphQLFailed(AssertionError):
    """A GraphQL response carried errors."""


@dataclass(eq=False)
class Pod:
    """One running service process."""

    name: str
    process: subprocess.Popen[bytes]
    addr: str
    log: Path
    http: httpx.AsyncClient = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])

    async def readyz(self) -> httpx.Response:
        return await self.http.get("/readyz")

    async def post(
        self, query: str, variables: Mapping[str, Any] | None = None,
        passport: Passport | None = None,
    ) -> dict[str, Any]:
        """POST ``query``; the whole response body."""
        headers = {PASSPORT_HEADER: passport.to_header()} if passport is not None else {}
        body: dict[str, Any] = {"query": query}
        if variables is not None:
            body["variables"] = dict(variables)
        response = await self.http.post("/graphql", json=body, headers=headers)
        assert response.status_code == 200, (response.status_code, response.text)
        answer: dict[str, Any] = response.json()
        return answer

    async def gql(
        self, query: str, variables: Mapping[str, Any] | None = None,
        passport: Passport | None = None,
    ) -> dict[str, Any]:
        """POST ``query``; its ``data``, failing the test on any error."""
        answer = await self.post(query, variables, passport)
        if answer.get("errors"):
            raise GraphQLFailed(f"{self.name}: {answer['errors']}")
        data: dict[str, Any] = answer["data"]
        return data

    @contextlib.asynccontextmanager
    async def socket(self, passport: Passport | None) -> AsyncIterator[GqlSocket]:
        """A graphql-transport-ws WebSocket, the passport on the upgrade."""
        headers = {PASSPORT_HEADER: passport.to_header()} if passport is not None else {}
        opening = time.monotonic()
        async with connect(
            f"ws://{self.addr}/graphql/ws", subprotocols=[PROTOCOL],
            additional_headers=headers, open_timeout=BOUND, close_timeout=2,
        ) as ws:
            assert ws.subprotocol == PROTOCOL
            yield GqlSocket(ws, opening, time.monotonic())

    def terminate(self) -> int:
        """SIGTERM, a bounded wait, then SIGKILL; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=BOUND)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@dataclass(eq=False)
class GqlSocket:
    """A client side of graphql-transport-ws.

    ``opening`` / ``opened`` are the monotonic times just before the upgrade
    was sent and just after it was accepted: the server's handshake lies
    between them.
    """

    ws: ClientConnection
    opening: float
    opened: float

    async def send(self, message: Mapping[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    async def receive(self, timeout: float = BOUND) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        return message

    async def init(self, payload: Mapping[str, Any] | None = None) -> None:
        init: dict[str, Any] = {"type": "connection_init"}
        if payload is not None:
            init["payload"] = dict(payload)
        await self.send(init)
        assert await self.receive() == {"type": "connection_ack"}

    async def subscribe(
        self, op_id: str, query: str, variables: Mapping[str, Any] | None = None
    ) -> None:
        payload: dict[str, Any] = {"query": query}
        if variables is not None:
            payload["variables"] = dict(variables)
        await self.send({"id": op_id, "type": "subscribe", "payload": payload})

    async def next(self, op_id: str, timeout: float = BOUND) -> dict[str, Any]:
        """The ``data`` of the next message, which must be a ``next`` of ``op_id``."""
        message = await self.receive(timeout)
        assert message.get("type") == "next" and message.get("id") == op_id, message
        payload: dict[str, Any] = message["payload"]
        assert not payload.get("errors"), payload
        data: dict[str, Any] = payload["data"]
        return data

    async def quiet(self, within: float) -> None:
        """Nothing arrives within the bound."""
        try:
            message = await asyncio.wait_for(self.ws.recv(), within)
        except TimeoutError:
            return
        raise AssertionError(f"expected nothing, got {message!r}")

    async def closed(self, timeout: float = BOUND) -> tuple[ConnectionClosed, float, list[Any]]:
        """Wait (bounded) for the server to close; the close, the monotonic
        time it arrived and the messages received before it."""
        before: list[Any] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                raw = await asyncio.wait_for(self.ws.recv(), max(0.0, deadline - time.monotonic()))
            except ConnectionClosed as ended:
                return ended, time.monotonic(), before
            before.append(json.loads(raw))


def _start(command: list[str], cwd: Path, env: Mapping[str, str], log: Path
           ) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            command, cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


async def provision_kv(nats_url: str) -> None:
    """What the operator and the twin do before the service starts: declare
    the buckets and publish the roster the service mirrors (an empty roster
    holds it DOWN). Idempotent."""
    await provision_buckets(nats_url, BUCKETS)
    nats = await open_nats(nats_url)
    try:
        await publish_roster(nats, DEFAULT_ROSTER)
    finally:
        await nats.aclose()


class Pods:
    """Spawns service processes on one store; `aclose` terminates them all."""

    def __init__(self, database_url: str, nats_url: str, workdir: Path) -> None:
        self.database_url = database_url
        self.nats_url = nats_url
        self.workdir = workdir
        self.pods: list[Pod] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._provisioned = False
        self._lanes_provisioned = False
        self.identity: ScopeIdentity | None = None
        """Identity, as the harness answers the pods' boot scope declarations."""
        self._identity_conn: Any = None

    async def spawn(
        self, name: str = "a", *, command: list[str] | None = None, cwd: Path = REPO,
        env: Mapping[str, str] | None = None,
    ) -> Pod:
        """Start a pod and wait until ``/readyz`` answers UP."""
        if not self._provisioned:
            await provision_kv(self.nats_url)
            self._provisioned = True
        if not self._lanes_provisioned:
            await provision_lanes(self.nats_url)
            self._lanes_provisioned = True
        if self.identity is None:
            self._identity_conn = await open_nats(self.nats_url)
            self.identity = await ScopeIdentity(
                self._identity_conn.client, known_scopes(IDENTITY_SCOPES)
            ).start()
        addr_file = self.workdir / f"{name}.addr"
        log = self.workdir / f"{name}.log"
        addr_file.unlink(missing_ok=True)
        environ = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "NATS_URL": self.nats_url,
            "EXAMPLE_SERVICE_HTTP_ADDR": "127.0.0.1:0",
            "EXAMPLE_SERVICE_ADDR_FILE": str(addr_file),
            "EXAMPLE_SERVICE_LOG_LEVEL": "WARNING",
            "SERVICE_ENGINE_POD_ID": f"bb-{name}",
            **(env or {}),
        }
        process = _start(command or service_command(), cwd, environ, log)
        self._procs.append(process)

        def tail() -> str:
            return log.read_text(errors="replace")[-4000:]

        try:
            await wait_until(
                lambda: addr_file.exists() or process.poll() is not None,
                timeout=START_BOUND, what=f"pod {name} to listen",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log:\n{tail()}") from None
        if process.poll() is not None:
            raise AssertionError(f"pod {name} exited with {process.returncode}:\n{tail()}")
        addr = addr_file.read_text().strip()
        pod = Pod(name, process, addr, log, httpx.AsyncClient(base_url=f"http://{addr}",
                                                              timeout=BOUND))
        self.pods.append(pod)

        async def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"pod {name} exited with {process.returncode}:\n{tail()}")
            try:
                response = await pod.readyz()
            except httpx.TransportError:
                return False
            return response.status_code == 200

        await wait_until(up, timeout=START_BOUND, what=f"pod {name} readiness UP")
        return pod

    async def stop(self, pod: Pod) -> int:
        """Terminate ``pod`` (SIGTERM, bounded); its exit code."""
        await pod.http.aclose()
        return await asyncio.to_thread(pod.terminate)

    async def aclose(self) -> None:
        if self.identity is not None:
            await self.identity.aclose()
            await self._identity_conn.aclose()
        for pod in self.pods:
            await pod.http.aclose()
        for process in self._procs:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._procs:
            try:
                await asyncio.to_thread(process.wait, BOUND)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)


# -- the service's GraphQL, as a client writes it -------------------------------------

ADMIN = Passport(sub="alice", org="acme", roles=("board:archive",))
"""A person of acme holding the archive scope."""
MEMBER = Passport(sub="carol", org="acme")
"""A person of acme without the archive scope."""
GUEST = Passport(sub="bob", org="globex")
"""A person of another org, made a board member through an invite."""
OUTSIDER = Passport(sub="mallory", org="globex")
"""A person of another org with no membership."""
NO_ORG = Passport(sub="nemo")
"""A person with no org at all."""

VIEW = "id title archived member affordances { action allowed reason }"
RESULT = f"success board {{ {VIEW} }} error {{ code message retryable action }}"

CREATE = f"mutation($id: ID, $title: String!) {{ createBoard(id: $id, title: $title) {{ {RESULT} }} }}"
RENAME = f"mutation($id: ID!, $title: String!) {{ renameBoard(id: $id, title: $title) {{ {RESULT} }} }}"
ARCHIVE = f"mutation($id: ID!) {{ archiveBoard(id: $id) {{ {RESULT} }} }}"
UNARCHIVE = f"mutation($id: ID!) {{ unarchiveBoard(id: $id) {{ {RESULT} }} }}"
DELETE = f"mutation($id: ID!) {{ deleteBoard(id: $id) {{ {RESULT} }} }}"
INVITE = "mutation($id: ID!) { inviteToBoard(id: $id) { success token error { code message } } }"
ACCEPT = f"mutation($token: String!) {{ acceptInvite(token: $token) {{ {RESULT} }} }}"
BOARD = f"query($id: ID!) {{ board(id: $id) {{ {VIEW} }} }}"

BOARDS_SUBSCRIPTION = f"""subscription {{ boards {{
    __typename
    ... on BoardsReset {{ revision keys views {{ {VIEW} }} }}
    ... on BoardsUpsert {{ revision key view {{ {VIEW} }} cause {{ name data }} }}
    ... on BoardsRemove {{ revision key cause {{ name data }} }}
}} }}"""

ORG_BOARDS_SUBSCRIPTION = """subscription { orgBoards {
    __typename
    ... on OrgBoardsReset { revision keys views { id title archived } }
    ... on OrgBoardsUpsert { revision key view { id title archived } }
    ... on OrgBoardsRemove { revision key }
} }"""


def key(board_id: str) -> str:
    """A window key as the deltas carry it: the key's canonical JSON."""
    return json.dumps(board_id)


async def create_board(pod: Pod, board_id: str, title: str, as_: Passport = ADMIN) -> None:
    result = (await pod.gql(CREATE, {"id": board_id, "title": title}, as_))["createBoard"]
    assert result["success"], result
