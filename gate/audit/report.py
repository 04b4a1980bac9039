"""What ``hitl-gate audit verify`` says about an ``AuditReport``: its lines and exit code.

Pure text: the verdict of ``gate.audit.verify`` for a reader at a terminal, kept next to the
report it reads so the command stays a parser and a printer (docs/auditing.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gate.audit.chain import VerifyResult
    from gate.audit.verify import AuditReport


@dataclass(frozen=True, slots=True)
class KeysUsed:
    """The keys a verification had: ``where`` they were named (``--key-env`` or the config
    keys), the receipt-key variable ``names`` in the order given, whether any receipt key and
    any public key was given, and the config's ``receipts.key_env`` (None without a config
    or when keys were named on the command line)."""

    where: str
    names: tuple[str, ...]
    receipt_key: bool
    public_key: bool
    configured_key_env: str | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """``exit_code`` 0 intact, 1 tampered or wrong key; ``out`` lines for stdout, ``err``
    lines for stderr (warnings, or the ``Error:`` line of a wrong key)."""

    exit_code: int
    out: tuple[str, ...] = ()
    err: tuple[str, ...] = ()


def verdict(
    report: AuditReport,
    keys: KeysUsed,
    *,
    held_seqs: Sequence[int] = (),
    head_seqs: Sequence[int] = (),
) -> Verdict:
    """The verdict on ``report``: the first failure as one ``TAMPERED: ...`` line (exit 1),
    a wrong key as an ``Error:`` line (exit 1: not tampering, b02-04), else the ``ok:``
    lines with what was checked and anchored (``held_seqs``: entries of the receipts given
    with --expect; ``head_seqs``: of the heads given with --expect-head) and the warnings."""
    result = report.chain
    if result.wrong_key:
        return Verdict(1, err=(f"Error: {keys.where} ({', '.join(keys.names)}): {result.reason}",))
    broken = chain_broken(report)
    if broken is not None:
        return Verdict(1, (broken,))
    signed = report.signatures
    if signed is not None and signed.findings:  # every finding, one line each
        return Verdict(
            1,
            tuple(f"TAMPERED: approver signature: {f.line()}" for f in signed.findings)
            + (f"(the audit log itself verified: {result.checked} entries)",),
        )
    problem = next(  # a request's rows, else the table the gate checks keys against
        (
            f"{noun} {matched.problem[0]}: {matched.problem[1]}"
            for noun, matched in report.kinds
            if matched is not None and matched.problem is not None
        ),
        report.credentials,
    )
    if problem is not None:
        tampered = f"TAMPERED: {problem}; the audit log itself verified ({result.checked} entries)"
        return Verdict(1, (tampered,))
    checked = ["chain"] + ["receipts"] * keys.receipt_key + ["signatures"] * keys.public_key
    what = ", ".join(checked[:-1]) + f" and {checked[-1]}" if len(checked) > 1 else checked[0]
    notes = "".join(f"; holds the receipt for entry {seq}" for seq in held_seqs)
    notes += heads_note(head_seqs)
    out = [f"ok: {result.checked} entries, {what} intact{spans_note(result, keys.names)}{notes}"]
    if signed is not None and signed.signed:
        out.append(f"ok: {len(signed.signed)} approver signatures verified")
    for noun, matched in report.kinds:
        # approvals are always counted; a log without questions is told what it always was
        if matched is not None and (noun == "approval" or matched.checked or matched.newer):
            newer = f" ({matched.newer} written since, not checked)" if matched.newer else ""
            out.append(f"ok: {matched.checked} {noun}s match the audit log{newer}")
    return Verdict(0, tuple(out), _warnings(result, keys))


def chain_broken(report: AuditReport) -> str | None:
    """The ``TAMPERED: entry N: ...`` line of a chain that did not verify, or of an anchor
    it does not hold (``audit verify`` and ``doctor`` alike), else None. A wrong key is not
    tampering: the caller says it first."""
    result = report.chain
    if not result.ok and not result.wrong_key:
        return (
            f"TAMPERED: entry {result.first_bad_seq}: {result.reason} "
            f"({result.checked} entries before it verified)"
        )
    anchor = report.anchor
    if anchor is not None:
        return f"TAMPERED: entry {anchor.seq}: {anchor.reason} ({anchor.source})"
    return None


def _warnings(result: VerifyResult, keys: KeysUsed) -> tuple[str, ...]:
    """Warnings of an intact log: newest span on the previous key; nothing authenticated."""
    err: list[str] = []
    if (
        keys.configured_key_env is not None
        and result.spans
        and keys.names[result.spans[-1][1]] != keys.configured_key_env
    ):
        err.append(
            f"warning: the newest entries are receipted with receipts.previous_key_env's"
            f" key ({keys.names[result.spans[-1][1]]}), not receipts.key_env's: the gate "
            "writes the receipt_key_rotated entry at its next start"
        )
    if not keys.receipt_key and not keys.public_key:
        err.append(
            "warning: no key was given, so nothing authenticated the entries: anyone "
            "can re-chain an edited log; verify with --public-key (or --key-env)"
        )
    return tuple(err)


def heads_note(seqs: Sequence[int]) -> str:
    """``; holds the logged head(s) at entr(y|ies) ...`` for the ok line ('' for none)."""
    unique = sorted(set(seqs))
    if not unique:
        return ""
    if len(unique) == 1:
        return f"; holds the logged head at entry {unique[0]}"
    return f"; holds the logged heads at entries {', '.join(map(str, unique))}"


def spans_note(result: VerifyResult, names: Sequence[str]) -> str:
    """`` (receipt keys: A for entries 1-4, B from entry 5)`` for a log whose receipt key
    was rotated, else ""."""
    spans = result.spans
    if len(spans) < 2:
        return ""
    parts = [
        f"{names[index]} for entries {first}-{spans[i + 1][0] - 1}"
        for i, (first, index) in enumerate(spans[:-1])
    ]
    parts.append(f"{names[spans[-1][1]]} from entry {spans[-1][0]}")
    return f" (receipt keys: {', '.join(parts)})"
