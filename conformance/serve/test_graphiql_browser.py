"""GraphiQL in a real Chromium where the public CDN cannot be reached: the
page says so plainly, instead of "Loading..." for ever, and an operator's
mirror replaces the CDN."""

from __future__ import annotations

import pytest
from playwright.async_api import Route

from service_engine import Database
from service_engine.graphql import graphql_app

from ..support.browser_support import chromium
from .test_graphql_app import SCHEMA, resolve_me, running_engine, serving

STATUS = "#graphiql-asset-status"


async def test_graphiql_says_when_the_cdn_is_unreachable(db: Database) -> None:
    """Every CDN request fails: the page names the assets, the CDN and the
    setting that fixes it, and no longer shows "Loading..."."""
    async with (
        running_engine(db) as engine,
        serving(graphql_app(engine, SCHEMA, resolve_me)) as addr,
        chromium() as browser,
    ):
        context = await browser.new_context()
        cdn: list[str] = []

        async def unreachable(route: Route) -> None:
            cdn.append(route.request.url)
            await route.abort("internetdisconnected")

        await context.route("https://unpkg.com/**", unreachable)
        page = await context.new_page()
        await page.goto(f"http://{addr}/graphql", wait_until="commit")
        status = page.locator(STATUS)
        await status.wait_for(state="visible", timeout=10_000)
        text = await status.text_content() or ""
        assert "GraphiQL could not load its assets" in text
        assert "https://unpkg.com" in text and "SERVICE_ENGINE_GRAPHIQL_ASSET_BASE_URL" in text
        assert await page.locator("#graphiql").text_content() != "Loading..."
        assert cdn and all(url.startswith("https://unpkg.com/") for url in cdn)
        await context.close()


@pytest.mark.parametrize("base", ["/mirror/npm"])
async def test_graphiql_loads_from_the_configured_mirror(db: Database, base: str) -> None:
    """With graphiql_asset_base_url set, the page asks the mirror, never the
    CDN; a mirror missing a file is named on the page."""
    async with (
        running_engine(db, graphiql_asset_base_url=base) as engine,
        serving(graphql_app(engine, SCHEMA, resolve_me)) as addr,
        chromium() as browser,
    ):
        context = await browser.new_context()
        asked: list[str] = []
        context.on("request", lambda request: asked.append(request.url))
        page = await context.new_page()
        await page.goto(f"http://{addr}/graphql", wait_until="commit")
        status = page.locator(STATUS)
        await status.wait_for(state="visible", timeout=10_000)
        text = await status.text_content() or ""
        assert f"http://{addr}{base}/react@" in text  # this app serves no mirror: 404
        assets = [url for url in asked if not url.endswith("/graphql")]
        assert assets and all(url.startswith(f"http://{addr}{base}/") for url in assets), asked
        await context.close()
