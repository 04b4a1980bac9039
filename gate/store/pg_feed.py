"""The change feed of the gates on one PostgreSQL database: what any gate appended to the
audit log, read by ``seq`` on every gate, so a long-poll on one gate wakes when another
resolves its request.

A write batch that appended entries moves the chain's head (``audit_head``), and a trigger
on that row (``pg_schema.CLUSTER``) notifies ``hitl_gate`` with the new seq, sent at the
batch's COMMIT. Each gate's ``Feed`` holds one dedicated listener session (``LISTEN
hitl_gate``) and, on a notification, after every (re)connection and at least every
``poll_s``, reads the entries after its cursor (``changes_after``). The cursor never skips
an entry: ``seq`` is given under the lock on the audit head, held to COMMIT, so entries
commit in ``seq`` order. A notification lost while the listener reconnects costs nothing
but the wait for the next read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.audit.entries import DECISION
from gate.errors import Unavailable
from gate.store.pg_session import close_quietly, connect, unavailable

log = logging.getLogger(__name__)

CHANNEL = "hitl_gate"  # the trigger on audit_head notifies it (pg_schema.CLUSTER)
POLL_S = 1.0  # the fallback: the feed reads at least this often
PAGE = 1000  # entries per read
RECONNECT_MAX_S = 5.0  # the longest wait between two attempts to reconnect


@dataclass(frozen=True, slots=True)
class Change:
    """One audit entry as the feed reports it: its ``seq``, ``kind``, the id of the
    request it is about (None for entries about no request) and, for a decision, whether it
    made a new revision (an adjust: its entry names ``new_revision``)."""

    seq: int
    kind: str
    request_id: str | None
    revised: bool = False


# a decision entry that made a new revision: canonical JSON (compact) names it at the top of
# its data; the same text nested in a field of the entry can only make ``revised`` True
# when it is not (a wake-up for nothing), never the other way round
_REVISED = '"new_revision":'


async def head(conn: Any) -> int:
    """The ``seq`` of the newest audit entry (0 for an empty log). Raises Unavailable."""
    with unavailable("reading the audit head"):
        cursor = await conn.execute("SELECT coalesce(max(seq), 0) FROM audit_log")
        (seq,) = await cursor.fetchone()
    return int(seq)


async def head_entry(conn: Any) -> tuple[str, str] | None:
    """``(entry_hash, receipt)`` of the newest audit entry, as the chain's head names it
    (None for an empty log). Raises Unavailable."""
    with unavailable("reading the audit head"):
        cursor = await conn.execute(
            "SELECT l.entry_hash, l.receipt FROM audit_head h JOIN audit_log l ON l.seq = h.seq"
            " WHERE h.id = 1"
        )
        row = await cursor.fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


async def changes_after(conn: Any, cursor: int, limit: int = PAGE) -> list[Change]:
    """The entries after ``seq`` ``cursor``, oldest first, at most ``limit``. Raises
    Unavailable."""
    with unavailable("reading the audit log"):
        rows = await conn.execute(
            "SELECT seq, kind, approval_id, kind = %s AND strpos(entry, %s) > 0"
            " FROM audit_log WHERE seq > %s ORDER BY seq LIMIT %s",
            (DECISION, _REVISED, cursor, limit),
        )
        found = await rows.fetchall()
    return [
        Change(int(seq), kind, request_id, bool(revised))
        for seq, kind, request_id, revised in found
    ]


class Feed:
    """One gate's change feed over ``url`` (with ``password``, or None): ``run`` calls
    ``on_changes`` with every entry appended after it started (in ``seq`` order, in lists
    of at most PAGE), whichever gate appended it, until cancelled.

    The listener session is ``hitl-gate/listener/<instance_id>``. When it is lost (the
    server restarted, the session was terminated) the feed logs ``event=listen_lost``,
    reconnects with a growing pause (up to RECONNECT_MAX_S), logs
    ``event=listen_reconnected`` and reads what it missed. ``cursor`` is the last ``seq``
    reported (None before the first connection: the feed starts at the head then);
    ``reads`` counts the reads, ``notified`` the notifications received.
    """

    def __init__(
        self,
        url: str,
        instance_id: str,
        on_changes: Callable[[list[Change]], None],
        poll_s: float = POLL_S,
        *,
        password: str | None = None,
    ) -> None:
        self.url = url
        self.password = password
        self.instance_id = instance_id
        self.on_changes = on_changes
        self.poll_s = poll_s
        self.cursor: int | None = None
        self.connected = asyncio.Event()
        self.reads = 0
        self.notified = 0

    async def run(self) -> None:
        """Loop until cancelled (the class's docstring)."""
        pause = 0.0
        lost = False
        while True:
            conn = None
            try:
                conn = await connect(self.url, "listener", self.instance_id, self.password)
                with unavailable("listening for changes"):
                    await conn.execute(f"LISTEN {CHANNEL}")
                if self.cursor is None:
                    self.cursor = await head(conn)
                if lost:
                    log.info("event=listen_reconnected cursor=%d", self.cursor)
                lost, pause = False, 0.0
                self.connected.set()
                await self._listen(conn)
            except Unavailable as exc:
                self.connected.clear()
                if not lost:
                    log.warning("event=listen_lost message=%s", exc.message)
                lost = True
                pause = min(RECONNECT_MAX_S, max(0.1, pause * 2))
            finally:
                await close_quietly(conn)
            await asyncio.sleep(pause)

    async def _listen(self, conn: Any) -> None:
        """Read what is new, then wait for a notification or ``poll_s``; again, until the
        session fails (Unavailable)."""
        while True:
            await self._catch_up(conn)
            with unavailable("waiting for notifications"):
                async for _ in conn.notifies(timeout=self.poll_s, stop_after=1):
                    self.notified += 1

    async def _catch_up(self, conn: Any) -> None:
        assert self.cursor is not None
        while True:
            changes = await changes_after(conn, self.cursor)
            self.reads += 1
            if not changes:
                return
            self.cursor = changes[-1].seq
            self.on_changes(changes)
            if len(changes) < PAGE:
                return
