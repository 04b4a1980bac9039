"""One write transaction's statements (sync, run on the writer: a thread or the writer
process): ``WriteTx``, reaching each table family's statements by composition, and the
audit log's tail."""

from __future__ import annotations

import hmac
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from gate.audit import chain as audit
from gate.audit.spans import matches
from gate.store.approvals import ApprovalStatements
from gate.store.credentials import CredentialStatements
from gate.store.invites import InviteStatements
from gate.store.outbox import OutboxStatements
from gate.store.pg_rate import PgRateEvents
from gate.store.questions import QuestionStatements
from gate.store.requests import RequestStatements, RequestTables

F = TypeVar("F")
D = TypeVar("D")
S = TypeVar("S", bound=RequestStatements[Any, Any])

# writes audit rows (``AuditRow``'s fields, in ``seq`` order) kept in memory, in one statement
AuditWriter = Callable[[sqlite3.Connection, list[audit.AuditRow]], None]


class RateEvents(Protocol):
    """Where the decision rate limit (``gate.core.ratelimit``) keeps its attempts: the
    writer's memory (one gate on SQLite) or a table every gate shares
    (``gate.store.pg_rate``)."""

    def window(self, operator_id: int, since_ms: int) -> tuple[int, int | None]:
        """``(count, oldest)``: how many attempts ``operator_id`` made after ``since_ms``,
        and the time (unix ms) of the oldest of them (None: none)."""

    def add(self, operator_id: int, at_ms: int, since_ms: int) -> None:
        """Count an attempt of ``operator_id`` at ``at_ms``; the ones at or before
        ``since_ms`` no longer count (they may be forgotten)."""

    def expect(self, operator_id: int, since_ms: int) -> None:
        """The window of ``operator_id`` after ``since_ms`` is likely asked for soon: a
        backend may read it with a statement it sends before (PostgreSQL: with the
        approval's load); a wrong guess costs nothing but that."""


class WriteTx:
    """The statements available inside one write transaction (``Store.transact``):
    ``approvals`` and ``questions`` (``gate.store.requests``: what both kinds share, and
    what each has of its own), ``outbox`` (every delivery table: ``gate.store.outbox``),
    ``credentials`` and ``invites``; and the audit log's, here.

    Synchronous: a transaction runs whole on the store's writer (its thread, or the writer
    process), inside the batch's transaction and its own SAVEPOINT (``gate.store.batch``),
    so a transaction costs one hop to the writer however many statements it runs.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.approvals = self._hooked(ApprovalStatements(conn))
        self.questions = self._hooked(QuestionStatements(conn))
        self.outbox = OutboxStatements(conn)
        self.credentials = CredentialStatements(conn)
        self.invites = InviteStatements(conn)
        # (seq, entry_hash) of the newest audit entry, known inside this transaction; None
        # = read it. The store forgets it whenever it rolls anything back (``forget_tail``).
        self._audit_tail: tuple[int, str] | None = None
        # (entry_hash, receipt) of the head entry the batch began on (PostgreSQL; None: not
        # read, or an empty log), and whether it verified with the key ``follows`` asked about
        self._head: tuple[str, str] | None = None
        self._follows: tuple[bytes, bool] | None = None
        self._appended_with: bytes | None = None  # the key of this transaction's appends
        # (seq, entry_hash) of the newest entry this transaction appended and still holds
        # (None: none); what it was when the current job began, to go back to on its rollback
        self.appended_head: tuple[int, str] | None = None
        self._head_at_job: tuple[int, str] | None = None
        # the newest audit time (unix ms) the log holds in this transaction (0: not known;
        # PostgreSQL keeps it in ``audit_head``), and what it was when the current job began
        self.last_at_ms = 0
        self._at_ms_at_job = 0
        # the rate limit's attempts when the backend keeps them (PostgreSQL: every gate's,
        # counted once each job ran, refused or not: ``job_ended``; written before the
        # batch's COMMIT by its backend); None: the writer's memory
        self.rate_events: PgRateEvents | None = None
        # the audit entries appended and not yet written (``defer_audit``: PostgreSQL, where
        # the backend writes them together before the COMMIT); None: each is written at once.
        # ``_job_mark``: where the running job's entries begin in it; ``_earlier``: entries of
        # the jobs before it written while it ran (inside its SAVEPOINT: kept again if it
        # rolls back)
        self.unwritten: list[audit.AuditRow] | None = None
        self._write_audit: AuditWriter | None = None
        self._job_mark = 0
        self._earlier: list[audit.AuditRow] = []

    def _hooked(self, statements: S) -> S:
        statements.before_audit_read = self.flush_audit
        return statements

    def requests(self, tables: RequestTables[F, D]) -> RequestStatements[F, D]:
        """The statements every kind shares, on the kind whose tables are ``tables``."""
        return self._hooked(RequestStatements(self._conn, tables))

    def use_approvals(self, statements: ApprovalStatements) -> None:
        """``approvals`` as a backend's own form of them (``gate.store.pg_approvals``)."""
        self.approvals = self._hooked(statements)

    def defer_audit(self, write: AuditWriter) -> None:
        """Keep the entries this transaction appends in memory (``unwritten``) until
        ``flush_audit`` writes them with ``write``: before the COMMIT (the backend's
        ``before_commit``) and before any statement of this transaction reads the log.
        The chain is computed as each is appended, as before."""
        self.unwritten = []
        self._write_audit = write

    def flush_audit(self) -> None:
        """Write the entries kept by ``defer_audit`` (nothing when none, or not deferred).
        Raises sqlite3.Error."""
        rows = self.unwritten
        if not rows or self._write_audit is None:
            return
        self._write_audit(self._conn, rows)
        self._earlier += rows[: self._job_mark]
        self.unwritten = []
        self._job_mark = 0

    def start_chain(
        self, tail: tuple[int, str], last_at_ms: int, receipt: str | None = None
    ) -> None:
        """The transaction begins with the chain's head known (PostgreSQL: the locked
        ``audit_head`` row): ``(seq, entry_hash)`` of the newest entry (``(0,
        GENESIS_HASH)`` for an empty log), its time and its ``receipt`` (None for an empty
        log); the next entry follows it."""
        self._audit_tail = tail
        self.last_at_ms = self._at_ms_at_job = last_at_ms
        self._head = None if receipt is None else (tail[1], receipt)

    def follows(self, key: bytes) -> bool:
        """Whether this transaction may append entries receipted with ``key``: True unless
        the head entry it began on (PostgreSQL's locked head; never known on SQLite, where
        one gate writes its file) is receipted with another key, i.e. another gate on the
        database rotated the receipt key. Once the transaction appended entries itself
        (``appended_head``), they are what it follows. One HMAC per transaction."""
        if self.appended_head is not None and self._appended_with is not None:
            return hmac.compare_digest(self._appended_with, key)
        if self._head is None:
            return True
        if self._follows is None or self._follows[0] != key:
            self._follows = (key, matches(key, *self._head))
        return self._follows[1]

    def job_started(self) -> None:
        """A job begins (its SAVEPOINT): ``forget_tail`` goes back to the head as it is now."""
        self._head_at_job = self.appended_head
        self._at_ms_at_job = self.last_at_ms
        if self.unwritten is not None:
            self._job_mark = len(self.unwritten)
            self._earlier = []
        if self.rate_events is not None:
            self.rate_events.job_started()

    def job_ended(self) -> None:
        """A job ran (its SAVEPOINT still open, before ``RELEASE``), or was refused and
        rolled back to its SAVEPOINT: what its statements held back is sent
        (``ApprovalStatements.flush_held``), and the rate-limit attempts it made count now
        (written with the batch), so a refused attempt counts too. Raises sqlite3.Error."""
        self.approvals.flush_held()
        if self.rate_events is not None:
            self.rate_events.job_ended()

    def running_attempts(self) -> list[Any]:
        """The rate-limit attempts the running job made (PostgreSQL; else none): what a job
        refused after a write carries into the batch's next round."""
        return [] if self.rate_events is None else self.rate_events.running()

    def forget_tail(self) -> None:
        """Drop what this transaction remembers of the audit log (after a rollback): the
        tail is read again, and ``appended_head`` is what it was when the job began."""
        self._audit_tail = None
        self.appended_head = self._head_at_job
        self.last_at_ms = self._at_ms_at_job
        self.approvals.drop_held()
        if self.unwritten is not None:  # the job's own entries go; the earlier ones stay
            self.unwritten = self._earlier + self.unwritten[: self._job_mark]
            self._job_mark, self._earlier = len(self.unwritten), []
            if self.unwritten:
                last = self.unwritten[-1]
                self._audit_tail = (last.seq, last.entry_hash)

    def last_audit_row(self) -> audit.AuditRow | None:
        """Return the newest audit row (highest seq), or None when the log is empty."""
        self.flush_audit()
        row = self._conn.execute(
            "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt, key_id,"
            " signature FROM audit_log ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        return None if row is None else audit.AuditRow(*row)

    def audit_span_starts(self, kind: str) -> list[tuple[int, str, str]]:
        """Return ``(seq, entry_hash, receipt)`` of entry 1 and of every entry of ``kind``
        (the receipt-key rotations: few), ascending. Scans the log once (no index on kind:
        run only at a start that rotates the receipt key)."""
        self.flush_audit()
        rows = self._conn.execute(
            "SELECT seq, entry_hash, receipt FROM audit_log WHERE seq = 1 OR kind = ? ORDER BY seq",
            (kind,),
        ).fetchall()
        return [(int(seq), str(digest), str(receipt)) for seq, digest, receipt in rows]

    def append_audit(
        self,
        kind: str,
        approval_id: str | None,
        at_ms: int,
        data: dict[str, Any],
        key: bytes,
        signer: audit.Signer | None = None,
    ) -> audit.AuditRow:
        """Append one hash-chained audit entry with its HMAC receipt and, with ``signer``,
        its Ed25519 signature and key id; return the stored row."""
        last = self._audit_tail
        if last is None:
            last = self._conn.execute(
                "SELECT seq, entry_hash FROM audit_log ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        prev_hash = last[1] if last else audit.GENESIS_HASH
        seq = (int(last[0]) if last else 0) + 1
        entry = audit.make_entry(seq, kind, approval_id, at_ms, data)
        entry_json, digest, receipt = audit.seal(prev_hash, entry, key)
        key_id, signature = audit.sign(signer, digest) if signer is not None else (None, None)
        row = audit.AuditRow(
            seq, approval_id, kind, entry_json, prev_hash, digest, receipt, key_id, signature
        )
        if self.unwritten is not None:
            self.unwritten.append(row)
        else:
            self._conn.execute(
                "INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash, entry_hash,"
                " receipt, key_id, signature) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (seq, approval_id, kind, entry_json, prev_hash, digest, receipt, key_id, signature),
            )
        self._audit_tail = self.appended_head = (seq, digest)  # set only once the row is kept
        self._appended_with = key
        self.last_at_ms = max(self.last_at_ms, at_ms)
        return row
