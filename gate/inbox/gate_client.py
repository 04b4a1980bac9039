"""The inbox's signed calls to the gate: a decision (or a question's answer)
posted to the dispatch's callback URL, and the approvers' public credentials fetched over
the credentials channel (docs/protocol.md "Credentials"). Both are signed with the relay
secret as SPEC §2 says and delivered by ``gate.relay.delivery`` (retried while the gate is
unreachable or answers 5xx, never after a 4xx) within DELIVERY_S seconds: an approver waits
for the page."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from gate.protocol import credentials
from gate.protocol.canonical import wire_json
from gate.relay.delivery import Answer, Courier, GateUnreachable

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0  # one attempt
DELIVERY_S = 5.0  # no attempt starts later than this after the first

__all__ = ["GateRefused", "GateUnreachable", "fetch_credentials", "post_decision"]


def _retrying(attempt: int, problem: str, _: float) -> None:
    log.warning("event=gate_retry attempt=%d error=%r", attempt, problem)


async def _post(url: str, body: bytes, secret: str) -> Answer:
    """Deliver ``body`` signed with ``secret`` to ``url`` within DELIVERY_S seconds, in a
    session of its own. Raises GateUnreachable."""
    async with aiohttp.ClientSession(trust_env=False) as session:
        courier = Courier(session, secret, TIMEOUT_S)
        return await courier.deliver(url, body, time.time() + DELIVERY_S, _retrying)


async def post_decision(
    url: str, body_obj: dict[str, Any], secret: str
) -> tuple[int, dict[str, Any]]:
    """POST a decision (or an answer) ``body_obj`` to the dispatch's callback ``url`` as
    canonical JSON signed with ``secret`` (SPEC §2 "Decision"); return the gate's HTTP
    status and its JSON answer (``{}`` when the answer is no JSON object). Each attempt
    times out after TIMEOUT_S; raises GateUnreachable when the gate never answered."""
    answer = await _post(url, wire_json(body_obj), secret)
    return answer.status, answer.fields()


async def fetch_credentials(
    callback_url: str, secrets: Sequence[str], max_skew: float
) -> credentials.CredentialsAnswer:
    """Ask the gate at ``callback_url`` (its relay listener base) for the approvers' public
    credentials (credentials channel): a signed ``credentials_request`` with the
    current secret, the answer's signature checked with ``secrets`` within ``max_skew``
    seconds and parsed. Returns the ``gate.protocol.credentials.CredentialsAnswer``. Raises
    GateUnreachable, ``GateRefused`` for an answer other than 200, or ProtocolError
    (401/400) for an answer whose signature or shape is wrong."""
    body = credentials.build_credentials_request(int(time.time()))
    url = callback_url.rstrip("/") + credentials.CREDENTIALS_PATH
    answer = await _post(url, body, secrets[0])
    if answer.status != 200:
        raise GateRefused(answer.status, answer.fields().get("reason"), url)
    return credentials.verify_credentials_answer(
        answer.raw, answer.signature, secrets, time.time(), max_skew
    )


class GateRefused(Exception):
    """The gate answered the credentials request with ``status`` (e.g. 404 ``not_found``:
    ``relay.credentials`` is off; 401: the secrets differ) and its ``reason``, at ``url``
    (its text names all three, never a secret)."""

    def __init__(self, status: int, reason: object, url: str) -> None:
        self.status = status
        self.reason = reason if isinstance(reason, str) else None
        self.url = url
        super().__init__(f"the gate answered {status} {self.reason or 'without a reason'} at {url}")
