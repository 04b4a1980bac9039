"""Relays that sign: the reference relay's ``--approver-key`` signs every
decision it posts with the approver's Ed25519 key, and the gate verifies it on a step whose
``approver_signature`` is ``required``.

Real processes throughout: ``hitl-gate keygen`` writes the key, ``python -m gate relay``
signs, ``python -m gate serve`` verifies, ``hitl-gate approvers add-key`` enrols over the
admin API; the SQLite file is read back.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from gate.protocol.approver_signature import (
    ed25519_credential_id,
    parse_approver_assertion,
    verify_ed25519,
)
from gate.tools.reference_relay.approver_key import ApproverKey
from tests.support import ROOT, CliProcess, GateProcess, gate_env, run_cli, write_config

VECTORS = json.loads(
    (ROOT / "conformance" / "vectors" / "approver_signature.json").read_text(encoding="utf-8")
)["cases"]
ADMIN_TOKEN = "test-admin-token-6e1f9a3b8c2d7f40e5"
ENV = gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN)
ALICE = "alice@example.com"  # operator 101
STEPS = [
    {"name": "req", "approvers": [101], "timeout": "1h", "approver_signature": "required"},
]
CREDENTIAL_LINE = r"approver key: credential (\S+) \(enrol its public key"


@pytest.fixture
def processes() -> Iterator[Callable[..., Any]]:
    """Start ``CliProcess``/``GateProcess`` objects and stop every one at the end."""
    started: list[Any] = []

    def start(proc: Any) -> Any:
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        if proc.proc is not None and proc.proc.poll() is None:
            proc.stop()


def keygen(directory: Path) -> tuple[Path, Path]:
    """``hitl-gate keygen --out DIR``: the approver's private and public key files."""
    done = run_cli("keygen", "--out", str(directory), env=ENV)
    assert done.returncode == 0, done.stderr
    return directory / "hitl-gate-ed25519.key", directory / "hitl-gate-ed25519.pub"


def start_relay(start: Callable[..., Any], auto: str, *extra: str) -> tuple[CliProcess, str]:
    relay = start(
        CliProcess(
            "relay",
            "--listen",
            "127.0.0.1:0",
            "--secret-env",
            "HITL_RELAY_SECRET",
            "--auto",
            auto,
            "--as",
            ALICE,
            *extra,
            env=ENV,
        )
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    return relay, url


def start_gate(start: Callable[..., Any], tmp_path: Path, relay_url: str) -> GateProcess:
    config = write_config(
        tmp_path, relay_url, steps=STEPS, api={"admin_token_env": "HITL_ADMIN_TOKEN"}
    )
    gate: GateProcess = start(GateProcess(config, env=ENV)).start()
    return gate


def enrol(gate: GateProcess, public_key: Path) -> str:
    done = run_cli(
        "approvers",
        "add-key",
        "-c",
        str(gate.config),
        "--api-url",
        gate.api_url,
        "101",
        "--public-key",
        str(public_key),
        env=ENV,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().strip()


def decisions(gate: GateProcess, approval_id: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{gate.config.parent / 'gate.db'}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT decision, reason, credential_id FROM decisions WHERE approval_id = ?",
            (approval_id,),
        ).fetchall()
    finally:
        conn.close()


def vector_key(tmp_path: Path) -> tuple[ApproverKey, dict[str, Any]]:
    """The vectors' Ed25519 key (RFC 8032 TEST 1) as a private key PEM file, loaded."""
    [case] = [c for c in VECTORS if c["id"] == "ed25519_approve"]
    private = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(case["key"]["private_seed_hex"]))
    path = tmp_path / "approver.key"
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ApproverKey.load(path), case


def dispatch_of(case: dict[str, Any]) -> dict[str, Any]:
    """A dispatch with the decision case's fields where a relay reads them."""
    given = case["input"]
    return {
        "approval_id": given["approval_id"],
        "revision": given["revision"],
        "payload_hash": given["payload_hash"],
        "callback": {"nonce": given["nonce"]},
    }


def test_approver_key_signs_the_known_answer_of_the_vectors(tmp_path: Path) -> None:
    key, case = vector_key(tmp_path)
    [decision] = [c for c in VECTORS if c["id"] == case["signs"]]
    assert key.credential_id == case["approver_assertion"]["credential_id"]
    assertion = key.assertion(dispatch_of(decision), decision["input"]["decision"], None, None)
    assert assertion == case["approver_assertion"]  # Ed25519 is deterministic


@pytest.mark.parametrize(
    "case", [c for c in VECTORS if c["kind"] == "decision"], ids=lambda c: c["id"]
)
def test_approver_key_signs_each_vector_decisions_digest(
    tmp_path: Path, case: dict[str, Any]
) -> None:
    key, signing = vector_key(tmp_path)
    given = case["input"]
    made = key.assertion(
        dispatch_of(case), given["decision"], given.get("adjust_text"), given.get("reason")
    )
    parsed = parse_approver_assertion(made)
    assert parsed is not None
    verify_ed25519(signing["key"]["public_pem"], parsed, bytes.fromhex(case["digest_hex"]))


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("auto", "verb", "reason"),
    [
        ("approve", "approve", None),
        ("skip:not this week", "skip", "not this week"),
        ("adjust:Hello, édited world", "adjust", None),
    ],
    ids=["approve", "skip-with-reason", "adjust"],
)
def test_relay_approver_key_signs_each_decision_the_gate_requires(
    tmp_path: Path, processes: Callable[..., Any], auto: str, verb: str, reason: str | None
) -> None:
    private, public = keygen(tmp_path / "keys")
    relay, url = start_relay(processes, auto, "--approver-key", str(private))
    printed = relay.wait_for_line(CREDENTIAL_LINE).group(1)
    raw = load_pem_public_key(public.read_bytes()).public_bytes_raw()  # type: ignore[union-attr]
    assert printed == ed25519_credential_id(raw)  # the id the gate enrols it under
    gate = start_gate(processes, tmp_path, url)
    assert enrol(gate, public) == printed

    api = gate.api()
    approval = api.create(step="req")
    resolved = api.wait_resolved(approval["approval_id"])
    assert resolved["outcome"] == {"approve": "approved", "skip": "skipped"}.get(verb, "adjusted")
    assert decisions(gate, approval["approval_id"]) == [(verb, reason, printed)]
    sent = rf"event=decision_sent approval_id={approval['approval_id']} .* answer=200 "
    relay.wait_for_line(sent)


@pytest.mark.e2e
def test_relay_without_approver_key_is_refused_on_a_required_step(
    tmp_path: Path, processes: Callable[..., Any]
) -> None:
    relay, url = start_relay(processes, "approve")
    gate = start_gate(processes, tmp_path, url)
    approval_id = gate.api().create(step="req")["approval_id"]
    refused = rf"approval_id={approval_id} .* answer=403 .*approver_signature_required"
    relay.wait_for_line(rf"event=decision_sent {refused}")
    assert "approver key:" not in relay.log()
    assert gate.api().get(approval_id)["state"] == "pending"
    assert decisions(gate, approval_id) == []


@pytest.mark.e2e
@pytest.mark.parametrize("which", ["public", "missing"])
def test_relay_approver_key_that_is_no_private_key_is_one_line(tmp_path: Path, which: str) -> None:
    _, public = keygen(tmp_path / "keys")
    path = public if which == "public" else tmp_path / "nope.key"
    done = run_cli(
        "relay", "--secret-env", "HITL_RELAY_SECRET", "--approver-key", str(path), env=ENV
    )
    assert done.returncode == 2
    expected = (
        "this is a public key: give the private .key file" if which == "public" else "cannot read"
    )
    [line] = done.stderr.decode().strip().splitlines()
    assert re.fullmatch(r"Error: --approver-key: .*", line) and expected in line, line


# ---- hitl-gate verify --approver-public-key ---------------------------------------------------

SIGNATURE_CHECKS = [
    "relay.decision_signed_by_approver",
    "gate.assertion_replay_refused",
    "gate.assertion_not_in_batch_refused",
    "gate.unsigned_decision_refused",
]


def verify_run(url: str, public_key: Path, timeout: float = 60) -> CliProcess:
    return CliProcess(
        "verify",
        url,
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--approver",
        ALICE,
        "--timeout",
        f"{timeout:g}",
        "--approver-public-key",
        str(public_key),
        "--json",
        env=ENV,
    )


@pytest.mark.e2e
def test_verify_approver_public_key_passes_a_signing_relay_and_fails_one_that_does_not(
    tmp_path: Path, processes: Callable[..., Any]
) -> None:
    private, public = keygen(tmp_path / "keys")
    _, signing_url = start_relay(processes, "approve", "--approver-key", str(private))
    plain, plain_url = start_relay(processes, "approve")
    signing_run = processes(verify_run(signing_url, public))
    plain_run = processes(verify_run(plain_url, public, timeout=5))

    code, out, err = signing_run.finish(120)
    assert code == 0, (out, err)
    report = json.loads(out)
    names = [c["name"] for c in report["checks"]]
    assert names[-4:] == SIGNATURE_CHECKS, names
    by_name = {c["name"]: c for c in report["checks"]}
    assert all(c["ok"] for c in report["checks"]), report
    raw = load_pem_public_key(public.read_bytes()).public_bytes_raw()  # type: ignore[union-attr]
    assert by_name[SIGNATURE_CHECKS[0]]["observed"] == (
        f"accepted and recorded with credential {ed25519_credential_id(raw)}"
    )
    assert by_name[SIGNATURE_CHECKS[1]]["observed"] == "refused 403 approver_signature_invalid"
    assert by_name[SIGNATURE_CHECKS[2]]["observed"] == "refused 403 approver_signature_invalid"
    assert by_name[SIGNATURE_CHECKS[3]]["observed"] == "refused 403 approver_signature_required"

    code, out, err = plain_run.finish(120)
    assert code == 1, (out, err)
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["relay.decision_accepted"]["ok"] is False  # refused: no signature
    signed = checks[SIGNATURE_CHECKS[0]]
    assert (signed["ok"], signed["skipped"]) == (False, False)
    assert signed["observed"] == "the decision has no approver_assertion"
    for name in SIGNATURE_CHECKS[1:]:
        assert checks[name]["skipped"] is True, checks[name]
    plain.wait_for_line(r"answer=403 .*approver_signature_required")


@pytest.mark.e2e
def test_verify_approver_public_key_that_is_no_ed25519_key_is_one_line(tmp_path: Path) -> None:
    private, _ = keygen(tmp_path / "keys")
    done = run_cli(
        "verify",
        "http://127.0.0.1:9/",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--approver",
        ALICE,
        "--approver-public-key",
        str(private),
        env=ENV,
    )
    assert done.returncode == 2
    assert done.stderr.decode() == (
        f"Error: --approver-public-key: {private} is not an Ed25519 public key in PEM\n"
    )
