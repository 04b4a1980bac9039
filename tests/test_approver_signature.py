"""The pure protocol layer of approver signatures (not enforced yet).

conformance/vectors/approver_signature.json is re-derived here with hashlib/json alone, then
checked against gate.protocol; WebAuthn is exercised with a software authenticator written
below with ``cryptography`` (ES256 P-256 key, real authenticator data and client data JSON,
signature over authData || SHA-256(clientDataJSON)); only its COSE key is encoded with the
``webauthn`` package's CBOR helper.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from webauthn.helpers import encode_cbor

from gate.protocol.approver_signature import (
    ApproverAssertion,
    batch_digest,
    challenge_for,
    check_in_batch,
    decision_digest,
    parse_approver_assertion,
    verify_ed25519,
)
from gate.protocol.approver_webauthn import verify_webauthn
from gate.protocol.errors import ProtocolError

VECTORS = Path(__file__).resolve().parent.parent / "conformance" / "vectors"
DATA = json.loads((VECTORS / "approver_signature.json").read_text(encoding="utf-8"))
CASES = {case["id"]: case for case in DATA["cases"]}
RP_ID = "gate.example.com"
ORIGIN = "https://gate.example.com"
UP, UV = 0x01, 0x04


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def of_kind(kind: str) -> list[Any]:
    return [pytest.param(c, id=c["id"]) for c in DATA["cases"] if c["kind"] == kind]


def refused(info: pytest.ExceptionInfo[ProtocolError]) -> tuple[int, str, str, object]:
    err = info.value
    return err.status, err.kind, err.code, err.body().get("detail", err.body().get("field"))


# --------------------------------------------------------------------------- vectors


@pytest.mark.parametrize("case", of_kind("decision"))
def test_vector_decision_digest(case: dict[str, Any]) -> None:
    inp = case["input"]
    signed = {
        "protocol": "hitl/v0",
        **{k: inp[k] for k in inp if k not in ("adjust_text", "reason")},
    }
    for name in ("adjust_text", "reason"):
        if name in inp:
            signed[f"{name}_sha256"] = hashlib.sha256(inp[name].encode("utf-8")).hexdigest()
    canonical = json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    assert canonical == case["canonical_utf8"]
    assert hashlib.sha256(canonical.encode("utf-8")).hexdigest() == case["digest_hex"]
    assert decision_digest(**inp).hex() == case["digest_hex"]
    assert b64(bytes.fromhex(case["digest_hex"])) == case["challenge_b64url"]


@pytest.mark.parametrize("case", of_kind("batch"))
def test_vector_batch_digest(case: dict[str, Any]) -> None:
    canonical = json.dumps(sorted(case["digests"]), separators=(",", ":"))

    assert canonical == case["canonical_utf8"]
    assert hashlib.sha256(canonical.encode("ascii")).hexdigest() == case["batch_digest_hex"]
    assert (
        batch_digest([bytes.fromhex(h) for h in case["digests"]]).hex() == case["batch_digest_hex"]
    )


def test_vector_batch_reordered_is_the_same_digest() -> None:
    one, two = CASES["batch_of_three"], CASES["batch_of_three_reordered"]

    assert one["digests"] != two["digests"]
    assert one["batch_digest_hex"] == two["batch_digest_hex"]
    assert CASES["batch_of_one"]["batch_digest_hex"] != CASES["approve"]["digest_hex"]


@pytest.mark.parametrize("case", of_kind("ed25519"))
def test_vector_ed25519_signature(case: dict[str, Any]) -> None:
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(case["key"]["private_seed_hex"]))
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    challenge = bytes.fromhex(case["challenge_hex"])
    assertion = parse_approver_assertion(case["approver_assertion"])
    assert assertion is not None

    assert raw.hex() == case["key"]["public_raw_hex"]
    assert key.sign(challenge).hex() == case["signature_hex"]
    assert assertion.signature.hex() == case["signature_hex"]
    verify_ed25519(raw, assertion, challenge)
    verify_ed25519(case["key"]["public_pem"], assertion, challenge)


def test_vector_ed25519_batch_binds_each_listed_decision() -> None:
    case = CASES["ed25519_batch_of_three"]
    assertion = parse_approver_assertion(case["approver_assertion"])
    assert assertion is not None
    pem = case["key"]["public_pem"]

    for item in ("approve", "approve_item_2", "approve_item_3"):
        digest = decision_digest(**CASES[item]["input"])
        challenge = challenge_for(assertion, digest)
        assert challenge.hex() == case["challenge_hex"]
        verify_ed25519(pem, assertion, challenge)
    with pytest.raises(ProtocolError) as info:
        challenge_for(assertion, decision_digest(**CASES["skip_with_reason"]["input"]))
    assert refused(info) == (403, "forbidden", "approver_signature_invalid", "not_in_batch")


# --------------------------------------------------------------------------- the digest

BASE: dict[str, Any] = dict(CASES["approve"]["input"])


@pytest.mark.parametrize(
    "change",
    [
        {"approval_id": "01KDWZ8B00J3Q9V5X7Z2M4N6PZ"},
        {"revision": 2},
        {"nonce": "6f1c2a9e0b7d4e3f8a5b1c0d2e4f6a7c"},
        {"payload_hash": "sha256:" + "0" * 64},
        {"decision": "skip"},
        {"reason": ""},
        {"reason": "why"},
    ],
    ids=lambda c: "-".join(f"{k}={v!r}" for k, v in c.items()),
)
def test_decision_digest_binds_every_field(change: dict[str, Any]) -> None:
    assert decision_digest(**{**BASE, **change}) != decision_digest(**BASE)


def test_decision_digest_adjust_text_counts_only_for_adjust() -> None:
    assert decision_digest(**BASE, adjust_text="ignored on approve") == decision_digest(**BASE)
    adjust = {**BASE, "decision": "adjust"}
    assert decision_digest(**adjust, adjust_text="a") != decision_digest(**adjust, adjust_text="b")


@pytest.mark.parametrize(
    "bad",
    [{"decision": "timeout"}, {"revision": 0}, {"revision": True}, {"revision": "1"}],
    ids=["timeout", "revision_0", "revision_bool", "revision_str"],
)
def test_decision_digest_refuses_what_no_decision_is(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        decision_digest(**{**BASE, **bad})


@pytest.mark.parametrize(
    "digests", [[], [b"\x01" * 32, b"\x01" * 32], [b"\x01" * 31]], ids=["empty", "dup", "short"]
)
def test_batch_digest_refuses_bad_lists(digests: list[bytes]) -> None:
    with pytest.raises(ValueError):
        batch_digest(digests)


def test_check_in_batch_one_item_changed_is_not_in_the_batch() -> None:
    items = [decision_digest(**CASES[i]["input"]) for i in ("approve", "approve_item_2")]
    batch = [d.hex() for d in items]
    changed = decision_digest(**{**BASE, "payload_hash": "sha256:" + "1" * 64})

    check_in_batch(items[0], batch)
    with pytest.raises(ProtocolError) as info:
        check_in_batch(changed, batch)
    assert refused(info) == (403, "forbidden", "approver_signature_invalid", "not_in_batch")


# --------------------------------------------------------------------------- parsing

ED = {"type": "ed25519", "credential_id": "AAEC", "signature": b64(b"s" * 64)}
WA = {
    "type": "webauthn",
    "credential_id": "AAEC",
    "authenticator_data": b64(b"a" * 37),
    "client_data_json": b64(b"{}"),
    "signature": b64(b"s" * 70),
}


@pytest.mark.parametrize(
    ("obj", "field_name"),
    [
        ("x", "approver_assertion"),
        ([], "approver_assertion"),
        ({**ED, "type": "rsa"}, "approver_assertion.type"),
        ({k: v for k, v in ED.items() if k != "type"}, "approver_assertion.type"),
        ({**ED, "credential_id": ""}, "approver_assertion.credential_id"),
        ({**ED, "credential_id": 5}, "approver_assertion.credential_id"),
        ({**ED, "credential_id": "a+b/"}, "approver_assertion.credential_id"),
        ({**ED, "credential_id": b64(b"c" * 1024)}, "approver_assertion.credential_id"),
        ({**ED, "signature": b64(b"s" * 63)}, "approver_assertion.signature"),
        ({k: v for k, v in ED.items() if k != "signature"}, "approver_assertion.signature"),
        ({**ED, "batch": []}, "approver_assertion.batch"),
        ({**ED, "batch": "ab"}, "approver_assertion.batch"),
        ({**ED, "batch": ["AB" * 32]}, "approver_assertion.batch"),
        ({**ED, "batch": ["ab" * 32, "ab" * 32]}, "approver_assertion.batch"),
        ({**ED, "batch": [f"{i:064x}" for i in range(257)]}, "approver_assertion.batch"),
        ({**WA, "authenticator_data": b64(b"a" * 36)}, "approver_assertion.authenticator_data"),
        ({**WA, "authenticator_data": b64(b"a" * 1025)}, "approver_assertion.authenticator_data"),
        ({**WA, "client_data_json": None}, "approver_assertion.client_data_json"),
        ({**WA, "client_data_json": b64(b"c" * 4097)}, "approver_assertion.client_data_json"),
        ({**WA, "signature": b64(b"s" * 1025)}, "approver_assertion.signature"),
        ({**WA, "user_handle": b64(b"u" * 65)}, "approver_assertion.user_handle"),
        ({**WA, "user_handle": 7}, "approver_assertion.user_handle"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_parse_approver_assertion_names_the_bad_part(obj: object, field_name: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_approver_assertion(obj)

    assert refused(info) == (400, "invalid", "invalid_approver_assertion", field_name)


def test_parse_approver_assertion_absent_padding_and_unknown_keys() -> None:
    assert parse_approver_assertion(None) is None
    padded = parse_approver_assertion({**ED, "credential_id": "AAE=", "future": 1})
    plain = parse_approver_assertion({**WA, "user_handle": b64(b"u"), "batch": ["ab" * 32]})

    assert padded == ApproverAssertion("ed25519", b"\x00\x01", b"s" * 64)
    assert padded.credential_id_b64 == "AAE"
    assert plain is not None and plain.user_handle == b"u" and plain.batch == ("ab" * 32,)
    assert plain.authenticator_data == b"a" * 37


# --------------------------------------------------------------------------- Ed25519


def ed25519_assertion(key: Ed25519PrivateKey, challenge: bytes) -> ApproverAssertion:
    out = parse_approver_assertion({**ED, "signature": b64(key.sign(challenge))})
    assert out is not None
    return out


def test_verify_ed25519_refusals() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    digest = decision_digest(**BASE)
    cases = {
        "other_key": (ed25519_assertion(other, digest), digest, "bad_signature"),
        "other_digest": (ed25519_assertion(key, digest), bytes(32), "bad_signature"),
        "webauthn": (parse_approver_assertion(WA), digest, "wrong_type"),
    }

    verify_ed25519(public, ed25519_assertion(key, digest), digest)
    for name, (assertion, challenge, detail) in cases.items():
        assert assertion is not None
        with pytest.raises(ProtocolError) as info:
            verify_ed25519(public, assertion, challenge)
        assert refused(info) == (403, "forbidden", "approver_signature_invalid", detail), name
    with pytest.raises(ValueError):
        verify_ed25519(b"short", ed25519_assertion(key, digest), digest)


# --------------------------------------------------------------------------- WebAuthn


@dataclass
class SoftAuthenticator:
    """A passkey in software: ES256 on P-256, the assertion a browser would return."""

    rp_id: str = RP_ID
    origin: str = ORIGIN
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    credential_id: bytes = field(default_factory=lambda: os.urandom(16))

    @property
    def cose_key(self) -> bytes:
        numbers = self.key.public_key().public_numbers()
        x, y = numbers.x.to_bytes(32, "big"), numbers.y.to_bytes(32, "big")
        return encode_cbor({1: 2, 3: -7, -1: 1, -2: x, -3: y})

    def sign(
        self,
        challenge: bytes,
        counter: int,
        *,
        flags: int = UP | UV,
        rp_id: str | None = None,
        origin: str | None = None,
        type_: str = "webauthn.get",
        signer: ec.EllipticCurvePrivateKey | None = None,
        batch: list[str] | None = None,
    ) -> ApproverAssertion:
        auth_data = (
            hashlib.sha256((rp_id or self.rp_id).encode("utf-8")).digest()
            + bytes([flags])
            + counter.to_bytes(4, "big")
        )
        client = json.dumps(
            {"type": type_, "challenge": b64(challenge), "origin": origin or self.origin},
            separators=(",", ":"),
        ).encode("utf-8")
        signed = auth_data + hashlib.sha256(client).digest()
        signature = (signer or self.key).sign(signed, ec.ECDSA(hashes.SHA256()))
        wire: dict[str, Any] = {
            "type": "webauthn",
            "credential_id": b64(self.credential_id),
            "authenticator_data": b64(auth_data),
            "client_data_json": b64(client),
            "signature": b64(signature),
        }
        if batch is not None:
            wire["batch"] = batch
        parsed = parse_approver_assertion(json.loads(json.dumps(wire)))
        assert parsed is not None
        return parsed


DIGEST = decision_digest(**BASE)


def check(auth: SoftAuthenticator, assertion: ApproverAssertion, stored: int = 0) -> int:
    return verify_webauthn(auth.cose_key, stored, assertion, DIGEST, RP_ID, [ORIGIN])


def test_verify_webauthn_accepts_and_returns_the_new_counter() -> None:
    auth = SoftAuthenticator()

    assert check(auth, auth.sign(DIGEST, 8), stored=7) == 8
    assert check(auth, auth.sign(DIGEST, 0), stored=0) == 0  # a counter-less passkey
    other_origin = auth.sign(DIGEST, 1, origin="https://relay.example.com")
    assert (
        verify_webauthn(
            auth.cose_key, 0, other_origin, DIGEST, RP_ID, [ORIGIN, "https://relay.example.com"]
        )
        == 1
    )


REFUSALS: dict[str, tuple[dict[str, Any], int, str]] = {
    "client_data_type_create": ({"type_": "webauthn.create"}, 0, "wrong_type"),
    "other_challenge": ({"challenge": bytes(32)}, 0, "challenge_mismatch"),
    "other_origin": ({"origin": "https://evil.example"}, 0, "origin_mismatch"),
    "other_rp_id": ({"rp_id": "evil.example"}, 0, "rp_id_mismatch"),
    "no_user_present": ({"flags": UV}, 0, "user_not_present"),
    "no_user_verified": ({"flags": UP}, 0, "user_not_verified"),
    "other_key": ({"signer": ec.generate_private_key(ec.SECP256R1())}, 0, "bad_signature"),
    "counter_equal": ({"counter": 5}, 5, "counter_went_backwards"),
    "counter_lower": ({"counter": 4}, 5, "counter_went_backwards"),
    "counter_zero_after_nonzero": ({"counter": 0}, 5, "counter_went_backwards"),
    "forged_low_counter": (
        {"counter": 1, "signer": ec.generate_private_key(ec.SECP256R1())},
        5,
        "bad_signature",
    ),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_verify_webauthn_refusals(name: str) -> None:
    changes, stored, detail = REFUSALS[name]
    auth = SoftAuthenticator()
    changes = dict(changes)
    challenge = changes.pop("challenge", DIGEST)
    counter = changes.pop("counter", stored + 1)

    with pytest.raises(ProtocolError) as info:
        check(auth, auth.sign(challenge, counter, **changes), stored=stored)

    assert refused(info) == (403, "forbidden", "approver_signature_invalid", detail)


def test_verify_webauthn_tampered_parts_and_wrong_type() -> None:
    auth = SoftAuthenticator()
    good = auth.sign(DIGEST, 1)
    flipped = (
        bytes([good.signature[0], good.signature[1]])
        + bytes([good.signature[2] ^ 1])
        + good.signature[3:]
    )
    tampered = {
        "signature": (
            ApproverAssertion(**{**_fields(good), "signature": flipped}),
            "bad_signature",
        ),
        "client_data": (
            ApproverAssertion(**{**_fields(good), "client_data_json": b"not json"}),
            "malformed",
        ),
        "ed25519": (parse_approver_assertion(ED), "wrong_type"),
    }

    for name, (assertion, detail) in tampered.items():
        assert assertion is not None
        with pytest.raises(ProtocolError) as info:
            check(auth, assertion)
        assert refused(info)[3] == detail, name
    with pytest.raises(ValueError):
        verify_webauthn(b"\xa0", 0, good, DIGEST, RP_ID, [ORIGIN])


def _fields(a: ApproverAssertion) -> dict[str, Any]:
    return {name: getattr(a, name) for name in ApproverAssertion.__slots__}


def test_verify_webauthn_batch_signed_once_binds_each_item() -> None:
    auth = SoftAuthenticator()
    items = [decision_digest(**CASES[i]["input"]) for i in ("approve", "approve_item_2")]
    listed = [items[1].hex(), items[0].hex()]  # any order: the batch digest sorts
    assertion = auth.sign(batch_digest(items), 3, batch=listed)

    for digest in items:
        challenge = challenge_for(assertion, digest)
        assert verify_webauthn(auth.cose_key, 2, assertion, challenge, RP_ID, [ORIGIN]) == 3
    # the relay swapped one item for another draft: its digest is not in what was signed
    changed = decision_digest(**{**BASE, "payload_hash": "sha256:" + "2" * 64})
    with pytest.raises(ProtocolError) as info:
        challenge_for(assertion, changed)
    assert refused(info)[3] == "not_in_batch"
    # a list edited after signing no longer hashes to the signed challenge
    edited = ApproverAssertion(**{**_fields(assertion), "batch": (listed[0], changed.hex())})
    with pytest.raises(ProtocolError) as info:
        verify_webauthn(auth.cose_key, 2, edited, challenge_for(edited, changed), RP_ID, [ORIGIN])
    assert refused(info)[3] == "challenge_mismatch"
