"""Signed delivery to the gate: a relay's decision, answer or credentials request signed with
the relay secret (SPEC §2) and POSTed to the gate's callback URL, with the one retry policy
every relay shares (docs/protocol.md, "Answers, in check order").

The policy: each attempt is signed afresh (a new ``t``; the body bytes never change) and
redirects are never followed. An HTTP answer below 500 ends the delivery at once: a 2xx is
taken, a 4xx is the gate's verdict and is never retried. A 5xx, a connection error or a
timeout is retried after 1 s, then 2, 4, ... up to 30 s between attempts, while the next
attempt still starts before the ``deadline``. The gate takes a re-sent decision at most once
(the same nonce and approver: 409 ``duplicate``), so a retry after a lost answer is safe.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gate.protocol import SIGNATURE_HEADER, signing

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
MAX_ANSWER_BYTES = 4 * 1024 * 1024

Retrying = Callable[[int, str, float], None]
"""Told before each retry: the attempt that failed (1-based), what went wrong
(``HTTP 503``, ``ClientConnectorError: ...``) and the pause before the next (seconds)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What the gate answered: its HTTP ``status``, the ``raw`` body (at most
    MAX_ANSWER_BYTES) and its ``X-Draftcat-Signature`` header (None without one)."""

    status: int
    raw: bytes
    signature: str | None = None

    def decoded(self) -> Any:
        """The body as JSON, or as text when it is no JSON (a proxy's error page)."""
        try:
            return json.loads(self.raw)
        except ValueError:
            return self.raw.decode("utf-8", "replace")

    def fields(self) -> dict[str, Any]:
        """The body as a JSON object, ``{}`` when it is none."""
        decoded = self.decoded()
        return decoded if isinstance(decoded, dict) else {}


class GateUnreachable(Exception):
    """No HTTP answer came from the gate before the deadline. Its text says what the last
    attempt met in a few words (``cannot reach the gate: ClientConnectorError``, ``the gate
    did not answer within 10 s``), never a URL or a secret; ``problem`` says it in full for
    a log line."""

    def __init__(self, exc: Exception, timeout_s: float | None) -> None:
        self.problem = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, aiohttp.ClientError):
            text = f"cannot reach the gate: {type(exc).__name__}"
        elif timeout_s is not None:
            text = f"the gate did not answer within {timeout_s:g} s"
        else:
            text = "the gate did not answer in time"
        super().__init__(text)


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float | None = None,
) -> Answer:
    """One POST of ``body`` with ``headers`` (redirects never followed; ``timeout_s`` seconds
    in all, None: the session's own), the answer read whole. Raises aiohttp.ClientError or
    TimeoutError when no answer came."""
    timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else None
    async with session.post(
        url, data=body, headers=headers, allow_redirects=False, timeout=timeout
    ) as resp:
        raw = b""  # read to its end: one read(n) returns only what has arrived so far
        while len(raw) < MAX_ANSWER_BYTES:
            chunk = await resp.content.read(MAX_ANSWER_BYTES - len(raw))
            if not chunk:
                break
            raw += chunk
        return Answer(resp.status, raw, resp.headers.get(SIGNATURE_HEADER))


@dataclass(frozen=True, slots=True)
class Courier:
    """Delivers bodies to the gate under the module's retry policy: through ``session``,
    signed with ``secret`` (the relay secret), each attempt bounded by ``timeout_s`` seconds
    (None: the session's own timeout)."""

    session: aiohttp.ClientSession
    secret: str = field(repr=False)
    timeout_s: float | None = None

    async def deliver(
        self, url: str, body: bytes, deadline: float, retrying: Retrying | None = None
    ) -> Answer:
        """POST ``body`` to ``url`` until ``deadline`` (unix seconds); ``retrying`` is told
        of each retry (for the caller's log line). Returns the first answer below 500, else
        the last 5xx when the deadline comes; raises GateUnreachable when the last attempt
        got no HTTP answer."""
        delay, attempt = FIRST_DELAY_S, 0
        while True:
            attempt += 1
            try:
                headers = signing.signed_headers(self.secret, int(time.time()), body)
                answer = await post(self.session, url, body, headers, self.timeout_s)
            except (aiohttp.ClientError, TimeoutError) as exc:
                if time.time() + delay >= deadline:
                    raise GateUnreachable(exc, self.timeout_s) from exc
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if answer.status < 500 or time.time() + delay >= deadline:
                    return answer
                problem = f"HTTP {answer.status}"
            if retrying is not None:
                retrying(attempt, problem, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)
