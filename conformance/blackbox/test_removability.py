"""Every slice of the reference service is removable: deleting its folder and
its one line in ``slices/__init__.py`` leaves a service that boots and
serves — exactly the remaining slices' queries, mutations and subscriptions,
their reactions bound — with no kernel, ``register`` or ``graphql`` edit; the
kernel alone boots too.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from example_service.graphql import build_app
from example_service.register import register
from example_service.slices import SLICES, compose
from service_engine import Engine, EngineConfig, ReadinessHandle, connect_pool
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.errors import WorkerStopped
from service_engine.graphql import ComposedService
from service_engine.graphql.compose import ROOT_KINDS
from service_engine.server.host import bind_listener, run_with_listener

from ..support.harness import wait_until
from ..support.nats_support import engine_nats
from .harness import BOUND, REPO, Pods, provision_kv, provision_lanes

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

ROOT_FIELDS = "{ __schema { queryType { fields { name } } } }"
ALL_ROOT_FIELDS = """{ __schema { queryType { fields { name } } mutationType { fields { name } }
                      subscriptionType { fields { name } } } }"""
SLICE_AGNOSTIC = ("kernel", "register.py", "graphql.py")


def query_fields(service: ComposedService) -> set[str]:
    return set(service.declared_fields("query"))


def root_fields(service: ComposedService) -> dict[str, set[str]]:
    return {kind: set(service.declared_fields(kind)) for kind in ROOT_KINDS}


@contextlib.asynccontextmanager
async def serving(
    store: ProvisionedDatabase, nats: EmbeddedNats, service: ComposedService
) -> AsyncIterator[str]:
    """The service composed as ``service``, in process: engine (with its own
    NATS connection, which a slice's reactions need) + HTTP on a free port."""
    await provision_kv(nats.url)
    await provision_lanes(nats.url)
    db = await connect_pool(store.app_url)
    try:
        async with engine_nats(nats) as conn:
            engine = await Engine.boot(EngineConfig(service="example"), db, conn, ReadinessHandle())
            register(engine, service)
            app = build_app(engine, service)
            sock = bind_listener("127.0.0.1:0")
            task = asyncio.create_task(run_with_listener(engine, app, sock, handle_signals=False))
            try:
                yield f"127.0.0.1:{sock.getsockname()[1]}"
            finally:
                engine.shutdown()
                with contextlib.suppress(WorkerStopped):
                    await asyncio.wait_for(task, BOUND)
                sock.close()
    finally:
        await db.aclose()


async def served_fields(addr: str) -> dict[str, set[str]]:
    """The root fields the running service serves, by kind (query, mutation,
    subscription): the slices' reactions and crons registered, readiness UP."""
    async with httpx.AsyncClient(base_url=f"http://{addr}", timeout=BOUND) as http:

        async def up() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await wait_until(up, what="readiness UP")
        body = (await http.post("/graphql", json={"query": ALL_ROOT_FIELDS})).json()
    schema = body["data"]["__schema"]
    return {
        kind: {f["name"] for f in (schema[f"{kind}Type"] or {"fields": []})["fields"]}
        for kind in ROOT_KINDS
    }


VARIANTS: dict[str, tuple[str, ...]] = {
    "kernel only": (), "every slice": SLICES,
    **{f"without {removed}": tuple(s for s in SLICES if s != removed) for removed in SLICES},
}
"""The compositions that must boot, by name (one test each, so a parallel
run spreads them over its workers)."""


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_the_kernel_alone_and_the_service_without_each_slice_boot(
    store: ProvisionedDatabase, nats_server: EmbeddedNats, variant: str
) -> None:
    """The kernel alone, every slice, and the service without each one slice compose and
    serve exactly the root fields of the slices they hold."""
    names = VARIANTS[variant]
    service = compose(names)
    assert service.slice_names == names, variant
    async with serving(store, nats_server, service) as addr:
        assert await served_fields(addr) == root_fields(service), variant
    assert query_fields(compose(())) == {"engineVersion"}


@pytest.mark.parametrize("removed", SLICES)
async def test_deleting_a_slice_folder_and_its_line_leaves_a_bootable_service(
    pods: Pods, tmp_path: Path, removed: str,
) -> None:
    """Deleting a slice's folder and its one line in the slice list (no slice-agnostic file
    names it) leaves a service that boots and serves the other slices' fields."""
    root = tmp_path / f"without_{removed}"
    package = root / "example_service"
    shutil.copytree(REPO / "example_service", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    # No slice-agnostic file names the slice.
    for name in SLICE_AGNOSTIC:
        target = package / name
        for path in [target] if target.is_file() else sorted(target.rglob("*.py")):
            assert f'"{removed}"' not in path.read_text(), path
            assert f"slices.{removed}" not in path.read_text(), path
    # Its folder, and its one line in the list.
    listing = package / "slices" / "__init__.py"
    lines = listing.read_text().splitlines(keepends=True)
    naming = [line for line in lines if f'"{removed}"' in line]
    assert len(naming) == 1, naming
    listing.write_text("".join(line for line in lines if line not in naming))
    shutil.rmtree(package / "slices" / removed)

    pod = await pods.spawn(f"r-{removed}", command=[sys.executable, "-m", "example_service"],
                           cwd=root)
    remaining = compose(tuple(s for s in SLICES if s != removed))
    data = await pod.gql(ROOT_FIELDS)
    assert {f["name"] for f in data["__schema"]["queryType"]["fields"]} == query_fields(
        remaining)
    await pods.stop(pod)
