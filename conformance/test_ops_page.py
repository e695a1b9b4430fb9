"""The ops page (``/ops``) in a real headless Chromium against a real pod:
Postgres, nats-server, uvicorn on a free port.

The page loads with no console error and nothing from outside the pod; a
dead letter shows up on it, is retried from it (an audited action) and
disappears; a passport without the ops role gets no data, on the page or
from its API.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import nats
import pytest
from playwright.async_api import ConsoleMessage, Page, Request

from service_engine import (
    Database,
    DeadLetter,
    DeadLetters,
    DeadLetterSource,
    Engine,
    EngineConfig,
    ReadinessHandle,
    WorkerStopped,
    open_nats,
)
from service_engine.embedded import EmbeddedNats
from service_engine.graphql import PASSPORT_HEADER, Passport, graphql_app

from .browser_support import chromium
from .harness import wait_until
from .test_graphql_app import SCHEMA, resolve_me, serving

OPERATOR = Passport(sub="olivia", org="acme", roles=("member", "ops"))
MEMBER = Passport(sub="alice", org="acme", roles=("member",))
BOUND_MS = 10_000


@contextlib.asynccontextmanager
async def ops_pod(db: Database, nats_server: EmbeddedNats) -> AsyncIterator[tuple[Engine, str]]:
    config = EngineConfig(service="ops-test", beat_interval=timedelta(milliseconds=50),
                          lease=timedelta(seconds=1))
    async with await open_nats(nats_server.url) as connection:
        engine = await Engine.boot(config, db, connection, ReadinessHandle())
        task = asyncio.create_task(engine.run())
        try:
            await wait_until(lambda: engine.readiness.is_up, what="engine UP")
            async with serving(graphql_app(engine, SCHEMA, resolve_me)) as addr:
                yield engine, addr
        finally:
            engine.shutdown()
            with contextlib.suppress(WorkerStopped):
                await asyncio.wait_for(task, 20)


def poison(subject: str) -> DeadLetter:
    return DeadLetter.for_message(
        uuid.uuid4(), DeadLetterSource.REACTION, "orders.on_payment", reason="poison",
        detail="ValueError: amount is not a number", subject=subject,
        payload=b'{"order": 9, "amount": "lots"}', message_id=uuid.uuid4(), attempts=3,
    )


class Watched:
    """Console errors, page errors and every request URL of one page."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        page.on("request", self._request)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def _request(self, request: Request) -> None:
        self.requests.append(request.url)


async def test_a_dead_letter_appears_on_the_ops_page_is_retried_from_it_and_disappears(
    db: Database, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service_engine.audit")
    subject = f"integration.evt.payments.{secrets.token_hex(4)}"
    async with ops_pod(db, nats_server) as (_, addr), chromium() as browser:
        context = await browser.new_context(
            extra_http_headers={PASSPORT_HEADER: OPERATOR.to_header()})
        page = await context.new_page()
        watched = Watched(page)
        await page.goto(f"http://{addr}/ops")
        await page.wait_for_selector("body[data-loaded=true]", timeout=BOUND_MS)
        assert await page.text_content("#readiness-status") == "UP"
        assert await page.locator("#dead-letters tbody tr").count() == 0

        letter = poison(subject)
        await DeadLetters(db).record_work(letter)
        row = page.locator(f'#dead-letters tr[data-id="{letter.id}"]')
        await row.wait_for(state="visible", timeout=BOUND_MS)
        assert "ValueError: amount is not a number" in (await row.text_content() or "")

        await row.locator('button[data-action="retry"]').click()
        await row.wait_for(state="detached", timeout=BOUND_MS)
        assert await page.get_attribute("#action-result", "data-outcome") == "Acked"
        assert await DeadLetters(db).get(letter.id) is None

        assert watched.errors == []
        assert watched.requests and all(url.startswith(f"http://{addr}/ops") for url in watched.requests)
        await context.close()

    audit = [r for r in caplog.records if r.name == "service_engine.audit"]
    assert [(r.ops_action, r.ops_actor, r.ops_target, r.ops_outcome) for r in audit] == [  # type: ignore[attr-defined]
        ("retry", "olivia", str(letter.id), "Acked")]
    client = await nats.connect(nats_server.url)
    try:
        stored = await client.jetstream().get_last_msg("INTEGRATION_EVT", subject)
        assert stored.data is not None
        assert json.loads(stored.data) == {"order": 9, "amount": "lots"}
    finally:
        await client.close()


async def test_a_passport_without_the_ops_role_gets_no_data(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The page answers 403 with the refusal and no data; so does its API,
    and an action is refused without touching the dead letter."""
    letter = poison("integration.evt.payments.secret")
    await DeadLetters(db).record_work(letter)
    async with ops_pod(db, nats_server) as (_, addr), chromium() as browser:
        for passport in (MEMBER, None):
            headers = {PASSPORT_HEADER: passport.to_header()} if passport else {}
            context = await browser.new_context(extra_http_headers=headers)
            page = await context.new_page()
            response = await page.goto(f"http://{addr}/ops")
            assert response is not None and response.status == 403
            text = await page.text_content("body") or ""
            expected = "ops_role_required" if passport else "passport_missing"
            assert expected in text and str(letter.id) not in text
            await context.close()
        async with httpx.AsyncClient(base_url=f"http://{addr}") as http:
            refused = await http.get("/ops/api/state", headers={PASSPORT_HEADER: MEMBER.to_header()})
            assert refused.status_code == 403 and str(letter.id) not in refused.text
            assert refused.json()["error"]["code"] == "ops_role_required"
            action = await http.post(f"/ops/api/dead-letters/{letter.id}/discard", json={},
                                     headers={PASSPORT_HEADER: MEMBER.to_header()})
            assert action.status_code == 403
            # The operator may; a form post (no JSON body) is refused even for them.
            form = await http.post(f"/ops/api/dead-letters/{letter.id}/discard",
                                   data={"x": "1"}, headers={PASSPORT_HEADER: OPERATOR.to_header()})
            assert form.status_code == 415
            state: dict[str, Any] = (await http.get(
                "/ops/api/state", headers={PASSPORT_HEADER: OPERATOR.to_header()})).json()
            assert [d["id"] for d in state["dead_letters"]["items"]] == [str(letter.id)]
            assert state["dead_letters"]["waiting"] == {"Reaction": 1}
    assert await DeadLetters(db).get(letter.id) is not None
