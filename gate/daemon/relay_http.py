"""The only outbound HTTP of the gate: the relay session, one signed POST and what it
answered, with the secrets of a URL kept out of error texts."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import aiohttp
from yarl import URL

from gate.protocol import signing
from gate.protocol.relay_answers import MAX_ANSWER_BYTES, relay_reason

MAX_ERROR_CHARS = 300


def relay_session(ca_file: Path | None = None) -> aiohttp.ClientSession:
    """Return the HTTP client session for dispatches.

    TLS certificates of an https relay are always verified: against ``ca_file`` (a PEM
    bundle, e.g. a private CA; it replaces the system CAs) when given, else against the
    system's CAs. Proxy variables of the environment are ignored (``trust_env=False``).
    Cookies a relay sets are neither kept nor sent back (a dispatch carries no state but
    its signed envelope; and no cookie jar is run per request).
    """
    tls: ssl.SSLContext | bool = True
    if ca_file is not None:
        tls = ssl.create_default_context(cafile=str(ca_file))
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=tls),
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


@dataclass(frozen=True, slots=True)
class SendResult:
    """One POST's result: HTTP ``status`` (None if none came), ``error`` (None = acked, 2xx),
    ``elapsed_s`` until the answer or the failure, in seconds, and ``failure``: why it was
    not acked (``http_status``, ``timeout``, ``connection``), None when acked."""

    status: int | None
    error: str | None
    elapsed_s: float
    failure: str | None = None


async def post_signed(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    secret: str,
    t: int,
    timeout_s: float,
    *,
    signature: str | None = None,
) -> SendResult:
    """POST ``body`` signed at unix second ``t`` (or with ``signature`` as given, for tests of
    relays); redirects are never followed; an ack is any 2xx within ``timeout_s`` seconds."""
    headers = signing.signed_headers(secret, t, body, signature)
    started = time.monotonic()
    try:
        async with session.post(
            url,
            data=body,
            headers=headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            status = resp.status
            if 200 <= status < 300:
                return SendResult(status, None, time.monotonic() - started)
            reason = relay_reason(await _answer_head(resp))  # the relay's words: redacted
            error = f"relay answered HTTP {status}" + (f": {redact(reason, url)}" if reason else "")
            return SendResult(status, error, time.monotonic() - started, "http_status")
    except TimeoutError:
        return SendResult(
            None, f"no answer within {timeout_s:g} s", time.monotonic() - started, "timeout"
        )
    except aiohttp.ClientError as exc:
        return SendResult(
            None,
            redact(f"{type(exc).__name__}: {exc}", url)[:MAX_ERROR_CHARS],
            time.monotonic() - started,
            "connection",
        )


async def _answer_head(resp: aiohttp.ClientResponse) -> bytes:
    """Up to MAX_ANSWER_BYTES of a refusal's body; b"" when reading it fails or times out
    (the status is the answer: the body only explains it)."""
    data = b""
    try:
        while len(data) < MAX_ANSWER_BYTES:
            chunk = await resp.content.read(MAX_ANSWER_BYTES - len(data))
            if not chunk:
                break
            data += chunk
    except (TimeoutError, aiohttp.ClientError):
        return b""
    return data


def redact(text: str, url: str) -> str:
    """Return ``text`` (an error message about ``url``) with the URL's secrets removed.

    A Power Automate or webhook URL carries its access signature in the query, and a URL may
    carry a password: every form of them is replaced by ``<redacted>``: the query as written
    and as decoded (yarl prints ``%2F`` as ``/``), each query value of four or more
    characters in both forms, the password and the fragment; error texts that drop the
    userinfo are covered because values are matched, not whole URLs (security review).
    """
    try:
        parsed = URL(url)
    except (TypeError, ValueError):
        return text
    secrets: set[str] = {
        parsed.raw_query_string,
        parsed.query_string,
        unquote(parsed.raw_query_string),
        parsed.raw_fragment,
        parsed.fragment,
    }
    for value in (parsed.raw_password, parsed.password):
        if value:
            secrets.add(value)
            secrets.add(quote(value, safe=""))
    for _, value in parsed.query.items():
        if len(value) >= 4:
            secrets.update({value, quote(value, safe=""), quote(value)})
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text
