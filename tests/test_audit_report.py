"""gate.audit.report: what ``audit verify`` says of a report (lines, stream, exit code). The
end-to-end answers are in tests/test_audit_verify.py; these pin each branch in-process."""

from __future__ import annotations

from gate.audit.chain import VerifyResult
from gate.audit.records import RecordsResult
from gate.audit.report import KeysUsed, Verdict, heads_note, verdict
from gate.audit.verify import AnchorProblem, AuditReport

KEYS = KeysUsed("receipts.key_env", ("NEW",), receipt_key=True, public_key=False)
NO_KEYS = KeysUsed("", (), receipt_key=False, public_key=False)


def test_wrong_key_is_an_error_not_tampering() -> None:
    report = AuditReport(VerifyResult(False, 0, 1, "receipt does not match", wrong_key=True))
    assert verdict(report, KEYS) == Verdict(
        1, err=("Error: receipts.key_env (NEW): receipt does not match",)
    )


def test_the_first_failure_is_named_and_nothing_after_it() -> None:
    chain = VerifyResult(False, 4, 5, "hash mismatch")
    assert verdict(AuditReport(chain), KEYS).out == (
        "TAMPERED: entry 5: hash mismatch (4 entries before it verified)",
    )
    anchored = AuditReport(VerifyResult(True, 9), AnchorProblem(7, "missing", "receipt r.json"))
    assert verdict(anchored, KEYS).out == ("TAMPERED: entry 7: missing (receipt r.json)",)
    records = AuditReport(VerifyResult(True, 9), None, RecordsResult(2, ("01J", "outcome")))
    assert verdict(records, KEYS) == Verdict(
        1, ("TAMPERED: approval 01J: outcome; the audit log itself verified (9 entries)",)
    )


def test_intact_names_what_was_checked_and_anchored() -> None:
    report = AuditReport(
        VerifyResult(True, 9, spans=((1, 0), (5, 1))), None, RecordsResult(3, None, 1)
    )
    keys = KeysUsed("--key-env", ("OLD", "NEW"), True, True)
    assert verdict(report, keys, held_seqs=[4], head_seqs=[9, 2, 9]) == Verdict(
        0,
        (
            "ok: 9 entries, chain, receipts and signatures intact (receipt keys: OLD for"
            " entries 1-4, NEW from entry 5); holds the receipt for entry 4; holds the logged"
            " heads at entries 2, 9",
            "ok: 3 approvals match the audit log (1 written since, not checked)",
        ),
    )


def test_warnings_without_keys_and_on_the_previous_key() -> None:
    assert verdict(AuditReport(VerifyResult(True, 1)), NO_KEYS).err == (
        "warning: no key was given, so nothing authenticated the entries: anyone can"
        " re-chain an edited log; verify with --public-key (or --key-env)",
    )
    rotated = KeysUsed("receipts.key_env", ("NEW", "OLD"), True, False, configured_key_env="NEW")
    said = verdict(AuditReport(VerifyResult(True, 2, spans=((1, 1),))), rotated)
    assert said.exit_code == 0 and said.err[0].startswith(
        "warning: the newest entries are receipted with receipts.previous_key_env's key (OLD)"
    )


def test_heads_note() -> None:
    assert heads_note([]) == ""
    assert heads_note([3]) == "; holds the logged head at entry 3"
