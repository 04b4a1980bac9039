"""Doctor checks of the database file (integrity, schema, mode) and of the audit chain."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gate.audit.chain import AuditRow
from gate.audit.report import chain_broken
from gate.audit.spans import matches
from gate.audit.verify import AuditReport, verify_database
from gate.config import ReceiptsConfig
from gate.errors import GateError
from gate.store import inspection as maintenance
from gate.store.inspection import DatabaseInfo
from gate.tools.doctor_check import Check, shown_errors, skip, warn
from gate.trust.keys import ReceiptKeys

if TYPE_CHECKING:
    from gate.store.readonly import Database


def check_database(path: Database) -> Check:
    """The database file passes ``PRAGMA integrity_check`` and has a schema this code knows;
    a missing file is a warning when the gate can create it on first start. A PostgreSQL
    database (``PgTarget``): ``_check_postgres``."""
    if not isinstance(path, Path):
        return _check_postgres(path)
    if not path.exists():
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if os.access(parent, os.W_OK | os.X_OK):
            return warn(
                "database", f"{path} does not exist yet; the gate creates it on first start"
            )
        return Check("database", False, f"{path} does not exist and {parent} is not writable")
    try:
        info = maintenance.inspect(path)
    except GateError as exc:
        return Check("database", False, exc.message)
    if info.problems:
        return Check(
            "database", False, f"{path}: integrity_check: " + shown_errors(list(info.problems))
        )
    if info.schema_version > info.code_schema_version:
        return _too_new(path, info)
    counts = (
        f"{info.approvals} approvals, {info.audit_entries} audit entries"
        if info.approvals is not None and info.audit_entries is not None
        else "no tables"
    )
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        return warn(
            "database",
            f"{path} is readable by others (mode {mode:04o}; it holds "
            f"drafts, final bodies and permits): chmod 600 {path}",
        )
    if info.schema_version < info.code_schema_version:
        return warn(
            "database",
            f"{path}: integrity ok, schema {info.schema_version} (the "
            f"gate migrates it to {info.code_schema_version} on start), {counts}",
        )
    return Check("database", True, f"{path}: integrity ok, schema {info.schema_version}, {counts}")


def _check_postgres(target: Database) -> Check:
    """The PostgreSQL database ``target`` has a schema this code knows (none yet: a warning,
    the gates create it), with its row counts; its pages are the server's to check."""
    try:
        info = maintenance.inspect(target)
    except GateError as exc:
        return Check("database", False, exc.message)
    if info.schema_version == 0 or info.approvals is None or info.audit_entries is None:
        return warn(
            "database", f"{target} has no tables yet; the gates create them at their first start"
        )
    schema = f"{target}: schema {info.schema_version}"
    if info.schema_version > info.code_schema_version:
        return _too_new(target, info)
    counts = f"{info.approvals} approvals, {info.audit_entries} audit entries"
    pages = "its pages are the server's to check (data checksums, pg_amcheck)"
    if info.schema_version < info.code_schema_version:
        return warn(
            "database",
            f"{schema} (the gates migrate it to {info.code_schema_version} at their first"
            f" start), {counts}; {pages}",
        )
    return Check("database", True, f"{schema}, {counts}; {pages}")


def _too_new(path: Database, info: DatabaseInfo) -> Check:
    """The database line of a schema newer than this code's (the gate refuses it)."""
    return Check(
        "database",
        False,
        f"{path}: schema {info.schema_version} is newer than "
        f"this hitl-gate's ({info.code_schema_version}); upgrade hitl-gate",
    )


def check_audit(
    path: Database,
    receipt_key: bytes | None,
    keys: ReceiptKeys | None,
    previous_key: bytes | None = None,
    receipts: ReceiptsConfig | None = None,
) -> Check:
    """Recompute the audit chain, its receipts (with the receipt key, and the previous one of
    a rotation: each entry with the key of its span, ``gate.audit.spans``) and its
    signatures (when the config names Ed25519 keys), then compare the approval records with
    it: the one check ``hitl-gate audit verify -c`` runs (``gate.audit.verify.
    verify_database``), formatted as the doctor's. A newest entry that neither key verifies
    FAILs naming the settings (the gate would refuse to start; a key that a later rotation
    retired is said to be, ``_mismatch``); one the previous key
    verifies WARNs (the gate writes the rotation entry at its next start). Spans before the first
    one whose key is configured (keys retired by earlier rotations) are checked for the
    chain only, and said so. ``receipts`` (the config's section) names the variables.
    ``path`` is the SQLite file or the PostgreSQL database (``PgTarget``; SKIP without
    tables yet, as for a file not created yet)."""
    if isinstance(path, Path) and not path.exists():
        return skip("audit", "no database yet")
    try:
        if not isinstance(path, Path) and maintenance.inspect(path).audit_entries is None:
            return skip("audit", "no tables yet")  # the gates create them at first start
        newest = maintenance.newest_audit_row(path)
    except GateError as exc:
        return Check("audit", False, exc.message)
    newest = newest if receipt_key is not None else None
    public = keys.public if keys is not None and keys.public else None
    given = tuple(k for k in (receipt_key, previous_key) if k is not None)
    pending = False
    if newest is not None and not matches(receipt_key or b"", newest.entry_hash, newest.receipt):
        pending = previous_key is not None and matches(
            previous_key, newest.entry_hash, newest.receipt
        )
        if not pending:
            return Check("audit", False, _mismatch(path, receipt_key, newest.seq, receipts))
    try:  # the one check audit verify -c runs too (gate.audit.verify)
        report = verify_database(path, given, public_keys=public, leading_unknown=True)
    except GateError as exc:
        return Check("audit", False, exc.message)
    failed = _failure(report, newest, receipts)
    if failed is not None:
        return Check("audit", False, failed)
    detail = _intact(report, receipt_key is not None, bool(public))
    if pending:
        previous = receipts.previous_key_env if receipts is not None else "the previous key"
        return warn(
            "audit",
            f"{detail}; the newest entries are receipted with "
            f"receipts.previous_key_env's key ({previous}): the gate writes the "
            "receipt_key_rotated entry at its next start",
        )
    return Check("audit", True, detail)


def _failure(
    report: AuditReport, newest: AuditRow | None, receipts: ReceiptsConfig | None
) -> str | None:
    """The doctor's words for the first check of ``report`` that failed, else None:
    a wrong key, the chain, an anchor, each kind's records, a signature, the credentials."""
    result = report.chain
    if result.wrong_key:
        named = _key_names(receipts)
        # no span found although the newest entry verifies with a configured key (checked
        # before): the entry that began the newest span lost its receipt
        caught = (
            f"; yet the newest entry (seq {newest.seq}) verifies with {named}: the "
            "receipt of the entry that began its span (entry 1 or a "
            "receipt_key_rotated entry) was changed"
            if newest is not None and result.first_bad_seq == newest.seq
            else ""
        )
        return f"entry {result.first_bad_seq}: {result.reason}{caught} (check {named})"
    broken = chain_broken(report)
    if broken is not None:
        return broken
    for noun, matched in report.kinds:
        if matched is not None and matched.problem is not None:
            subject_id, reason = matched.problem
            return f"TAMPERED: {noun} {subject_id}: {reason}; the audit log itself verified"
    signed = report.signatures
    if signed is not None and signed.findings:
        return f"TAMPERED: approver signature: {signed.findings[0].line()}"
    if report.credentials is not None:
        return f"TAMPERED: {report.credentials}; the audit log itself verified"
    return None


def _intact(report: AuditReport, receipts: bool, signatures: bool) -> str:
    """What an intact ``report`` checked: entries, what of them, the records matching it
    (questions only when there are some), and the receipts not checked or not all."""
    result, records, asked = report.chain, report.records, report.questions
    assert records is not None  # verify_database checks them unless told not to
    what = ["chain"] + ["receipts"] * receipts + ["signatures"] * signatures
    detail = (
        f"{result.checked} entries, {', '.join(what)} intact; {records.checked} approvals match it"
    )
    if asked is not None and asked.checked:
        detail += f", {asked.checked} questions too"
    if not receipts:
        detail += " (receipts not checked: no receipt key)"
    elif result.spans and result.spans[0][0] > 1:
        first = result.spans[0][0]
        detail += (
            f" (receipts from entry {first}: entries 1-{first - 1} are receipted with "
            "a key retired by a rotation, which the config no longer names; audit "
            "verify --key-env checks them with it)"
        )
    return detail


def _key_names(receipts: ReceiptsConfig | None, joined: str = " and ") -> str:
    """``receipts.key_env (VARIABLE)``, then ``joined`` and the previous key's setting when
    the config names one (just ``receipts.key_env`` without the config's section)."""
    if receipts is None:
        return "receipts.key_env"
    named = f"receipts.key_env ({receipts.key_env})"
    if receipts.previous_key_env is not None:
        named += f"{joined}receipts.previous_key_env ({receipts.previous_key_env})"
    return named


def _mismatch(path: Database, key: bytes | None, seq: int, receipts: ReceiptsConfig | None) -> str:
    """The doctor's words for a newest entry (``seq``) that no configured key verifies:
    ``key`` began a span of the log that a later rotation ended (another gate rotated the
    key; a gate with this config writes nothing more), or simply does not verify it."""
    try:
        starts = maintenance.receipt_span_starts(path)
    except GateError:
        starts = []
    began = [
        i for i, (_, digest, receipt) in enumerate(starts) if matches(key or b"", digest, receipt)
    ]
    if not began or began[-1] + 1 >= len(starts):
        return _key_mismatch(seq, receipts)
    named = "receipts.key_env" + (f" ({receipts.key_env})" if receipts is not None else "")
    return (
        f"the log went over to a new receipt key at entry {starts[began[-1] + 1][0]} "
        f"(receipt_key_rotated) and {named} holds the retired one: a gate running with this "
        "config answers 503 receipt_key_retired, and one starting refuses to; set "
        "receipts.key_env to the variable holding the new key"
    )


def _key_mismatch(seq: int, receipts: ReceiptsConfig | None) -> str:
    """The doctor's words for a newest entry that no configured receipt key verifies."""
    return (
        f"the newest audit entry's receipt (seq {seq}) does not verify with "
        f"{_key_names(receipts, ' nor with ')}, so the gate refuses to start: set "
        "receipts.key_env to the variable holding the key this log was written with, or, "
        "to rotate the key, receipts.previous_key_env to that variable"
    )
