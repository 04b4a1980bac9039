"""The passkey-invite statements of ``WriteTx`` (table ``approver_invites`` of
migration 7): create, look up, mark used. Sync, on the writer. And the read-only counts of
passkeys the doctor makes."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gate.model import field_values
from gate.store import readonly

if TYPE_CHECKING:
    from gate.store.readonly import Database

_COLUMNS = (
    "invite_hash, operator_id, label, challenge, created_at, expires_at, used_at, credential_id"
)


@dataclass(frozen=True, slots=True)
class Invite:
    """One row of ``approver_invites``: ``invite_hash`` (SHA-256 hex of the token, never the
    token), the ``operator_id`` it enrols, the ``label`` the credential gets (or None), the
    registration ``challenge`` (base64url), ``created_at``/``expires_at``/``used_at`` (unix
    ms; ``used_at`` None while unused) and the ``credential_id`` enrolled with it."""

    invite_hash: str
    operator_id: int
    label: str | None
    challenge: str
    created_at: int
    expires_at: int
    used_at: int | None = None
    credential_id: str | None = None


_VALUES = field_values(Invite)


class InviteStatements:
    """The passkey-invite statements of ``WriteTx`` (``WriteTx.invites``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def insert(self, invite: Invite) -> None:
        """Store a new, unused invite."""
        self._conn.execute(
            f"INSERT INTO approver_invites ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            _VALUES(invite),  # ``_COLUMNS`` are ``Invite``'s fields, in their order
        )

    def load(self, invite_hash: str) -> Invite | None:
        """The invite whose token hashes to ``invite_hash``, or None."""
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM approver_invites WHERE invite_hash = ?", (invite_hash,)
        ).fetchone()
        return None if row is None else Invite(*row)

    def use(self, invite_hash: str, at_ms: int, credential_id: str) -> None:
        """Mark the invite used at ``at_ms`` (unix ms) for ``credential_id``; the caller
        checked it is unused."""
        self._conn.execute(
            "UPDATE approver_invites SET used_at = ?, credential_id = ? WHERE invite_hash = ?",
            (at_ms, credential_id, invite_hash),
        )


def count_passkeys(path: Database) -> int:
    """How many passkeys (``type`` webauthn, not revoked) the database at ``path`` holds;
    0 for a database from before migration 6. Read-only (``gate.store.readonly``); raises
    Unavailable when it cannot be opened."""
    with readonly.reading(path, f"cannot read {path}") as conn:
        if not readonly.has_table(conn, "approver_credentials"):
            return 0
        row = conn.execute(
            "SELECT COUNT(*) FROM approver_credentials"
            " WHERE type = 'webauthn' AND revoked_at IS NULL"
        ).fetchone()
        return int(row[0])


def credential_facts(path: Database) -> tuple[dict[str, int], set[int]]:
    """``(passkeys in force by the rp_id of their enrolment entry, operator ids holding a
    credential in force)`` of the database at ``path`` (doctor); empty before
    migration 6. Read-only; raises Unavailable when it cannot be read."""
    with readonly.reading(path, f"cannot read {path}") as conn:
        if not readonly.has_table(conn, "approver_credentials"):
            return {}, set()
        rows = conn.execute(
            "SELECT json_extract(a.entry, '$.data.rp_id'), COUNT(*) FROM approver_credentials c"
            " JOIN audit_log a ON a.kind = 'approver_credential_enrolled'"
            " AND json_extract(a.entry, '$.data.credential_id') = c.credential_id"
            " WHERE c.type = 'webauthn' AND c.revoked_at IS NULL GROUP BY 1"
        ).fetchall()
        holders = conn.execute(
            "SELECT DISTINCT operator_id FROM approver_credentials WHERE revoked_at IS NULL"
        ).fetchall()
    return {str(rp): int(n) for rp, n in rows if rp is not None}, {int(r[0]) for r in holders}
