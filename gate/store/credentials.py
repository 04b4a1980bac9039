"""The approver-credential statements of ``WriteTx`` (table
``approver_credentials`` of migration 6): enrol, look up, list, revoke, and a passkey's
WebAuthn counter (migration 8). Sync, on the writer."""

from __future__ import annotations

import sqlite3

from gate.model import Credential, field_values

_COLUMNS = "credential_id, operator_id, type, public_key, sign_count, label, created_at, revoked_at"
_VALUES = field_values(Credential)


class CredentialStatements:
    """The approver-credential statements of ``WriteTx`` (``WriteTx.credentials``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def load(self, credential_id: str) -> Credential | None:
        """The credential with this id (revoked or not), or None."""
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM approver_credentials WHERE credential_id = ?",
            (credential_id,),
        ).fetchone()
        return None if row is None else Credential(*row)

    def all(self) -> list[Credential]:
        """Every credential, revoked ones included, by operator id then enrolment time."""
        rows = self._conn.execute(
            f"SELECT {_COLUMNS} FROM approver_credentials"
            " ORDER BY operator_id, created_at, credential_id"
        ).fetchall()
        return [Credential(*row) for row in rows]

    def insert(self, credential: Credential) -> None:
        """Store a new credential; the caller checked that its id is not taken
        (sqlite3.IntegrityError otherwise)."""
        self._conn.execute(
            f"INSERT INTO approver_credentials ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            _VALUES(credential),  # ``_COLUMNS`` are the model's fields, in their order
        )

    def revoke(self, credential_id: str, at_ms: int) -> None:
        """Mark the credential revoked at ``at_ms`` (unix ms); the caller checked it is in
        force."""
        self._conn.execute(
            "UPDATE approver_credentials SET revoked_at = ? WHERE credential_id = ?",
            (at_ms, credential_id),
        )

    def set_sign_count(
        self, credential_id: str, sign_count: int, counter_assertion: str | None = None
    ) -> None:
        """Store a passkey's last signature counter and the SHA-256 hex of the
        batch assertion that carried it (``assertion_sha256``; None for a single decision:
        migration 8)."""
        self._conn.execute(
            "UPDATE approver_credentials SET sign_count = ?, counter_assertion = ?"
            " WHERE credential_id = ?",
            (sign_count, counter_assertion, credential_id),
        )

    def counter_assertion(self, credential_id: str) -> str | None:
        """The SHA-256 hex of the batch assertion that set the credential's counter, or None
        (read only when an assertion repeats the stored counter)."""
        row = self._conn.execute(
            "SELECT counter_assertion FROM approver_credentials WHERE credential_id = ?",
            (credential_id,),
        ).fetchone()
        return None if row is None else row[0]


def in_force(conn: sqlite3.Connection) -> list[Credential]:
    """Every credential not revoked, by credential_id (the credentials channel);
    on the read connection (``gate.store.reads.Reads.credentials_in_force``)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM approver_credentials WHERE revoked_at IS NULL"
        " ORDER BY credential_id"
    ).fetchall()
    return [Credential(*row) for row in rows]
