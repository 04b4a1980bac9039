"""The reference relay's sending: sign a decision or an answer and POST it to the callback URL,
retrying with backoff while the gate is unreachable or answers 5xx, until the dispatch's
``expires_at``."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.canonical import wire_json
from gate.tools.reference_relay.state import expiry_of

# the relay's log lines keep the logger name they had before this module was split out
log = logging.getLogger("gate.tools.reference_relay.relay")

RETRY_CAP_S = 30.0


async def post_signed(
    session: aiohttp.ClientSession, secret: str, url: str, message: dict[str, Any]
) -> tuple[int, Any]:
    """Sign ``message`` (a decision or an answer) with a fresh ``t`` and POST it to
    ``url`` without following redirects; return (status, decoded answer or its text).

    Raises aiohttp.ClientError or TimeoutError when the gate cannot be reached.
    """
    body = wire_json(message)
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        PROTOCOL_HEADER: PROTOCOL,
        SIGNATURE_HEADER: signing.sign(secret, int(time.time()), body),
    }
    async with session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
        text_answer = await resp.text()
        try:
            answer = json.loads(text_answer)
        except ValueError:
            answer = text_answer
        return resp.status, answer


async def deliver_with(
    envelope: dict[str, Any],
    identity: str,
    send: Callable[[], Awaitable[tuple[int, Any]]],
) -> tuple[int, Any] | None:
    """``send()`` (a decision's or an answer's POST) until the gate answers below 500,
    retrying with backoff while it is unreachable or answers 5xx, until the dispatch's
    ``expires_at``. Returns the last answer, or None if it never came."""
    subject = (
        f"question_id={envelope.get('question_id')}"
        if envelope.get("kind") == "question"
        else f"approval_id={envelope.get('approval_id')}"
    )
    deadline = expiry_of(envelope, time.time())
    delay = 1.0
    while True:
        try:
            status, answer = await send()
            if status < 500:
                return status, answer
            problem = f"HTTP {status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if time.time() + delay >= deadline:
            log.error(
                "event=decision_lost %s approver=%s error=%r (it expires at the gate)",
                subject,
                identity,
                problem,
            )
            return None
        log.warning(
            "event=decision_retry %s approver=%s error=%r retry_in_s=%.0f",
            subject,
            identity,
            problem,
            delay,
        )
        await asyncio.sleep(delay)
        delay = min(delay * 2, RETRY_CAP_S)
