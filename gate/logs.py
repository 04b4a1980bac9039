"""The one place that configures logging: key=value lines on stderr, UTC timestamps."""

from __future__ import annotations

import logging
import sys
import time


class _UTCFormatter(logging.Formatter):
    converter = time.gmtime

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return time.strftime("%Y-%m-%dT%H:%M:%S", self.converter(record.created)) + (
            f".{int(record.msecs):03d}Z")


def configure(level: str = "INFO") -> None:
    """Send log records to stderr as ``<UTC time> <LEVEL> <logger> <message>``.

    Messages are ``event=... key=value`` pairs; they never carry a secret or a draft
    body (its payload hash instead). Access logs are off: requests are logged by event.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_UTCFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
