"""The scope declaration handshake against an in-process fake Identity over
a spawned nats-server: confirm -> UP, reject -> DOWN with the reason and a
typed error from run, no Identity yet -> DOWN until it answers, the boot
errors of a bad manifest, and a scopeless service skipping the gate."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import pytest

from service_engine import Database, Engine, ReadinessHandle
from service_engine.embedded import EmbeddedNats
from service_engine.errors import WorkerStopped
from service_engine.messaging.nats import open_nats
from service_engine.scopes.identity import ScopeIdentity, known_scopes
from service_engine.scopes.manifest import (
    EmptyScopeManifest,
    MalformedScopeKey,
    ScopeManifest,
    ScopeManifestSpansServices,
    ScopeRejected,
    ScopeWithoutNats,
)

from ..support.harness import fast_engine_config, wait_until

KNOWN = {"board:archive", "card:advance"}


async def booted(db: Database, url: str | None) -> tuple[Engine, ReadinessHandle]:
    readiness = ReadinessHandle()
    nats = None if url is None else await open_nats(url)
    engine = await Engine.boot(fast_engine_config("sample", lock_timeout=timedelta(seconds=1)), db, nats, readiness)
    return engine, readiness


async def stop(engine: Engine, task: asyncio.Task[None]) -> None:
    engine.shutdown()
    with contextlib.suppress(WorkerStopped):
        await asyncio.wait_for(task, 10)
    if engine.nats is not None:
        await engine.nats.aclose()


async def test_confirmed_declaration_brings_the_pod_up(db: Database, nats_server: EmbeddedNats) -> None:
    """The slices' contributions are declared once; readiness is DOWN under
    scope_declaration until Identity confirms, then UP."""
    identity_conn = await open_nats(nats_server.url)
    identity = await ScopeIdentity(identity_conn.client, known_scopes(KNOWN)).start()
    engine, readiness = await booted(db, nats_server.url)
    engine.contribute_scopes(["board:archive"])
    engine.contribute_scopes(["sample.card:advance"])
    declaration = engine.declare_contributed_scopes()
    assert declaration is not None and declaration.scopes == tuple(sorted(KNOWN))
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: readiness.is_up, what="UP after Identity confirmed")
        assert [r.declaration for r in identity.requests] == [declaration]
        assert identity.requests[0].pod_id == engine.config.pod_id
    finally:
        await stop(engine, task)
        await identity.aclose()
        await identity_conn.aclose()


async def test_rejected_declaration_keeps_the_pod_down(db: Database, nats_server: EmbeddedNats) -> None:
    """A scope typo: Identity rejects, the pod stays DOWN with the reason
    and run raises ScopeRejected."""
    identity_conn = await open_nats(nats_server.url)
    identity = await ScopeIdentity(identity_conn.client, known_scopes(KNOWN)).start()
    engine, readiness = await booted(db, nats_server.url)
    engine.declare_scopes(ScopeManifest.of(["board:archiv"]))
    try:
        with pytest.raises(ScopeRejected) as raised:
            await asyncio.wait_for(engine.run(), 30)
        assert "board:archiv" in raised.value.rejection
        assert not readiness.is_up and readiness.holds("scope_declaration")
        assert "board:archiv" in str(readiness.current().to_json())
    finally:
        await identity.aclose()
        await identity_conn.aclose()
        assert engine.nats is not None
        await engine.nats.aclose()


async def test_down_until_identity_answers(db: Database, nats_server: EmbeddedNats) -> None:
    """With no Identity listening the pod keeps asking, DOWN; once Identity
    subscribes it confirms and the pod comes UP."""
    engine, readiness = await booted(db, nats_server.url)
    engine.contribute_scopes(["board:archive"])
    engine.declare_contributed_scopes()
    task = asyncio.create_task(engine.run())
    identity_conn = await open_nats(nats_server.url)
    try:
        handshake = engine.scopes.handshake
        await wait_until(lambda: handshake is not None and handshake.attempts >= 2, what="retries")
        assert not readiness.is_up and readiness.holds("scope_declaration")
        identity = await ScopeIdentity(identity_conn.client).start()
        await wait_until(lambda: readiness.is_up, what="UP once Identity answered")
        await identity.aclose()
    finally:
        await stop(engine, task)
        await identity_conn.aclose()


async def test_manifest_boot_errors_and_scopeless_service(db: Database) -> None:
    """Malformed keys, two services, the pod's service not named, and an
    empty manifest are boot errors; contributing nothing is scopeless (no
    gate, UP without Identity); declaring without NATS is ScopeWithoutNats."""
    engine, readiness = await booted(db, None)
    with pytest.raises(MalformedScopeKey):
        engine.contribute_scopes(["board:archive", "Bad"])
        engine.declare_contributed_scopes()
    for keys, error in ((["a.b:c", "sample.b:c"], ScopeManifestSpansServices),
                        (["twin.b:c"], ScopeManifestSpansServices), ([], EmptyScopeManifest)):
        with pytest.raises(error):
            engine.declare_scopes(ScopeManifest.of(keys))

    scopeless, scopeless_ready = await booted(db, None)
    assert scopeless.declare_contributed_scopes() is None
    task = asyncio.create_task(scopeless.run())
    try:
        await wait_until(lambda: scopeless_ready.is_up, what="a scopeless pod UP")
    finally:
        await stop(scopeless, task)

    engine.declare_scopes(ScopeManifest.of(["board:archive"]))
    with pytest.raises(ScopeWithoutNats):
        await engine.run()
    assert readiness.holds("scope_declaration")
