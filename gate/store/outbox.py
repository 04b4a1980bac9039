"""The one outbox contract of the store: queue a send, plan what is due, record an attempt,
give up. Over the four delivery tables as they are (``outbox`` and ``question_outbox`` of
migrations 1 and 5: a request's dispatches; ``followup_outbox`` and ``question_notices`` of
migrations 4 and 5: reminders, escalations and resolution notices), each an ``OutboxTable``
naming its closed set of identifiers. Rows come out as frozen values (``DueDispatch``,
``DueFollowUp``, ``DueNotice``), read by the daemon's channels (``gate.daemon.delivery``).

Two families share the contract and differ in how a row ends:

- a **dispatch** (``request`` set) is due while its request is pending at that version, and
  is retried until the request resolves: it never gives up, and an ack sets ``delivered_at``
  and ``next_attempt_at`` to the ack time;
- a **send with a give-up time** (``give_up_at``): retried until then, then ``failed_at``; a
  drop (no retry time: its target was turned off, its approval resolved) fails it at once
  and is no attempt.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gate.store.approvals import APPROVALS
from gate.store.questions import QUESTIONS
from gate.store.requests import RequestTables

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class DueDispatch:
    """A due dispatch (``outbox``, ``question_outbox``): ``version`` (an approval's revision,
    a question's version) of the request ``request_id``, ``attempts`` so far and the
    ``next_attempt_at`` it was due at (unix ms)."""

    request_id: str
    version: int
    attempts: int
    next_attempt_at: int

    @property
    def key(self) -> tuple[str, int]:
        """The row's primary key."""
        return (self.request_id, self.version)


@dataclass(frozen=True, slots=True)
class DueFollowUp:
    """A due ``followup_outbox`` row: the ``kind`` (``reminder``, ``escalation``, ``notice``)
    and number ``n`` of ``approval_id``, sending ``revision``; ``attempts`` so far, due at
    ``next_attempt_at``, failed if not delivered by ``give_up_at`` (unix ms)."""

    approval_id: str
    kind: str
    n: int
    revision: int
    attempts: int
    next_attempt_at: int
    give_up_at: int

    @property
    def key(self) -> tuple[str, str, int]:
        """The row's primary key."""
        return (self.approval_id, self.kind, self.n)


@dataclass(frozen=True, slots=True)
class DueNotice:
    """A due ``question_notices`` row: the resolution notice of ``question_id`` (its final
    ``version``), ``attempts`` so far, due at ``next_attempt_at``, failed if not delivered by
    ``give_up_at`` (unix ms)."""

    question_id: str
    version: int
    attempts: int
    next_attempt_at: int
    give_up_at: int

    @property
    def key(self) -> tuple[str]:
        """The row's primary key."""
        return (self.question_id,)


@dataclass(frozen=True, slots=True)
class Attempt:
    """A recorded attempt: the row's ``state`` after it (``delivered``, ``retry`` or
    ``failed``) and its ``attempts`` so far."""

    state: str
    attempts: int


@dataclass(frozen=True, slots=True)
class OutboxTable(Generic[R]):
    """One delivery table and its closed set of identifiers: ``table`` (its unsent rows are
    in the partial index ``{table}_due``), ``columns`` (what a queued row names: its primary
    key, the first ``key`` of them, then the version it sends), ``row`` (its due rows'
    value, made from ``columns``, ``attempts``, ``next_attempt_at`` and, without ``request``,
    ``give_up_at``) and ``kinds`` (the values the second column may take; () any).

    ``request`` is the kind of request (``gate.store.requests.RequestTables``) a dispatch
    belongs to: set, the table holds dispatches; None, its rows have a give-up time."""

    table: str
    columns: tuple[str, ...]
    key: int
    row: Callable[..., R]
    request: RequestTables[Any, Any] | None = None
    kinds: tuple[str, ...] = ()

    def _unsent(self) -> tuple[str, str]:
        """``(FROM clause, WHERE condition)`` of the rows still to be sent."""
        source = f"FROM {self.table} o INDEXED BY {self.table}_due"
        if self.request is None:
            return source, "o.delivered_at IS NULL AND o.failed_at IS NULL"
        table, id_column, version = self.request.table, self.request.id, self.request.version
        return (
            f"{source} JOIN {table} r ON r.{id_column} = o.{id_column}",
            f"o.delivered_at IS NULL AND r.state = 'pending' AND r.{version} = o.{version}",
        )


DISPATCHES: OutboxTable[DueDispatch] = OutboxTable(
    "outbox", ("approval_id", "revision"), 2, DueDispatch, APPROVALS
)
QUESTION_DISPATCHES: OutboxTable[DueDispatch] = OutboxTable(
    "question_outbox", ("question_id", "version"), 2, DueDispatch, QUESTIONS
)
FOLLOWUPS: OutboxTable[DueFollowUp] = OutboxTable(
    "followup_outbox",
    ("approval_id", "kind", "n", "revision"),
    3,
    DueFollowUp,
    kinds=("reminder", "escalation", "notice"),
)
QUESTION_NOTICES: OutboxTable[DueNotice] = OutboxTable(
    "question_notices", ("question_id", "version"), 1, DueNotice
)


def plan(
    conn: sqlite3.Connection, outbox: OutboxTable[R], now_ms: int, limit: int
) -> tuple[list[R], int | None]:
    """Up to ``limit`` rows of ``outbox`` due at ``now_ms`` (unix ms), earliest first, and the
    earliest ``next_attempt_at`` of any unsent row, due or not (None when there is none):
    for a dispatch, only of a pending request's current version. Both through the table's
    partial index: no scan. Run it in one snapshot (``gate.store.reads.Reads.outbox_plan``)."""
    source, unsent = outbox._unsent()
    columns = ", ".join(f"o.{column}" for column in outbox.columns)
    extra = "" if outbox.request is not None else ", o.give_up_at"
    due = conn.execute(
        f"SELECT {columns}, o.attempts, o.next_attempt_at{extra} {source}"
        f" WHERE {unsent} AND o.next_attempt_at <= ? ORDER BY o.next_attempt_at LIMIT ?",
        (now_ms, limit),
    ).fetchall()
    first = conn.execute(
        f"SELECT o.next_attempt_at {source} WHERE {unsent} ORDER BY o.next_attempt_at LIMIT 1"
    ).fetchone()
    return [outbox.row(*row) for row in due], None if first is None else int(first[0])


class OutboxStatements:
    """The outbox statements of a write transaction (``gate.store.tx.WriteTx.outbox``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def queue(
        self,
        outbox: OutboxTable[Any],
        values: tuple[Any, ...],
        at_ms: int,
        give_up_at_ms: int | None = None,
        *,
        once: bool = False,
    ) -> bool:
        """Queue a send named by ``values`` (``outbox.columns``), due at ``at_ms`` and, for a
        table with a give-up time, failed if not delivered by ``give_up_at_ms`` (unix ms).
        ``once``: a row with that primary key already there changes nothing (returns
        False); else it is an error (sqlite3.IntegrityError). Raises ValueError for a kind
        outside ``outbox.kinds`` or a give-up time missing or out of place."""
        if outbox.kinds and values[1] not in outbox.kinds:
            raise ValueError(f"unknown {outbox.columns[1]} {values[1]!r} for {outbox.table}")
        columns = (*outbox.columns, "next_attempt_at")
        args: tuple[Any, ...] = (*values, at_ms)
        if (give_up_at_ms is None) != (outbox.request is not None):
            raise ValueError(f"{outbox.table}: a give-up time goes with sends that give up")
        if give_up_at_ms is not None:
            columns, args = (*columns, "give_up_at"), (*args, give_up_at_ms)
        cur = self._conn.execute(
            f"INSERT {'OR IGNORE ' if once else ''}INTO {outbox.table} ({', '.join(columns)})"
            f" VALUES ({', '.join('?' for _ in columns)})",
            args,
        )
        return cur.rowcount == 1

    def attempted(
        self,
        outbox: OutboxTable[Any],
        key: tuple[Any, ...],
        now_ms: int,
        *,
        acked: bool,
        error: str | None,
        retry_at_ms: int | None,
    ) -> Attempt | None:
        """Record one attempt at ``now_ms`` (unix ms) of the row ``key``: acked sets
        ``delivered_at``; otherwise the next attempt is at ``retry_at_ms``. ``error`` becomes
        ``last_error``. A dispatch counts the attempt (an ack also sets ``next_attempt_at``
        to ``now_ms``); it is never dropped (ValueError for a ``retry_at_ms`` of None). A send
        with a give-up time fails (``failed_at``) when ``retry_at_ms`` is None (a drop, no
        attempt) or not before its ``give_up_at``. None when the row is gone, delivered or
        failed already (nothing changed)."""
        where = " AND ".join(f"{column} = ?" for column in outbox.columns[: outbox.key])
        if outbox.request is not None:
            if not acked and retry_at_ms is None:
                raise ValueError("a dispatch is retried until its request resolves, never dropped")
            cur = self._conn.execute(
                f"UPDATE {outbox.table} SET attempts = attempts + 1, delivered_at = ?,"
                f" next_attempt_at = ?, last_error = ? WHERE {where} AND delivered_at IS NULL",
                (now_ms if acked else None, now_ms if acked else retry_at_ms, error, *key),
            )
            if cur.rowcount != 1:
                return None
            row = self._conn.execute(
                f"SELECT attempts FROM {outbox.table} WHERE {where}", key
            ).fetchone()
            return Attempt("delivered" if acked else "retry", int(row[0]))
        found = self._conn.execute(
            f"SELECT give_up_at, attempts FROM {outbox.table} WHERE {where}"
            " AND delivered_at IS NULL AND failed_at IS NULL",
            key,
        ).fetchone()
        if found is None:
            return None
        if acked:
            state, sets, args = "delivered", "delivered_at = ?", (now_ms,)
        elif retry_at_ms is None or retry_at_ms >= int(found[0]):
            state, sets, args = "failed", "failed_at = ?", (now_ms,)
        else:
            state, sets, args = "retry", "next_attempt_at = ?", (retry_at_ms,)
        counted = 0 if not acked and retry_at_ms is None else 1  # a drop is no attempt
        self._conn.execute(
            f"UPDATE {outbox.table} SET attempts = attempts + ?, {sets}, last_error = ?"
            f" WHERE {where}",
            (counted, *args, error, *key),
        )
        return Attempt(state, int(found[1]) + counted)
