"""Administering approver keys: secrets that must differ, credential ids in one spelling,
the CLI with a PEM it did not write, revoked keys named as such, refusals and admin actions
in the daemon's log, and check-config naming a signing step nobody can enrol a key for."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gate.config import load_config, load_secrets
from gate.errors import ConfigError
from gate.protocol.approver_signature import b64url, parse_approver_assertion
from gate.protocol.errors import ProtocolError
from tests.support import (
    RECEIPT_KEY,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    run_cli,
    write_config,
)

ADMIN_TOKEN = "test-admin-token-5d0c8b2e7a4f9136c1"
ENV = gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN)
STEPS = [
    {"name": "req", "approvers": [101, 102], "timeout": "1h", "approver_signature": "required"}
]


def test_admin_token_must_differ_from_the_receipt_key(tmp_path: Path) -> None:
    """Auditors hold the receipt key: equal to the admin token, it would let them enrol a key
    for anyone and approve as them."""
    config = load_config(
        write_config(tmp_path, "http://127.0.0.1:9/relay", api={"admin_token_env": "HITL_ADMIN"})
    )
    with pytest.raises(ConfigError) as caught:
        load_secrets(config, {**ENV, "HITL_ADMIN": RECEIPT_KEY})
    assert caught.value.errors == [
        "receipts.key_env: HITL_RECEIPT_KEY has the same value as HITL_ADMIN"
        " (api.admin_token_env); each secret must be distinct"
    ]


def test_a_credential_id_has_one_spelling() -> None:
    """Padding stays optional (protocol.md), but other trailing bits of the same bytes are
    refused, so the id logged is the id enrolled."""
    raw = bytes(range(16))
    canonical = b64url(raw)  # 22 characters, the last one carries 4 unused bits
    signature = b64url(b"\x00" * 64)
    assert (
        parse_approver_assertion(
            {"type": "ed25519", "credential_id": canonical + "==", "signature": signature}
        ).credential_id
        == raw
    )
    other = canonical[:-1] + chr(ord(canonical[-1]) + 1)
    assert base64.urlsafe_b64decode(other + "==") == raw  # the same bytes, another spelling
    with pytest.raises(ProtocolError) as caught:
        parse_approver_assertion(
            {"type": "ed25519", "credential_id": other, "signature": signature}
        )
    assert (caught.value.code, caught.value.extra["field"]) == (
        "invalid_approver_assertion",
        "approver_assertion.credential_id",
    )


def _key_with_comment(path: Path) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    path.write_bytes("# clé d'Alice\n".encode() + pem)
    return key


@pytest.mark.e2e
def test_the_approvers_cli_and_the_log(tmp_path: Path, relay: Any) -> None:
    config = write_config(
        tmp_path, relay.url, steps=STEPS, api={"admin_token_env": "HITL_ADMIN_TOKEN"}
    )
    gate = GateProcess(config, env=ENV).start()
    try:

        def approvers(*args: str) -> Any:
            return run_cli(
                "approvers",
                args[0],
                "-c",
                str(config),
                "--api-url",
                gate.api_url,
                *args[1:],
                env=ENV,
            )

        # a PEM with a non-ASCII comment line is read, not a traceback
        _key_with_comment(tmp_path / "alice.pub")
        added = approvers("add-key", "101", "--public-key", str(tmp_path / "alice.pub"))
        assert added.returncode == 0, added.stderr
        credential_id = added.stdout.decode().strip()
        # enrolment and revocation are in the daemon's log (ids only)
        gate.wait_for_line(rf"event=approver_credential_enrolled .*credential_id={credential_id}")

        # a credential id is one path segment: this one is unknown, not another route
        odd = approvers("revoke", "../../approvals/X/cancel")
        assert odd.returncode == 1, odd.stderr
        assert b"unknown_credential" in odd.stderr or b"no approver credential" in odd.stderr

        assert approvers("revoke", "--", credential_id).returncode == 0
        gate.wait_for_line(rf"event=approver_credential_revoked .*credential_id={credential_id}")
        # enrolling a revoked key again says it is revoked
        again = approvers("add-key", "101", "--public-key", str(tmp_path / "alice.pub"))
        assert again.returncode == 1
        assert b"revoked" in again.stderr, again.stderr
        assert b"Traceback" not in again.stderr + added.stderr

        # a refusal's detail is in the log line
        approval_id = gate.api().create("req")["approval_id"]
        dispatch = relay.wait_dispatch(approval_id)
        forged = {
            "type": "ed25519",
            "credential_id": credential_id,
            "signature": b64url(b"\x01" * 64),
        }
        status, answer, _ = post_decision(
            gate.callback_url,
            decision_body(dispatch, "alice@example.com", approver_assertion=forged),
        )
        assert (status, answer.get("detail")) == (403, "revoked")
        gate.wait_for_line(
            r"event=decision_refused .*reason=approver_signature_invalid .*detail=revoked"
        )
    finally:
        gate.stop()


@pytest.mark.e2e
def test_check_config_warns_of_a_signing_step_without_the_admin_api(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/relay", steps=STEPS)
    checked = run_cli("check-config", "-c", str(config), env=ENV)
    assert checked.returncode == 0, checked.stderr
    assert (
        b"pipelines[0].steps[0].approver_signature: required, but api.admin_token_env is not"
        b" set: no approver credential can be enrolled" in checked.stderr
    ), checked.stderr


@pytest.mark.e2e
def test_a_credential_id_that_begins_with_a_dash_is_revoked(tmp_path: Path, relay: Any) -> None:
    """Base64url ids may begin with ``-`` (1 in 64 keys; CI met ``-ghEk…`` as "No such
    option '-g'"): click reads such an id as options, so the usage error says to put it
    after ``--``, which works."""
    from gate.protocol.approver_signature import ed25519_credential_id

    keys = []
    while len(keys) < 2:
        key = Ed25519PrivateKey.generate()
        raw = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        credential_id = ed25519_credential_id(raw)
        if credential_id.startswith("-"):
            keys.append(key)
    config = write_config(
        tmp_path, relay.url, steps=STEPS, api={"admin_token_env": "HITL_ADMIN_TOKEN"}
    )
    gate = GateProcess(config, env=ENV).start()
    try:
        base = ("-c", str(config), "--api-url", gate.api_url)
        ids = []
        for n, key in enumerate(keys):
            pub = tmp_path / f"k{n}.pub"
            pub.write_bytes(
                key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
            added = run_cli(
                "approvers", "add-key", *base, str(101 + n), "--public-key", str(pub), env=ENV
            )
            assert added.returncode == 0, added.stderr
            ids.append(added.stdout.decode().strip())
        plain = run_cli("approvers", "revoke", *base, ids[0], env=ENV)
        assert plain.returncode == 2, plain.stderr  # read as options: a usage error ...
        assert b"goes after '--'" in plain.stderr, plain.stderr  # ... that says what to do
        for credential_id in ids:
            dashed = run_cli("approvers", "revoke", *base, "--", credential_id, env=ENV)
            assert dashed.returncode == 0, dashed.stderr
        listed = run_cli("approvers", "list", *base, "--json", env=ENV)
        assert all(item["revoked_at"] for item in json.loads(listed.stdout))
    finally:
        gate.stop()
