"""Populate gate databases directly with sqlite3, row for row what the gate itself writes.

Creating 100,000 approvals over HTTP would take most of the benchmark's time, so
``add_pending`` writes them here, using the gate's own schema (``gate.store.schema``),
request hash (``gate.core.approvals.create.parse_create``), payload hash and audit sealing
(``gate.audit.chain.seal``): per approval the ``approvals`` row, revision 1 with its nonce, the
outbox row already delivered (one attempt), and the ``created`` and ``dispatch_ack`` audit
entries chained after whatever the file already holds, so ``hitl-gate audit verify``
passes on the result.
``audit_only`` writes a long audit chain alone, for ``audit verify``.
"""

from __future__ import annotations

import json
import secrets as pysecrets
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from ulid import ULID

from bench.common import CONTENT_TYPE, PIPELINE, RISK, STEP, draft_body, scope
from gate.audit import chain as audit
from gate.audit.receipts import receipt_object
from gate.core.approvals.create import parse_create
from gate.protocol.canonical import payload_hash
from gate.store.schema import MIGRATIONS, SCHEMA_VERSION

CHUNK = 5000


def connect(path: Path) -> sqlite3.Connection:
    """Open ``path`` for bulk writing (WAL like the gate; synchronous off while building)."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")
    return conn


def create_schema(path: Path) -> None:
    """Create an empty gate database at ``path`` with every migration applied."""
    conn = connect(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        for index in range(version, SCHEMA_VERSION):
            conn.execute("BEGIN IMMEDIATE")
            for statement in MIGRATIONS[index]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {index + 1}")
            conn.execute("COMMIT")
    finally:
        finish(conn)


def finish(conn: sqlite3.Connection) -> None:
    """Checkpoint the WAL into the main file and close."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _chain_head(conn: sqlite3.Connection) -> tuple[int, str]:
    row = conn.execute("SELECT seq, entry_hash FROM audit_log ORDER BY seq DESC LIMIT 1").fetchone()
    return (int(row[0]), str(row[1])) if row else (0, audit.GENESIS_HASH)


def add_pending(
    path: Path,
    count: int,
    created_ms: Callable[[int], int],
    expires_ms: Callable[[int], int],
    receipt_key: bytes,
    first_index: int = 0,
    ack_delay_ms: int = 3,
) -> None:
    """Append ``count`` pending approvals of pipeline ``bench`` step ``q1``, dispatched and
    acked, to the database at ``path`` (schema created when needed).

    ``created_ms(i)``/``expires_ms(i)`` give approval ``i``'s timestamps (unix ms); ``i``
    runs from ``first_index``. Audit entries continue the file's chain.
    """
    create_schema(path)
    conn = connect(path)
    scope_rows = scope()
    scope_json = json.dumps(scope_rows, ensure_ascii=False)
    approver_ids = [op_id for op_id, _ in scope_rows]
    seq, prev_hash = _chain_head(conn)
    approvals: list[tuple[Any, ...]] = []
    revisions: list[tuple[Any, ...]] = []
    outbox: list[tuple[Any, ...]] = []
    audit_rows: list[tuple[Any, ...]] = []

    def flush() -> None:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO approvals (approval_id, run_id, pipeline, step, risk, content_type,"
            " quorum_required, scope, budget, spend, revision, state, created_at, expires_at,"
            " idempotency_key, request_hash, approver_signature)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,'off')",  # q1: as the gate freezes it
            approvals,
        )
        conn.executemany(
            "INSERT INTO revisions (approval_id, revision, body, payload_hash, nonce,"
            " created_at, created_by) VALUES (?,?,?,?,?,?,?)",
            revisions,
        )
        conn.executemany(
            "INSERT INTO outbox (approval_id, revision, attempts, next_attempt_at, delivered_at,"
            " last_error) VALUES (?,?,?,?,?,?)",
            outbox,
        )
        conn.executemany(
            "INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash, entry_hash,"
            " receipt) VALUES (?,?,?,?,?,?,?)",
            audit_rows,
        )
        conn.execute("COMMIT")
        for rows in (approvals, revisions, outbox, audit_rows):
            rows.clear()

    def seal(kind: str, approval_id: str, at_ms: int, data: dict[str, Any]) -> None:
        nonlocal seq, prev_hash
        seq += 1
        entry = audit.make_entry(seq, kind, approval_id, at_ms, data)
        entry_json, digest, receipt = audit.seal(prev_hash, entry, receipt_key)
        audit_rows.append((seq, approval_id, kind, entry_json, prev_hash, digest, receipt))
        prev_hash = digest

    try:
        for i in range(first_index, first_index + count):
            created = created_ms(i)
            expires = expires_ms(i)
            acked = created + ack_delay_ms
            approval_id = str(ULID.from_timestamp(created / 1000))
            body = draft_body(i)
            digest = payload_hash(body)
            request_hash = parse_create(
                {
                    "pipeline": PIPELINE,
                    "step": STEP,
                    "draft": {"content_type": CONTENT_TYPE, "body": body},
                }
            ).request_hash()
            approvals.append(
                (
                    approval_id,
                    str(ULID.from_timestamp(created / 1000)),
                    PIPELINE,
                    STEP,
                    RISK,
                    CONTENT_TYPE,
                    1,
                    scope_json,
                    None,
                    None,
                    1,
                    "pending",
                    created,
                    expires,
                    None,
                    request_hash,
                )
            )
            revisions.append((approval_id, 1, body, digest, pysecrets.token_hex(16), created, None))
            outbox.append((approval_id, 1, 1, acked, acked, None))
            seal(
                "created",
                approval_id,
                created,
                {
                    "pipeline": PIPELINE,
                    "step": STEP,
                    "revision": 1,
                    "payload_hash": digest,
                    "quorum": 1,
                    "approvers": approver_ids,
                    "expires_at": expires,
                },
            )
            seal("dispatch_ack", approval_id, acked, {"revision": 1, "attempts": 1})
            if len(approvals) >= CHUNK:
                flush()
        if approvals:
            flush()
    finally:
        finish(conn)


def audit_only(path: Path, entries: int, receipt_key: bytes, start_ms: int) -> None:
    """Write ``entries`` chained audit entries (created, dispatch_ack, decision, resolved per
    approval, as the gate writes them for an approved quorum-1 approval) to a new database,
    the log alone (``audit verify -c --no-records`` passes on it); ``add_audit_records``
    adds the rows it describes."""
    create_schema(path)
    conn = connect(path)
    seq, prev_hash = _chain_head(conn)
    rows: list[tuple[Any, ...]] = []
    approver_ids = [op_id for op_id, _ in scope()]
    approval_id = ""
    digest = ""
    nonce = ""
    try:
        for n in range(entries):
            at = start_ms + n * 7
            phase = n % 4
            if phase == 0:
                approval_id = str(ULID.from_timestamp(at / 1000))
                digest = payload_hash(draft_body(n))
                nonce = pysecrets.token_hex(16)
                kind, data = (
                    "created",
                    {
                        "pipeline": PIPELINE,
                        "step": STEP,
                        "revision": 1,
                        "payload_hash": digest,
                        "quorum": 1,
                        "approvers": approver_ids,
                        "expires_at": at + 14_400_000,
                    },
                )
            elif phase == 1:
                kind, data = "dispatch_ack", {"revision": 1, "attempts": 1}
            elif phase == 2:
                kind, data = (
                    "decision",
                    {
                        "operator_id": approver_ids[n % len(approver_ids)],
                        "decision": "approve",
                        "revision": 1,
                        "payload_hash": digest,
                        "nonce": nonce,
                        "effect": "approve",
                    },
                )
            else:
                kind, data = (
                    "resolved",
                    {
                        "outcome": "approved",
                        "revision": 1,
                        "payload_hash": digest,
                        "approved_by": [approver_ids[(n - 1) % len(approver_ids)]],
                        "quorum": 1,
                    },
                )
            seq += 1
            entry = audit.make_entry(seq, kind, approval_id, at, data)
            entry_json, entry_hash, receipt = audit.seal(prev_hash, entry, receipt_key)
            rows.append((seq, approval_id, kind, entry_json, prev_hash, entry_hash, receipt))
            prev_hash = entry_hash
            if len(rows) >= CHUNK * 4:
                _insert_audit(conn, rows)
        if rows:
            _insert_audit(conn, rows)
    finally:
        finish(conn)


def add_audit_records(path: Path) -> None:
    """Add to an ``audit_only`` database the approval, revision and decision rows its log
    describes, so ``audit verify -c`` (with its records check) passes on it; a last approval
    cut short stays pending. Made from the stored log (constant memory: this process's RSS
    is inherited by the timed CLI runs it forks)."""
    conn = connect(path)
    try:
        _records_from_log(conn, 1)
    finally:
        finish(conn)


def _insert_audit(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash,"
        " entry_hash, receipt) VALUES (?,?,?,?,?,?,?)",
        rows,
    )
    conn.execute("COMMIT")
    rows.clear()


def _records_from_log(conn: sqlite3.Connection, first_seq: int) -> None:
    """The approvals, revisions and decisions rows ``audit_only``'s log describes, read back
    from it in seq order (the created entry of seq ``s`` drafted ``draft_body(s - first_seq)``)."""
    identity = {op_id: ident for op_id, ident in scope()}
    scope_json = json.dumps(scope(), ensure_ascii=False)
    approvals: list[list[Any]] = []
    revisions: list[tuple[Any, ...]] = []
    decisions: list[tuple[Any, ...]] = []

    def flush() -> None:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO approvals (approval_id, run_id, pipeline, step, risk, content_type,"
            " quorum_required, scope, revision, state, outcome, created_at, expires_at,"
            " resolved_at, request_hash, receipt, approver_signature)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,'off')",  # q1: as the gate freezes it
            approvals,
        )
        conn.executemany(
            "INSERT INTO revisions (approval_id, revision, body, payload_hash, nonce,"
            " created_at, created_by) VALUES (?,?,?,?,?,?,?)",
            revisions,
        )
        conn.executemany(
            "INSERT INTO decisions (approval_id, revision, operator_id, identity, decision,"
            " payload_hash, decided_at, recorded_at) VALUES (?,?,?,?,?,?,?,?)",
            decisions,
        )
        conn.execute("COMMIT")
        for pending in (approvals, revisions, decisions):
            pending.clear()

    reader = conn.execute(
        "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt"
        " FROM audit_log WHERE seq >= ? ORDER BY seq",
        (first_seq,),
    )
    for row in iter(lambda: reader.fetchmany(CHUNK), []):
        for seq, approval_id, kind, entry_json, *_ in row:
            entry = json.loads(entry_json)
            data, at = entry["data"], _ms(entry["at"])
            if kind == "created":
                approvals.append(
                    [
                        approval_id,
                        approval_id,
                        PIPELINE,
                        STEP,
                        RISK,
                        CONTENT_TYPE,
                        1,
                        scope_json,
                        1,
                        "pending",
                        None,
                        at,
                        data["expires_at"],
                        None,
                        "sha256:" + "0" * 64,
                        None,
                    ]
                )
                revisions.append(
                    (
                        approval_id,
                        1,
                        draft_body(seq - first_seq),
                        data["payload_hash"],
                        data["payload_hash"][7:39],
                        at,
                        None,
                    )
                )
            elif kind == "decision":
                decisions.append(
                    (
                        approval_id,
                        1,
                        data["operator_id"],
                        identity[data["operator_id"]],
                        "approve",
                        data["payload_hash"],
                        entry["at"],
                        at,
                    )
                )
            elif kind == "resolved":
                stored = audit.AuditRow(seq, approval_id, kind, entry_json, *_)
                approvals[-1][9:11] = ["resolved", "approved"]
                approvals[-1][13] = at
                approvals[-1][15] = json.dumps(receipt_object(stored))
            if len(approvals) >= CHUNK and kind == "resolved":
                flush()
    if approvals:
        flush()


def _ms(text: str) -> int:
    """Unix ms of an entry's RFC 3339 ``at``."""
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
