"""RFC 3339 times as hitl/v0 writes and reads them: unix milliseconds to UTC with ``Z``
(the wire's form, and a fixed-width one for people), and a date-time back to milliseconds.
Pure."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime


@functools.lru_cache(maxsize=256)
def _utc_seconds(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def rfc3339(ms: int) -> str:
    """Format unix milliseconds as RFC 3339 UTC with ``Z``; fraction only when non-zero (like Go's
    RFC3339Nano)."""
    base = _utc_seconds(ms // 1000)
    frac = ms % 1000
    return f"{base}.{frac:03d}".rstrip("0") + "Z" if frac else base + "Z"


def rfc3339_ms(ms: int) -> str:
    """Format unix milliseconds as RFC 3339 UTC with exactly three fraction digits and ``Z``
    (``2026-12-07T10:20:16.400Z``): fixed width, for what a person reads. The wire keeps
    ``rfc3339``."""
    return f"{_utc_seconds(ms // 1000)}.{ms % 1000:03d}Z"


# RFC 3339 §5.6 date-time: full date, "T" (or "t", or a space per its note), full time with
# seconds and an optional fraction, then "Z"/"z" or a numeric offset
_RFC3339 = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]+))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _is_rfc3339(text: str) -> bool:
    """True when ``text`` is an RFC 3339 date-time of a real instant (``fromisoformat`` alone
    also takes a date, a time without seconds or offset, and ISO 8601's basic format)."""
    return rfc3339_to_ms(text) is not None


def rfc3339_to_ms(text: str) -> int | None:
    """The instant of the RFC 3339 date-time ``text`` as unix milliseconds (a finer fraction
    cut, not rounded); None when ``text`` is no RFC 3339 date-time of a real instant."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    day, clock, fraction, offset = match.groups()
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        when = datetime.fromisoformat(f"{day}T{clock}.{(fraction or '0')[:6]:0<6}{offset}")
    except ValueError:
        return None
    return int(when.replace(microsecond=0).timestamp()) * 1000 + when.microsecond // 1000
