"""What the two listeners' apps hold for their handlers: the settings a reload replaces
(``ApiSettings``, ``CallbackSettings``) and the typed ``web.AppKey``s of the service, the
metrics (the same on both apps) and each app's settings. Its own module, so the route
modules (``requests``, ``admin``, ``enrol``, ``credentials``) and the app factories (``api``,
``callback``) all import it and none imports another."""

from __future__ import annotations

from collections.abc import Sequence
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


@dataclass(slots=True)
class CallbackSettings:
    """Secrets accepted on decisions (current first, then previous) and the skew window (s).

    Mutable: a config reload (SIGHUP) replaces both (``reconfigure``); each request reads
    them anew.
    """

    relay_secrets: Sequence[str]
    max_skew_s: float

    def reconfigure(self, relay_secrets: Sequence[str], max_skew_s: float) -> None:
        """Accept decisions signed with ``relay_secrets`` within ``max_skew_s`` seconds from
        the next request on (SIGHUP reload). No await: a request sees both old or both new."""
        self.relay_secrets = relay_secrets
        self.max_skew_s = max_skew_s


SERVICE = web.AppKey("service", GateService)
METRICS = web.AppKey("metrics", Metrics)
SETTINGS = web.AppKey("api_settings", ApiSettings)
CALLBACK_SETTINGS = web.AppKey("callback_settings", CallbackSettings)
