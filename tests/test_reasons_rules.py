"""The pure parts of reasons: SPEC §2 check 12's reason rule, the records
cross-check of reasons, and the lines the pipeline side prints. No daemon, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from gate.audit.approval_kind import reasons_problem
from gate.client.hops import reason_summary, skip_reason_lines
from gate.core.approvals import rules
from gate.errors import GateError
from gate.protocol.envelope import Decision


def decision(verb: str, reason: str | None) -> Decision:
    return Decision(
        "A", "n" * 32, verb, "sha256:" + "0" * 64, "alice@example.com", None, None,
        "new text" if verb == "adjust" else None, "2026-08-02T09:31:05Z", reason,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("verb", "reason", "required", "recorded"),
    [
        ("skip", None, False, None),
        ("skip", "fix it", True, "fix it"),
        ("skip", "  padded  ", True, "  padded  "),  # recorded as sent
        ("approve", " \t\n\u3000", False, None),  # only White_Space: no reason
        ("approve", None, True, None),  # required only on a skip
        ("adjust", "x" * 10, True, "x" * 10),  # exactly the limit
        ("skip", "\x1f", True, "\x1f"),  # a control is not blank (as a draft)
    ],
    ids=["none", "required", "padded", "blank", "approve", "limit", "control"],
)
def test_check_reason_returns_what_is_recorded(
    verb: str, reason: str | None, required: bool, recorded: str | None
) -> None:
    assert rules.check_reason(decision(verb, reason), 10, required) == recorded


@pytest.mark.parametrize(
    ("verb", "reason", "required", "code"),
    [
        ("skip", None, True, "reason_required"),
        ("skip", "", True, "reason_required"),
        ("skip", " \u2003\n", True, "reason_required"),
        ("approve", "x" * 11, False, "reason_too_long"),
        ("skip", "é" * 11, True, "reason_too_long"),  # characters, not bytes
    ],
    ids=["missing", "empty", "blank", "too-long", "too-long-chars"],
)
def test_check_reason_refuses_422(verb: str, reason: str | None, required: bool, code: str) -> None:
    with pytest.raises(GateError) as caught:
        rules.check_reason(decision(verb, reason), 10, required)
    assert (caught.value.status, caught.value.kind, caught.value.code) == (422, "invalid", code)


def test_check_reason_counts_characters_not_bytes() -> None:
    assert rules.check_reason(decision("skip", "é" * 10), 10, True) == "é" * 10


def test_reasons_problem_names_the_entry_and_never_the_text() -> None:
    stored = [(1, 101, "secret plan"), (1, 102, None)]
    assert reasons_problem(stored, [(5, 1, 101, "secret plan"), (6, 1, 102, None)]) is None
    problem = reasons_problem(stored, [(5, 1, 101, "other"), (6, 1, 102, None)])
    assert problem == (
        "the reason of the decision by operator 101 on revision 1 differs between the "
        "decisions table and audit entry 5"
    )
    assert reasons_problem([(1, 102, "added")], [(6, 1, 102, None)]) is not None


def approval(outcome: str | None, *decisions: dict[str, Any]) -> dict[str, Any]:
    return {"outcome": outcome, "decisions": list(decisions)}


def test_skip_reason_lines_only_for_a_skip_with_a_reason() -> None:
    skip = {"decision": "skip", "identity": "bob@example.com", "reason": "a\nb\x1b[2J\u202e"}
    plain = {"decision": "skip", "identity": "bob@example.com", "reason": None}
    assert skip_reason_lines(approval("skipped", skip)) == [
        "skipped by bob@example.com: a\n  b<U+001B>[2J<U+202E>"
    ]
    assert skip_reason_lines(approval("skipped", plain)) == []
    assert skip_reason_lines(approval("approved", dict(skip, decision="approve"))) == []


def test_reason_summary_is_one_quoted_line() -> None:
    noted = {"decision": "approve", "reason": "ok\nbut \x07late"}
    assert reason_summary(approval("approved", noted)) == '  reason "ok\\nbut <U+0007>late"'
    assert reason_summary(approval(None)) == ""
