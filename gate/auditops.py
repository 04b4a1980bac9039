"""Read audit rows (database or export file) and receipts for ``audit verify``/``export``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gate import audit
from gate.errors import GateError
from gate.store.auditlog import DatabaseRows


async def read_database(path: Path) -> Iterable[audit.AuditRow]:
    """Return the audit rows of the database at ``path``, streamed (``DatabaseRows``).

    Raises GateError ``no_database`` if it does not exist, Unavailable when it cannot be read.
    """
    if not Path(path).exists():
        raise GateError("no_database", f"no database at {path}")
    return DatabaseRows(path)


def read_export(path: Path) -> list[audit.AuditRow]:
    """Return the rows of a JSON Lines export; GateError naming the first unreadable line."""
    rows = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GateError("bad_export", f"cannot read {path}: {exc}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(audit.parse_export_line(line))
        except (ValueError, KeyError, TypeError):
            raise GateError("bad_export", f"{path}:{number}: not an audit export line") from None
    return rows


def read_expected(path: Path) -> tuple[Path, dict[str, Any]]:
    """Return ``(path, receipt)`` from a receipt file for ``audit verify --expect``.

    The file holds a receipt object (``{seq, entry_hash, receipt, alg, ...}``) or an
    approval object whose ``receipt`` is one (``hitl-gate request --json`` output).
    Raises GateError ``bad_receipt`` when it is neither.
    """
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise GateError("bad_receipt", f"cannot read a receipt from {path}: {exc}") from None
    if isinstance(obj, dict) and isinstance(obj.get("receipt"), dict):
        obj = obj["receipt"]
    seq = obj.get("seq") if isinstance(obj, dict) else None
    if (not isinstance(obj, dict) or isinstance(seq, bool) or not isinstance(seq, int)
            or not isinstance(obj.get("entry_hash"), str)):
        raise GateError("bad_receipt", f"{path} holds no receipt (seq, entry_hash)")
    return Path(path), obj
