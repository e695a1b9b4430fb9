"""The GraphiQL page a browser's ``GET /graphql`` gets: Strawberry's page,
its subscriptions pointed at the engine's socket and its assets loaded from
a configurable base (`graphiql_html`)."""

from __future__ import annotations

import json
import re

__all__ = ["GRAPHIQL_ASSET_TIMEOUT_SECONDS", "graphiql_html"]

_SUBSCRIPTION_URL_LINE = "const subscriptionUrl = httpUrlToWebSockeUrl(fetchURL);"
_CDN = "https://unpkg.com/"
_ASSET_TAG = re.compile(r"<(script|link)(\s+)crossorigin")

GRAPHIQL_ASSET_TIMEOUT_SECONDS = 15
"""Past this, a GraphiQL page whose assets have not loaded says so."""

_ASSET_STATUS = """<script>
      (function () {
        var base = %(base)s;
        var failed = [];
        function show(text) {
          var box = document.getElementById("graphiql-asset-status");
          if (!box) {
            box = document.createElement("div");
            box.id = "graphiql-asset-status";
            box.setAttribute("role", "alert");
            box.style.cssText = "font: 16px/1.5 sans-serif; padding: 2em; max-width: 50em;";
            (document.body || document.documentElement).appendChild(box);
          }
          box.textContent = text;
          var root = document.getElementById("graphiql");
          if (root && root.textContent === "Loading...") { root.textContent = ""; }
        }
        var advice = " GraphiQL's scripts and styles come from " + base +
          ", which this browser cannot reach. An operator can serve a mirror of the same " +
          "files and point SERVICE_ENGINE_GRAPHIQL_ASSET_BASE_URL at it. The GraphQL " +
          "endpoint itself is not affected.";
        window.graphiqlAssetFailed = function (element) {
          failed.push(element.src || element.href);
          show("GraphiQL could not load its assets (" + failed.join(", ") + ")." + advice);
        };
        setTimeout(function () {
          if (typeof window.GraphiQL === "undefined" && !failed.length) {
            show("GraphiQL's assets have not loaded after %(timeout)d seconds." + advice);
          }
        }, %(timeout)d * 1000);
      })();
    </script>"""


def graphiql_html(
    template: str, http_path: str, ws_path: str, *, asset_base: str = "https://unpkg.com"
) -> str:
    """Strawberry's GraphiQL page, its subscriptions opened on ``ws_path``
    (resolved against the page's URL, so a path prefix in front of the
    service keeps working) and its assets loaded from ``asset_base`` instead
    of the public CDN (a mirror of the same paths and bytes: the integrity
    hashes stay). Assets that fail to load, or are still missing after
    `GRAPHIQL_ASSET_TIMEOUT_SECONDS`, replace "Loading..." with a message
    saying what to do.

    Raises `RuntimeError` if a Strawberry upgrade changed what this
    rewrites: fail at startup rather than serve subscriptions going nowhere.
    """
    if _SUBSCRIPTION_URL_LINE not in template or _CDN not in template or "<head>" not in template:
        raise RuntimeError(
            "Strawberry's GraphiQL page changed: cannot point its subscriptions at "
            f"{ws_path!r} and its assets at {asset_base!r}; update "
            "service_engine.server.graphiql.graphiql_html"
        )
    if ws_path.startswith(http_path.rstrip("/") + "/"):
        target = http_path.rstrip("/").rsplit("/", 1)[-1] + ws_path[len(http_path.rstrip("/")):]
    else:
        target = ws_path
    line = (
        "const subscriptionUrl = httpUrlToWebSockeUrl("
        f"new URL({json.dumps(target)}, fetchURL).toString());"
    )
    page = template.replace(_SUBSCRIPTION_URL_LINE, line)
    page = page.replace(_CDN, asset_base.rstrip("/") + "/")
    page = _ASSET_TAG.sub(r'<\1\2onerror="graphiqlAssetFailed(this)"\2crossorigin', page)
    status = _ASSET_STATUS % {
        # </script> cannot appear inside the inline script.
        "base": json.dumps(asset_base).replace("</", "<\\/"),
        "timeout": GRAPHIQL_ASSET_TIMEOUT_SECONDS,
    }
    return page.replace("<head>", "<head>\n    " + status, 1)
