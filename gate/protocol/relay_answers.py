"""What a relay's refusal of a dispatch tells an operator: its JSON ``reason``, made safe to
log and show, and the stored ``last_error`` split into status and reason again."""

from __future__ import annotations

import json
import re

from gate.protocol.numbers import ascii_int

# a refusal's ``reason`` is read from at most this many bytes of the relay's answer and kept
# to at most this many characters (docs/design.md, "Dispatch")
MAX_ANSWER_BYTES = 4096
MAX_REASON_CHARS = 100
# printable ASCII but quotes, backslash and backtick: what a relay's reason may keep as is
_UNSAFE = re.compile(r"[^ !#-&(-\[\]-_a-~]+")
_REFUSED = re.compile(r"relay answered HTTP ([0-9]{3}): (.+)")


def relay_reason(answer: bytes) -> str | None:
    """Return the ``reason`` of a relay's JSON answer (``{"status": ..., "reason": ...}``,
    hitl/v0's refusal shape), made safe to log and show, or None.

    ``answer`` is at most MAX_ANSWER_BYTES of the body (a longer JSON body does not parse:
    no reason). The reason must be a string; whitespace becomes single spaces, each run of
    other characters outside printable ASCII, and quotes, backslash and backtick, becomes
    ``?``; the result is cut to MAX_REASON_CHARS. A reason without a letter or digit left
    counts as none. Never raises.
    """
    try:
        parsed = json.loads(answer)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, cut off, or nested too deep
        return None
    reason = parsed.get("reason") if isinstance(parsed, dict) else None
    if not isinstance(reason, str):
        return None
    clean = _UNSAFE.sub("?", " ".join(reason.split()))[:MAX_REASON_CHARS].strip()
    return clean if any(c.isalnum() for c in clean) else None


def refusal_reason(error: str | None) -> tuple[int, str | None] | None:
    """Split a stored ``last_error`` of a refused dispatch (``relay answered HTTP 401:
    timestamp_out_of_window``) into ``(status, reason or None)``; None for other errors."""
    if not error or not error.startswith("relay answered HTTP "):
        return None
    match = _REFUSED.fullmatch(error)
    if match is not None:
        return int(match.group(1)), match.group(2)
    digits = error.removeprefix("relay answered HTTP ")
    status = ascii_int(digits)
    return None if status is None else (status, None)
