"""Passkeys after a new user's first pass: an http ``relay.public_url``
on a domain makes passkeys unavailable (browsers refuse WebAuthn there), an empty
``webauthn.origins`` is a config error, doctor warns about passkeys enrolled for another RP
ID and about operators of a ``required`` step with no credential, and the enrolment page
shows its expiry, has an icon, answers a trailing slash, and refuses a registration without
the library's text. Real daemons, the real CLI, a software authenticator (P-256, ``none``
attestation) posting real registrations over HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import cbor2
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support import (
    GateProcess,
    gate_env,
    http_request,
    run_cli,
    shown_time,
    write_config,
)

ADMIN_TOKEN = "test-admin-token-findings-5d1e8a27c3"
ENV = gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN)
ADMIN = {"admin_token_env": "HITL_ADMIN_TOKEN"}
STEPS = [{"name": "req", "approvers": [101, 102], "approver_signature": "required"}]
FIXED_REFUSAL = "the passkey registration does not verify for this invite"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def registration(challenge: str, rp_id: str, origin: str) -> dict[str, Any]:
    """A software authenticator's answer to ``navigator.credentials.create``: a fresh P-256
    key, ``none`` attestation, user present and verified (flags 0x45)."""
    key = ec.generate_private_key(ec.SECP256R1())
    numbers = key.public_key().public_numbers()
    cose = {1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32), -3: numbers.y.to_bytes(32)}
    cred_id = hashlib.sha256(cbor2.dumps(cose)).digest()[:16]
    auth_data = (
        hashlib.sha256(rp_id.encode()).digest()
        + bytes([0x45])
        + (0).to_bytes(4)
        + bytes(16)
        + len(cred_id).to_bytes(2)
        + cred_id
        + cbor2.dumps(cose)
    )
    client = {"type": "webauthn.create", "challenge": challenge, "origin": origin}
    attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
    return {
        "id": b64url(cred_id),
        "rawId": b64url(cred_id),
        "type": "public-key",
        "response": {
            "clientDataJSON": b64url(json.dumps(client).encode()),
            "attestationObject": b64url(attestation),
            "transports": ["internal"],
        },
        "clientExtensionResults": {},
    }


def config(tmp_path: Path, relay: dict[str, Any] | None = None, **top: Any) -> Path:
    path = write_config(tmp_path, "http://127.0.0.1:9/relay", steps=STEPS, relay=relay, api=ADMIN)
    if top:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        data.update(top)
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def cli(*args: str) -> tuple[int, str, str]:
    proc = run_cli(*args, env=ENV)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def invite(gate: GateProcess, operator: str) -> tuple[str, str]:
    """(the invite URL, its expires_at as printed)."""
    code, out, err = cli(
        "approvers", "invite", "-c", str(gate.config), "--api-url", gate.api_url, operator
    )
    assert code == 0, err
    return out.strip(), err.strip().removeprefix("expires at ")


def options_of(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="options">(.*?)</script>', page, re.S)
    assert found, page
    parsed: dict[str, Any] = json.loads(found.group(1))
    return parsed


def enrol(url: str) -> tuple[int, Any]:
    """GET the page, answer its options with the software authenticator, POST it back."""
    status, _, raw = http_request(url)
    assert status == 200, raw
    options = options_of(raw.decode())
    origin = "http://localhost:" + url.split(":")[2].split("/")[0]
    body = registration(options["challenge"], options["rp"]["id"], origin)
    return post(url, body, origin)


def post(url: str, body: Any, origin: str) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", "Origin": origin}
    status, _, raw = http_request(url, "POST", json.dumps(body).encode(), headers)
    return status, json.loads(raw)


def enrolled_at(path: Path, *operators: str) -> None:
    """Start a gate on the config at ``path``, enrol a passkey for each of ``operators``
    through its invite page, stop it: its database then holds their credentials."""
    gate = GateProcess(path, env=ENV).start()
    try:
        for operator in operators:
            status, answer = enrol(invite(gate, operator)[0])
            assert status == 200, answer
    finally:
        gate.stop()


def doctor_lines(path: Path) -> list[str]:
    _, out, err = cli("doctor", "-c", str(path))
    return [line for line in (out + err).splitlines() if "passkeys" in line or "steps[" in line]


# --------------------------------------------------------------------------- M1, L2


@pytest.mark.e2e
def test_http_public_url_on_a_domain_leaves_passkeys_unavailable(tmp_path: Path) -> None:
    path = config(tmp_path, {"public_url": "http://gate.example.com/"})
    assert cli("check-config", "-c", str(path))[0] == 0  # a warning, not an error
    warned = [line for line in doctor_lines(path) if line.startswith("WARN passkeys")]
    assert warned and "http" in warned[0] and "relay.public_url" in warned[0], warned
    gate = GateProcess(path, env=ENV).start()
    try:
        code, out, err = cli(
            "approvers", "invite", "-c", str(path), "--api-url", gate.api_url, "101"
        )
        assert code != 0 and out == ""
        assert "relay.public_url" in err and "https" in err, err
    finally:
        gate.stop()


@pytest.mark.e2e
def test_empty_webauthn_origins_is_a_config_error(tmp_path: Path) -> None:
    path = config(tmp_path, webauthn={"rp_id": "localhost", "origins": []})
    code, out, err = cli("check-config", "-c", str(path))
    assert code != 0
    assert "webauthn.origins" in out + err and "no origin" in out + err, out + err


# --------------------------------------------------------------------------- M2, M3


@pytest.mark.e2e
def test_doctor_warns_of_passkeys_for_another_rp_id_and_operators_without_one(
    tmp_path: Path,
) -> None:
    path = config(tmp_path)
    enrolled_at(path, "101")
    lines = doctor_lines(path)
    assert any(
        line.startswith("WARN")
        and "operators 102 (bob@example.com)" in line
        and "pipelines[0].steps[0]" in line
        for line in lines
    ), lines
    assert not any("101 (" in line for line in lines), lines  # 101 has its passkey
    # the same database under a gate whose RP ID is now gate.example.com
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["relay"]["public_url"] = "https://gate.example.com"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    lines = doctor_lines(path)
    assert any(
        "1 passkeys were enrolled for rp_id localhost and cannot sign for gate.example.com" in line
        and line.startswith("WARN")
        for line in lines
    ), lines


# --------------------------------------------------------------------------- M4, L5


@pytest.mark.e2e
def test_enrol_page_expiry_icon_trailing_slash_and_fixed_refusal(tmp_path: Path) -> None:
    gate = GateProcess(config(tmp_path), env=ENV).start()
    try:
        url, expires = invite(gate, "101")
        status, _, raw = http_request(url)
        page = raw.decode()
        assert status == 200
        # the page carries the API's time; the CLI printed it fixed width
        wire = page.split('<time id="expires" datetime="')[1].split('"')[0]
        assert shown_time(wire) == expires, page
        assert '<link rel="icon" href="/enrol/static/favicon.svg"' in page
        base = url.split("/enrol/")[0]
        status, headers, raw = http_request(base + "/enrol/static/favicon.svg")
        assert status == 200 and headers["content-type"].startswith("image/svg+xml")
        assert raw.startswith(b"<svg")
        # a trailing slash: the same page; an unknown one: the same "Unknown invite" page
        assert http_request(url + "/")[:1] == (200,)
        assert http_request(url + "/")[2] == http_request(url)[2]
        status, _, raw = http_request(base + "/enrol/nope/")
        assert status == 404 and b"Unknown invite" in raw
        # refusals carry one fixed sentence, never the library's text
        origin = "http://localhost:" + url.split(":")[2].split("/")[0]
        options = options_of(page)
        garbage = {
            "id": "AAAA",
            "rawId": "AAAA",
            "type": "public-key",
            "response": {"clientDataJSON": "e30", "attestationObject": "oA"},
        }
        wrong = registration(b64url(b"x" * 32), options["rp"]["id"], origin)
        for body in (garbage, wrong):
            status, answer = post(url, body, origin)
            assert (status, answer["reason"]) == (400, "invalid_registration"), answer
            assert answer["message"] == FIXED_REFUSAL, answer
        assert "__cause__" not in gate.log()
        # enrol.js names every refusal and the browser's errors in words
        script = http_request(base + "/enrol/static/enrol.js")[2].decode()
        for words in (
            "This invite has expired. Ask for a new one.",
            "Open the link exactly as printed",
            "The passkey was not created (cancelled, timed out, or this authenticator",
        ):
            assert words in script
    finally:
        gate.stop()


@pytest.mark.e2e
def test_invite_url_opens_on_an_allowed_origin(tmp_path: Path) -> None:
    """``relay.public_url`` on 127.0.0.1 (relays call back there) with the relying party
    ``localhost``: the invite URL uses the allowed origin, since a page opened on
    127.0.0.1 cannot make a passkey for localhost (the browser refuses: SecurityError)."""
    path = config(
        tmp_path,
        {"public_url": "http://127.0.0.1:18089"},
        webauthn={"rp_id": "localhost", "origins": ["http://localhost:18089"]},
    )
    gate = GateProcess(path, env=ENV).start()
    try:
        url, _ = invite(gate, "101")
        assert url.startswith("http://localhost:18089/enrol/"), url
    finally:
        gate.stop()
