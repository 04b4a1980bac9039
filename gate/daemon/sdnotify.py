"""A tiny sd_notify(3): service readiness and watchdog messages to systemd, no library needed.

systemd (``Type=notify``) hands the daemon ``NOTIFY_SOCKET``: the address of an AF_UNIX
datagram socket, either a path (``/run/systemd/notify``) or an abstract name written with a
leading ``@``. Each message is one datagram of newline-separated ``KEY=VALUE`` assignments
(``READY=1``, ``STATUS=...``, ``STOPPING=1``, ``RELOADING=1``, ``WATCHDOG=1``). Without
``NOTIFY_SOCKET`` every call does nothing, so the daemon runs the same outside systemd.

Sending never raises and never blocks: a notification that cannot be delivered (socket
gone, queue full) is logged once at WARNING and otherwise ignored, as sd_notify does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping

from gate.protocol.numbers import ascii_int

log = logging.getLogger(__name__)


def socket_address(value: str | None) -> str | bytes | None:
    """Return the ``sendto`` address of a ``NOTIFY_SOCKET`` value, or None if there is none.

    ``/path`` is a filesystem socket; ``@name`` an abstract one (``\\0name``). Other forms
    (e.g. systemd 254's ``vsock:``) are not supported: None, with a warning.
    """
    if not value:
        return None
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode("utf-8", "surrogateescape")
    log.warning("event=notify_socket_unsupported reason=not_a_unix_socket_address")
    return None


def watchdog_interval(environ: Mapping[str, str], pid: int | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``WATCHDOG_USEC``, or None when no
    watchdog is asked of this process (unset, invalid, zero, or ``WATCHDOG_PID`` is set and
    names another process)."""
    usec = ascii_int(environ.get("WATCHDOG_USEC", ""))
    if not usec:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner and ascii_int(owner) != (os.getpid() if pid is None else pid):
        return None
    return usec / 2 / 1_000_000


class Notifier:
    """Sends sd_notify messages to ``NOTIFY_SOCKET`` (read from ``environ`` at construction)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = socket_address(env.get("NOTIFY_SOCKET"))
        self.watchdog_s = watchdog_interval(env) if self.address is not None else None
        self._warned = False

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` assignments as one datagram; True if it was sent.

        A newline inside a value would start another assignment: it is replaced by a space.
        """
        if self.address is None:
            return False
        lines = [a.replace("\n", " ") for a in assignments]
        data = "\n".join(lines).encode("utf-8", "replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)
                sock.sendto(data, self.address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("event=notify_failed error=%s", exc.strerror or type(exc).__name__)
            return False
        return True

    def ready(self, status: str) -> bool:
        """``READY=1`` with ``STATUS=status``: startup (or a reload) is complete."""
        return self.notify("READY=1", f"STATUS={status}")

    def reloading(self) -> bool:
        """``RELOADING=1`` (with ``MONOTONIC_USEC``, as systemd 253+ wants); READY=1 ends it."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading")

    def stopping(self, status: str = "stopping") -> bool:
        """``STOPPING=1``: the daemon is shutting down."""
        return self.notify("STOPPING=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        """``STATUS=status``: free text shown by ``systemctl status``."""
        return self.notify(f"STATUS={status}")

    async def run_watchdog(self) -> None:
        """Send ``WATCHDOG=1`` every ``WATCHDOG_USEC``/2 until cancelled (nothing if unset).

        The pings come from the event loop itself, so they stop when the loop hangs; a
        storage fault does not stop them (the gate recovers from it without a restart).
        """
        if self.watchdog_s is None:
            return
        log.info("event=watchdog_enabled interval_s=%g", self.watchdog_s)
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_s)
