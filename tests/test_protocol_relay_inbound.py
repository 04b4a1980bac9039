"""gate/protocol/relay_inbound.py: what the reference relay and the inbox check of a signed POST
from the gate before reading it (signature, window, JSON, protocol) and the subject a notice
names, table by table. The relays' HTTP answers are pinned end to end by test_relay_signing,
test_inbox_relay and test_relay_n8n's shared cases."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gate.protocol import signing
from gate.protocol.errors import ProtocolError
from gate.protocol.relay_inbound import is_notice, notice_subject, open_signed

SECRET = "relay-inbound-test-secret-0123456789"
NOW = 1_767_225_600.0
SKEW = 300.0


def _signed(body: bytes, t: int = int(NOW), secret: str = SECRET) -> str:
    return signing.sign(secret, t, body)


def test_open_signed_returns_the_hitl_v0_object() -> None:
    body = json.dumps({"protocol": "hitl/v0", "approval_id": "a1"}).encode()

    got = open_signed(_signed(body), body, [SECRET], NOW, SKEW)

    assert got == {"protocol": "hitl/v0", "approval_id": "a1"}


def test_open_signed_takes_a_previous_secret_too() -> None:
    body = b'{"protocol":"hitl/v0"}'

    assert open_signed(_signed(body), body, ["another-secret-0123456789", SECRET], NOW, SKEW)


OBJECT = b'{"protocol":"hitl/v0"}'
REFUSED: list[Any] = [
    pytest.param(None, OBJECT, 401, "signature_missing", id="no-header"),
    pytest.param("t=1,v1=zz", OBJECT, 401, "signature_malformed", id="malformed-header"),
    pytest.param(
        _signed(OBJECT, t=int(NOW - SKEW - 1)), OBJECT, 401, "timestamp_out_of_window", id="old"
    ),
    pytest.param(
        _signed(OBJECT, secret="wrong-secret-0123456789"),
        OBJECT,
        401,
        "signature_mismatch",
        id="other-secret",
    ),
    pytest.param(_signed(b"{"), b"{", 400, "invalid_json", id="no-json"),
    pytest.param(_signed(b"[1]"), b"[1]", 400, "invalid_protocol", id="no-object"),
    pytest.param(
        _signed(b'{"protocol":"hitl/v1"}'),
        b'{"protocol":"hitl/v1"}',
        400,
        "invalid_protocol",
        id="other-protocol",
    ),
    pytest.param(_signed(b"{}"), b"{}", 400, "invalid_protocol", id="no-protocol"),
]


@pytest.mark.parametrize(("header", "body", "status", "reason"), REFUSED)
def test_open_signed_refuses_with_the_first_failing_reason(
    header: str | None, body: bytes, status: int, reason: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        open_signed(header, body, [SECRET], NOW, SKEW)

    assert (caught.value.status, caught.value.code) == (status, reason)


def test_open_signed_invalid_protocol_answer_body_is_the_relays() -> None:
    with pytest.raises(ProtocolError) as caught:
        open_signed(_signed(b"[]"), b"[]", [SECRET], NOW, SKEW)

    assert caught.value.body() == {"status": "invalid", "reason": "invalid_protocol"}


def test_open_signed_checks_the_signature_before_the_json() -> None:
    with pytest.raises(ProtocolError) as caught:
        open_signed(None, b"{", [SECRET], NOW, SKEW)

    assert caught.value.code == "signature_missing"


@pytest.mark.parametrize(
    ("notice", "expected"),
    [
        pytest.param(
            {"type": "notice", "approval_id": "a1", "outcome": "approved"},
            ("approval_id", "a1", "approved"),
            id="approval",
        ),
        pytest.param(
            {"type": "notice", "kind": "question", "question_id": "q1", "outcome": "answered"},
            ("question_id", "q1", "answered"),
            id="question",
        ),
        pytest.param(
            {"type": "notice", "kind": "question", "approval_id": "a1", "outcome": "x"},
            None,
            id="question-without-question-id",
        ),
        pytest.param({"type": "notice", "approval_id": "a1"}, None, id="no-outcome"),
        pytest.param(
            {"type": "notice", "approval_id": 7, "outcome": "approved"}, None, id="id-no-string"
        ),
    ],
)
def test_notice_subject(notice: dict[str, Any], expected: tuple[str, str, str] | None) -> None:
    assert notice_subject(notice) == expected


def test_is_notice_only_for_type_notice() -> None:
    assert is_notice({"type": "notice"})
    assert not is_notice({"type": "dispatch"})
    assert not is_notice({})


@pytest.mark.parametrize(
    "body",
    [
        b'{"protocol":"hitl/v0","kind":"question","question":{"text":"a \\ud800 b"}}',
        b'{"protocol":"hitl/v0","draft":{"body":"\\udfff"}}',
        b'{"protocol":"hitl/v0","\\ud800":1}',
        b'{"protocol":"hitl/v0","approvers":[["\\ud800"]]}',
    ],
)
def test_open_signed_refuses_a_lone_surrogate_anywhere(body: bytes) -> None:
    """Session 11 review: a signed question holding ``\\ud800`` reached the hash (UTF-8
    encoding) and raised UnicodeEncodeError: a 500, not an answer. Such JSON is no UTF-8
    text: 400 ``invalid_json`` before any field is read."""
    with pytest.raises(ProtocolError) as caught:
        open_signed(_signed(body), body, [SECRET], NOW, SKEW)

    assert (caught.value.status, caught.value.code) == (400, "invalid_json")
    assert "lone surrogate" in str(caught.value)
