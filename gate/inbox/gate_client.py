"""The inbox's signed calls to the gate: a decision (or a question's answer)
posted to the dispatch's callback URL, and the approvers' public credentials fetched over
the credentials channel (docs/protocol.md "Credentials"). Both are signed with the relay
secret as SPEC §2 says; a call is retried only when the gate could not be reached, never
after it answered (an answer, even a 5xx, is what the approver is told)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, credentials, signing
from gate.protocol.canonical import wire_json

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
ATTEMPTS = 3
BACKOFF_S = (0.5, 1.0)  # before the 2nd and 3rd attempt
CREDENTIALS_PATH = "/hitl/v0/credentials"  # part A's gate.protocol.credentials.CREDENTIALS_PATH
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class GateUnreachable(Exception):
    """The gate could not be reached after ``ATTEMPTS`` tries (nothing was answered)."""


async def _post(
    url: str, body: bytes, secret: str, session: aiohttp.ClientSession | None
) -> tuple[int, bytes, str | None]:
    """One signed POST of ``body`` (a fresh ``t`` per attempt), retried on connection
    errors only; returns (status, raw answer, its signature header). Raises GateUnreachable."""
    own = session is None
    client = session or aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=TIMEOUT_S), trust_env=False
    )
    try:
        for attempt in range(ATTEMPTS):
            headers = {
                "Content-Type": "application/json; charset=utf-8",
                PROTOCOL_HEADER: PROTOCOL,
                SIGNATURE_HEADER: signing.sign(secret, int(time.time()), body),
            }
            try:
                async with client.post(
                    url, data=body, headers=headers, allow_redirects=False
                ) as resp:
                    raw = await _answer(resp)
                    return resp.status, raw, resp.headers.get(SIGNATURE_HEADER)
            except aiohttp.ClientConnectionError as exc:
                if attempt + 1 == ATTEMPTS:
                    raise GateUnreachable(f"cannot reach the gate: {type(exc).__name__}") from exc
                log.warning("event=gate_retry attempt=%d error=%s", attempt + 1, type(exc).__name__)
                await asyncio.sleep(BACKOFF_S[attempt])
            except TimeoutError as exc:  # sent, maybe taken: never sent twice blindly
                raise GateUnreachable(f"the gate did not answer within {TIMEOUT_S:g} s") from exc
        raise AssertionError("unreachable")  # pragma: no cover
    finally:
        if own:
            await client.close()


async def _answer(resp: aiohttp.ClientResponse) -> bytes:
    """The gate's answer, read until its end (one ``read(n)`` returns only what has arrived
    so far), at most MAX_ANSWER_BYTES (review rev17a finding 2)."""
    data = b""
    while len(data) < MAX_ANSWER_BYTES:
        chunk = await resp.content.read(MAX_ANSWER_BYTES - len(data))
        if not chunk:
            break
        data += chunk
    return data


async def post_decision(
    url: str,
    body_obj: dict[str, Any],
    secret: str,
    session: aiohttp.ClientSession | None = None,
) -> tuple[int, dict[str, Any]]:
    """POST a decision (or an answer) ``body_obj`` to the dispatch's callback ``url`` as
    canonical JSON signed with ``secret`` (SPEC §2 "Decision"); return the gate's HTTP
    status and its JSON answer (``{}`` when the answer is no JSON object). Times out after
    10 s; retried only when the gate could not be reached (then raises GateUnreachable),
    never after an HTTP answer."""
    status, raw, _ = await _post(url, wire_json(body_obj), secret, session)
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    return status, answer if isinstance(answer, dict) else {}


async def fetch_credentials(
    callback_url: str,
    secrets: Sequence[str],
    max_skew: float,
    session: aiohttp.ClientSession | None = None,
) -> credentials.CredentialsAnswer:
    """Ask the gate at ``callback_url`` (its relay listener base) for the approvers' public
    credentials (credentials channel): a signed ``credentials_request`` with the
    current secret, the answer's signature checked with ``secrets`` within ``max_skew``
    seconds and parsed. Returns the ``gate.protocol.credentials.CredentialsAnswer``. Raises
    GateUnreachable, ``GateRefused`` for an answer other than 200, or ProtocolError
    (401/400) for an answer whose signature or shape is wrong."""
    body = credentials.build_credentials_request(int(time.time()))
    url = callback_url.rstrip("/") + CREDENTIALS_PATH
    status, raw, header = await _post(url, body, secrets[0], session)
    if status != 200:
        raise GateRefused(status, raw, url)
    return credentials.verify_credentials_answer(raw, header, secrets, time.time(), max_skew)


class GateRefused(Exception):
    """The gate answered the credentials request with ``status`` (e.g. 404 ``not_found``:
    ``relay.credentials`` is off; 401: the secrets differ) and its ``reason``, at ``url``
    (its text names all three, never a secret)."""

    def __init__(self, status: int, raw: bytes, url: str = "") -> None:
        try:
            reason = json.loads(raw).get("reason")
        except (ValueError, AttributeError):
            reason = None
        self.status = status
        self.reason = reason if isinstance(reason, str) else None
        self.url = url
        where = f" at {url}" if url else ""
        super().__init__(f"the gate answered {status} {self.reason or 'without a reason'}{where}")
