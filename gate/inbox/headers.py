"""The inbox's security headers: a strict Content-Security-Policy (only its own
script, style and images; no inline script or style, no frames, forms post only to it),
no referrer, no MIME sniffing, and pages never cached."""

from __future__ import annotations

from aiohttp import web

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
"""The one policy of every inbox response."""

COMMON = {
    "Content-Security-Policy": CSP,
    # same-origin, not no-referrer: under no-referrer Chromium sends ``Origin: null`` with a
    # plain HTML form's POST (a question's answer), which read_post must refuse; no
    # referrer ever leaves the inbox either way (found by the browser e2e tests)
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}
STATIC_PREFIX = "/static/"


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``COMMON`` plus ``Cache-Control: no-store`` for every page and answer, ``no-cache``
    (revalidate) for ``/static/`` assets."""
    cache = "no-cache" if request.path.startswith(STATIC_PREFIX) else "no-store"
    response.headers.update({**COMMON, "Cache-Control": cache})


def install(app: web.Application) -> None:
    """Add the security headers to every response of ``app`` (errors and static included),
    through ``on_response_prepare``."""
    app.on_response_prepare.append(_add_headers)
