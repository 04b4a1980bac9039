"""The approver_credentials table against the verified audit log: the
gate reads the table when it checks a decision's signature, so a key swapped, moved
to another operator, un-revoked, added or deleted by whoever can write the database file is
named by ``audit verify -c`` (like a decision row edited, ``gate.audit.records``). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gate.audit.signature_checks import LoggedCredential


def problem(
    stored: Iterable[tuple[Any, ...]],
    logged: Mapping[str, LoggedCredential],
    newer: set[str],
) -> str | None:
    """The first way the ``stored`` rows ``(credential_id, operator_id, type, public_key,
    revoked_at)`` disagree with the credentials the verified log enrolled and revoked
    (``logged``), else None; ids in ``newer`` (entries after the verified part) are skipped.
    The answer names the credential: ``credential ID: why``."""
    seen: set[str] = set()
    for credential_id, operator_id, kind, public_key, revoked_at in stored:
        seen.add(str(credential_id))
        if credential_id in newer:
            continue
        known = logged.get(str(credential_id))
        where = f"credential {credential_id}"
        if known is None:
            return f"{where}: in the table but never enrolled in the audit log"
        data = known.data
        if operator_id != data.get("operator_id"):
            return (
                f"{where}: operator_id is {operator_id!r} in the table but "
                f"{data.get('operator_id')!r} in its enrolment entry"
            )
        if kind != data.get("type"):
            return f"{where}: type is {kind!r} in the table but {data.get('type')!r} logged"
        if public_key != data.get("public_key"):
            return f"{where}: public_key differs from its enrolment entry"
        if revoked_at is None and known.revoked_seq is not None:
            return f"{where}: in force in the table but revoked by audit entry {known.revoked_seq}"
        if revoked_at is not None and known.revoked_seq is None:
            return f"{where}: revoked in the table but no audit entry revokes it"
    for credential_id in sorted(set(logged) - seen - newer):
        return f"credential {credential_id}: enrolled in the audit log but missing from the table"
    return None
