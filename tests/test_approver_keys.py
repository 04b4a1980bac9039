"""Approver-signed decisions: Ed25519 approver keys owned by the gate,
enrolled through the admin API (``hitl-gate approvers``), and a step's
``approver_signature: off | optional | required`` enforced on the decision path.

Everything through a real daemon: the CLI over the admin API, real signed envelopes with
real Ed25519 signatures (``cryptography``), and the SQLite file read back.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gate.config import load_config, load_secrets
from gate.errors import ConfigError
from gate.protocol.approver_signature import b64url, batch_digest, decision_digest
from tests.support import (
    API_TOKEN,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    run_cli,
    shown_time,
    write_config,
)

ADMIN_TOKEN = "test-admin-token-5d0c8b2e7a4f9136c1"
ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"  # 101-103
STEPS = [
    {"name": "req", "approvers": [101, 102], "timeout": "1h", "approver_signature": "required"},
    {"name": "req2", "quorum": 2, "approvers": [101, 102], "approver_signature": "required"},
    {"name": "opt", "approvers": [101, 102], "timeout": "1h", "approver_signature": "optional"},
    {"name": "off", "approvers": [101, 102], "timeout": "1h"},
]
ENV = gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN)


@pytest.fixture
def signing_gate(tmp_path: Path, relay: Any) -> Any:
    config = write_config(
        tmp_path, relay.url, steps=STEPS, api={"admin_token_env": "HITL_ADMIN_TOKEN"}
    )
    proc = GateProcess(config, env=ENV).start()
    yield proc
    if proc.proc and proc.proc.poll() is None:
        proc.stop()


def cli(*args: str) -> Any:
    return run_cli(*args, env=ENV)


def approvers(gate: Any, command: str, *args: str) -> Any:
    """``hitl-gate approvers COMMAND -c CONFIG --api-url URL ARGS`` (the API binds port 0)."""
    return cli("approvers", command, "-c", str(gate.config), "--api-url", gate.api_url, *args)


def new_key(directory: Path, name: str) -> tuple[Ed25519PrivateKey, Path]:
    """A fresh Ed25519 key and its public half written as PEM."""
    key = Ed25519PrivateKey.generate()
    path = directory / f"{name}.pub"
    path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key, path


def enrol(gate: Any, operator_id: int, pub: Path, label: str | None = None) -> str:
    args = [str(operator_id), "--public-key", str(pub)] + (["--label", label] if label else [])
    proc = approvers(gate, "add-key", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode().strip()


def digest_of(dispatch: dict[str, Any], verb: str = "approve", **texts: Any) -> bytes:
    return decision_digest(
        approval_id=dispatch["approval_id"],
        revision=dispatch["revision"],
        nonce=dispatch["callback"]["nonce"],
        payload_hash=dispatch["payload_hash"],
        decision=verb,
        **texts,
    )


def assertion(key: Ed25519PrivateKey, credential_id: str, challenge: bytes) -> dict[str, Any]:
    return {
        "type": "ed25519",
        "credential_id": credential_id,
        "signature": b64url(key.sign(challenge)),
    }


def rows(db: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def db_of(gate: Any) -> Path:
    return gate.config.parent / "gate.db"


def refused(detail: str) -> dict[str, Any]:
    return {"status": "forbidden", "reason": "approver_signature_invalid", "detail": detail}


@pytest.mark.e2e
def test_enrol_list_revoke_through_the_admin_api(signing_gate: Any, tmp_path: Path) -> None:
    gate = signing_gate
    _, pub = new_key(tmp_path, "alice")
    credential_id = enrol(gate, 101, pub, "alice laptop")
    raw = serialization.load_pem_public_key(pub.read_bytes()).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert credential_id == b64url(hashlib.sha256(raw).digest()[:16])  # as the vectors
    again = approvers(gate, "add-key", "101", "--public-key", str(pub))
    assert again.returncode == 1 and b"enrolled already" in again.stderr

    listed = approvers(gate, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [item] = json.loads(listed.stdout)
    assert item["credential_id"] == credential_id
    assert (item["operator_id"], item["identity"], item["type"]) == (101, ALICE, "ed25519")
    assert (item["public_key"], item["label"], item["revoked_at"]) == (
        b64url(raw),
        "alice laptop",
        None,
    )
    text = approvers(gate, "list").stdout.decode()
    assert text.startswith(f"{credential_id}  101  {ALICE}  ed25519  active")

    # an unknown operator: 400 naming it; a key that is not Ed25519: one line, exit 2
    unknown = approvers(gate, "add-key", "4242", "--public-key", str(pub))
    assert unknown.returncode == 1 and b"4242" in unknown.stderr, unknown.stderr
    ec_pub = tmp_path / "ec.pub"
    ec_pub.write_bytes(
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    not_ed = approvers(gate, "add-key", "101", "--public-key", str(ec_pub))
    assert not_ed.returncode == 2 and not_ed.stderr.count(b"\n") == 1, not_ed.stderr
    assert b"not an Ed25519 public key" in not_ed.stderr

    done = approvers(gate, "revoke", "--", credential_id)
    assert done.returncode == 0, done.stderr
    twice = approvers(gate, "revoke", "--", credential_id)
    assert twice.returncode == 1 and b"revoked already" in twice.stderr
    [(revoked_at,)] = rows(db_of(gate), "SELECT revoked_at FROM approver_credentials")
    assert revoked_at is not None
    [item] = json.loads(approvers(gate, "list", "--json").stdout)
    text = approvers(gate, "list").stdout.decode()
    assert text == (
        f"{credential_id}  101  {ALICE}  ed25519  revoked {shown_time(item['revoked_at'])}"
        '  "alice laptop"\n'
    )

    entries = [
        (kind, json.loads(entry)["data"])
        for kind, entry in rows(
            db_of(gate), "SELECT kind, entry FROM audit_log WHERE kind LIKE 'approver_credential_%'"
        )
    ]
    assert entries == [
        (
            "approver_credential_enrolled",
            {
                "operator_id": 101,
                "credential_id": credential_id,
                "type": "ed25519",
                "public_key": b64url(raw),
                "label": "alice laptop",
            },
        ),
        ("approver_credential_revoked", {"operator_id": 101, "credential_id": credential_id}),
    ]
    verify = cli("audit", "verify", "-c", str(gate.config))
    assert verify.returncode == 0, verify.stderr + verify.stdout


@pytest.mark.e2e
def test_tokens_are_disjoint(signing_gate: Any) -> None:
    pipeline = signing_gate.api()
    status, answer = pipeline.call("GET", "/v1/admin/approvers")
    assert (status, answer["reason"]) == (401, "token_invalid")
    status, answer = pipeline.call("POST", "/v1/admin/approvers", {"operator_id": 101})
    assert (status, answer["reason"]) == (401, "token_invalid")
    admin = type(pipeline)(signing_gate.api_url, ADMIN_TOKEN)
    assert admin.call("GET", "/v1/admin/approvers") == (200, {"items": []})
    status, answer = admin.call("GET", "/v1/approvals?state=pending")
    assert (status, answer["reason"]) == (401, "token_invalid")
    status, answer = admin.call("POST", "/v1/approvals", {"pipeline": "p", "step": "off"})
    assert (status, answer["reason"]) == (401, "token_invalid")


@pytest.mark.e2e
def test_without_admin_token_env_no_admin_api(gate: Any) -> None:
    status, answer = gate.api().call("GET", "/v1/admin/approvers")
    assert (status, answer["reason"]) == (404, "not_found")
    proc = run_cli("approvers", "list", "-c", str(gate.config), "--api-url", gate.api_url)
    assert proc.returncode == 2
    assert proc.stderr.count(b"\n") == 1 and b"set api.admin_token_env" in proc.stderr


@pytest.mark.e2e
def test_required_step_needs_the_approvers_own_signature(
    signing_gate: Any, relay: Any, tmp_path: Path
) -> None:
    gate, api = signing_gate, signing_gate.api()
    alice, alice_pub = new_key(tmp_path, "alice")
    bob, bob_pub = new_key(tmp_path, "bob")
    alice_id, bob_id = enrol(gate, 101, alice_pub), enrol(gate, 102, bob_pub)

    first = api.create("req", "pay 1.250,00 EUR")["approval_id"]
    other = api.create("req", "pay 9.999,00 EUR")["approval_id"]
    dispatch, other_dispatch = relay.wait_dispatch(first), relay.wait_dispatch(other)
    assert dispatch["approver_signature"] == "required"  # the relay knows to sign
    before = api.get(first)

    # the relay secret alone no longer approves: the point of the issue
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, ALICE))
    assert (status, answer) == (
        403,
        {"status": "forbidden", "reason": "approver_signature_required"},
    )
    digest = digest_of(dispatch)
    for body, detail in (
        # bob's key on alice's decision
        ({"approver_assertion": assertion(bob, bob_id, digest)}, "wrong_operator"),
        # alice's signature over another approval's digest
        (
            {"approver_assertion": assertion(alice, alice_id, digest_of(other_dispatch))},
            "bad_signature",
        ),
        # a key nobody enrolled
        (
            {"approver_assertion": assertion(alice, b64url(b"\x01" * 16), digest)},
            "unknown_credential",
        ),
    ):
        status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, ALICE, **body))
        assert (status, answer) == (403, refused(detail)), detail
    assert api.get(first) == before  # a refused decision changes nothing

    signed = assertion(alice, alice_id, digest)
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(dispatch, ALICE, approver_assertion=signed)
    )
    assert status == 200, answer
    resolved = api.wait_resolved(first)
    assert resolved["outcome"] == "approved"
    assert [d["credential_id"] for d in resolved["decisions"]] == [alice_id]
    assert rows(
        db_of(gate), "SELECT credential_id FROM decisions WHERE approval_id = ?", (first,)
    ) == [(alice_id,)]
    [(entry,)] = rows(
        db_of(gate),
        "SELECT entry FROM audit_log WHERE kind = 'decision' AND approval_id = ?",
        (first,),
    )
    data = json.loads(entry)["data"]
    assert (data["credential_id"], data["assertion"]) == (alice_id, signed)

    # a revoked key signs nothing
    assert approvers(gate, "revoke", "--", alice_id).returncode == 0
    status, answer, _ = post_decision(
        gate.callback_url,
        decision_body(
            other_dispatch,
            ALICE,
            approver_assertion=assertion(alice, alice_id, digest_of(other_dispatch)),
        ),
    )
    assert (status, answer) == (403, refused("revoked"))
    verify = cli("audit", "verify", "-c", str(gate.config))
    assert verify.returncode == 0, verify.stderr + verify.stdout

    # the row says who signed; the log is the proof: a row edited to unsigned shows
    assert gate.stop() == 0
    conn = sqlite3.connect(db_of(gate))
    with conn:
        conn.execute("UPDATE decisions SET credential_id = NULL WHERE approval_id = ?", (first,))
    conn.close()
    verify = cli("audit", "verify", "-c", str(gate.config))
    assert verify.returncode == 1, verify.stderr + verify.stdout
    assert (
        b"decision 'approve' by operator 101 on revision 1 is in the decisions table but not"
        b" in the audit log"
    ) in verify.stdout


@pytest.mark.e2e
def test_batch_one_signature_for_two_approvals(
    signing_gate: Any, relay: Any, tmp_path: Path
) -> None:
    gate, api = signing_gate, signing_gate.api()
    bob, bob_pub = new_key(tmp_path, "bob")
    bob_id = enrol(gate, 102, bob_pub)
    ids = [api.create("req", f"invoice {n}")["approval_id"] for n in range(3)]
    dispatches = [relay.wait_dispatch(approval_id) for approval_id in ids]
    digests = [digest_of(d) for d in dispatches[:2]]
    batch = {
        **assertion(bob, bob_id, batch_digest(digests)),
        "batch": [d.hex() for d in reversed(digests)],
    }
    # the third item's digest is not in the list it carries
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(dispatches[2], BOB, approver_assertion=batch)
    )
    assert (status, answer) == (403, refused("not_in_batch"))
    for dispatch in dispatches[:2]:
        status, answer, _ = post_decision(
            gate.callback_url, decision_body(dispatch, BOB, approver_assertion=batch)
        )
        assert status == 200, answer
    for approval_id in ids[:2]:
        resolved = api.wait_resolved(approval_id)
        assert resolved["decisions"][0]["credential_id"] == bob_id
    assert api.get(ids[2])["state"] == "pending"


@pytest.mark.e2e
def test_optional_and_off_steps(signing_gate: Any, relay: Any, tmp_path: Path) -> None:
    gate, api = signing_gate, signing_gate.api()
    alice, alice_pub = new_key(tmp_path, "alice")
    alice_id = enrol(gate, 101, alice_pub)
    unsigned, bad, off = (api.create(step)["approval_id"] for step in ("opt", "opt", "off"))
    d_unsigned, d_bad, d_off = (relay.wait_dispatch(i) for i in (unsigned, bad, off))
    assert d_unsigned["approver_signature"] == "optional"
    assert "approver_signature" not in d_off  # an off step's dispatch is as before

    # optional: unsigned accepted (credential_id null), an invalid signature refused
    status, answer, _ = post_decision(gate.callback_url, decision_body(d_unsigned, ALICE))
    assert status == 200, answer
    assert api.wait_resolved(unsigned)["decisions"][0]["credential_id"] is None
    wrong = assertion(alice, alice_id, digest_of(d_bad, "skip"))  # signed a skip, sends approve
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(d_bad, ALICE, approver_assertion=wrong)
    )
    assert (status, answer) == (403, refused("bad_signature"))
    malformed = {"type": "ed25519", "credential_id": alice_id, "signature": "short"}
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(d_bad, ALICE, approver_assertion=malformed)
    )
    assert (status, answer["reason"]) == (400, "invalid_approver_assertion")

    # off: the field is ignored entirely, garbage included
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(d_off, ALICE, approver_assertion="garbage")
    )
    assert status == 200, answer
    resolved = api.wait_resolved(off)
    assert resolved["decisions"][0]["credential_id"] is None
    [(entry,)] = rows(
        db_of(gate),
        "SELECT entry FROM audit_log WHERE kind = 'decision' AND approval_id = ?",
        (off,),
    )
    assert "credential_id" not in json.loads(entry)["data"]


def test_admin_token_must_differ_from_the_pipeline_token(tmp_path: Path) -> None:
    config = load_config(
        write_config(tmp_path, "http://127.0.0.1:9/relay", api={"admin_token_env": "HITL_ADMIN"})
    )
    assert load_secrets(config, {**ENV, "HITL_ADMIN": ADMIN_TOKEN}).admin_token == ADMIN_TOKEN
    with pytest.raises(ConfigError) as caught:
        load_secrets(config, {**ENV, "HITL_ADMIN": API_TOKEN})
    assert caught.value.errors == [
        "api.admin_token_env: HITL_ADMIN has the same value as HITL_API_TOKEN (api.token_env);"
        " each secret must be distinct"
    ]


@pytest.mark.e2e
def test_a_delegate_signs_with_their_own_key(tmp_path: Path, relay: Any) -> None:
    config = write_config(
        tmp_path, relay.url, steps=STEPS, api={"admin_token_env": "HITL_ADMIN_TOKEN"}
    )
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["delegations"] = [{"from": 101, "to": 103, "until": "2999-01-01T00:00:00Z"}]
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    gate = GateProcess(config, env=ENV).start()
    try:
        alice, alice_pub = new_key(tmp_path, "alice")
        carol, carol_pub = new_key(tmp_path, "carol")
        alice_id, carol_id = enrol(gate, 101, alice_pub), enrol(gate, 103, carol_pub)
        approval_id = gate.api().create("req")["approval_id"]
        dispatch = relay.wait_dispatch(approval_id)
        reason = "  "  # recorded as none (only white space), signed exactly as sent
        digest = digest_of(dispatch, "skip", reason=reason)

        def skip(key: Ed25519PrivateKey, credential_id: str) -> tuple[int, Any]:
            body = decision_body(
                dispatch,
                CAROL,
                "skip",
                reason=reason,
                approver_assertion=assertion(key, credential_id, digest),
            )
            status, answer, _ = post_decision(gate.callback_url, body)
            return status, answer

        # the principal's key is not the delegate's: the one who decides signs
        assert skip(alice, alice_id) == (403, refused("wrong_operator"))
        status, answer = skip(carol, carol_id)
        assert status == 200, answer
        [decided] = gate.api().wait_resolved(approval_id)["decisions"]
        assert decided["operator_id"] == 103 and decided["on_behalf_of"]["operator_id"] == 101
        assert (decided["credential_id"], decided["reason"]) == (carol_id, None)
    finally:
        gate.stop()


@pytest.mark.e2e
def test_approver_signature_is_frozen_when_the_approval_is_created(
    signing_gate: Any, relay: Any, tmp_path: Path
) -> None:
    """A reload from ``required`` to ``off`` does not let the relay secret alone approve an
    approval created under ``required`` (it is frozen at creation, like the scope); the
    approvals created after the reload follow the new mode."""
    gate, api = signing_gate, signing_gate.api()
    before = api.create("req", "pay 1.250,00 EUR")["approval_id"]
    dispatch = relay.wait_dispatch(before)
    assert dispatch["approver_signature"] == "required"
    assert rows(
        db_of(gate), "SELECT approver_signature FROM approvals WHERE approval_id = ?", (before,)
    ) == [("required",)]

    relaxed = [dict(step, approver_signature="off") for step in STEPS]
    write_config(tmp_path, relay.url, steps=relaxed, api={"admin_token_env": "HITL_ADMIN_TOKEN"})
    assert gate.proc is not None
    gate.proc.send_signal(signal.SIGHUP)
    gate.wait_for_line(r"event=reloaded ")

    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, ALICE))
    assert (status, answer) == (
        403,
        {"status": "forbidden", "reason": "approver_signature_required"},
    )
    # an approval created after the reload is off: no mark, the relay secret decides
    assert "approver_signature" not in relay.wait_dispatch(
        after := api.create("req", "pay 2,00 EUR")["approval_id"]
    )
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(relay.wait_dispatch(after), ALICE)
    )
    assert status == 200, answer
