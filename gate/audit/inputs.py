"""Read what ``audit verify`` checks besides a database: an export's rows, ``--expect``
receipt files and ``--expect-head`` values."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gate.audit import chain as audit
from gate.audit.export import parse_export_line
from gate.errors import GateError


def read_export(path: Path) -> list[audit.AuditRow]:
    """Return the rows of a JSON Lines export.

    Raises GateError ``unreadable_export`` when the file cannot be read as UTF-8 text,
    ``bad_export_line`` naming the first line that is not an export line.
    """
    rows = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise GateError("unreadable_export", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise GateError(
            "unreadable_export", f"cannot read {path}: not UTF-8 text (byte {exc.start})"
        ) from None
    # JSON Lines: a record ends at "\n" (a "\r" before it is dropped), never at U+2028,
    # U+2029 or U+0085, which JSON keeps raw inside strings and str.splitlines would split on
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            rows.append(parse_export_line(line))
        except (ValueError, KeyError, TypeError):
            raise GateError(
                "bad_export_line",
                f"line {number} of {path} is not an audit export line (changed, or not an export)",
                extra={"line": number},
            ) from None
    return rows


def read_expected(path: Path) -> tuple[Path, dict[str, Any]]:
    """Return ``(path, receipt)`` from a receipt file for ``audit verify --expect``.

    The file holds a receipt object (``{seq, entry_hash, receipt, alg, ...}``) or an
    approval object (``hitl-gate request --json`` output, an API answer): its resolution
    ``receipt`` when it has one, else its ``created_receipt`` (a pending approval). One is
    enough: the entry hash at a receipt's seq commits to every entry before it, so the
    resolution's receipt also holds the created entry in place. Raises GateError
    ``bad_receipt`` when the file holds none of these.
    """
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise GateError("bad_receipt", f"cannot read a receipt from {path}: {exc}") from None
    if isinstance(obj, dict):  # an approval object: its receipt, else its created one
        obj = next(
            (
                obj[name]
                for name in ("receipt", "created_receipt")
                if isinstance(obj.get(name), dict)
            ),
            obj,
        )
    seq = obj.get("seq") if isinstance(obj, dict) else None
    if (
        not isinstance(obj, dict)
        or isinstance(seq, bool)
        or not isinstance(seq, int)
        or not isinstance(obj.get("entry_hash"), str)
    ):
        raise GateError("bad_receipt", f"{path} holds no receipt (seq, entry_hash)")
    return Path(path), obj


_HEAD = re.compile(r"([0-9]{1,18}):([0-9a-fA-F]{64})")


def parse_head(text: str) -> tuple[int, str]:
    """Return ``(seq, entry_hash)`` from ``SEQ:HASH`` (``audit verify --expect-head``): a
    chain head as the gate logs it, ``event=audit_head seq=SEQ hash=HASH``. The hash is
    taken in either case and returned lowercase. Raises GateError ``bad_head`` naming the
    text when it is not a seq of 1 or more and 64 hex digits."""
    match = _HEAD.fullmatch(text.strip())
    if match is None or int(match.group(1)) < 1:
        raise GateError(
            "bad_head",
            f"{text!r} is not SEQ:HASH (an audit entry's seq, 1 or "
            "more, and its entry hash, 64 hex digits, as the gate logs them in "
            "event=audit_head)",
        )
    return int(match.group(1)), match.group(2).lower()
