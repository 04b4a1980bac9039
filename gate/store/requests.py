"""The SQL every kind of request shares (approvals, questions), over each kind's own tables
as they are: a ``RequestTables`` names a kind's closed set of table and column identifiers
(``gate.store.approvals.APPROVALS``, ``gate.store.questions.QUESTIONS``), and one set of
reads and statements serves both through it. A kind's own columns (decisions, answers) and
its loader stay in its module.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gate.audit import chain as audit
from gate.audit.receipts import receipt_object
from gate.model import Dispatch

F = TypeVar("F")  # the kind's loaded value (``Approval``, ``Question``)
D = TypeVar("D")  # what resolving a due one needs (``Resolvable``, ``DueQuestion``)


@dataclass(frozen=True, slots=True)
class RequestTables(Generic[F, D]):
    """One kind's tables: ``table`` (pending ones in the partial index
    ``{table}_pending_expiry``) keyed by ``id``, its current ``version`` column (also the
    versions' and the outbox's), ``versions`` (the table of its versions, each hashed in
    ``version_hash``), ``request_hash`` (the create request's hash, for idempotency),
    ``outbox`` (its dispatches), ``created`` (the audit entry kind of its creation, found
    through the partial index ``audit_log_{created}``), ``json_columns`` (given as Python values,
    stored as JSON), ``permit`` (whether a resolution stores an execution permit),
    ``due_extra`` (more columns a due row carries) and ``due_row``/``load`` (the kind's
    values)."""

    table: str
    id: str
    version: str
    versions: str
    version_hash: str
    request_hash: str
    outbox: str
    created: str
    json_columns: tuple[str, ...]
    permit: bool
    due_extra: tuple[str, ...]
    due_row: Callable[..., D]
    load: Callable[[sqlite3.Connection, str, bool, bool], F | None]

    @property
    def created_sql(self) -> str:
        """The audit row of a request's creation entry, through its partial index."""
        return (
            "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt, key_id,"
            f" signature FROM audit_log INDEXED BY audit_log_{self.created}"
            f" WHERE approval_id = ? AND kind = '{self.created}' ORDER BY seq LIMIT 1"
        )


def request_row(
    conn: sqlite3.Connection,
    kind: RequestTables[Any, Any],
    columns: tuple[str, ...],
    request_id: str,
    outbox: bool,
    created: bool,
) -> dict[str, Any] | None:
    """The request's ``columns`` by name, ``scope`` as ``(operator id, identity)`` pairs and
    ``receipt`` decoded, with (unless ``outbox`` is False) its ``outbox`` rows and (unless
    ``created`` is False) its ``created_receipt``: what every kind's loader starts from.
    None when there is no such request."""
    row = conn.execute(
        f"SELECT {', '.join(columns)} FROM {kind.table} WHERE {kind.id} = ?", (request_id,)
    ).fetchone()
    if row is None:
        return None
    return request_values(conn, kind, columns, row, request_id, outbox, created)


def request_values(
    conn: sqlite3.Connection,
    kind: RequestTables[Any, Any],
    columns: tuple[str, ...],
    row: Sequence[Any],
    request_id: str,
    outbox: bool,
    created: bool,
) -> dict[str, Any]:
    """``request_row``'s values from the request's ``row`` of ``columns``, already read
    (a backend's loader may read more with it in one statement)."""
    values = dict(zip(columns, row, strict=True))
    values["scope"] = tuple(
        (int(op), str(identity)) for op, identity in json.loads(values["scope"])
    )
    values["receipt"] = json.loads(values["receipt"]) if values["receipt"] else None
    values["outbox"] = dispatches(conn, kind, request_id) if outbox else ()
    values["created_receipt"] = created_receipt(conn, kind, request_id) if created else None
    return values


def created_receipt(
    conn: sqlite3.Connection, kind: RequestTables[Any, Any], request_id: str
) -> dict[str, Any] | None:
    """The receipt object (``gate.audit.receipts.receipt_object``) of the request's
    creation entry, read from the log itself; None when the log holds no such entry."""
    entry = conn.execute(kind.created_sql, (request_id,)).fetchone()
    return receipt_object(audit.AuditRow(*entry)) if entry is not None else None


def dispatches(
    conn: sqlite3.Connection, kind: RequestTables[Any, Any], request_id: str
) -> tuple[Dispatch, ...]:
    """The request's outbox rows, by version."""
    rows = conn.execute(
        f"SELECT {kind.version}, attempts, next_attempt_at, delivered_at, last_error"
        f" FROM {kind.outbox} WHERE {kind.id} = ? ORDER BY {kind.version}",
        (request_id,),
    )
    return tuple(Dispatch(*row) for row in rows)


def names_nothing(text: str | None) -> bool:
    """True for a text holding U+0000 (an id or a name from a URL): no stored id or name
    holds one (every listener refuses it in a body) and PostgreSQL cannot take it as a
    parameter, so a lookup by it finds nothing without a query, on both backends alike."""
    return text is not None and "\x00" in text


def page(
    conn: sqlite3.Connection,
    kind: RequestTables[F, Any],
    state: str,
    pipeline: str | None,
    limit: int,
    after: str | None,
) -> list[F]:
    """Up to ``limit`` requests ordered by id (ULID: creation order), loaded whole;
    ``state`` is pending|resolved|all, ``after`` the cursor (the last id seen)."""
    if names_nothing(pipeline):
        return []
    filters = {  # each condition with its value; None: not filtered on
        "state = ?": None if state == "all" else state,
        "pipeline = ?": pipeline or None,
        f"{kind.id} > ?": after or None,
    }
    given = {clause: value for clause, value in filters.items() if value is not None}
    sql = f"SELECT {kind.id} FROM {kind.table}"
    if given:
        sql += " WHERE " + " AND ".join(given)
    sql += f" ORDER BY {kind.id} LIMIT ?"
    ids = [row[0] for row in conn.execute(sql, [*given.values(), limit]).fetchall()]
    return [full for full in (kind.load(conn, i, True, True) for i in ids) if full is not None]


def next_expiry(conn: sqlite3.Connection, kind: RequestTables[Any, Any]) -> int | None:
    """The earliest ``expires_at`` (unix ms) of a pending request of ``kind``, or None."""
    row = conn.execute(
        f"SELECT MIN(expires_at) FROM {kind.table} INDEXED BY {kind.table}_pending_expiry"
        " WHERE state = 'pending'"
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def pending_summary(
    conn: sqlite3.Connection, kind: RequestTables[Any, Any]
) -> tuple[int, int | None]:
    """``(pending requests of kind, earliest created_at in unix ms or None)``."""
    count, oldest = conn.execute(
        f"SELECT COUNT(*), MIN(created_at) FROM {kind.table} INDEXED BY"
        f" {kind.table}_pending_expiry WHERE state = 'pending'"
    ).fetchone()
    return int(count), None if oldest is None else int(oldest)


def _nothing() -> None:
    return None


class RequestStatements(Generic[F, D]):
    """The statements of a write transaction about one kind of request (``kind``): the
    generic part of ``gate.store.approvals.ApprovalStatements`` and
    ``gate.store.questions.QuestionStatements``."""

    def __init__(self, conn: sqlite3.Connection, kind: RequestTables[F, D]) -> None:
        self._conn = conn
        self.kind = kind
        # called before a load reads the audit log (the created receipt): the transaction's
        # entries kept in memory are written first (``WriteTx.flush_audit``)
        self.before_audit_read: Callable[[], None] = _nothing

    def load(self, request_id: str, outbox: bool = True, created_receipt: bool = True) -> F | None:
        """The request whole (its versions, (unless ``outbox`` is False) its outbox rows,
        (unless ``created_receipt`` is False) its created receipt) as seen inside this
        transaction, or None."""
        if names_nothing(request_id):
            return None
        if created_receipt:
            self.before_audit_read()
        return self.kind.load(self._conn, request_id, outbox, created_receipt)

    def by_idempotency_key(self, key: str) -> tuple[str, str] | None:
        """``(id, request hash)`` of the request created with Idempotency-Key ``key``, or
        None."""
        kind = self.kind
        row = self._conn.execute(
            f"SELECT {kind.id}, {kind.request_hash} FROM {kind.table} WHERE idempotency_key = ?",
            (key,),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def insert(self, row: dict[str, Any]) -> None:
        """Insert a request's row (``json_columns`` given as Python values, stored as JSON;
        a missing or None one stored as NULL)."""
        values = dict(row)
        for column in self.kind.json_columns:
            found = values.get(column)
            values[column] = None if found is None else json.dumps(found, ensure_ascii=False)
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        self._conn.execute(
            f"INSERT INTO {self.kind.table} ({cols}) VALUES ({marks})", tuple(values.values())
        )

    def set_version(self, request_id: str, version: int) -> None:
        """Make ``version`` the request's current version."""
        kind = self.kind
        self._conn.execute(
            f"UPDATE {kind.table} SET {kind.version} = ? WHERE {kind.id} = ?",
            (version, request_id),
        )

    def resolve(
        self,
        request_id: str,
        outcome: str,
        at_ms: int,
        receipt: dict[str, Any],
        permit: str | None = None,
    ) -> bool:
        """Mark a pending request resolved with ``outcome`` at ``at_ms`` (unix ms), with its
        resolution ``receipt`` and (a kind with permits) execution ``permit`` (compact JWS,
        or None), in one statement; return False (nothing changed) if it was not pending.
        Raises ValueError for a permit of a kind without them."""
        kind = self.kind
        if permit is not None and not kind.permit:
            raise ValueError(f"{kind.table} carry no permit")
        sets = "state = 'resolved', outcome = ?, resolved_at = ?, receipt = ?"
        args: tuple[Any, ...] = (outcome, at_ms, json.dumps(receipt))
        if kind.permit:
            sets, args = f"{sets}, permit = ?", (*args, permit)
        sql = f"UPDATE {kind.table} SET {sets} WHERE {kind.id} = ? AND state = 'pending'"
        return self.changed_one(sql, (*args, request_id))

    def changed_one(self, sql: str, args: tuple[Any, ...]) -> bool:
        """Run the statement ``sql`` that changes one row; whether it did (a backend's form
        may send it with another: ``gate.store.pg_approvals``)."""
        return bool(self._conn.execute(sql, args).rowcount == 1)

    def due(self, now_ms: int, limit: int) -> list[D]:
        """What resolving a due request needs, oldest deadline first, in one query: pending
        requests with ``expires_at <= now_ms`` (unix ms), at most ``limit``, each with its
        current version and that version's hash (and ``due_extra``)."""
        kind = self.kind
        extra = "".join(f", a.{column}" for column in kind.due_extra)
        rows = self._conn.execute(
            f"SELECT a.{kind.id}, a.{kind.version}, v.{kind.version_hash}{extra}"
            f" FROM {kind.table} a INDEXED BY {kind.table}_pending_expiry JOIN {kind.versions} v"
            f" ON v.{kind.id} = a.{kind.id} AND v.{kind.version} = a.{kind.version}"
            " WHERE a.state = 'pending' AND a.expires_at <= ?"
            " ORDER BY a.expires_at LIMIT ?",
            (now_ms, limit),
        ).fetchall()
        return [kind.due_row(*row) for row in rows]
