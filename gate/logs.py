"""The one place that configures logging: lines on stderr, UTC timestamps.

Two formats. ``text`` (the default): ``<UTC time> <LEVEL> <logger> event=... key=value ...``,
for a human at a terminal. ``json``: one JSON object per line, for journald and log
collectors: ``ts`` (RFC 3339 UTC), ``level``, ``logger``, ``event``, then every ``key=value``
field of the message as its own key.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import sys
import time
from typing import Any

from gate.protocol.times import rfc3339_ms

FORMATS = ("text", "json")
# a line whose message has no ``event=`` field (a library's own message) gets this event and
# its message under ``text``
UNSTRUCTURED = "unstructured"
# keys of the JSON line itself: a message field of the same name is kept as ``<name>_``
_RESERVED = frozenset({"ts", "level", "logger", "event", "text", "exception", "stack"})
_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)=")
_FIRST_KEY = re.compile(r"(?:^|(?<=\s))[A-Za-z_][A-Za-z0-9_.]*=")
_NEXT_KEY = re.compile(r"\s+(?=[A-Za-z_][A-Za-z0-9_.]*=)")
_QUOTED = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\"""", re.DOTALL)
_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?[0-9]{1,18}\.[0-9]+")


def utc_timestamp(created: float) -> str:
    """Return ``created`` (unix seconds) as RFC 3339 UTC with milliseconds and ``Z``: the
    fixed-width time every screen shows (``gate.protocol.times.rfc3339_ms``, which formats
    each second once, not each line)."""
    return rfc3339_ms(int(created * 1000))


class _UTCFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return utc_timestamp(record.created)


def parse_fields(message: str) -> tuple[dict[str, Any], str]:
    """Split a ``key=value ...`` message into ``(fields, leading text)``.

    A value runs to the next `` key=`` (so the last one may hold spaces: ``message=disk I/O
    error``); a value written as a Python string literal (``error='no answer'``, from
    ``%r``) is unquoted. Whole numbers become ints, decimals floats, ``None`` null; anything
    else stays a string. Text before the first ``key=`` is returned apart.
    """
    first = _FIRST_KEY.search(message)
    if first is None:
        return {}, message.strip()
    fields: dict[str, Any] = {}
    leading = message[: first.start()].strip()
    pos, end = first.start(), len(message)
    while pos < end:
        key_match = _KEY.match(message, pos)
        if key_match is None:  # stray text after a quoted value: it belongs to no field
            nxt = _NEXT_KEY.search(message, pos)
            stop = nxt.start() if nxt else end
            leading = f"{leading} {message[pos:stop].strip()}".strip()
            pos = nxt.end() if nxt else end
            continue
        key, pos = key_match.group(1), key_match.end()
        quoted = _QUOTED.match(message, pos)
        if quoted and (quoted.end() == end or message[quoted.end()].isspace()):
            value: Any = _unquote(quoted.group(0))
            pos = quoted.end()
        else:
            nxt = _NEXT_KEY.search(message, pos)
            stop = nxt.start() if nxt else end
            value = _scalar(message[pos:stop].strip())
            pos = stop
        fields.setdefault(key, value)
        while pos < end and message[pos].isspace():
            pos += 1
    return fields, leading


def _unquote(literal: str) -> str:
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        return literal
    return value if isinstance(value, str) else literal


def _scalar(text: str) -> Any:
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if text == "None":
        return None
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``event``, the message's
    fields; ``text`` for words outside fields, ``exception`` for a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        fields, leading = parse_fields(record.getMessage())
        event = fields.pop("event", None)
        out: dict[str, Any] = {
            "ts": utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "event": str(event) if event is not None else UNSTRUCTURED,
        }
        for key, value in fields.items():
            out[f"{key}_" if key in _RESERVED else key] = value
        if leading:
            out["text"] = leading
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)  # ASCII: a lone surrogate cannot break the write


ACCEPT_FAILED_EVERY_S = 60.0


class AcceptFailures(logging.Filter):
    """Turns asyncio's "socket.accept() out of system resource" errors (logged with a
    traceback for every refused accept: hundreds a second while the process is out of file
    descriptors) into one ``event=accept_failed`` line per ``every_s`` seconds, with the
    reason and how many were left out since the last one. Other records pass unchanged."""

    def __init__(self, every_s: float = ACCEPT_FAILED_EVERY_S, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._last: float | None = None
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False for a repeat within the interval; rewrite the first of each interval."""
        if not str(record.msg).startswith("socket.accept() out of system resource"):
            return True
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            self._suppressed += 1
            return False
        error = record.exc_info[1] if record.exc_info else None
        reason = getattr(error, "strerror", None) or type(error).__name__
        record.msg = (
            "event=accept_failed reason=%r suppressed=%d (new connections are refused "
            "until descriptors free up: raise LimitNOFILE, or find who holds "
            "so many connections)"
        )
        record.args = (reason, self._suppressed)
        record.exc_info = None
        record.exc_text = None
        self._last, self._suppressed = now, 0
        return True


def configure(level: str = "INFO", log_format: str = "text") -> None:
    """Send log records to stderr: ``text`` as ``<UTC time> <LEVEL> <logger> <message>``,
    ``json`` as one JSON object per line (``JsonFormatter``).

    Messages are ``event=... key=value`` pairs; a line about an approval carries its
    ``approval_id``; they never carry a secret, a nonce or a draft body (its payload hash
    instead). Access logs are off: requests are logged by event.
    """
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}")
    # no line shows the caller, thread or process: skip collecting them per record (the
    # logging HOWTO's "Optimization" switches; about a quarter of a line's cost)
    logging._srcfile = None  # type: ignore[attr-defined,unused-ignore]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(_UTCFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.filters[:] = [f for f in asyncio_log.filters if not isinstance(f, AcceptFailures)]
    asyncio_log.addFilter(AcceptFailures())
