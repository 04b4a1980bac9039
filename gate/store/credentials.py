"""The approver-credential statements of ``WriteTx`` (table
``approver_credentials`` of migration 6): enrol, look up, list, revoke. Sync, on the writer."""

from __future__ import annotations

import sqlite3

from gate.model import Credential

_COLUMNS = "credential_id, operator_id, type, public_key, sign_count, label, created_at, revoked_at"


class CredentialStatements:
    """The approver-credential statements of ``WriteTx``."""

    _conn: sqlite3.Connection

    def load_credential(self, credential_id: str) -> Credential | None:
        """The credential with this id (revoked or not), or None."""
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM approver_credentials WHERE credential_id = ?",
            (credential_id,),
        ).fetchone()
        return None if row is None else Credential(*row)

    def credentials(self) -> list[Credential]:
        """Every credential, revoked ones included, by operator id then enrolment time."""
        rows = self._conn.execute(
            f"SELECT {_COLUMNS} FROM approver_credentials"
            " ORDER BY operator_id, created_at, credential_id"
        ).fetchall()
        return [Credential(*row) for row in rows]

    def insert_credential(self, credential: Credential) -> None:
        """Store a new credential; the caller checked that its id is not taken
        (sqlite3.IntegrityError otherwise)."""
        self._conn.execute(
            f"INSERT INTO approver_credentials ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                credential.credential_id,
                credential.operator_id,
                credential.type,
                credential.public_key,
                credential.sign_count,
                credential.label,
                credential.created_at,
                credential.revoked_at,
            ),
        )

    def revoke_credential(self, credential_id: str, at_ms: int) -> None:
        """Mark the credential revoked at ``at_ms`` (unix ms); the caller checked it is in
        force."""
        self._conn.execute(
            "UPDATE approver_credentials SET revoked_at = ? WHERE credential_id = ?",
            (at_ms, credential_id),
        )


def in_force(conn: sqlite3.Connection) -> list[Credential]:
    """Every credential not revoked, by credential_id (the credentials channel);
    on the read connection (``gate.store.reads.Reads.credentials_in_force``)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM approver_credentials WHERE revoked_at IS NULL"
        " ORDER BY credential_id"
    ).fetchall()
    return [Credential(*row) for row in rows]
