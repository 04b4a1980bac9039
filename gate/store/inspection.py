"""Read-only inspection of a gate database for ``hitl-gate doctor``: never writes, never migrates.

The daemon's ``Store`` opens read-write and runs migrations; an operator's health check must
not do either (it may run as another user, or before an upgrade is meant to happen). These
functions open the file with ``gate.store.readonly.connect`` (``query_only``; never creates
it), so a missing file is an error, not a new empty database.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from gate.audit import chain as audit
from gate.errors import Unavailable
from gate.store import readonly
from gate.store.readonly import ReadConnection, has_table, reading
from gate.store.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from gate.store.readonly import Database

MAX_PROBLEMS = 20


@dataclass(frozen=True, slots=True)
class DatabaseInfo:
    """What ``inspect`` found: ``problems`` is ``PRAGMA integrity_check``'s answer minus its
    ``ok`` (empty = intact, at most MAX_PROBLEMS lines); ``schema_version`` is
    ``PRAGMA user_version``; ``approvals`` and ``audit_entries`` count rows (None when the
    schema is too old or foreign to hold them)."""

    problems: tuple[str, ...]
    schema_version: int
    code_schema_version: int
    approvals: int | None
    audit_entries: int | None


def read_only(path: Database) -> AbstractContextManager[ReadConnection]:
    """A ``gate.store.readonly`` connection to the existing database at ``path``, closed on
    exit; Unavailable when it cannot be opened or read (``cannot read database PATH: ...``)."""
    return reading(path, f"cannot read database {path}")


def _count(conn: ReadConnection, table: str) -> int | None:
    if not has_table(conn, table):
        return None
    return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def inspect(path: Database) -> DatabaseInfo:
    """Run ``PRAGMA integrity_check`` (a SQLite file's; a PostgreSQL database's pages are
    the server's to check: no problems) and read the schema version and row counts of the
    database at ``path``, read-only. Raises Unavailable (``storage_unavailable``) when the
    file is missing, unreadable or not a SQLite database, or the server cannot be read."""
    with read_only(path) as conn:
        problems: tuple[str, ...] = ()
        if isinstance(path, PurePath):
            rows = conn.execute(f"PRAGMA integrity_check({MAX_PROBLEMS})").fetchall()
            problems = tuple(str(r[0]) for r in rows if str(r[0]) != "ok")
        version = readonly.schema_version(conn)
        return DatabaseInfo(
            problems, version, SCHEMA_VERSION, _count(conn, "approvals"), _count(conn, "audit_log")
        )


def newest_audit_row(path: Database) -> audit.AuditRow | None:
    """Return the audit row with the highest seq of the database at ``path`` (a SQLite file
    or a PostgreSQL database; None for an empty log), read-only. Raises Unavailable when
    it cannot be opened or has no audit_log table."""
    with read_only(path) as conn:
        if _count(conn, "audit_log") is None:
            raise Unavailable(
                "storage_unavailable", f"{path} has no audit_log table (not a hitl-gate database?)"
            )
        row = conn.execute(
            f"SELECT {readonly.audit_columns(conn)} FROM audit_log ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        return None if row is None else audit.AuditRow(*row)


def receipt_span_starts(path: Database) -> list[tuple[int, str, str]]:
    """Return ``(seq, entry_hash, receipt)`` of entry 1 and of every ``receipt_key_rotated``
    entry of the database at ``path`` (the starts of its receipt-key spans: few), ascending,
    read-only. Scans the log once (doctor, for a config whose key the log no longer uses)."""
    with read_only(path) as conn:
        rows = conn.execute(
            "SELECT seq, entry_hash, receipt FROM audit_log"
            " WHERE seq = 1 OR kind = 'receipt_key_rotated' ORDER BY seq"
        ).fetchall()
    return [(int(seq), str(digest), str(receipt)) for seq, digest, receipt in rows]


def failed_followups(path: Database, since_ms: int) -> tuple[dict[str, int], str | None]:
    """Return ``({kind: count}, last error of the latest)`` of the ``followup_outbox`` rows
    (notices, reminders, escalations) of the database at ``path`` given up at or
    after ``since_ms`` (unix ms), read-only; rows dropped because their approval resolved
    (``last_error`` ``resolved``) are not failures. ``({}, None)`` when there are none (or no
    table yet)."""
    with read_only(path) as conn:
        if not has_table(conn, "followup_outbox"):
            return {}, None
        where = "failed_at >= ? AND coalesce(last_error, '') <> 'resolved'"
        counts = {
            str(kind): int(n)
            for kind, n in conn.execute(
                f"SELECT kind, count(*) FROM followup_outbox WHERE {where} GROUP BY kind",
                (since_ms,),
            )
        }
        row = conn.execute(
            f"SELECT last_error FROM followup_outbox WHERE {where} ORDER BY failed_at DESC LIMIT 1",
            (since_ms,),
        ).fetchone()
        return counts, None if row is None else row[0]


def credential_rows(path: Database, after_seq: int) -> tuple[list[tuple[Any, ...]], set[str]]:
    """The approver_credentials table of the database at ``path``, read-only:
    ``(rows, newer)`` where rows are ``(credential_id, operator_id, type, public_key,
    revoked_at)`` as stored, by credential_id, and ``newer`` the credential ids an
    enrolment or revocation entry after ``after_seq`` names (written after the chain was
    verified: not compared), read in one snapshot. ``([], set())`` before migration 6."""
    with read_only(path) as conn:
        if _count(conn, "approver_credentials") is None:
            return [], set()
        conn.execute("BEGIN")
        rows = conn.execute(
            "SELECT credential_id, operator_id, type, public_key, revoked_at"
            " FROM approver_credentials ORDER BY credential_id"
        ).fetchall()
        newer = {
            str(row[0])
            for row in conn.execute(
                "SELECT json_extract(entry, '$.data.credential_id') FROM audit_log"
                " WHERE seq > ? AND kind IN ('approver_credential_enrolled',"
                " 'approver_credential_revoked')",
                (after_seq,),
            )
        }
        conn.execute("COMMIT")
    return [tuple(row) for row in rows], newer
