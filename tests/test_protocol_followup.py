"""The wire additions against conformance/vectors/followup.json: the follow-up fields of
a dispatch (reminder, escalation, delegates, a required skip reason) and resolution notices.
The vectors were computed with json, hashlib and hmac alone; here the gate's own builders must
produce the same bytes, and the signature is recomputed independently."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gate.protocol import signing
from gate.protocol.canonical import wire_json
from gate.protocol.envelope import build_dispatch
from gate.protocol.followup import FollowUp, build_notice
from tests.test_protocol import VECTORS, independent_header, load_cases

CASES = load_cases("followup.json")


def _dispatch(
    base: dict[str, Any],
    approvers: list[str],
    followup: FollowUp | None,
    requested_by: str | None = None,
) -> bytes:
    envelope = build_dispatch(
        approval_id=base["approval_id"],
        run_id=base["run_id"],
        pipeline=base["pipeline"],
        step=base["step"],
        issued_at_ms=1767225600000,
        expires_at_ms=1767240000000,
        risk=base["risk"],
        quorum_required=base["quorum"]["required"],
        quorum_collected=base["quorum"]["collected"],
        approvers=approvers,
        payload_hash=base["payload_hash"],
        content_type=base["draft"]["content_type"],
        body=base["draft"]["body"],
        callback_url=base["callback"]["url"],
        nonce=base["callback"]["nonce"],
        revision=base["revision"],
        followup=followup,
        requested_by=requested_by,
    )
    return wire_json(envelope)


def test_followup_vectors_file_well_formed() -> None:
    data = json.loads((VECTORS / "followup.json").read_text(encoding="utf-8"))
    assert set(data) == {"description", "cases"}
    ids = [case["id"] for case in data["cases"]]
    assert len(ids) == len(set(ids)) == 6


@pytest.mark.parametrize("case", CASES)
def test_vector_followup(case: dict[str, Any]) -> None:
    body = case["body_utf8"].encode("utf-8")
    assert independent_header(case["secret"], case["t"], body) == case["header"]
    assert signing.sign(case["secret"], case["t"], body) == case["header"]
    if "notice" in case:
        built = wire_json(build_notice(**case["approval"], **case["notice"]))
    else:
        spec = dict(case["followup"])
        if "delegates" in spec:
            spec["delegates"] = tuple(tuple(pair) for pair in spec["delegates"])
        for key in ("awaiting",):
            if key in spec:
                spec[key] = tuple(spec[key])
        base = case["base"]
        approvers = case.get("approvers", base["approvers"])
        built = _dispatch(base, approvers, FollowUp(**spec), case.get("requested_by"))
    assert built == body


def test_empty_followup_leaves_the_dispatch_unchanged() -> None:
    """A v0 relay sees byte-for-byte today's dispatch unless a follow-up field applies."""
    base = CASES[0].values[0]["base"]
    assert _dispatch(base, base["approvers"], FollowUp()) == _dispatch(
        base, base["approvers"], None
    )
    assert json.loads(_dispatch(base, base["approvers"], None)) == base


def test_dispatch_without_requested_by_is_unchanged() -> None:
    """requested_by is additive: absent (never null) when the pipeline named nobody."""
    base = CASES[0].values[0]["base"]
    assert _dispatch(base, base["approvers"], None, None) == _dispatch(
        base, base["approvers"], None
    )
    assert "requested_by" not in json.loads(_dispatch(base, base["approvers"], None))


def test_notice_cannot_be_taken_for_a_dispatch() -> None:
    notice = build_notice(
        approval_id="01KDWZ8B00J3Q9V5X7Z2M4N6PR",
        run_id="r",
        pipeline="p",
        step="s",
        outcome="cancelled",
        resolved_at_ms=0,
        revision=1,
        payload_hash="sha256:00",
        decided_by=[],
        reason=None,
    )
    assert notice["type"] == "notice"
    assert not {"callback", "nonce", "draft", "actions"} & set(notice)


def test_notice_refuses_an_unknown_outcome() -> None:
    with pytest.raises(ValueError, match="unknown outcome 'pending'"):
        build_notice(
            approval_id="a",
            run_id="r",
            pipeline="p",
            step="s",
            outcome="pending",
            resolved_at_ms=0,
            revision=1,
            payload_hash="sha256:00",
            decided_by=[],
            reason=None,
        )
