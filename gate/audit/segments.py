"""The chain verified in independent runs of entries, joined in order (parallel verify)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gate.audit import spans as audit_spans
from gate.audit.chain import (
    GENESIS_HASH,
    PREV_BROKEN,
    ReceiptKeyArg,
    VerifyResult,
    entry_problem,
    receipt_keys,
)


@dataclass(frozen=True, slots=True)
class Segment:
    """What ``verify_segment`` saw in one run of consecutive entries, for ``stitch``.

    ``first_seq``/``first_prev``: seq and prev_hash of its first row, taken as given (None
    when the run had no rows); ``last_seq``/``last_hash``: of the last row that verified;
    ``checked``: rows that verified; ``problem``: ``(seq, reason)`` of the first bad row,
    ``wrong_key`` as in VerifyResult. Receipt-key spans (index into the keys given, None
    without keys): ``initial_key`` of its first row, ``starts`` ``(seq, key)`` of the spans
    begun in it, ``end_key`` of the span open at its end.
    """

    first_seq: int | None
    first_prev: str | None
    last_seq: int | None
    last_hash: str | None
    checked: int
    problem: tuple[int, str] | None = None
    wrong_key: bool = False
    initial_key: int | None = None
    starts: tuple[tuple[int, int], ...] = ()
    end_key: int | None = None


def verify_segment(rows: Iterable[Sequence[Any]], key: ReceiptKeyArg) -> Segment:
    """Verify a run of consecutive entries on its own, as ``verify`` does for the whole log.

    ``rows``: ascending tuples ``(seq, approval_id, kind, entry, prev_hash, entry_hash,
    receipt, ...)``. The first row's seq and prev_hash are taken as given: ``stitch``
    checks them against the run before, and the receipt key of its first row (found by
    trying each key given) against the span the run before ended in. Runs are
    independent, so they can be verified in parallel (``gate.audit.verify.verify_database``).
    Signatures are not checked here.
    """
    prev = ""
    expected = 0
    first: tuple[int, str] | None = None
    checked = 0
    spans = audit_spans.Spans(receipt_keys(key))
    for row in rows:
        if first is None:
            first, prev, expected = (row[0], row[4]), row[4], row[0]  # seq, prev_hash
        reason, wrong_key, digest = entry_problem(spans, prev, expected, *row[:7])
        if reason is not None:
            return _ended(first, expected, prev, checked, spans, (row[0], reason), wrong_key)
        prev = digest
        expected += 1
        checked += 1
    if first is None:
        return Segment(None, None, None, None, 0)
    return _ended(first, expected, prev, checked, spans)


def _ended(
    first: tuple[int, str],
    expected: int,
    prev: str,
    checked: int,
    spans: audit_spans.Spans,
    problem: tuple[int, str] | None = None,
    wrong_key: bool = False,
) -> Segment:
    """The Segment of a run that began at ``first`` (seq, prev_hash) and verified
    ``checked`` rows up to ``expected - 1`` (hash ``prev``), then stopped at ``problem``."""
    return Segment(
        first[0],
        first[1],
        expected - 1 if checked else None,
        prev if checked else None,
        checked,
        problem,
        wrong_key,
        spans.initial,
        tuple(spans.starts),
        spans.current,
    )


def stitch(segments: Iterable[Segment]) -> VerifyResult:
    """Join consecutive ``verify_segment`` results (ascending, covering seq 1 upwards) into
    what ``verify`` returns for the same rows without public keys: the same first bad
    entry and reason, the same count. Stops reading ``segments`` at the first problem."""
    prev, expected, checked = GENESIS_HASH, 1, 0
    current: int | None = None  # receipt key of the span open so far
    used: set[int] = set()
    starts: list[tuple[int, int]] = []
    for segment in segments:
        if segment.first_seq is None:
            continue
        if segment.first_seq != expected:
            return VerifyResult(
                False,
                checked,
                segment.first_seq,
                f"expected entry {expected}, found {segment.first_seq} (deleted or inserted entry)",
            )
        if segment.first_prev != prev:
            return VerifyResult(False, checked, segment.first_seq, PREV_BROKEN)
        begins = bool(segment.starts) and segment.starts[0][0] == segment.first_seq
        if segment.initial_key is not None and not begins and segment.initial_key != current:
            # its first entry verified with another key than the span it continues
            return VerifyResult(False, checked, segment.first_seq, audit_spans.RECEIPT_MISMATCH)
        for seq, index in segment.starts:  # each rotation is to a key no earlier span used
            if index in used:
                return VerifyResult(
                    False, checked + seq - segment.first_seq, seq, audit_spans.OLD_KEY
                )
            used.add(index)
            starts.append((seq, index))
        if segment.problem is not None:
            return VerifyResult(
                False,
                checked + segment.checked,
                segment.problem[0],
                segment.problem[1],
                wrong_key=segment.wrong_key,
            )
        checked += segment.checked
        current = segment.end_key
        assert segment.last_seq is not None and segment.last_hash is not None
        expected, prev = segment.last_seq + 1, segment.last_hash
    return VerifyResult(True, checked, spans=tuple(starts))
