"""Reading a whole request body under a size limit (review rev17a finding 2):
``request.content.read(n)`` answers with what has arrived SO FAR, so a body larger than one
network read was cut (a 1 MB dispatch refused ``signature_mismatch``, a long adjust
``csrf_mismatch``). One helper for every inbox handler that reads a body."""

from __future__ import annotations

from aiohttp import web


async def read_whole(request: web.Request, limit: int) -> bytes | None:
    """The request's whole body (bytes), or None when it is larger than ``limit`` bytes (a
    Content-Length over it is refused before reading; a body without one is read at most up
    to the app's ``client_max_size``, which must exceed ``limit``). The caller answers None
    with 413 ``body_too_large``."""
    if request.content_length is not None and request.content_length > limit:
        return None
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return None
    return raw if len(raw) <= limit else None
