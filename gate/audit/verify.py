"""Read audit rows (database or export file) and receipts for ``audit verify``/``export``."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from gate.audit import chain as audit
from gate.errors import GateError, Unavailable
from gate.store import auditlog
from gate.store.auditlog import DatabaseRows

# entries per ``audit verify`` work unit; a log of one unit or less is verified in-process
SEGMENT_ROWS = 50_000
MAX_WORKERS = 8


async def read_database(path: Path) -> Iterable[audit.AuditRow]:
    """Return the audit rows of the database at ``path``, streamed (``DatabaseRows``).

    Raises GateError ``no_database`` if it does not exist, Unavailable when it cannot be read.
    """
    if not Path(path).exists():
        raise GateError("no_database", f"no database at {path}")
    return DatabaseRows(path)


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
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(audit.parse_export_line(line))
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
    if isinstance(obj, dict):
        held = next(
            (
                obj[name]
                for name in ("receipt", "created_receipt")
                if isinstance(obj.get(name), dict)
            ),
            None,
        )
        obj = held if held is not None else obj
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


def verify_database(
    path: Path,
    key: audit.ReceiptKeyArg,
    *,
    workers: int | None = None,
    segment_rows: int = SEGMENT_ROWS,
) -> audit.VerifyResult:
    """``audit verify`` of a database without public keys: the chain and (with ``key``: one
    receipt key, or several, each for its own span) every HMAC receipt, with the same answer
    as ``audit.verify`` over ``DatabaseRows``.

    The entries up to the highest seq present at the start are cut into runs of
    ``segment_rows``; each run is verified on its own (``audit.verify_segment``) in
    ``workers`` processes (default: the CPUs this process may use, at most 8; 1 = all
    in this process), and the runs are joined in order (``audit.stitch``), so the first
    bad entry and its reason do not depend on the split. Entries appended while it runs
    are not checked. Raises GateError ``no_database``, Unavailable on a read error.
    """
    if not Path(path).exists():
        raise GateError("no_database", f"no database at {path}")
    bounds = auditlog.seq_bounds(Path(path))
    if bounds is None:
        return audit.VerifyResult(True, 0)
    low, high = min(bounds[0], 1), bounds[1]
    key = audit.receipt_keys(key)
    ranges = [
        (start, min(start + segment_rows - 1, high)) for start in range(low, high + 1, segment_rows)
    ]
    count = workers if workers is not None else min(MAX_WORKERS, _usable_cpus())
    if count <= 1 or len(ranges) == 1:
        return audit.stitch(_segment(_verify_range(str(path), lo, hi, key)) for lo, hi in ranges)
    # fork is cheapest; only safe while this process runs one thread
    method = "fork" if threading.active_count() == 1 else "spawn"
    with ProcessPoolExecutor(
        min(count, len(ranges)), mp_context=multiprocessing.get_context(method)
    ) as pool:
        futures = [pool.submit(_verify_range, str(path), lo, hi, key) for lo, hi in ranges]
        try:
            return audit.stitch(_segment(future.result()) for future in futures)
        finally:
            for future in futures:  # after the first bad run the rest is not needed
                future.cancel()


def _segment(outcome: tuple[Any, ...] | str) -> audit.Segment:
    if isinstance(outcome, str):  # a worker's read error, passed back as text
        raise Unavailable("storage_unavailable", outcome)
    (
        first_seq,
        first_prev,
        last_seq,
        last_hash,
        checked,
        problem,
        wrong_key,
        initial_key,
        starts,
        end_key,
    ) = outcome
    return audit.Segment(
        first_seq,
        first_prev,
        last_seq,
        last_hash,
        checked,
        None if problem is None else (int(problem[0]), str(problem[1])),
        wrong_key,
        initial_key,
        tuple(starts),
        end_key,
    )


def _verify_range(path: str, low: int, high: int, key: tuple[bytes, ...]) -> tuple[Any, ...] | str:
    """Worker: verify entries ``low..high``; the Segment as a plain tuple, or the error."""
    try:
        seg = audit.verify_segment(auditlog.read_range(Path(path), low, high), key)
    except GateError as exc:
        return exc.message
    return (
        seg.first_seq,
        seg.first_prev,
        seg.last_seq,
        seg.last_hash,
        seg.checked,
        seg.problem,
        seg.wrong_key,
        seg.initial_key,
        seg.starts,
        seg.end_key,
    )


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
