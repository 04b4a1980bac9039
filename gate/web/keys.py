"""What the pipeline API app holds for its handlers: the settings a reload replaces and the
typed ``web.AppKey``s of the service, the settings and the metrics. Its own module, so the
route modules (``requests``, ``admin``) and the app factory (``api``) all import it and
none imports another."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gate.core.service import GateService
from gate.metrics import Metrics


@dataclass(slots=True)
class ApiSettings:
    """The bearer token pipelines present and the largest draft body accepted (bytes, UTF-8).

    Mutable: a config reload (SIGHUP) replaces ``token`` (``reconfigure``); each request
    reads it anew.
    """

    token: str
    max_draft_bytes: int
    # the admin token (``api.admin_token_env``): the only key to ``/v1/admin/``;
    # None: those routes answer 404
    admin_token: str | None = None

    def reconfigure(self, token: str, admin_token: str | None = None) -> None:
        """Accept ``token`` (and ``admin_token`` on the admin routes) from the next request
        on (SIGHUP reload); the draft limit needs a restart."""
        self.token = token
        self.admin_token = admin_token

    def body_limit(self) -> int:
        """The largest request body read (bytes): a draft's or a question's JSON escaping can
        grow it up to 6x (\\uXXXX); the text itself is checked against ``max_draft_bytes``
        once decoded."""
        return self.max_draft_bytes * 6 + 64 * 1024


SERVICE = web.AppKey("service", GateService)
SETTINGS = web.AppKey("api_settings", ApiSettings)
METRICS = web.AppKey("metrics", Metrics)
