"""The credentials channel's pure layer (``gate.protocol.credentials``).

conformance/vectors/credentials.json is re-derived here with hashlib/hmac/json alone, then
the gate's builders, parsers and the relay-side verifier are checked against it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from gate.protocol import signing
from gate.protocol.credentials import (
    CredentialsAnswer,
    RelyingParty,
    ServedCredential,
    build_credentials_answer,
    build_credentials_request,
    parse_credentials_answer,
    parse_credentials_request,
    verify_credentials_answer,
)
from gate.protocol.errors import ProtocolError

VECTORS = Path(__file__).resolve().parent.parent / "conformance" / "vectors"
DATA = json.loads((VECTORS / "credentials.json").read_text(encoding="utf-8"))
CASES = {case["id"]: case for case in DATA["cases"]}


def of_kind(kind: str) -> list[Any]:
    return [pytest.param(c, id=c["id"]) for c in DATA["cases"] if c["kind"] == kind]


def hmac_header(secret: str, t: int, body: bytes) -> str:
    msg = str(t).encode("ascii") + b"." + body
    return f"t={t},v1=" + hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------------- vectors


@pytest.mark.parametrize("case", of_kind("request") + of_kind("answer"))
def test_vector_header_is_the_hmac_of_the_body(case: dict[str, Any]) -> None:
    body = case["body_utf8"].encode("utf-8")
    assert hmac_header(case["secret"], case["t"], body) == case["header"]
    assert signing.sign(case["secret"], case["t"], body) == case["header"]


def test_vector_request_is_built_by_the_gate() -> None:
    case = CASES["request"]
    built = build_credentials_request(case["issued_at_s"])
    assert built == case["body_utf8"].encode("utf-8")
    assert built.decode() == canon(
        {"protocol": "hitl/v0", "type": "credentials_request", "issued_at": "2026-01-01T00:00:00Z"}
    )
    parse_credentials_request(built)


@pytest.mark.parametrize("case", of_kind("answer"))
def test_vector_answer_is_built_and_parsed(case: dict[str, Any]) -> None:
    inp = case["input"]
    built = build_credentials_answer(inp["webauthn"], inp["credentials"], case["issued_at_s"])
    assert built == case["body_utf8"].encode("utf-8")
    answer = verify_credentials_answer(
        built, case["header"], [case["secret"]], case["t"] + 299, 300
    )
    expected = sorted(inp["credentials"], key=lambda c: c["credential_id"])
    assert [c.credential_id for c in answer.credentials] == [c["credential_id"] for c in expected]
    assert answer.issued_at == "2026-01-01T00:00:00Z"
    if inp["webauthn"] is None:
        assert answer.webauthn is None
    else:
        assert answer.webauthn == RelyingParty(
            inp["webauthn"]["rp_id"], tuple(inp["webauthn"]["origins"])
        )


@pytest.mark.parametrize("case", of_kind("request_refused"))
def test_vector_request_refused_names_the_field(case: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_credentials_request(case["body_utf8"].encode("utf-8"))
    assert (info.value.status, info.value.kind) == (400, "invalid")
    assert info.value.extra["field"] == case["field"]


@pytest.mark.parametrize("case", of_kind("answer_refused"))
def test_vector_answer_refused_names_the_field(case: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_credentials_answer(case["body_utf8"].encode("utf-8"))
    assert (info.value.status, info.value.kind) == (400, "invalid")
    assert info.value.extra["field"] == case["field"]
    assert info.value.code == "invalid_" + case["field"].split(".")[0].split("[")[0]


# --------------------------------------------------------------------------- builders


def test_credentials_answer_leaves_out_revoked_and_extra_fields() -> None:
    answer = CASES["answer"]
    kept, revoked = (dict(c) for c in answer["input"]["credentials"])
    kept.update(created_at="2026-01-01T00:00:00Z", revoked_at=None, sign_count=3)
    revoked["revoked_at"] = "2026-01-01T00:00:00Z"
    raw = build_credentials_answer(answer["input"]["webauthn"], [revoked, kept], 1767225600)
    parsed = parse_credentials_answer(raw)
    assert [c.credential_id for c in parsed.credentials] == [kept["credential_id"]]
    assert set(json.loads(raw)["credentials"][0]) == {
        "credential_id",
        "operator_id",
        "identity",
        "type",
        "public_key",
        "label",
    }


def test_credentials_answer_parse_returns_typed_values() -> None:
    parsed = parse_credentials_answer(CASES["answer"]["body_utf8"].encode("utf-8"))
    assert isinstance(parsed, CredentialsAnswer)
    by_type = {c.type: c for c in parsed.credentials}
    assert by_type["ed25519"] == ServedCredential(
        credential_id=by_type["ed25519"].credential_id,
        operator_id=101,
        identity="alice@example.com",
        type="ed25519",
        public_key="11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo",
        label="Alice's laptop",
    )
    assert by_type["webauthn"].label is None


def test_credentials_request_ignores_unknown_fields() -> None:
    obj = json.loads(CASES["request"]["body_utf8"])
    obj["relay"] = "inbox"  # v0 is additive
    parse_credentials_request(canon(obj).encode())


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b'{"a":1,"a":2}', "\ufeff[]".encode(), b"\xff"],
    ids=["empty", "text", "duplicate_key", "bom_list", "not_utf8"],
)
def test_credentials_request_refuses_what_is_no_json_object(raw: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_credentials_request(raw)
    assert (info.value.status, info.value.code) == (400, "invalid_json")


def test_credentials_request_refuses_a_date_without_time() -> None:
    obj = json.loads(CASES["request"]["body_utf8"])
    obj["issued_at"] = "2026-01-01"
    with pytest.raises(ProtocolError) as info:
        parse_credentials_request(canon(obj).encode())
    assert info.value.extra["field"] == "issued_at"


# --------------------------------------------------------------------------- relay side


def verify(raw: bytes, header: str | None, now: int, secrets: list[str]) -> CredentialsAnswer:
    return verify_credentials_answer(raw, header, secrets, now, 300)


@pytest.mark.parametrize(
    ("header", "now", "secrets", "reason"),
    [
        (None, 1767225600, ["test-secret-new"], "signature_missing"),
        ("t=abc,v1=00", 1767225600, ["test-secret-new"], "signature_malformed"),
        (
            CASES["answer"]["header"],
            1767225600 + 301,
            ["test-secret-new"],
            "timestamp_out_of_window",
        ),
        (CASES["answer"]["header"], 1767225600, ["test-secret-old"], "signature_mismatch"),
    ],
    ids=["missing", "malformed", "window", "other_secret"],
)
def test_verify_credentials_answer_refuses_a_bad_signature(
    header: str | None, now: int, secrets: list[str], reason: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        verify(CASES["answer"]["body_utf8"].encode(), header, now, secrets)
    assert (info.value.status, info.value.code) == (401, reason)


def test_verify_credentials_answer_accepts_the_previous_secret_during_rotation() -> None:
    case = CASES["answer"]
    answer = verify(
        case["body_utf8"].encode(), case["header"], case["t"], ["x" * 16, case["secret"]]
    )
    assert len(answer.credentials) == 2


def test_verify_credentials_answer_refuses_one_changed_byte() -> None:
    case = CASES["answer"]
    raw = case["body_utf8"].replace("alice@", "mallory@").encode()
    with pytest.raises(ProtocolError) as info:
        verify(raw, case["header"], case["t"], [case["secret"]])
    assert info.value.code == "signature_mismatch"


def test_verify_credentials_answer_checks_the_signature_before_the_shape() -> None:
    raw = b"[]"
    with pytest.raises(ProtocolError) as info:
        verify(raw, hmac_header("s" * 16, 1767225600, raw), 1767225600, ["t" * 16])
    assert info.value.status == 401
    with pytest.raises(ProtocolError) as info:
        verify(raw, hmac_header("s" * 16, 1767225600, raw), 1767225600, ["s" * 16])
    assert (info.value.status, info.value.code) == (400, "invalid_json")
