"""What every inbox handler shares: the ``InboxState`` (database, config, secrets, relying
party, credentials cache, clock, metrics) under the app key ``STATE``, the item a request may
decide, and the signed post of a decision or an answer to the gate."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from gate.inbox.config import InboxConfig, InboxSecrets, RelyingParty
from gate.inbox.credentials_cache import CredentialsCache
from gate.inbox.db import InboxDb
from gate.inbox.decided import may_decide
from gate.inbox.metrics import InboxMetrics
from gate.inbox.model import Item, Session
from gate.inbox.shortlived import ShortLived


@dataclass
class InboxState:
    """What every handler shares: the database, the config and relay secrets, the inbox's
    own relying party (None: nobody can sign in), the credentials cache, the clock
    (unix ms) and the metrics; ``shortlived`` keeps sign-in challenges, sign-in tries and
    bulk batches in the database (no handler keeps state in memory an approver's next
    request depends on: that request may reach another replica)."""

    db: InboxDb
    config: InboxConfig
    secrets: InboxSecrets
    party: RelyingParty | None
    credentials: CredentialsCache
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    metrics: InboxMetrics = field(default_factory=InboxMetrics)
    shortlived: ShortLived = field(init=False)

    def __post_init__(self) -> None:
        self.shortlived = ShortLived(self.db)


STATE = web.AppKey("inbox_state", InboxState)


def state_of(request: web.Request) -> InboxState:
    """The app's ``InboxState``."""
    return request.app[STATE]


async def current_seq(state: InboxState) -> int:
    """The inbox's change counter now (the highest ``updated_seq``; 0 with no items)."""
    return max((i.updated_seq for i in await state.db.items(state.now_ms())), default=0)


async def decidable(request: web.Request, session: Session) -> Item:
    """The item ``{id}`` of the request when the session may decide it; else raises 404
    (an item of another approver is not disclosed)."""
    state = state_of(request)
    item = await state.db.item(request.match_info["id"], state.now_ms())
    if item is None or not may_decide(session, item):
        raise web.HTTPNotFound(text="no such item", content_type="text/plain")
    return item
