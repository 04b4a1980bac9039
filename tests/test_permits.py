"""Execution permits: known answers (fixed key, fixed clock), gate.trust.permit.verify, and the real
daemon issuing them through ``hitl-gate request --wait --permit-out`` and the reference relay.

Nothing is mocked: the gate is ``python -m gate serve`` with a signing key, the relay is
``python -m gate relay --auto ...`` or the capturing relay of tests/support.py, and the
permit is checked with ``hitl-gate permit verify`` (no secret in its environment), the
library function, Node.js's standard library and OpenSSL, as docs/auditing.md shows.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gate.model import Approval, Revision
from gate.protocol.canonical import canonical_json
from gate.trust import keys, permit
from tests.support import (
    ROOT,
    CliProcess,
    GateProcess,
    decision_body,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)
from tests.test_signed_audit import doc_block, no_secret_env, sign_config

VECTORS = ROOT / "conformance" / "vectors"
(VEC,) = json.loads((VECTORS / "permit.json").read_text(encoding="utf-8"))["cases"]
MAIL = "Guten Tag Frau Müller,\r\nbitte zahlen Sie 1.250,00 € bis Freitag.\n\n"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def vector_key(name: str = "key") -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(VEC[name]["private_seed_hex"]))


# ---- known answers --------------------------------------------------------------------------


def test_permit_vector_issue_is_deterministic() -> None:
    signer = keys.Signer.from_private_key(vector_key())
    assert signer.key_id == VEC["key"]["key_id"]

    assert permit.issue(signer, VEC["claims"]) == VEC["token"]
    header, payload, signature = VEC["token"].split(".")
    assert (
        unb64url(header).decode()
        == VEC["header_json"]
        == ('{"alg":"EdDSA","kid":"' + signer.key_id + '","typ":"hitl-permit+jwt"}')
    )
    assert unb64url(payload).decode() == VEC["payload_json"]
    assert canonical_json(VEC["claims"]).decode() == VEC["payload_json"]
    # a plain RFC 8037 JWS: Ed25519 over the ASCII signing input, checked without PyJWT
    vector_key().public_key().verify(unb64url(signature), f"{header}.{payload}".encode())


def test_permit_vector_claims() -> None:
    claims = VEC["claims"]
    body_hash = "sha256:" + hashlib.sha256(VEC["body"].encode("utf-8")).hexdigest()

    assert claims == {
        "iss": "hitl-gate",
        "approval_id": "01KDWZ8B00J3Q9V5X7Z2M4N6PR",
        "run_id": "run-2026-01-01-7",
        "pipeline": "rechnungsprüfung",
        "step": "send-followup",
        "outcome": "approved",
        "revision": 1,
        "payload_hash": body_hash,
        "approved_by": [
            {"operator_id": 102, "identity": "bob@example.com"},
            {"operator_id": 103, "identity": "carol@example.com"},
        ],
        "quorum": 2,
        "requested_by": "alice@example.com",
        "audit_seq": 2,
        "audit_entry_hash": claims["audit_entry_hash"],
        "iat": VEC["resolved_at_ms"] // 1000,
        "exp": VEC["resolved_at_ms"] // 1000 + 900,
    }
    audit_vec = json.loads((VECTORS / "audit_entry.json").read_text(encoding="utf-8"))
    assert claims["audit_entry_hash"] == audit_vec["cases"][0]["rows"][1]["entry_hash"]


@pytest.mark.parametrize("check", VEC["checks"], ids=[c["id"] for c in VEC["checks"]])
def test_permit_vector_checks(check: dict[str, Any]) -> None:
    trusted = [vector_key(name).public_key() for name in check["trusted"]]

    if check["expect"] == "ok":
        verified = permit.verify(check["token"], trusted, check["body"], check["now"])
        assert verified.claims == VEC["claims"]
        assert verified.key_id == VEC["key"]["key_id"]
        assert verified.expires_at == VEC["claims"]["exp"]
        return
    with pytest.raises(permit.PermitError) as info:
        permit.verify(check["token"], trusted, check["body"], check["now"])
    assert info.value.code == check["expect"], info.value.message


# ---- gate.trust.permit.verify: each refusal
# -------------------------------------------------------


def _forge(
    claims: dict[str, Any],
    header: dict[str, Any] | None = None,
    key: Ed25519PrivateKey | None = None,
) -> str:
    head = b64url(json.dumps(header or json.loads(VEC["header_json"])).encode())
    body = b64url(canonical_json(claims))
    signature = (key or vector_key()).sign(f"{head}.{body}".encode())
    return f"{head}.{body}.{b64url(signature)}"


NOW = VEC["claims"]["iat"] + 10
KID = VEC["key"]["key_id"]

REFUSALS: list[tuple[str, Callable[[], str], str]] = [
    ("not_a_jws", lambda: "hello", "permit_malformed"),
    (
        "alg_none",
        lambda: _forge(VEC["claims"], {"alg": "none", "kid": KID, "typ": "hitl-permit+jwt"}),
        "permit_malformed",
    ),
    (
        "alg_hs256",
        lambda: _forge(VEC["claims"], {"alg": "HS256", "kid": KID, "typ": "hitl-permit+jwt"}),
        "permit_malformed",
    ),
    (
        "typ_jwt",
        lambda: _forge(VEC["claims"], {"alg": "EdDSA", "kid": KID, "typ": "JWT"}),
        "permit_malformed",
    ),
    (
        "no_kid",
        lambda: _forge(VEC["claims"], {"alg": "EdDSA", "typ": "hitl-permit+jwt"}),
        "permit_unknown_key",
    ),
    (
        "skipped_outcome",
        lambda: _forge({**VEC["claims"], "outcome": "skipped"}),
        "permit_not_approved",
    ),
    (
        "exp_missing",
        lambda: _forge({k: v for k, v in VEC["claims"].items() if k != "exp"}),
        "permit_invalid_claims",
    ),
    (
        "exp_string",
        lambda: _forge({**VEC["claims"], "exp": str(VEC["claims"]["exp"])}),
        "permit_invalid_claims",
    ),
    ("payload_not_object", lambda: _forge([1, 2]), "permit_invalid_claims"),  # type: ignore[arg-type]
    (
        "signature_bit_flip",
        lambda: VEC["token"][:-2] + ("A" if VEC["token"][-2] != "A" else "B") + VEC["token"][-1],
        "permit_bad_signature",
    ),
]


@pytest.mark.parametrize(("name", "make", "code"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_permit_verify_refuses(name: str, make: Callable[[], str], code: str) -> None:
    with pytest.raises(permit.PermitError) as info:
        permit.verify(make(), [vector_key().public_key()], VEC["body"], NOW)
    assert info.value.code == code, (name, info.value.message)


def test_permit_verify_pipeline_step_and_bytes_body() -> None:
    trusted = {KID: vector_key().public_key()}
    body = VEC["body"].encode("utf-8")

    assert (
        permit.verify(
            VEC["token"], trusted, body, NOW, pipeline="rechnungsprüfung", step="send-followup"
        ).approval_id
        == VEC["claims"]["approval_id"]
    )
    with pytest.raises(permit.PermitError) as info:
        permit.verify(VEC["token"], trusted, body, NOW, step="pay-invoice")
    assert info.value.code == "permit_wrong_step"
    with pytest.raises(permit.PermitError) as info:
        permit.verify(VEC["token"], trusted, b"\xef\xbb\xbf" + body, NOW)  # a BOM is a change
    assert info.value.code == "permit_body_mismatch"


def test_permit_claims_for_refuses_outcomes_that_do_not_fire() -> None:
    approval = Approval(
        approval_id="a",
        run_id="r",
        pipeline="p",
        step="s",
        risk="low",
        content_type="text/plain",
        quorum_required=1,
        scope=(),
        budget=None,
        spend=None,
        revision=1,
        state="pending",
        outcome=None,
        created_at=0,
        expires_at=1,
        resolved_at=None,
        idempotency_key=None,
        request_hash="",
        receipt=None,
        requested_by=None,
        requested_by_id=None,
        allow_self_approval=False,
        permit=None,
        revisions=(Revision(1, "", "sha256:00", "n1", 0, None),),
        decisions=(),
    )
    for outcome in ("skipped", "timeout", "cancelled"):
        with pytest.raises(ValueError, match="no permit exists"):
            permit.claims_for(approval, outcome, [], 1, "0" * 64, 0, 900)


# ---- the real daemon ------------------------------------------------------------------------


def reference_relay(clis: Callable[..., CliProcess], auto: str) -> str:
    relay = clis(
        "relay", "--listen", "127.0.0.1:0", "--secret-env", "HITL_RELAY_SECRET", "--auto", auto
    )
    return relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)


def signed_gate(directory: Path, relay_url: str, **kw: Any) -> tuple[GateProcess, Path, str]:
    config = write_config(directory, relay_url)
    public, kid = sign_config(config, **kw)
    return GateProcess(config).start(), public, kid


def permit_verify(
    permit_file: Path, public: Path, body_file: Path, *extra: str
) -> tuple[int, str, str]:
    """Run ``hitl-gate permit verify``; return (exit code, stdout, stderr)."""
    proc = run_cli(
        "permit",
        "verify",
        str(permit_file),
        "--public-key",
        str(public),
        "--body-file",
        str(body_file),
        *extra,
        env=no_secret_env(),
    )
    assert "Traceback" not in proc.stderr.decode()
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


@pytest.mark.e2e
@pytest.mark.parametrize(("auto", "final"), [("approve", MAIL), ("adjust:Neuer Text €", None)])
def test_permit_request_wait_permit_out_and_verify(
    tmp_path: Path, clis: Any, auto: str, final: str | None
) -> None:
    gate, public, kid = signed_gate(tmp_path, reference_relay(clis, auto))
    try:
        out = tmp_path / "permit.jws"
        proc = run_cli(
            "request",
            "-c",
            str(gate.config),
            "--api-url",
            gate.api_url,
            "--pipeline",
            "p",
            "--step",
            "q1",
            "--run-id",
            "run-42",
            "--draft-file",
            "-",
            "--wait",
            "--permit-out",
            str(out),
            stdin=MAIL.encode("utf-8"),
        )
        stderr = proc.stderr.decode()
        assert proc.returncode == 0, stderr
        final_body = final if final is not None else auto.partition(":")[2]
        assert proc.stdout == final_body.encode("utf-8")
        assert stderr.splitlines()[-1] == f"permit saved to {out}"
        assert os.stat(out).st_mode & 0o777 == 0o600
        token = out.read_text().strip()

        approval_id = stderr.split()[2]
        approval = gate.api().get(approval_id)
        assert approval["permit"] == token
        body_file = tmp_path / "final.txt"
        body_file.write_bytes(final_body.encode("utf-8"))
        code, text, _ = permit_verify(out, public, body_file, "--json")
        assert code == 0, text
        claims = json.loads(text)
        iat = claims["iat"]
        assert claims == {
            "iss": "hitl-gate",
            "approval_id": approval_id,
            "run_id": "run-42",
            "pipeline": "p",
            "step": "q1",
            "outcome": approval["outcome"],
            "revision": approval["revision"],
            "payload_hash": approval["payload_hash"],
            "approved_by": [{"operator_id": 101, "identity": "alice@example.com"}],
            "quorum": 1,
            "audit_seq": approval["receipt"]["seq"],
            "audit_entry_hash": approval["receipt"]["entry_hash"],
            "iat": iat,
            "exp": iat + 900,
        }
        assert abs(iat - time.time()) < 60
        assert json.loads(unb64url(token.split(".")[0])) == {
            "alg": "EdDSA",
            "kid": kid,
            "typ": "hitl-permit+jwt",
        }

        code, text, _ = permit_verify(out, public, body_file)
        assert code == 0
        until = datetime.fromtimestamp(claims["exp"], UTC)
        assert text == (
            f"ok: permit for approval {approval_id} (p/q1, "
            f"{approval['outcome']} by alice@example.com), body "
            f"{approval['payload_hash']}, valid until {until:%Y-%m-%dT%H:%M:%S}.000Z\n"
        ), text
        if auto.startswith("adjust"):
            # the original draft is not what was approved
            draft = tmp_path / "draft.txt"
            draft.write_bytes(MAIL.encode("utf-8"))
            code, text, _ = permit_verify(out, public, draft)
            assert code == 1
            assert text == (
                f"INVALID: permit_body_mismatch: the body hashes to "
                f"sha256:{hashlib.sha256(MAIL.encode()).hexdigest()}, the permit "
                f"allows {approval['payload_hash']}\n"
            )
    finally:
        gate.stop()


@pytest.mark.e2e
def test_request_replayed_after_the_permit_expired_fails_instead_of_saving_it(
    tmp_path: Path, clis: Any
) -> None:
    """Pipeline-author review: ``request --wait --permit-out`` replayed (same Idempotency-Key)
    after ``permit_lifetime`` exited 0, printed the body and saved a permit that
    ``permit verify`` then refused as expired. It now fails (exit 1) naming the expiry, prints
    no body and leaves no permit file: the action can no longer fire on that approval."""
    gate, public, kid = signed_gate(tmp_path, reference_relay(clis, "approve"), lifetime="2s")
    try:
        out = tmp_path / "permit.jws"
        args = (
            "request",
            "-c",
            str(gate.config),
            "--api-url",
            gate.api_url,
            "--pipeline",
            "p",
            "--step",
            "q1",
            "--draft",
            "kurz gültig",
            "--idempotency-key",
            "k-1",
            "--wait",
            "--permit-out",
            str(out),
        )
        first = run_cli(*args)
        assert first.returncode == 0, first.stderr
        exp = json.loads(unb64url(out.read_text().split(".")[1]))["exp"]
        wait_until(lambda: time.time() > exp + 0.1, 10, "the permit's expiry")
        again = run_cli(*args)
        assert (again.returncode, again.stdout) == (1, b""), again.stderr
        approval_id = first.stderr.decode().split()[2]
        assert again.stderr.decode().splitlines()[-1] == (
            f"Error: the permit of approval {approval_id} expired at "
            f"{datetime.fromtimestamp(exp, UTC):%Y-%m-%dT%H:%M:%S}.000Z: the action must not fire "
            "on it; request again with a new Idempotency-Key"
        )
        assert not out.exists()
    finally:
        gate.stop()


@pytest.fixture
def approved(tmp_path: Path, relay: Any) -> Iterator[dict[str, Any]]:
    """A signed gate, one approved approval and its saved permit and body."""
    gate, public, kid = signed_gate(tmp_path, relay.url)
    try:
        api = gate.api()
        approval_id = api.create("q2", MAIL, run_id="run-7")["approval_id"]
        dispatch = relay.wait_dispatch(approval_id)
        for who in ("bob@example.com", "carol@example.com"):
            status, _, _ = post_decision(gate.callback_url, decision_body(dispatch, who))
            assert status == 200
        approval = api.get(approval_id)
        token_file, body_file = tmp_path / "permit.jws", tmp_path / "mail.txt"
        token_file.write_text(approval["permit"] + "\n")
        body_file.write_bytes(MAIL.encode("utf-8"))
        yield {
            "gate": gate,
            "public": public,
            "kid": kid,
            "approval": approval,
            "token": approval["permit"],
            "token_file": token_file,
            "body_file": body_file,
            "dir": tmp_path,
        }
    finally:
        gate.stop()


@pytest.mark.e2e
def test_permit_verify_without_pipeline_and_step_warns_that_they_were_not_checked(
    approved: dict[str, Any],
) -> None:
    """Security review: a permit of a quorum-1 step passed ``permit verify`` as printed in its
    help for an action of a quorum-2 step. Without --pipeline/--step the verdict stays "ok"
    (the signature, expiry and body are checked), but stderr says what was not checked and
    which pipeline/step the permit is for; with both given, nothing is said."""
    token_file, public, body_file = (
        approved["token_file"],
        approved["public"],
        approved["body_file"],
    )
    code, out, err = permit_verify(token_file, public, body_file)
    assert code == 0 and out.startswith("ok: permit for approval"), out
    assert err == (
        "warning: the permit is for p/q2; --pipeline and --step were not given, so "
        "a permit for another pipeline or step would pass too\n"
    )
    code, out, err = permit_verify(token_file, public, body_file, "--step", "q2")
    assert code == 0 and err == (
        "warning: the permit is for p/q2; --pipeline was not given, "
        "so a permit for another pipeline would pass too\n"
    ), err
    code, out, err = permit_verify(token_file, public, body_file, "--pipeline", "p", "--step", "q2")
    assert (code, err) == (0, ""), err
    code, out, err = permit_verify(token_file, public, body_file, "--pipeline", "p", "--step", "q1")
    assert code == 1 and out.startswith("INVALID: permit_wrong_step"), out


@pytest.mark.e2e
def test_permit_quorum_2_names_both_approvers(approved: dict[str, Any]) -> None:
    claims = permit.verify(
        approved["token"], [keys.load_public_key(approved["public"])], MAIL, time.time()
    ).claims

    assert claims["approved_by"] == [
        {"operator_id": 102, "identity": "bob@example.com"},
        {"operator_id": 103, "identity": "carol@example.com"},
    ]
    assert claims["quorum"] == 2
    assert claims["outcome"] == "approved"


@pytest.mark.e2e
def test_permit_expired_wrong_body_wrong_key_altered_claim(approved: dict[str, Any]) -> None:
    token, public = approved["token"], keys.load_public_key(approved["public"])
    claims = permit.verify(token, [public], MAIL, time.time()).claims

    # expired: the library takes `now`, so exp is tested exactly
    assert permit.verify(token, [public], MAIL, claims["exp"] - 0.001)
    with pytest.raises(permit.PermitError) as info:
        permit.verify(token, [public], MAIL, claims["exp"])
    assert (info.value.code, info.value.message) == (
        "permit_expired",
        f"expired at {claims['exp']} (now {claims['exp']})",
    )

    d = approved["dir"]
    wrong_body = d / "other.txt"
    wrong_body.write_bytes(MAIL.rstrip("\n").encode())
    code, text, _ = permit_verify(approved["token_file"], approved["public"], wrong_body)
    assert code == 1 and text.startswith("INVALID: permit_body_mismatch: "), text

    _, other_public, other_kid = keys.generate(d / "other-key")
    code, text, _ = permit_verify(approved["token_file"], other_public, approved["body_file"])
    assert (code, text) == (
        1,
        f"INVALID: permit_unknown_key: signed by key "
        f"'{approved['kid']}', which is not a trusted public key\n",
    )

    head, payload, sig = token.split(".")
    altered = dict(json.loads(unb64url(payload)), quorum=1, approved_by=[])
    altered_file = d / "altered.jws"
    altered_file.write_text(f"{head}.{b64url(canonical_json(altered))}.{sig}")
    code, text, _ = permit_verify(altered_file, approved["public"], approved["body_file"])
    assert (code, text) == (
        1,
        f"INVALID: permit_bad_signature: signature does not verify with "
        f"key {approved['kid']} (altered or forged)\n",
    )

    code, text, _ = permit_verify(
        approved["token_file"], approved["public"], approved["body_file"], "--step", "q1"
    )
    assert (code, text) == (1, "INVALID: permit_wrong_step: permit is for step 'q2', not 'q1'\n")
    assert other_kid != approved["kid"]


@pytest.mark.e2e
@pytest.mark.toolchain
@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_permit_docs_node_snippet(approved: dict[str, Any]) -> None:
    script = approved["dir"] / "verify-permit.mjs"
    script.write_text(doc_block("node-permit"), encoding="utf-8")

    def node(body: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["node", str(script), str(approved["token_file"]), str(approved["public"]), str(body)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    proc = node(approved["body_file"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["approval_id"] == approved["approval"]["approval_id"]
    other = approved["dir"] / "other.txt"
    other.write_text("something else")
    proc = node(other)
    assert (proc.returncode, proc.stdout) == (1, "INVALID: body does not match the permit\n")


@pytest.mark.e2e
@pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("openssl", "jq", "basenc")),
    reason="openssl, jq or basenc missing",
)
def test_permit_docs_openssl_recipe(approved: dict[str, Any]) -> None:
    d = approved["dir"]
    shutil.copy(approved["public"], d / "hitl-gate-ed25519.pub")
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", doc_block("openssl-permit")],
        cwd=d,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "Signature Verified Successfully"
    expected = approved["approval"]["payload_hash"]
    assert lines[1] == f"payload_hash: {expected}"
    assert lines[2] == f"body:         {expected}"


@pytest.mark.e2e
def test_permit_never_exists_for_skipped_timeout_cancelled(tmp_path: Path, relay: Any) -> None:
    gate, _, _ = signed_gate(tmp_path, relay.url)
    try:
        api = gate.api()
        skipped = api.create("q1", "skip me")["approval_id"]
        status, _, _ = post_decision(
            gate.callback_url, decision_body(relay.wait_dispatch(skipped), verb="skip")
        )
        assert status == 200
        cancelled = api.create("q1", "cancel me")["approval_id"]
        assert api.call("POST", f"/v1/approvals/{cancelled}/cancel")[0] == 200
        timed_out = api.create("short", "let me expire")["approval_id"]
        assert api.wait_resolved(timed_out, timeout=15)["outcome"] == "timeout"
        for approval_id, outcome in (
            (skipped, "skipped"),
            (cancelled, "cancelled"),
            (timed_out, "timeout"),
        ):
            approval = api.get(approval_id)
            assert (approval["outcome"], approval["permit"]) == (outcome, None)
            assert approval["receipt"]["signature_alg"] == "ed25519"

        # `request --permit-out` on a skip: exit 3, and a stale permit file is removed
        out = tmp_path / "permit.jws"
        out.write_text("an old permit\n")
        cli = CliProcess(
            "request",
            "-c",
            str(gate.config),
            "--api-url",
            gate.api_url,
            "--pipeline",
            "p",
            "--step",
            "q1",
            "--draft",
            "skip me too",
            "--wait",
            "--permit-out",
            str(out),
        )
        approval_id = cli.wait_for_line(r"requested approval (\S+)").group(1)
        post_decision(
            gate.callback_url, decision_body(relay.wait_dispatch(approval_id), verb="skip")
        )
        code, stdout, stderr = cli.finish()
        assert (code, stdout) == (3, b""), stderr
        assert not out.exists()
        assert "permit saved" not in stderr
    finally:
        gate.stop()


@pytest.mark.e2e
def test_permit_out_without_signing_key_exits_1(gate: GateProcess, relay: Any) -> None:
    """New-user review: an older permit file at --permit-out was left in place on this exit
    (docs/auditing.md promises any outcome without a permit removes it)."""
    out = gate.config.parent / "permit.jws"
    out.write_text("an old permit\n")
    cli = CliProcess(
        "request",
        "-c",
        str(gate.config),
        "--api-url",
        gate.api_url,
        "--pipeline",
        "p",
        "--step",
        "q1",
        "--draft",
        "approve me",
        "--wait",
        "--permit-out",
        str(out),
    )
    approval_id = cli.wait_for_line(r"requested approval (\S+)").group(1)
    status, _, _ = post_decision(gate.callback_url, decision_body(relay.wait_dispatch(approval_id)))
    assert status == 200
    code, stdout, stderr = cli.finish()

    assert (code, stdout) == (1, b"")
    assert stderr.splitlines()[-1] == (
        f"Error: approval {approval_id} is approved but the gate issued no permit "
        "(receipts.signing_key_file is not configured)"
    )
    assert not out.exists()
    assert gate.api().get(approval_id)["permit"] is None
    assert "key_id" not in gate.api().get(approval_id)["receipt"]


@pytest.mark.e2e
def test_permit_out_needs_wait(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/relay")
    proc = run_cli(
        "request",
        "-c",
        str(config),
        "--pipeline",
        "p",
        "--step",
        "q1",
        "--draft",
        "x",
        "--permit-out",
        str(tmp_path / "p.jws"),
    )

    assert (proc.returncode, proc.stderr.decode()) == (2, "Error: --permit-out needs --wait\n")


@pytest.mark.e2e
def test_permit_lifetime_is_configurable(tmp_path: Path, relay: Any) -> None:
    gate, public, _ = signed_gate(tmp_path, relay.url, lifetime="90s")
    try:
        api = gate.api()
        approval_id = api.create("q1", "short-lived")["approval_id"]
        post_decision(gate.callback_url, decision_body(relay.wait_dispatch(approval_id)))
        token = wait_until(lambda: api.get(approval_id)["permit"], what="permit")
        claims = permit.verify(
            token, [keys.load_public_key(public)], "short-lived", time.time()
        ).claims
        assert claims["exp"] - claims["iat"] == 90
    finally:
        gate.stop()
