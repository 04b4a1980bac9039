"""Passkeys in a real browser: Debian's headless Chromium, driven by Playwright
for Python, with a CDP virtual authenticator (ctap2, internal, resident key, user
verification) enrols a passkey through the gate's one-time invite page and signs decisions
the gate accepts; a replayed assertion (counter not increased), a used and an expired
invite are refused. Everything through a real daemon on loopback, the SQLite file read back.

Skipped when /usr/bin/chromium or playwright is absent, failed instead under HITL_CI=1.
Screenshots go to ``$HITL_ARTIFACTS`` (or the test's tmp dir).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.protocol.approver_signature import decision_digest
from tests.support import (
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ADMIN_TOKEN = "test-admin-token-passkeys-7c2e91d04b"
ENV = gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN)
STEPS = [
    {"name": "req", "approvers": [101, 102], "timeout": "1h", "approver_signature": "required"},
    {"name": "req2", "quorum": 2, "approvers": [101, 102], "approver_signature": "required"},
]
GET_ASSERTION = """async ([challenge, credentialId]) => {
  const dec = (t) => Uint8Array.from(atob(t.replace(/-/g, '+').replace(/_/g, '/')
      + '==='.slice((t.length + 3) % 4)), (c) => c.charCodeAt(0));
  const enc = (b) => btoa(String.fromCharCode(...new Uint8Array(b)))
      .replace(/\\+/g, '-').replace(/\\//g, '_').replace(/=+$/, '');
  const got = await navigator.credentials.get({publicKey: {
    challenge: dec(challenge), rpId: 'localhost', userVerification: 'required',
    allowCredentials: [{type: 'public-key', id: dec(credentialId)}]}});
  return {type: 'webauthn', credential_id: enc(got.rawId),
    authenticator_data: enc(got.response.authenticatorData),
    client_data_json: enc(got.response.clientDataJSON),
    signature: enc(got.response.signature),
    user_handle: got.response.userHandle ? enc(got.response.userHandle) : null};
}"""


def _playwright() -> Any:
    """``playwright.sync_api`` or a skip (a failure under HITL_CI=1)."""
    missing = None
    if not os.path.exists(CHROMIUM) or shutil.which(CHROMIUM) is None:
        missing = f"{CHROMIUM} is not installed (apt-get install chromium)"
    try:
        from playwright import sync_api
    except ImportError:
        missing = missing or "playwright is not installed (pip install playwright)"
    if missing is not None:
        if os.environ.get("HITL_CI"):
            pytest.fail(f"HITL_CI=1: {missing}")
        pytest.skip(missing)
    return sync_api


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    base = Path(os.environ.get("HITL_ARTIFACTS") or tmp_path / "artifacts")
    directory = base / "passkeys"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A fresh headless Chromium page with a virtual authenticator."""
    sync_api = _playwright()
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium"), executable_path=CHROMIUM, headless=True, args=ARGS
        )
        try:
            page = ctx.new_page()
            cdp = ctx.new_cdp_session(page)
            cdp.send("WebAuthn.enable")
            options = {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
            }
            cdp.send("WebAuthn.addVirtualAuthenticator", {"options": options})
            yield page
        finally:
            ctx.close()


@pytest.fixture
def passkey_gate(tmp_path: Path, relay: Any) -> Iterator[GateProcess]:
    config = write_config(
        tmp_path, relay.url, steps=STEPS, api={"admin_token_env": "HITL_ADMIN_TOKEN"}
    )
    proc = GateProcess(config, env=ENV).start()
    yield proc
    if proc.proc and proc.proc.poll() is None:
        proc.stop()


def invite(gate: GateProcess, *args: str) -> tuple[str, str]:
    """``hitl-gate approvers invite``: (the URL on stdout, stderr)."""
    proc = run_cli(
        "approvers", "invite", "-c", str(gate.config), "--api-url", gate.api_url, *args, env=ENV
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode().strip(), proc.stderr.decode()


def rows(gate: GateProcess, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{gate.config.parent / 'gate.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def origin_post(url: str, body: bytes, origin: str) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, body, {"Content-Type": "application/json", "Origin": origin}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def enrol_in_browser(page: Any, url: str, shots: Path) -> None:
    page.goto(url)
    assert page.title().startswith("Enrol a passkey")
    page.screenshot(path=str(shots / "invite.png"))
    page.click("#create")
    page.wait_for_selector("#status.ok", timeout=30_000)
    assert "Passkey enrolled" in page.inner_text("main")
    # the page says who tells the approver where to sign in
    assert "Your administrator will tell you where to sign in." in page.inner_text("main")
    page.screenshot(path=str(shots / "enrolled.png"))


def sign(page: Any, dispatch: dict[str, Any], credential_id: str) -> dict[str, Any]:
    digest = decision_digest(
        approval_id=dispatch["approval_id"],
        revision=dispatch["revision"],
        nonce=dispatch["callback"]["nonce"],
        payload_hash=dispatch["payload_hash"],
        decision="approve",
    )
    challenge = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    result: dict[str, Any] = page.evaluate(GET_ASSERTION, [challenge, credential_id])
    return {k: v for k, v in result.items() if v is not None}


@pytest.mark.e2e
@pytest.mark.slow
def test_passkey_enrolled_in_chromium_signs_decisions(
    passkey_gate: GateProcess, relay: Any, browser: Any, artifacts: Path
) -> None:
    gate, page = passkey_gate, browser
    expiring, _ = invite(gate, "102", "--ttl", "60s")
    expiring_at = time.monotonic() + 60
    url, err = invite(gate, "101", "--label", "alice chromium")
    port = gate.callback_url.split(":")[2].split("/")[0]
    assert url.startswith(f"http://localhost:{port}/enrol/") and err.startswith("expires at ")
    token = url.rsplit("/", 1)[1]
    assert not rows(gate, "SELECT 1 FROM approver_invites WHERE invite_hash = ?", (token,))

    enrol_in_browser(page, url, artifacts)
    [(credential_id, operator_id, kind, label, count)] = rows(
        gate, "SELECT credential_id, operator_id, type, label, sign_count FROM approver_credentials"
    )
    assert (operator_id, kind, label) == (101, "webauthn", "alice chromium")
    [(used_at, used_by)] = rows(
        gate, "SELECT used_at, credential_id FROM approver_invites WHERE operator_id = 101"
    )
    assert used_at is not None and used_by == credential_id
    kind_sql = "SELECT entry FROM audit_log WHERE kind = 'approver_credential_enrolled'"
    [(data,)] = rows(gate, kind_sql)
    entry = json.loads(data)["data"]
    assert (entry["type"], entry["rp_id"], entry["origin"]) == (
        "webauthn",
        "localhost",
        f"http://localhost:{port}",
    )
    assert entry["credential_id"] == credential_id and entry["sign_count"] == count

    # the used invite: a clear page with no button, and a POST stores nothing
    page.goto(url)
    assert "already used" in page.inner_text("main") and page.query_selector("#create") is None
    page.screenshot(path=str(artifacts / "used.png"))
    assert origin_post(url, b"{}", f"http://localhost:{port}") == 410
    assert origin_post(url, b"{}", "http://evil.example") == 403

    # a required step: the browser signs the decision digest, the relay posts it
    api = gate.api()
    first = api.create(step="req")
    dispatch = relay.wait_dispatch(first["approval_id"])
    signed = sign(page, dispatch, credential_id)
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(dispatch, approver_assertion=signed)
    )
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    assert rows(
        gate, "SELECT credential_id FROM decisions WHERE approval_id = ?", (first["approval_id"],)
    ) == [(credential_id,)]
    [(stored_count,)] = rows(gate, "SELECT sign_count FROM approver_credentials")

    # quorum 2: the same assertion replayed while pending is a counter that did not increase
    second = api.create(step="req2")
    dispatch = relay.wait_dispatch(second["approval_id"])
    signed = sign(page, dispatch, credential_id)
    body = decision_body(dispatch, approver_assertion=signed)
    assert post_decision(gate.callback_url, body)[:2] == (
        200,
        {"status": "recorded", "resolved": False},
    )
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(dispatch, approver_assertion=signed)
    )
    assert status == 403 and answer["detail"] == "counter_regressed", answer
    gate.wait_for_line("event=approver_counter_regressed credential_id=" + credential_id)
    [(last_count,)] = rows(gate, "SELECT sign_count FROM approver_credentials")
    assert last_count > stored_count or last_count == stored_count == 0

    verify = run_cli("audit", "verify", "-c", str(gate.config), env=ENV)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    # the expired invite: waited on the gate's own answer, never a fixed sleep
    def expired() -> bool:
        if time.monotonic() < expiring_at:  # the gate's clock decides; this only spares GETs
            return False
        page.goto(expiring)
        return "expired" in page.inner_text("main")

    wait_until(expired, timeout=max(5.0, expiring_at - time.monotonic() + 30), what="expiry")
    assert page.query_selector("#create") is None
    page.screenshot(path=str(artifacts / "expired.png"))
    assert origin_post(expiring, b"{}", f"http://localhost:{port}") == 410
    assert len(rows(gate, "SELECT 1 FROM approver_credentials")) == 1
