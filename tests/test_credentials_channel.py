"""The credentials channel, gate side: ``POST /hitl/v0/credentials`` on the relay
listener of a real daemon, asked with real signed requests, answered with a signed body that
the relay-side ``verify_credentials_answer`` checks; keys enrolled and revoked through the
admin API, and the answer compared with the SQLite file.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gate.protocol.credentials import (
    CredentialsAnswer,
    build_credentials_request,
    verify_credentials_answer,
)
from gate.protocol.errors import ProtocolError
from tests.support import (
    API_TOKEN,
    OLD_SECRET,
    SECRET,
    Api,
    CaptureRelay,
    GateProcess,
    as_json,
    gate_env,
    http_request,
    sign_headers,
    write_config,
)

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = "test-admin-token-5d0c8b2e7a4f9136c1"
ENV = gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN)
ALICE, BOB = 101, 102


@pytest.fixture(scope="module")
def capture() -> Iterator[CaptureRelay]:
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory, capture: CaptureRelay) -> Iterator[Any]:
    """One daemon for the module, ``relay.credentials: true``, with the admin API."""
    config = write_config(
        tmp_path_factory.mktemp("cred"),
        capture.url,
        relay={"credentials": True},
        api={"admin_token_env": "HITL_ADMIN_TOKEN"},
    )
    proc = GateProcess(config, env=ENV).start()
    yield proc
    if proc.proc and proc.proc.poll() is None:
        proc.stop()


def url_of(gate: Any) -> str:
    return gate.callback_url.removesuffix("/hitl/v0/decisions") + "/hitl/v0/credentials"


def ask(
    url: str,
    body: bytes | None = None,
    *,
    secret: str = SECRET,
    t: int | None = None,
    header: str | None = None,
    extra: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    raw = build_credentials_request(int(time.time())) if body is None else body
    headers = sign_headers(raw, secret, t, header)
    headers.update(extra or {})
    return http_request(url, "POST", raw, headers)


def served(gate: Any, **kwargs: Any) -> tuple[CredentialsAnswer, dict[str, str], bytes]:
    status, headers, raw = ask(url_of(gate), **kwargs)
    assert status == 200, (status, raw)
    answer = verify_credentials_answer(
        raw, headers.get("x-draftcat-signature"), [SECRET], time.time(), 300
    )
    return answer, headers, raw


def admin(gate: Any) -> Api:
    return Api(gate.api_url, ADMIN_TOKEN)


def enrol(gate: Any, operator_id: int, label: str | None = None) -> dict[str, Any]:
    pem = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    body: dict[str, Any] = {"operator_id": operator_id, "type": "ed25519", "public_key": pem}
    if label:
        body["label"] = label
    status, view = admin(gate).call("POST", "/v1/admin/approvers", body)
    assert status == 201, view
    return view


def in_force_in_db(gate: Any) -> list[str]:
    conn = sqlite3.connect(f"file:{gate.config.parent / 'gate.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT credential_id FROM approver_credentials WHERE revoked_at IS NULL"
            " ORDER BY credential_id"
        ).fetchall()
    finally:
        conn.close()
    return [row[0] for row in rows]


def test_credentials_lists_keys_in_force_and_not_revoked_ones(gate: Any) -> None:
    kept = enrol(gate, ALICE, "Alice's laptop")
    other = enrol(gate, BOB)
    gone = enrol(gate, BOB, "lost phone")
    status, _ = admin(gate).call("POST", f"/v1/admin/approvers/{gone['credential_id']}/revoke")
    assert status == 200

    answer, headers, raw = served(gate)

    ids = [c.credential_id for c in answer.credentials]
    assert ids == in_force_in_db(gate)  # the SQLite file, by credential_id
    assert kept["credential_id"] in ids and other["credential_id"] in ids
    assert gone["credential_id"] not in ids
    alice = next(c for c in answer.credentials if c.credential_id == kept["credential_id"])
    assert (alice.operator_id, alice.identity, alice.type) == (
        ALICE,
        "alice@example.com",
        "ed25519",
    )
    assert (alice.public_key, alice.label) == (kept["public_key"], "Alice's laptop")
    assert headers["x-hitl-protocol"] == "hitl/v0"
    assert headers["content-type"].startswith("application/json")
    assert json.loads(raw)["type"] == "credentials"
    gate.wait_for_line(rf"event=credentials_served count={len(ids)}\b")
    assert kept["public_key"] not in gate.log()  # a key is data, not a log field


def test_credentials_names_the_relying_party_in_force(gate: Any) -> None:
    answer, _, _ = served(gate)
    # no relay.public_url and a loopback listener: the default relying party
    port = url_of(gate).rsplit(":", 1)[1].split("/")[0]
    assert answer.webauthn is not None
    assert (answer.webauthn.rp_id, answer.webauthn.origins) == (
        "localhost",
        (f"http://localhost:{port}",),
    )


def test_credentials_answer_is_signed_with_the_current_secret_only(gate: Any) -> None:
    # asked with the previous secret (a rotation under way): accepted, answered with the new
    _, headers, raw = served(gate, secret=OLD_SECRET)
    with pytest.raises(ProtocolError) as info:
        verify_credentials_answer(
            raw, headers["x-draftcat-signature"], [OLD_SECRET], time.time(), 300
        )
    assert info.value.code == "signature_mismatch"


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"header": ""}, "signature_missing"),
        ({"header": "t=now,v1=abc"}, "signature_malformed"),
        ({"t": 1}, "timestamp_out_of_window"),
        ({"secret": "another-secret-of-32-bytes-0000000"}, "signature_mismatch"),
    ],
    ids=["missing", "malformed", "window", "mismatch"],
)
def test_credentials_refuses_a_bad_signature_401(
    gate: Any, kwargs: dict[str, Any], reason: str
) -> None:
    status, headers, raw = ask(url_of(gate), **kwargs)
    assert (status, as_json(raw)) == (401, {"status": "unauthorized", "reason": reason})
    assert "x-draftcat-signature" not in headers
    gate.wait_for_line(rf"event=credentials_refused status=401 reason={reason}")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"[]", "json"),
        (b'{"protocol":"hitl/v0","type":"credentials","issued_at":"2026-01-01T00:00:00Z"}', "type"),
        (
            b'{"protocol":"hitl/v1","type":"credentials_request","issued_at":"2026-01-01T00:00:00Z"}',
            "protocol",
        ),
        (b'{"protocol":"hitl/v0","type":"credentials_request"}', "issued_at"),
    ],
    ids=["list", "answer_type", "protocol", "no_issued_at"],
)
def test_credentials_refuses_a_wrong_body_400(gate: Any, body: bytes, field: str) -> None:
    status, _, raw = ask(url_of(gate), body)
    answer = as_json(raw)
    assert status == 400
    assert (answer["status"], answer["reason"], answer["field"]) == (
        "invalid",
        f"invalid_{field}",
        field,
    )


def test_credentials_refuses_another_protocol_header_400(gate: Any) -> None:
    status, _, raw = ask(url_of(gate), extra={"X-Hitl-Protocol": "hitl/v1"})
    assert (status, as_json(raw)["reason"]) == (400, "invalid_protocol")


def test_credentials_refuses_a_body_over_64_kib_413(gate: Any) -> None:
    status, _, raw = ask(url_of(gate), b" " * (64 * 1024 + 1))
    assert (status, as_json(raw)) == (413, {"status": "invalid", "reason": "body_too_large"})


def test_credentials_are_not_on_the_api_listener(gate: Any) -> None:
    raw = build_credentials_request(int(time.time()))
    headers = sign_headers(raw) | {"Authorization": f"Bearer {API_TOKEN}"}  # a pipeline's
    status, _, body = http_request(gate.api_url + "/hitl/v0/credentials", "POST", raw, headers)
    assert (status, as_json(body)) == (404, {"status": "not_found", "reason": "not_found"})


def test_credentials_off_by_default_answers_404_until_a_reload_turns_it_on(
    tmp_path: Path, relay: CaptureRelay
) -> None:
    config = write_config(tmp_path, relay.url)
    proc = GateProcess(config).start()
    try:
        status, headers, raw = ask(url_of(proc))
        assert (status, as_json(raw)) == (404, {"status": "not_found", "reason": "not_found"})
        assert "x-draftcat-signature" not in headers
        assert "event=credentials" not in proc.log()

        write_config(tmp_path, relay.url, relay={"credentials": True})
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGHUP)
        proc.wait_for_line(r"event=reloaded ")
        answer, _, _ = served(proc)
        assert answer.credentials == ()
        proc.wait_for_line(r"event=credentials_served count=0\b")
    finally:
        proc.stop()


def test_a_reload_that_changes_the_relying_party_is_followed(
    tmp_path: Path, relay: CaptureRelay
) -> None:
    # the relying party is resolved once per config, not per decision: a reload must still
    # replace it (the answer names the one in force)
    config = write_config(tmp_path, relay.url, relay={"credentials": True})
    proc = GateProcess(config).start()
    try:
        first, _, _ = served(proc)
        assert first.webauthn is not None and first.webauthn.rp_id == "localhost"
        port = url_of(proc).rsplit(":", 1)[1].split("/")[0]
        origins = [f"http://localhost:{port}", "http://localhost:9"]
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
        data["webauthn"] = {"rp_id": "localhost", "origins": origins}
        config.write_text(yaml.safe_dump(data), encoding="utf-8")
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGHUP)
        proc.wait_for_line(r"event=reloaded ")
        second, _, _ = served(proc)
        assert second.webauthn is not None and list(second.webauthn.origins) == origins
    finally:
        proc.stop()
