"""The ops page (``/ops``) in a real headless Chromium against a real pod:
Postgres, nats-server, uvicorn on a free port, an inbound reaction.

The page loads with no console error and nothing from outside the pod; a
dead letter shows up on it, is retried from it (an audited action) and
disappears; a passport without the ops role gets no data, on the page or
from its API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from playwright.async_api import ConsoleMessage, Page, Request
from pydantic import BaseModel

from service_engine import Database, Engine, EngineConfig, open_nats
from service_engine.embedded import EmbeddedNats
from service_engine.graphql import PASSPORT_HEADER, Passport, graphql_app
from service_engine.integration import DeadLetter, DeadLetters, DeadLetterSource
from service_engine.pipeline import Reaction
from service_engine.render import Query
from service_engine.render.windows import WindowSpec

from ..support.browser_support import chromium
from ..support.harness import engine_running, wait_until
from ..support.inbound_support import dead_letter_rows, effects, producer
from ..support.inbound_support import pod as inbound_pod
from ..support.sample_cards import Card, CardsView, RankQuery, write_card
from ..support.sample_cards import Principal as CardsPrincipal
from ..support.sample_orders import PlaceOrder, place_order
from .test_graphql_app import SCHEMA, resolve_me, serving

OPERATOR = Passport(sub="olivia", org="acme", roles=("member", "ops"))
MEMBER = Passport(sub="alice", org="acme", roles=("member",))
BOUND_MS = 10_000
ALICE_CARDS = CardsPrincipal("alice", frozenset({"acme"}))


@contextlib.asynccontextmanager
async def ops_pod(
    db: Database, nats_server: EmbeddedNats, *projectors: Any
) -> AsyncIterator[tuple[Engine, str]]:
    config = EngineConfig(service="ops-test", beat_interval=timedelta(milliseconds=50),
                          lease=timedelta(seconds=1))
    async with (
        await open_nats(nats_server.url) as connection,
        engine_running(config, db, *projectors, nats=connection, bound=20) as engine,
        serving(graphql_app(engine, SCHEMA, resolve_me)) as addr,
    ):
        yield engine, addr


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


@pytest.mark.slow
async def test_a_poison_message_dead_letter_appears_is_retried_from_the_page_and_disappears(
    db: Database, streams: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """A command the reaction cannot handle is dead-lettered and shows up on
    the page; once the cause is fixed, Retry republishes it, the reaction
    applies it, and the row leaves the page. The retry is audited; the page
    logs no console error and loads nothing from outside the pod."""
    caplog.set_level(logging.INFO, logger="service_engine.audit")
    fixed = False

    async def buggy(cx: Reaction[Any], command: BaseModel) -> None:
        assert isinstance(command, PlaceOrder)
        if command.order_id == "o-poison" and not fixed:
            raise RuntimeError("amount is not a number")

    async with (
        inbound_pod(db, streams, [place_order("a", before=buggy)]) as running,
        serving(graphql_app(running.engine, SCHEMA, resolve_me)) as addr,
        producer(streams) as twin,
        chromium() as browser,
    ):
        context = await browser.new_context(
            extra_http_headers={PASSPORT_HEADER: OPERATOR.to_header()})
        page = await context.new_page()
        watched = Watched(page)
        await page.goto(f"http://{addr}/ops")
        await page.wait_for_selector("body[data-loaded=true]", timeout=BOUND_MS)
        assert await page.text_content("#readiness-status") == "UP"
        assert await page.locator("#dead-letters tbody tr").count() == 0

        sent = await twin.command(PlaceOrder(order_id="o-poison"))
        await wait_until(lambda: _count(dead_letter_rows(db), 1), what="the dead letter")
        [letter] = await dead_letter_rows(db)
        assert letter["message_id"] == sent.envelope_id
        row = page.locator(f'#dead-letters tr[data-id="{letter["id"]}"]')
        await row.wait_for(state="visible", timeout=BOUND_MS)
        assert "RuntimeError: amount is not a number" in (await row.text_content() or "")
        assert "Reaction: 1" in (await page.text_content("#dead-letter-sources") or "")

        fixed = True  # the fix is deployed
        await row.locator('button[data-action="retry"]').click()
        await row.wait_for(state="detached", timeout=BOUND_MS)
        assert await page.get_attribute("#action-result", "data-outcome") == "Acked"
        await wait_until(lambda: _count(effects(db), 1), what="the retried command applied")
        assert [e["order_id"] for e in await effects(db)] == ["o-poison"]
        assert await dead_letter_rows(db) == []

        assert watched.errors == []
        assert watched.requests and all(url.startswith(f"http://{addr}/ops") for url in watched.requests)
        await context.close()

    audit = [r for r in caplog.records if r.name == "service_engine.audit"]
    assert [(r.ops_action, r.ops_actor, r.ops_target, r.ops_outcome) for r in audit] == [  # type: ignore[attr-defined]
        ("retry", "olivia", str(letter["id"]), "Acked")]


async def _count(rows: Any, n: int) -> bool:
    return len(await rows) == n


@pytest.mark.slow
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
            assert state["readiness"] == {"status": "UP"}
            assert state["outbox"] == {"pending": 0, "failed": 0, "oldest_pending_age_seconds": 0.0}
    assert await DeadLetters(db).get(letter.id) is not None


@pytest.mark.slow
async def test_the_page_shows_live_sessions_per_projector_and_the_rates(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Live sessions appear per projector and leave with their session;
    committed impacts and delivered deltas draw the rate chart."""
    async with ops_pod(db, nats_server, CardsView()) as (engine, addr), chromium() as browser:
        context = await browser.new_context(
            extra_http_headers={PASSPORT_HEADER: OPERATOR.to_header()})
        page = await context.new_page()
        watched = Watched(page)
        await page.goto(f"http://{addr}/ops")
        await page.wait_for_selector("body[data-loaded=true]", timeout=BOUND_MS)
        stream = await engine.attach(ALICE_CARDS, "cards", WindowSpec(Query(RankQuery(100))))
        row = page.locator('#sessions tr[data-projector="cards"]')
        await row.wait_for(state="visible", timeout=BOUND_MS)
        assert (await row.text_content() or "").endswith("1")

        async def writing() -> None:
            # Card writes reach the session as deltas; dead letters recorded
            # through the engine are committed impacts it counts.
            async with db.pool.acquire() as conn:
                for i in range(40):
                    await write_card(conn, Card("c1", "acme", 1, f"v{i}"))
                    await engine.dead_letters.record_work(DeadLetter.for_work(
                        DeadLetterSource.CRON, "tick", reason="load", key=str(i)))
                    await asyncio.sleep(0.05)

        writer = asyncio.create_task(writing())
        try:
            for series in ("impacts", "deltas"):
                line = page.locator(f"#rates polyline.{series}")
                await line.wait_for(state="attached", timeout=BOUND_MS)
                # A point above the baseline: a rate above zero was drawn.
                await page.wait_for_function(
                    "name => { const p = document.querySelector('#rates polyline.' + name);"
                    " return p && p.getAttribute('points').split(' ')"
                    ".some(xy => parseFloat(xy.split(',')[1]) < 150); }",
                    arg=series, timeout=BOUND_MS)
        finally:
            await writer
        await stream.aclose()
        await row.wait_for(state="visible", timeout=BOUND_MS)
        await page.wait_for_function(
            "() => document.querySelector('#sessions tr[data-projector=cards] td:last-child')"
            ".textContent === '0'", timeout=BOUND_MS)
        assert watched.errors == []
        await context.close()
