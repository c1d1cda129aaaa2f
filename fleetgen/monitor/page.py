"""One HTML page, self-contained: the vendored uPlot, fleetgen's page script and styles, and
the page's data, inlined (no CDN, no server needed to open it)."""

from __future__ import annotations

import html
from functools import cache
from importlib import resources
from typing import Any

import orjson

# The vendored charting library (npm `uplot`, MIT; see web/uPlot.LICENSE and docs/design.md).
UPLOT_VERSION = "1.6.32"
ASSETS = ("uPlot.iife.min.js", "uPlot.min.css", "page.js", "page.css")


@cache
def asset(name: str) -> str:
    return (resources.files("fleetgen.monitor") / "web" / name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """JSON safe inside a <script> element: a `<` can only be inside a string, where
    \\u003c means the same."""
    return orjson.dumps(data).decode().replace("<", "\\u003c")


def render(title: str, data: dict[str, Any], extra_js: str = "") -> str:
    licence = asset("uPlot.LICENSE").splitlines()[2].strip()  # the copyright line
    return "".join((
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{html.escape(title)}</title>",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        # An empty icon: no request for /favicon.ico, from disk or from the live server.
        "<link rel=\"icon\" href=\"data:,\">",
        f"<style>{asset('uPlot.min.css')}\n{asset('page.css')}</style>",
        f"<!-- uPlot {UPLOT_VERSION}, MIT licence, {html.escape(licence)} -->",
        f"<script>{asset('uPlot.iife.min.js')}</script>",
        f"<script>{asset('page.js')}</script>",
        f"<script>{extra_js}</script>" if extra_js else "",
        "</head><body><div id=\"root\"></div>",
        f"<script type=\"application/json\" id=\"page-data\">{embed_json(data)}</script>",
        "</body></html>\n",
    ))
