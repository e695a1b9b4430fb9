"""The GraphiQL page where the public CDN is unreachable: its asset base is
configurable and a failed or stalled load says so instead of "Loading..."."""

from __future__ import annotations

import re

from strawberry.http.ides import get_graphql_ide_html

from service_engine.server.graphiql import GRAPHIQL_ASSET_TIMEOUT_SECONDS, graphiql_html

TEMPLATE = get_graphql_ide_html("graphiql")


def _assets(page: str) -> list[str]:
    return re.findall(r'(?:src|href)="(https?://[^"]+|/[^"]+)"', page)


def test_the_default_page_loads_from_the_public_cdn_as_before() -> None:
    """By default the GraphiQL page loads the same CDN assets as Strawberry's, integrity hashes
    kept."""
    page = graphiql_html(TEMPLATE, "/graphql", "/graphql/ws")
    before = [a for a in _assets(TEMPLATE) if a.startswith("https://unpkg.com/")]
    assert before and [a for a in _assets(page) if a.startswith("https://unpkg.com/")] == before
    # The integrity hashes stay: a mirror must serve the same bytes.
    assert re.findall(r'integrity="([^"]+)"', page) == re.findall(r'integrity="([^"]+)"', TEMPLATE)


def test_an_operator_mirror_replaces_the_cdn() -> None:
    """An asset base (a URL or a path) replaces the CDN for every asset."""
    for base, prefix in (("https://npm.mirror.internal/", "https://npm.mirror.internal/"),
                         ("/static/npm", "/static/npm/")):
        page = graphiql_html(TEMPLATE, "/graphql", "/graphql/ws", asset_base=base)
        assert "unpkg.com" not in page
        assets = _assets(page)
        assert assets and all(a.startswith(prefix) for a in assets if not a.startswith("data:"))
        assert prefix + "graphiql@" in page


def test_every_asset_reports_its_failure_and_a_stall_is_timed_out() -> None:
    """Every asset tag reports its failure to a handler defined before them, and a stall past the
    timeout shows a message naming the setting."""
    page = graphiql_html(TEMPLATE, "/graphql", "/graphql/ws", asset_base="/mirror")
    tags = re.findall(r"<(?:script|link)\s[^>]*crossorigin[^>]*>", page)
    assert len(tags) == len(re.findall(r"<(?:script|link)\s+crossorigin", TEMPLATE)) > 0
    assert all('onerror="graphiqlAssetFailed(this)"' in tag for tag in tags)
    # The handler is defined before the first asset tag, inside <head>.
    assert page.index("window.graphiqlAssetFailed") < page.index('onerror="graphiqlAssetFailed')
    assert "GraphiQL could not load its assets" in page
    assert f"have not loaded after {GRAPHIQL_ASSET_TIMEOUT_SECONDS} seconds" in page
    assert "SERVICE_ENGINE_GRAPHIQL_ASSET_BASE_URL" in page
    assert '"/mirror"' in page


def test_the_asset_base_cannot_break_out_of_the_script() -> None:
    """An asset base holding </script> cannot break out of the inline script."""
    page = graphiql_html(TEMPLATE, "/graphql", "/graphql/ws",
                         asset_base="https://x.example/</script><script>alert(1)")
    status = page[page.index("<script>"):page.index("</script>")]
    assert "alert(1)" in status and "</script><script>" not in status
