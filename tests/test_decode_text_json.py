"""``gate.protocol.envelope.decode_text_json``: how every JSON request body of the gate is read.
A string holding a lone surrogate (a JSON ``\\ud800`` escape: no UTF-8 text, so SQLite,
hashing and signing all fail on it) is refused 400 ``invalid_<field>`` with a sentence, on
every listener, before anything is written.

The table runs against one real daemon (pipeline API, admin API, relay callbacks, the
enrolment page), each request checked against the SQLite file read back: no row anywhere
changed.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gate.protocol.envelope import lone_surrogate_field
from tests.support import (
    API_TOKEN,
    GateProcess,
    as_json,
    gate_env,
    http_request,
    module_gate,
    sign_headers,
)

ADMIN_TOKEN = "test-admin-token-8c1f4e0b9d2a7356e4"
STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "ask", "type": "question", "approvers": [101, 102, 103], "timeout": "1h"},
]
relay, gate = module_gate(
    "surrogates",
    env=gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN),
    steps=STEPS,
    api={"admin_token_env": "HITL_ADMIN_TOKEN"},
    relay={"questions": True, "credentials": True},
)
TABLES = (
    "approvals",
    "questions",
    "question_versions",
    "approver_credentials",
    "approver_invites",
    "audit_log",
    "outbox",
    "question_outbox",
)
PEM = (
    Ed25519PrivateKey.generate()
    .public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode("ascii")
)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        pytest.param({"label": "ok"}, None, id="none"),
        pytest.param({"label": "\ud800"}, "label", id="top-level"),
        pytest.param({"draft": {"body": "ok", "content_type": "\udfff"}}, "draft.content_type"),
        pytest.param({"options": ["a", "b \ud800"]}, "options[1]", id="list-item"),
        pytest.param({"a": "\ud800", "b": "\udc00"}, "a", id="first-in-document-order"),
        pytest.param({"a": {"\ud800": "x"}}, "a", id="key-reported-at-its-parent"),
        pytest.param({"not plain": "\ud800"}, "json", id="odd-key-reported-at-its-parent"),
        pytest.param(["\ud800"], "json", id="top-level-array"),
        pytest.param("\udfff", "json", id="top-level-string"),
    ],
)
def test_decode_text_json_lone_surrogate_field_names_the_first(value: Any, field: str) -> None:
    assert lone_surrogate_field(value) == field


def _counts(gate: GateProcess) -> dict[str, int]:
    db = sqlite3.connect(f"file:{gate.config.parent / 'gate.db'}?mode=ro", uri=True)
    try:
        return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        db.close()


def _raw(body: dict[str, Any]) -> bytes:
    """ASCII JSON: a lone surrogate goes over the wire as its ``\\ud800`` escape."""
    return json.dumps(body).encode("ascii")


def _post(gate: GateProcess, where: str, path: str, raw: bytes) -> tuple[int, Any]:
    callback_base = gate.callback_url.rsplit("/hitl/", 1)[0]
    headers = {"Content-Type": "application/json"}
    if where == "api":
        base = gate.api_url
        headers["Authorization"] = f"Bearer {API_TOKEN}"
    elif where == "admin":
        base = gate.api_url
        headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    elif where == "signed":
        base = callback_base
        headers = sign_headers(raw)
    else:  # the enrolment page's own script posts from the gate's origin
        base = callback_base
        headers["Origin"] = f"http://localhost:{urlsplit(callback_base).port}"
    status, _, answer = http_request(base + path, "POST", raw, headers)
    return status, as_json(answer)


QUESTION = {"pipeline": "p", "step": "ask", "text": "Which PO?", "response_type": "free_text"}
SURFACES = [
    pytest.param(
        "admin",
        "/v1/admin/approvers/invites",
        {"operator_id": 101, "label": "\ud800"},
        "invalid_label",
        "label",
        id="admin-invite-label",
    ),
    pytest.param(
        "admin",
        "/v1/admin/approvers",
        {"operator_id": 101, "type": "ed25519", "public_key": PEM, "label": "laptop \udfff"},
        "invalid_label",
        "label",
        id="admin-approver-key-label",
    ),
    pytest.param(
        "api",
        "/v1/approvals",
        {"pipeline": "p", "step": "q1", "draft": {"body": "x"}, "note": "\ud800"},
        "invalid_note",
        "note",
        id="approval-unknown-field",
    ),
    pytest.param(
        "api",
        "/v1/questions",
        {**QUESTION, "context": {"po": "\udfff"}},
        "invalid_context.po",
        "context.po",
        id="question-unknown-field",
    ),
    pytest.param(
        "api",
        "/v1/questions",
        {**QUESTION, "response_type": "single_choice", "options": ["a", "\ud800"]},
        "invalid_options",
        "options[1]",
        id="question-option",
    ),
    pytest.param(
        "signed",
        "/hitl/v0/decisions",
        {
            "protocol": "hitl/v0",
            "approval_id": "01J9ZQ3V6W8X2Y4A5B7C9D1E3F",
            "nonce": "n",
            "decision": "skip",
            "payload_hash": "sha256:00",
            "approver": {"id": "alice@example.com"},
            "decided_at": "2026-08-02T09:31:05Z",
            "reason": "\ud800",
        },
        "invalid_reason",
        "reason",
        id="decision-reason",
    ),
    pytest.param(
        "signed",
        "/hitl/v0/credentials",
        {"protocol": "hitl/v0", "type": "credentials_request", "issued_at": "\ud800"},
        "invalid_issued_at",
        "issued_at",
        id="credentials-request",
    ),
    pytest.param(
        "enrol",
        "/enrol/no-such-invite",
        {"id": "\ud800", "type": "public-key"},
        "invalid_id",
        "id",
        id="enrol-registration",
    ),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("where", "path", "body", "reason", "field"), SURFACES)
def test_decode_text_json_refuses_a_lone_surrogate_before_anything_is_written(
    gate: GateProcess,
    where: str,
    path: str,
    body: dict[str, Any],
    reason: str,
    field: str,
) -> None:
    before = _counts(gate)

    status, answer = _post(gate, where, path, _raw(body))

    assert (status, answer["reason"], answer["field"]) == (400, reason, field), answer
    assert answer["message"].startswith(f"{field} holds a lone surrogate")
    assert _counts(gate) == before
    assert "internal_error" not in gate.log()


@pytest.mark.e2e
def test_decode_text_json_the_same_fields_without_a_surrogate_are_written(
    gate: GateProcess,
) -> None:
    """The refusals above are the surrogate's, not the body's: the same requests with plain
    text are taken (so the table cannot pass on a body refused for another reason)."""
    status, invite = _post(
        gate, "admin", "/v1/admin/approvers/invites", _raw({"operator_id": 101, "label": "x"})
    )
    assert status == 201, invite
    key = {"operator_id": 101, "type": "ed25519", "public_key": PEM, "label": "laptop"}
    status, enrolled = _post(gate, "admin", "/v1/admin/approvers", _raw(key))
    assert (status, enrolled["label"]) == (201, "laptop"), enrolled
    note = {"pipeline": "p", "step": "q1", "draft": {"body": "x"}, "note": "n"}
    assert _post(gate, "api", "/v1/approvals", _raw(note))[0] == 201
    status, asked = _post(gate, "api", "/v1/questions", _raw({**QUESTION, "context": {}}))
    assert status == 201, asked
    request = {"protocol": "hitl/v0", "type": "credentials_request"}
    issued = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    assert (
        _post(gate, "signed", "/hitl/v0/credentials", _raw({**request, "issued_at": issued}))[0]
        == 200
    )


@pytest.mark.parametrize(
    ("body", "reason", "field"),
    [
        (
            {"schema": {"properties": {"n": {"title": "\ud800"}}}},
            "invalid_schema",
            "schema.properties.n.title",
        ),
        (
            {"schema": {"properties": {"n": {"enum": ["a", "\udfff"]}}}},
            "invalid_schema",
            "schema.properties.n.enum[1]",
        ),
        ({"draft": {"body": "\ud800"}}, "invalid_draft.body", "draft.body"),
        ({"options": ["a", "\ud800"]}, "invalid_options", "options[1]"),
    ],
    ids=["schema-title", "schema-enum", "draft-body", "options"],
)
def test_decode_text_json_a_surrogate_inside_a_schema_is_invalid_schema(
    body: dict[str, Any], reason: str, field: str
) -> None:
    """Every refusal of a form schema is ``invalid_schema`` (``field`` the path inside it): a
    client checking for it missed ``invalid_schema.properties.n.title``."""
    from gate.protocol.envelope import decode_text_json
    from gate.protocol.errors import ProtocolError

    with pytest.raises(ProtocolError) as refused:
        decode_text_json(json.dumps(body).encode())
    assert (refused.value.code, refused.value.extra["field"]) == (reason, field)


def test_decode_json_an_integer_of_too_many_digits_is_refused_in_our_words() -> None:
    """Python's own message ("Exceeds the limit (4300 digits) for integer string conversion
    ... use sys.set_int_max_str_digits()") reached the sender."""
    from gate.protocol.envelope import decode_json
    from gate.protocol.errors import ProtocolError

    with pytest.raises(ProtocolError) as refused:
        decode_json(b'{"spend": ' + b"9" * 5001 + b"}")
    assert refused.value.code == "invalid_json"
    assert refused.value.message == "body is not valid JSON: a number has more than 4300 digits"


# Bodies the raw-bytes test must not let through: every way a lone surrogate or U+0000 can be
# written in JSON (an escape, either case, in a key or a value, deep or at the top), and
# bodies that only look like one (an escaped backslash before "u0000", a paired surrogate).
_TRICKY = [
    b'{"body": "a\\u0000b"}',
    b'{"body": "\\ud800"}',
    b'{"body": "\\uDBFF"}',
    b'{"body": "\\uDc00 tail"}',
    b'{"k\\u0000": 1}',
    b'{"a": [{"b": ["x", "\\udfff"]}]}',
    b'"\\u0000"',
    b'["\\ud83d"]',
    b'{"body": "\\\\u0000 is six characters"}',
    b'{"body": "\\ud83d\\ude00 a pair is one character"}',
    b'{"body": "\\u00e9\\u2028 other escapes"}',
    b'{"body": "no escape at all"}',
    b'{"n": 1, "t": true, "z": null}',
]


@pytest.mark.parametrize("raw", _TRICKY)
def test_decode_text_json_refuses_exactly_what_the_full_check_refuses(raw: bytes) -> None:
    """``decode_text_json`` walks the decoded value only when the raw body holds an escape
    that can make a lone surrogate or U+0000 (they reach decoded JSON no other way): its
    answer is ``decode_json`` + ``check_unicode``'s, body for body."""
    from gate.errors import GateError
    from gate.protocol.envelope import check_unicode, decode_json, decode_text_json

    def answer(read: Any) -> str | None:
        try:
            read()
        except GateError as exc:
            return f"{exc.code}: {exc.message}"
        return None

    full = answer(lambda: check_unicode(decode_json(raw)))
    assert answer(lambda: decode_text_json(raw)) == full
    if raw in (_TRICKY[0], _TRICKY[1], _TRICKY[4]):
        assert full is not None  # the table holds refusals, not only passes
