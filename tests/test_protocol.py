"""Tests for gate.protocol (pure hitl/v0): the shared conformance vectors, then direct unit tests.

The vectors in ``conformance/vectors/*.json`` were computed with hashlib/hmac alone, not with
gate code; these tests assert that gate.protocol agrees with them (and re-derive the HMACs and
hashes independently, so an edited vector file fails here rather than misleading a relay author).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from gate.protocol import (
    DECISIONS_PATH,
    MAX_DECISION_BYTES,
    PROTOCOL,
    PROTOCOL_HEADER,
    SIGNATURE_HEADER,
    signing,
)
from gate.protocol.canonical import canonical_json, payload_hash, wire_json
from gate.protocol.envelope import (
    ACTIONS,
    Decision,
    build_decision,
    build_dispatch,
    decode_json,
    parse_decision,
)
from gate.protocol.errors import ProtocolError
from gate.protocol.times import rfc3339, rfc3339_ms

VECTORS = Path(__file__).resolve().parent.parent / "conformance" / "vectors"
NOW = 1767225600
DRAFT = "Café — naïve résumé 👍\n"
DRAFT_HASH = "sha256:c0b8d811c2edb85cfa2cdeee45b1e680c3ee5c286d28c69150649868aa07dfdc"
REENCODED_HASH = "sha256:97fe2d5aaf6ba5731999ef64fb912e726246917fb4af150dedfb9eb743487796"
VECTOR_FILES = (
    "signature.json",
    "payload_hash.json",
    "signature_header.json",
    "decision_parse.json",
    "question.json",
    "approver_signature.json",
)


def load_cases(name: str) -> list[Any]:
    """Return ``pytest.param`` per case of a vector file, with the case id as the test id."""
    data = json.loads((VECTORS / name).read_text(encoding="utf-8"))
    return [pytest.param(case, id=case["id"]) for case in data["cases"]]


def body_of(case: dict[str, Any]) -> bytes:
    """The raw bytes of a vector case: ``body_utf8`` encoded as UTF-8, or ``body_hex`` decoded."""
    if "body_hex" in case:
        assert "body_utf8" not in case
        return bytes.fromhex(case["body_hex"])
    return str(case["body_utf8"]).encode("utf-8")


def independent_header(secret: str, t: int, body: bytes) -> str:
    mac = hmac.new(secret.encode("utf-8"), str(t).encode("ascii") + b"." + body, hashlib.sha256)
    return f"t={t},v1={mac.hexdigest()}"


# --------------------------------------------------------------------------- the vector files


@pytest.mark.parametrize("name", VECTOR_FILES)
def test_vectors_file_well_formed(name: str) -> None:
    data = json.loads((VECTORS / name).read_text(encoding="utf-8"))

    assert set(data) == {"description", "cases"}
    assert data["description"].strip()
    ids = [case["id"] for case in data["cases"]]
    assert ids and all(isinstance(i, str) and i for i in ids)
    assert len(ids) == len(set(ids)), "case ids must be unique"


@pytest.mark.parametrize("case", load_cases("signature.json"))
def test_vector_signature(case: dict[str, Any]) -> None:
    body = body_of(case)

    assert independent_header(case["secret"], case["t"], body) == case["header"]
    assert signing.sign(case["secret"], case["t"], body) == case["header"]
    parsed = signing.verify(case["header"], body, [case["secret"]], now=case["t"], max_skew=300)
    assert parsed.t == case["t"]


def test_vector_signature_pretty_and_compact_differ() -> None:
    cases = {p.values[0]["id"]: p.values[0] for p in load_cases("signature.json")}
    pretty, compact = cases["decision_pretty"], cases["decision_compact"]

    assert json.loads(pretty["body_utf8"]) == json.loads(compact["body_utf8"])
    assert pretty["header"] != compact["header"]
    with pytest.raises(ProtocolError) as info:  # H01: the pretty signature on compact bytes
        signing.verify(pretty["header"], body_of(compact), ["test-secret-new"], NOW, 300)
    assert info.value.code == "signature_mismatch"


@pytest.mark.parametrize("case", load_cases("payload_hash.json"))
def test_vector_payload_hash(case: dict[str, Any]) -> None:
    expected = "sha256:" + hashlib.sha256(case["body"].encode("utf-8")).hexdigest()

    assert case["payload_hash"] == expected
    assert payload_hash(case["body"]) == case["payload_hash"]


def test_vector_payload_hash_draft_values() -> None:
    cases = {p.values[0]["id"]: p.values[0] for p in load_cases("payload_hash.json")}

    assert cases["draft_text"]["body"] == DRAFT
    assert cases["draft_text"]["payload_hash"] == DRAFT_HASH
    reencoded = cases["draft_reencoded_u_escapes"]
    assert reencoded["payload_hash"] == REENCODED_HASH
    assert reencoded["body"] == json.dumps(DRAFT)[1:-1]  # JSON string literal, quotes dropped
    assert reencoded["body"].isascii() and "\\u00e9" in reencoded["body"]


@pytest.mark.parametrize("case", load_cases("signature_header.json"))
def test_vector_signature_header(case: dict[str, Any]) -> None:
    body = body_of(case)
    args = (case["header"], body, case["secrets"], case["now"], case["max_skew"])

    if case["accepted"]:
        parsed = signing.verify(*args)
        assert parsed.v1 and all(len(v) == 64 for v in parsed.v1)
    else:
        with pytest.raises(ProtocolError) as info:
            signing.verify(*args)
        assert (info.value.code, info.value.status, info.value.kind) == (
            case["reason"],
            401,
            "unauthorized",
        )


@pytest.mark.parametrize("case", load_cases("decision_parse.json"))
def test_vector_decision_parse(case: dict[str, Any]) -> None:
    raw = body_of(case)

    if case["accepted"]:
        decision = parse_decision(raw)
        assert isinstance(decision, Decision)
        for field, value in case.get("expect", {}).items():
            assert getattr(decision, field) == value, field
    else:
        with pytest.raises(ProtocolError) as info:
            parse_decision(raw)
        assert (info.value.code, info.value.status, info.value.kind) == (
            case["reason"],
            400,
            "invalid",
        )
        assert info.value.body()["reason"] == case["reason"]


# --------------------------------------------------------------------------- signing


def test_signing_constants_are_wire_names() -> None:
    assert SIGNATURE_HEADER == "X-Draftcat-Signature"
    assert PROTOCOL_HEADER == "X-Hitl-Protocol"
    assert PROTOCOL == "hitl/v0"
    assert DECISIONS_PATH == "/hitl/v0/decisions"
    assert MAX_DECISION_BYTES == 64 * 1024


def test_signing_window_is_inclusive_and_symmetric() -> None:
    signing.check_window(NOW - 300, NOW, 300)
    signing.check_window(NOW + 300, NOW, 300)
    for t in (NOW - 301, NOW + 301):
        with pytest.raises(ProtocolError) as info:
            signing.check_window(t, NOW, 300)
        assert info.value.code == "timestamp_out_of_window"


def test_signing_window_uses_fractional_now() -> None:
    # the gate's clock has milliseconds: 300.001 s away is outside a 300 s window
    signing.check_window(NOW, NOW + 300.0, 300)
    with pytest.raises(ProtocolError):
        signing.check_window(NOW, NOW + 300.001, 300)


@pytest.mark.parametrize(
    "header",
    [
        "t=" + "9" * 21 + ",v1=" + "a" * 64,
        "t=1767225600,v1=" + "a" * 64 + ",x" * 3000,
        "=,=,=",
        ",,,,",
        "t==1767225600,v1=" + "a" * 64,
        "t=1767225600,v1=" + "a" * 65,
        "t=1767225600,v1=\x00",
        "t=١٧٦٧٢٢٥٦٠٠,v1=" + "a" * 64,
        "\u00a0",
    ],
    ids=[
        "t_21_digits",
        "too_long",
        "only_equals",
        "only_commas",
        "double_equals",
        "v1_65_hex",
        "v1_nul",
        "t_arabic_digits",
        "nbsp_only",
    ],
)
def test_signing_parse_malformed_never_leaks_valueerror(header: str) -> None:
    with pytest.raises(ProtocolError) as info:
        signing.parse(header)
    assert info.value.status == 401
    assert info.value.code in ("signature_malformed", "signature_missing")


def test_signing_parse_lowercases_v1_and_keeps_order() -> None:
    a, b = "A" * 64, "0123456789abcdef" * 4
    parsed = signing.parse(f" t = 5 , v1 = {a} , v1={b} ")

    assert (parsed.t, parsed.v1, parsed.t_text) == (5, ("a" * 64, b), "5")


def test_malformed_v1_is_ignored_when_another_v1_is_well_formed() -> None:
    """SPEC §2: "a signature matches if any v1 matches any configured secret". One v1 that
    was not 64 hex digits made the whole header signature_malformed:
    it is now skipped when a well-formed v1 is present, wherever it stands; with none well
    formed the header stays malformed."""
    body = b'{"x":1}'
    good = signing.compute("test-secret-new", NOW, body)
    for junk in ("zz", good[:-1], good + "0", "", "yQ77OMqc=", "\u0661" * 64):
        for header in (f"t={NOW},v1={junk},v1={good}", f"t={NOW},v1={good},v1={junk}"):
            parsed = signing.verify(header, body, ["test-secret-new"], NOW, 300)
            assert parsed.v1 == (good,), header
        with pytest.raises(ProtocolError) as info:
            signing.verify(f"t={NOW},v1={junk},v1={'0' * 64}", body, ["test-secret-new"], NOW, 300)
        assert info.value.code == "signature_mismatch"
        with pytest.raises(ProtocolError) as info:
            signing.parse(f"t={NOW},v1={junk},v1={junk}")
        assert info.value.code == "signature_malformed"


def test_signing_check_hmac_any_v1_any_secret() -> None:
    body = b'{"x":1}'
    old = signing.compute("test-secret-old", NOW, body)
    parsed = signing.SignatureHeader(t=NOW, v1=("0" * 64, old))

    signing.check_hmac(parsed, body, ["test-secret-new", "test-secret-old"])
    with pytest.raises(ProtocolError) as info:
        signing.check_hmac(parsed, body, ["test-secret-new"])
    assert info.value.code == "signature_mismatch"
    with pytest.raises(ProtocolError):
        signing.check_hmac(parsed, body, [])


# --------------------------------------------------------------------------- canonical / wire


def test_canonical_json_sorted_compact_utf8() -> None:
    value = {"b": 1, "a": {"d": [1, 2], "c": "é👍"}, "A": None}

    assert canonical_json(value) == '{"A":null,"a":{"c":"é👍","d":[1,2]},"b":1}'.encode()


def test_canonical_json_refuses_nan() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_wire_json_non_ascii_unescaped_compact_in_order() -> None:
    raw = wire_json({"z": DRAFT, "a": [1, {"k": "€"}]})

    assert raw == ('{"z":"Café — naïve résumé 👍\\n","a":[1,{"k":"€"}]}').encode()
    assert b"\\u" not in raw
    assert DRAFT.rstrip("\n").encode("utf-8") in raw
    assert json.loads(raw)["z"] == DRAFT


def test_wire_json_signed_bytes_roundtrip() -> None:
    # H02: serialize once, sign those bytes; a receiver recomputes over the same bytes
    raw = wire_json({"draft": {"body": DRAFT}, "payload_hash": payload_hash(DRAFT)})
    header = signing.sign("test-secret-new", NOW, raw)

    signing.verify(header, raw, ["test-secret-new"], NOW, 300)
    received = json.loads(raw.decode("utf-8"))
    assert received["draft"]["body"] == DRAFT
    assert payload_hash(received["draft"]["body"]) == DRAFT_HASH


# --------------------------------------------------------------------------- envelopes


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (1767225600000, "2026-01-01T00:00:00Z"),
        (1767225600001, "2026-01-01T00:00:00.001Z"),
        (1767225600010, "2026-01-01T00:00:00.01Z"),
        (1767225600100, "2026-01-01T00:00:00.1Z"),
        (1767225600250, "2026-01-01T00:00:00.25Z"),
        (1767225600999, "2026-01-01T00:00:00.999Z"),
        (1767229199000, "2026-01-01T00:59:59Z"),
        (1772323200000, "2026-03-01T00:00:00Z"),
    ],
    ids=["epoch", "now", "1ms", "10ms", "100ms", "250ms", "999ms", "59m59s", "march"],
)
def test_rfc3339_formats_utc_z(ms: int, text: str) -> None:
    assert rfc3339(ms) == text


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1796638816400, "2026-12-07T10:20:16.400Z"),
        (1796638816450, "2026-12-07T10:20:16.450Z"),
        (1796638816395, "2026-12-07T10:20:16.395Z"),
    ],
    ids=["epoch", "400ms", "450ms", "395ms"],
)
def test_rfc3339_ms_is_fixed_width(ms: int, text: str) -> None:
    assert rfc3339_ms(ms) == text


def dispatch_kwargs(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        approval_id="01KDWZ8B00J3Q9V5X7Z2M4N6PR",
        run_id="run-1",
        pipeline="p",
        step="q1",
        issued_at_ms=1767225600000,
        expires_at_ms=1767229200000,
        risk="high",
        quorum_required=2,
        quorum_collected=0,
        approvers=["alice@example.com", "bob@example.com"],
        payload_hash=DRAFT_HASH,
        content_type="text/plain",
        body=DRAFT,
        callback_url="https://gate.example.com/hitl/v0/decisions",
        nonce="6f1c2a9e0b7d4e3f8a5b1c0d2e4f6a7b",
        revision=1,
    )
    kwargs.update(overrides)
    return kwargs


def test_build_dispatch_fields() -> None:
    env = build_dispatch(**dispatch_kwargs())

    assert env == {
        "protocol": "hitl/v0",
        "approval_id": "01KDWZ8B00J3Q9V5X7Z2M4N6PR",
        "run_id": "run-1",
        "pipeline": "p",
        "step": "q1",
        "issued_at": "2026-01-01T00:00:00Z",
        "expires_at": "2026-01-01T01:00:00Z",
        "risk": "high",
        "quorum": {"required": 2, "collected": 0},
        "approvers": ["alice@example.com", "bob@example.com"],
        "payload_hash": DRAFT_HASH,
        "draft": {"content_type": "text/plain", "body": DRAFT},
        "actions": [{"verb": "approve"}, {"verb": "skip"}, {"verb": "adjust", "accepts": "text"}],
        "callback": {
            "url": "https://gate.example.com/hitl/v0/decisions",
            "nonce": "6f1c2a9e0b7d4e3f8a5b1c0d2e4f6a7b",
        },
        "revision": 1,
    }
    assert "budget" not in env


def test_build_dispatch_budget_only_when_given() -> None:
    budget = {"unit": "EUR", "spent_today": 1.5, "cap_today": 20.0}
    env = build_dispatch(**dispatch_kwargs(budget=budget))

    assert env["budget"] == budget


def test_build_dispatch_actions_not_shared_mutable() -> None:
    # a pure builder returns fresh values: a caller editing one envelope must not change
    # the module-level ACTIONS (and so every later dispatch). Checked without mutating.
    env = build_dispatch(**dispatch_kwargs())

    assert env["actions"] == ACTIONS
    assert env["actions"] is not ACTIONS
    assert all(mine is not shared for mine, shared in zip(env["actions"], ACTIONS, strict=True))


def test_build_decision_parses_back() -> None:
    body = build_decision(
        approval_id="a1",
        nonce="n1",
        decision="adjust",
        payload_hash=DRAFT_HASH,
        approver_id="alice@example.com",
        decided_at_ms=1767225600250,
        channel="cli",
        adjust_text="new\n",
    )

    decision = parse_decision(wire_json(body))
    assert decision == Decision(
        approval_id="a1",
        nonce="n1",
        decision="adjust",
        payload_hash=DRAFT_HASH,
        approver_id="alice@example.com",
        approver_display=None,
        approver_channel="cli",
        adjust_text="new\n",
        decided_at="2026-01-01T00:00:00.25Z",
    )


def test_parse_decision_drops_adjust_text_unless_adjust() -> None:
    body = build_decision(
        approval_id="a1",
        nonce="n1",
        decision="approve",
        payload_hash=DRAFT_HASH,
        approver_id="alice@example.com",
        decided_at_ms=0,
        adjust_text="ignored",
    )

    assert parse_decision(wire_json(body)).adjust_text is None


@pytest.mark.parametrize(
    "raw", [b"[" * 100_000, b'{"a":' * 50_000], ids=["deep_array", "deep_object"]
)
def test_decode_json_deep_nesting_is_invalid_json(raw: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_json(raw)
    assert info.value.code == "invalid_json"
    assert info.value.status == 400
