"""A bearer token checked the one way: the gate's API and metrics, the inbox's metrics. Pure."""

from __future__ import annotations

import hmac


def bearer_problem(header: str, expected: str) -> str | None:
    """Why the ``Authorization`` header value ``header`` does not carry ``expected`` as
    ``Bearer <token>``: ``token_missing`` (no such header, another scheme, a blank token) or
    ``token_invalid`` (another token, or ``expected`` empty); None when it does. Compared in
    constant time; a header with bytes that are not UTF-8 (kept by aiohttp as lone
    surrogates) never matches and never raises."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return "token_missing"
    presented = token.strip().encode("utf-8", "surrogateescape")
    wanted = expected.encode("utf-8")
    if not wanted or not hmac.compare_digest(presented, wanted):
        return "token_invalid"
    return None
