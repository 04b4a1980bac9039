"""The ``audit export`` line format: one JSON Lines record per audit entry, and back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from gate.audit.chain import AuditRow
from gate.protocol.canonical import reject_json_constant

_FIELDS = tuple(field.name for field in fields(AuditRow))  # an export line: each, in order


def export_line(row: AuditRow) -> str:
    """Return one JSON Lines record for ``audit export`` (no trailing newline).

    Fields: seq, approval_id, kind, entry (canonical JSON text), prev_hash, entry_hash,
    receipt, key_id and signature (null when the entry is not signed).
    """
    return json.dumps(
        {name: getattr(row, name) for name in _FIELDS}, ensure_ascii=False, separators=(",", ":")
    )


def _optional_text(obj: Mapping[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a string or null")
    return value


def parse_export_line(line: str) -> AuditRow:
    """Parse one ``audit export`` line back into an AuditRow; raises ValueError/KeyError/TypeError.

    Exports written before signing existed (no key_id/signature fields) parse as unsigned.
    """
    obj = json.loads(line, parse_constant=reject_json_constant)
    if not isinstance(obj, dict):
        raise TypeError("an export line is a JSON object")
    seq = obj["seq"]
    if type(seq) is not int:  # as written: no "1", 1.9 or true (the Node verifier agrees)
        raise TypeError("seq must be an integer")
    texts = [obj[name] for name in ("kind", "entry", "prev_hash", "entry_hash", "receipt")]
    if not all(isinstance(text, str) for text in texts):
        raise TypeError("kind, entry, prev_hash, entry_hash and receipt must be strings")
    kind, entry, prev_hash, entry_hash, receipt = texts
    return AuditRow(
        seq,
        _optional_text(obj, "approval_id"),
        kind,
        entry,
        prev_hash,
        entry_hash,
        receipt,
        _optional_text(obj, "key_id"),
        _optional_text(obj, "signature"),
    )
