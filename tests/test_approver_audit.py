"""Proof that travels: ``audit verify`` (database and export) re-verifies every
approver signature the log holds, ``audit signatures`` lists them, the ``created`` entry says
a step is signed, and the permit names the credential of each counted approval.

A real daemon with a signing key and real Ed25519 approver keys for what the gate writes;
logs sealed by the test itself (as a tamperer holding the receipt key would) for what the
gate never writes: a decision signed by a revoked or never-enrolled key, a passkey whose
counter went backwards. Every verdict comes from the real ``hitl-gate`` CLI over a real
export file.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest

from gate.audit import chain as audit
from gate.audit.credential_entries import CredentialEnrolledData, CredentialRevokedData
from gate.audit.entries import CreatedData, DecisionData
from gate.audit.export import export_line
from gate.protocol.approver_signature import (
    ApproverAssertion,
    b64url,
    batch_digest,
    decision_digest,
)
from gate.protocol.canonical import canonical_json
from tests.support import (
    RECEIPT_KEY,
    GateProcess,
    decision_body,
    post_decision,
    write_config,
)
from tests.test_approver_keys import (
    ENV,
    STEPS,
    assertion,
    cli,
    digest_of,
    enrol,
    new_key,
)
from tests.test_approver_signature import SoftAuthenticator
from tests.test_signed_audit import sign_config

ALICE, BOB = "alice@example.com", "bob@example.com"


def export(gate: GateProcess, path: Path) -> list[str]:
    done = cli("audit", "export", "-c", str(gate.config), "-o", str(path))
    assert done.returncode == 0, done.stderr
    return path.read_text(encoding="utf-8").splitlines()


def rechain(lines: list[str], index: int, change: Callable[[dict[str, Any]], None]) -> list[str]:
    """Change the ``data`` of entry ``index`` and re-hash and re-receipt every entry from it
    on, as a tamperer holding the receipt key would (entry signatures are not redone)."""
    rows = [json.loads(line) for line in lines]
    entry = json.loads(rows[index]["entry"])
    change(entry["data"])
    rows[index]["entry"] = canonical_json(entry).decode("utf-8")
    prev = rows[index]["prev_hash"]
    for row in rows[index:]:
        row["prev_hash"] = prev
        row["entry_hash"] = prev = audit.chain_hash(prev, row["entry"].encode("utf-8"))
        row["receipt"] = audit.receipt(RECEIPT_KEY.encode(), prev)
        row["key_id"] = row["signature"] = None
    return [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in rows]


def verify_file(path: Path, *extra: str) -> tuple[int, str]:
    done = cli("audit", "verify", "--file", str(path), "--key-env", "HITL_RECEIPT_KEY", *extra)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


def signatures(*args: str) -> tuple[int, str, str]:
    done = cli("audit", "signatures", *args)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def verdicts(out: str) -> list[str]:
    """The first 3 characters of each row's ``verified`` column (under the header's)."""
    header, *rows = out.splitlines()
    return [row[header.index("verified") :][:3] for row in rows]


def index_of(lines: list[str], kind: str, approval_id: str | None = None) -> int:
    return next(
        i
        for i, line in enumerate(lines)
        if json.loads(line)["kind"] == kind
        and (approval_id is None or json.loads(line)["approval_id"] == approval_id)
    )


@pytest.mark.e2e
def test_signatures_travel_in_the_export(tmp_path: Path, relay: Any) -> None:
    config = write_config(
        tmp_path, relay.url, steps=STEPS, api={"admin_token_env": "HITL_ADMIN_TOKEN"}
    )
    public, _ = sign_config(config)
    gate = GateProcess(config, env=ENV).start()
    api = gate.api()
    alice, alice_pub = new_key(tmp_path, "alice")
    bob, bob_pub = new_key(tmp_path, "bob")
    alice_id, bob_id = enrol(gate, 101, alice_pub), enrol(gate, 102, bob_pub)

    signed = api.create("req", "pay 1.250,00 EUR")["approval_id"]
    adjusted = api.create("opt", "mail to the customer")["approval_id"]
    unsigned = api.create("off", "nothing to sign")["approval_id"]
    first, second, third = (relay.wait_dispatch(a) for a in (signed, adjusted, unsigned))
    status, answer, _ = post_decision(
        gate.callback_url,
        decision_body(
            first, ALICE, approver_assertion=assertion(alice, alice_id, digest_of(first))
        ),
    )
    assert status == 200, answer
    # an adjust with a blank reason: the text and the reason as sent are signed, the reason
    # is recorded as none, so the entry logs both hashes for an offline verifier
    texts = {"adjust_text": "mail to the customer, politely", "reason": "  "}
    signature = assertion(bob, bob_id, digest_of(second, "adjust", **texts))
    status, answer, _ = post_decision(
        gate.callback_url,
        decision_body(second, BOB, "adjust", approver_assertion=signature, **texts),
    )
    assert status == 200, answer
    status, answer, _ = post_decision(gate.callback_url, decision_body(third, ALICE))
    assert status == 200, answer
    approved = api.wait_resolved(signed)

    # the permit names the credential of each counted approval; unsigned items have none
    permit = jwt.decode(approved["permit"], options={"verify_signature": False})
    assert permit["approved_by"] == [
        {"operator_id": 101, "identity": ALICE, "credential_id": alice_id}
    ]
    plain = jwt.decode(api.wait_resolved(unsigned)["permit"], options={"verify_signature": False})
    assert plain["approved_by"] == [{"operator_id": 101, "identity": ALICE}]

    verify = cli("audit", "verify", "-c", str(config))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert b"ok: 2 approver signatures verified" in verify.stdout
    assert gate.stop() == 0

    lines = export(gate, tmp_path / "audit.jsonl")
    entries = [json.loads(json.loads(line)["entry"]) for line in lines]
    created = {e["approval_id"]: e["data"] for e in entries if e["kind"] == "created"}
    assert created[signed]["approver_signature"] == "required"
    assert created[adjusted]["approver_signature"] == "optional"
    assert "approver_signature" not in created[unsigned]  # an off step's entry is as before
    [adjust] = [
        e["data"] for e in entries if e["kind"] == "decision" and e["approval_id"] == adjusted
    ]
    assert "reason" not in adjust and len(adjust["reason_sha256"]) == 64
    assert len(adjust["adjust_text_sha256"]) == 64
    [plain_entry] = [
        e["data"] for e in entries if e["kind"] == "decision" and e["approval_id"] == unsigned
    ]
    assert not {"credential_id", "assertion", "reason_sha256"} & set(plain_entry)

    code, said = verify_file(tmp_path / "audit.jsonl", "--public-key", str(public))
    assert code == 0, said
    assert "ok: 2 approver signatures verified" in said

    code, out, err = signatures("--file", str(tmp_path / "audit.jsonl"), "--approval", signed)
    assert (code, err) == (0, ""), err
    row = [signed, "1", first["payload_hash"], "approve", "101", alice_id, "ed25519", "yes"]
    header = ["approval", "revision", "payload_hash", "decision", "operator", "credential"]
    header += ["type", "verified"]
    widths = [max(len(h), len(v)) for h, v in zip(header, row, strict=True)]
    assert out.splitlines() == [  # a header line, the columns aligned under it
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(),
    ]
    code, out, _ = signatures("--file", str(tmp_path / "audit.jsonl"), "--json")
    listed = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [(o["approval"], o["decision"], o["credential"], o["verified"]) for o in listed] == [
        (signed, "approve", alice_id, True),
        (adjusted, "adjust", bob_id, True),
    ]
    code, out, err = signatures("-c", str(config), "--approval", unsigned)
    assert (code, out, err) == (1, "", f"no signed decision for approval {unsigned} in this log\n")

    # a tampered signature, re-hashed and re-receipted: the chain holds, the signature not
    at = index_of(lines, "decision", signed)
    seq = json.loads(lines[at])["seq"]

    def flip(data: dict[str, Any]) -> None:
        sig = bytearray(_unb64(data["assertion"]["signature"]))
        sig[0] ^= 1
        data["assertion"]["signature"] = b64url(bytes(sig))

    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join(rechain(lines, at, flip)) + "\n", encoding="utf-8")
    code, said = verify_file(tampered)
    assert code == 1, said
    assert (
        f"TAMPERED: approver signature: entry {seq}: approval {signed}, operator 101, "
        f"credential {alice_id}: the approver's signature does not verify (bad_signature"
    ) in said
    code, out, _ = signatures("--file", str(tampered), "--approval", signed)
    assert code == 1 and out.rstrip().endswith("does not verify)"), out
    assert "  no: the approver's signature does not verify (bad_signature" in out
    # with the gate's public key the re-chained entry is caught by the chain first
    code, said = verify_file(tampered, "--public-key", str(public))
    assert code == 1 and f"TAMPERED: entry {seq}: " in said, said

    # the signature stripped from a required step's decision: unsigned is a finding too
    def strip(data: dict[str, Any]) -> None:
        del data["credential_id"], data["assertion"]

    stripped = tmp_path / "stripped.jsonl"
    stripped.write_text("\n".join(rechain(lines, at, strip)) + "\n", encoding="utf-8")
    code, said = verify_file(stripped)
    assert code == 1, said
    assert (
        f"TAMPERED: approver signature: entry {seq}: approval {signed}, operator 101, "
        "credential none: an unsigned decision on an approval whose step required"
    ) in said


# ------------------------------------------------- logs the gate would never write


class Log:
    """An audit log sealed entry by entry with the test receipt key, written as an export."""

    def __init__(self) -> None:
        self.rows: list[audit.AuditRow] = []

    def add(self, kind: str, approval_id: str | None, data: dict[str, Any]) -> int:
        seq = len(self.rows) + 1
        prev = self.rows[-1].entry_hash if self.rows else audit.GENESIS_HASH
        entry = audit.make_entry(seq, kind, approval_id, 1_700_000_000_000 + seq, data)
        text, entry_hash, receipt = audit.seal(prev, entry, RECEIPT_KEY.encode())
        self.rows.append(audit.AuditRow(seq, approval_id, kind, text, prev, entry_hash, receipt))
        return seq

    def write(self, path: Path) -> Path:
        path.write_text("".join(export_line(r) + "\n" for r in self.rows), encoding="utf-8")
        return path


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _wire(a: ApproverAssertion) -> dict[str, Any]:
    return {
        "type": a.type,
        "credential_id": b64url(a.credential_id),
        "authenticator_data": b64url(a.authenticator_data),
        "client_data_json": b64url(a.client_data_json),
        "signature": b64url(a.signature),
    }


def _decision(
    log: Log, approval_id: str, operator_id: int, credential_id: str, sign: Callable[[bytes], Any]
) -> int:
    nonce, payload_hash = "ab" * 16, "sha256:" + "cd" * 32
    digest = decision_digest(
        approval_id=approval_id,
        revision=1,
        nonce=nonce,
        payload_hash=payload_hash,
        decision="approve",
    )
    data = DecisionData(
        operator_id=operator_id,
        decision="approve",
        revision=1,
        payload_hash=payload_hash,
        nonce=nonce,
        effect="approve",
        credential_id=credential_id,
        assertion=sign(digest),
    )
    return log.add("decision", approval_id, data.to_data())


def _created(log: Log, approval_id: str) -> None:
    data = CreatedData(
        "p", "req", 1, "sha256:" + "cd" * 32, 1, [101, 102], 1, None, None, "required"
    )
    log.add("created", approval_id, data.to_data())


@pytest.mark.e2e
def test_offline_verify_finds_revoked_unknown_and_foreign_keys(tmp_path: Path) -> None:
    alice, _ = new_key(tmp_path, "alice")
    raw = alice.public_key().public_bytes_raw()
    alice_id, ghost_id = b64url(b"\x0a" * 16), b64url(b"\x0b" * 16)
    log = Log()
    log.add(
        "approver_credential_enrolled",
        None,
        CredentialEnrolledData(101, alice_id, "ed25519", b64url(raw)).to_data(),
    )
    ids = ["01JREVOKED00000000000000AA", "01JGHOST000000000000000000", "01JFOREIGN0000000000000000"]
    for approval_id in ids:
        _created(log, approval_id)
    _decision(
        log, "01JOK00000000000000000000A", 101, alice_id, lambda d: assertion(alice, alice_id, d)
    )
    foreign = _decision(log, ids[2], 102, alice_id, lambda d: assertion(alice, alice_id, d))
    revoked = log.add(
        "approver_credential_revoked", None, CredentialRevokedData(101, alice_id).to_data()
    )
    late = _decision(log, ids[0], 101, alice_id, lambda d: assertion(alice, alice_id, d))
    ghost = _decision(log, ids[1], 101, ghost_id, lambda d: assertion(alice, ghost_id, d))
    code, said = verify_file(log.write(tmp_path / "audit.jsonl"))
    assert code == 1, said
    findings = [line for line in said.splitlines() if line.startswith("TAMPERED")]
    assert findings == [
        f"TAMPERED: approver signature: entry {foreign}: approval {ids[2]}, operator 102, "
        f"credential {alice_id}: the credential belongs to operator 101, not to the operator "
        "who decided",
        f"TAMPERED: approver signature: entry {late}: approval {ids[0]}, operator 101, "
        f"credential {alice_id}: the credential was revoked by entry {revoked}, before this "
        "decision",
        f"TAMPERED: approver signature: entry {ghost}: approval {ids[1]}, operator 101, "
        f"credential {ghost_id}: no approver_credential_enrolled entry before it enrols this "
        "credential",
    ]
    code, out, _ = signatures("--file", str(tmp_path / "audit.jsonl"))
    assert code == 1
    assert verdicts(out) == ["yes", "no:", "no:", "no:"]


@pytest.mark.e2e
def test_offline_verify_of_passkey_assertions(tmp_path: Path) -> None:
    """A passkey's assertions re-verified against the rp_id its enrolment logged; counters
    must increase in log order; the client data's origin must be https (or localhost)."""
    auth = SoftAuthenticator()
    credential_id = b64url(auth.credential_id)
    enrolled = CredentialEnrolledData(101, credential_id, "webauthn", b64url(auth.cose_key))
    log = Log()
    log.add(
        "approver_credential_enrolled",
        None,
        {**enrolled.to_data(), "rp_id": auth.rp_id, "origin": auth.origin, "sign_count": 3},
    )
    seqs = {}
    cases: list[tuple[str, int, dict[str, Any]]] = [
        ("01JGOOD0000000000000000000", 4, {}),
        ("01JREPLAYCOUNTER0000000000", 4, {}),  # the same counter again: a clone
        ("01JHTTP0000000000000000000", 9, {"origin": "http://gate.example.com"}),
        ("01JRPID0000000000000000000", 10, {"rp_id": "evil.example.com"}),
        ("01JLATER000000000000000000", 11, {}),
    ]
    for approval_id, counter, bad in cases:
        seqs[approval_id] = _decision(
            log,
            approval_id,
            101,
            credential_id,
            lambda d, c=counter, b=bad: _wire(auth.sign(d, c, **b)),
        )
    code, said = verify_file(log.write(tmp_path / "audit.jsonl"))
    assert code == 1, said
    findings = [line for line in said.splitlines() if line.startswith("TAMPERED")]
    head = "TAMPERED: approver signature: entry {}: approval {}, operator 101, credential {}: "
    assert findings == [
        head.format(seqs[cases[1][0]], cases[1][0], credential_id)
        + "the approver's signature does not verify (counter_went_backwards: the "
        "authenticator's counter did not increase: a cloned authenticator?)",
        head.format(seqs[cases[2][0]], cases[2][0], credential_id)
        + "the approver's signature does not verify (origin_mismatch: client data origin "
        "'http://gate.example.com' is neither https nor http://localhost)",
        head.format(seqs[cases[3][0]], cases[3][0], credential_id)
        + "the approver's signature does not verify (rp_id_mismatch: the assertion is for "
        "another relying party)",
    ]
    code, out, _ = signatures("--file", str(tmp_path / "audit.jsonl"), "--approval", cases[4][0])
    assert code == 0 and out.rstrip().endswith("  webauthn  yes"), out


@pytest.mark.e2e
def test_offline_verify_accepts_a_batch_assertion_on_each_of_its_items_and_nothing_else(
    tmp_path: Path,
) -> None:
    """One batch assertion (one counter value) logged on each of its items
    verifies; a single assertion, or another batch's, at that counter is a regression."""
    auth = SoftAuthenticator()
    credential_id = b64url(auth.credential_id)
    enrolled = CredentialEnrolledData(101, credential_id, "webauthn", b64url(auth.cose_key))
    log = Log()
    log.add(
        "approver_credential_enrolled",
        None,
        {**enrolled.to_data(), "rp_id": auth.rp_id, "origin": auth.origin, "sign_count": 3},
    )
    batch_ids = [f"01JBATCH{n}00000000000000000" for n in range(3)]
    digests = {a: _approve_digest(a) for a in [*batch_ids, "01JCLONE000000000000000000"]}
    hexes = [digests[a].hex() for a in batch_ids]
    one = _wire(auth.sign(batch_digest([digests[a] for a in batch_ids]), 7)) | {"batch": hexes}
    for approval_id in batch_ids:
        _decision(log, approval_id, 101, credential_id, lambda _d: one)
    single = _decision(
        log, "01JSINGLE00000000000000000", 101, credential_id, lambda d: _wire(auth.sign(d, 7))
    )
    other = [digests[batch_ids[0]].hex(), digests["01JCLONE000000000000000000"].hex()]
    clone = _wire(auth.sign(batch_digest([bytes.fromhex(h) for h in other]), 7))
    cloned = _decision(
        log, "01JCLONE000000000000000000", 101, credential_id, lambda _d: clone | {"batch": other}
    )
    code, said = verify_file(log.write(tmp_path / "audit.jsonl"))
    assert code == 1, said
    findings = [line for line in said.splitlines() if line.startswith("TAMPERED")]
    head = "TAMPERED: approver signature: entry {}: approval {}, operator 101, credential {}: "
    regressed = (
        "the approver's signature does not verify (counter_went_backwards: the "
        "authenticator's counter did not increase: a cloned authenticator?)"
    )
    assert findings == [
        head.format(single, "01JSINGLE00000000000000000", credential_id) + regressed,
        head.format(cloned, "01JCLONE000000000000000000", credential_id) + regressed,
    ]
    code, out, _ = signatures("--file", str(tmp_path / "audit.jsonl"))
    said = verdicts(out)
    assert said == ["yes", "yes", "yes", "no:", "no:"], out


def _approve_digest(approval_id: str) -> bytes:
    return decision_digest(
        approval_id=approval_id,
        revision=1,
        nonce="ab" * 16,
        payload_hash="sha256:" + "cd" * 32,
        decision="approve",
    )
