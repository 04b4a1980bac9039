"""End-to-end lifecycle of the real daemon: real processes, real HTTP, a real SQLite file.

Every gate here is ``python -m gate serve`` in a subprocess; relays are the real reference
relay (``python -m gate relay``), the capturing relay of tests/support.py, or a small
redirecting HTTP server. Nothing is mocked; waits are conditions with deadlines or the
API's long-poll.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import shlex
import shutil
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.protocol import signing
from gate.protocol.errors import ProtocolError
from gate.store.schema import SCHEMA_VERSION
from tests.support import (
    API_TOKEN,
    OLD_SECRET,
    RECEIPT_KEY,
    SECRET,
    Api,
    CliProcess,
    GateProcess,
    decision_body,
    free_port,
    gate_env,
    http_request,
    post_decision,
    run_cli,
    sign_headers,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

# the shared draft text and its payload hash (H02, H12).
BATCH_DRAFT = "Café — naïve résumé 👍\n"
BATCH_HASH = "sha256:c0b8d811c2edb85cfa2cdeee45b1e680c3ee5c286d28c69150649868aa07dfdc"

# A non-ASCII invoice e-mail with CRLF, trailing blanks and no final newline normalisation.
INVOICE_MAIL = (
    "Betreff: Zahlungserinnerung – Rechnung Nr. 2026-114\r\n"
    "\r\n"
    "Guten Tag Frau Müller,  \n"
    "die Rechnung über 1.250,00 € ist seit dem 15.01. fällig. Café — naïve résumé 👍\n"
    "\tMit freundlichen Grüßen\n"
    "Łukasz Żółć · 東京\n\n"
)

ULID_RE = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
RFC3339_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def sha256_hash(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def epoch(rfc3339: str) -> float:
    """RFC 3339 ``...Z`` -> unix seconds."""
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def db_path(config: Path) -> Path:
    return config.parent / yaml.safe_load(config.read_text(encoding="utf-8"))["storage"]["path"]


def db_scalar(path: Path, sql: str) -> Any:
    """One value read from the SQLite file with the stdlib sqlite3 module (read-only)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def add_pipeline(config: Path, name: str, steps: list[dict[str, Any]]) -> Path:
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["pipelines"].append({"name": name, "steps": steps})
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return config


def start_reference_relay(clis: Callable[..., CliProcess], auto: str) -> tuple[CliProcess, str]:
    relay = clis(
        "relay", "--listen", "127.0.0.1:0", "--secret-env", "HITL_RELAY_SECRET", "--auto", auto
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    return relay, url


def acked(gate: GateProcess, approval_id: str) -> dict[str, Any]:
    """Wait until the gate has recorded the relay's ack of the dispatch; return the approval."""
    api = gate.api()
    return wait_until(
        lambda: (a := api.get(approval_id))["dispatch"]["delivered_at"] and a,
        what=f"dispatch ack of {approval_id}",
    )


# ---- happy path with the real reference relay ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("auto", "code", "outcome"),
    [("approve", 0, "approved"), ("skip", 3, "skipped"), ("adjust:New text", 0, "adjusted")],
)
def test_request_wait_through_reference_relay(tmp_path, spawn, clis, auto, code, outcome):
    relay, relay_url = start_reference_relay(clis, auto)
    config = write_config(tmp_path, relay_url)
    gate = spawn(config)

    proc = run_cli(
        "request",
        "-c",
        str(config),
        "--api-url",
        gate.api_url,
        "--pipeline",
        "p",
        "--step",
        "q1",
        "--draft-file",
        "-",
        "--wait",
        stdin=INVOICE_MAIL.encode("utf-8"),
    )
    stderr = proc.stderr.decode("utf-8")
    assert proc.returncode == code, stderr
    final_body = {"approved": INVOICE_MAIL, "skipped": None, "adjusted": "New text"}[outcome]
    assert proc.stdout == (final_body or "").encode("utf-8")
    assert "Traceback" not in stderr

    lines = stderr.splitlines()
    approval_id = re.fullmatch(
        rf"requested approval ({ULID_RE.pattern}) for p/q1 \(quorum 1, "
        rf"{re.escape(sha256_hash(INVOICE_MAIL))}\)",
        lines[0],
    ).group(1)
    verb = auto.partition(":")[0]
    final_rev, final_hash = (
        (2, sha256_hash("New text")) if verb == "adjust" else (1, sha256_hash(INVOICE_MAIL))
    )
    expected = [
        # the ack is normally recorded first; under load the decision may overtake it
        r"dispatched revision 1 to the relay \((attempt 1, acked "
        + RFC3339_Z.pattern
        + r"|decision arrived before the ack was recorded)\)",
        rf"decision {verb} by alice@example\.com \(operator 101, revision 1, via auto\)",
        rf"resolved: {outcome} \(revision {final_rev}, {re.escape(final_hash)}\)",
        r"receipt: audit entry \d+ hmac-sha256=[0-9a-f]{64}",
    ]
    assert len(lines) == 1 + len(expected), stderr
    for pattern, line in zip(expected, lines[1:], strict=True):
        assert re.fullmatch(pattern, line), (pattern, line)

    approval = gate.api().get(approval_id)
    assert (approval["state"], approval["outcome"], approval["final_body"]) == (
        "resolved",
        outcome,
        final_body,
    )
    assert approval["payload_hash"] == final_hash
    assert [(d["identity"], d["decision"], d["channel"]) for d in approval["decisions"]] == [
        ("alice@example.com", verb, "auto")
    ]
    assert re.search(
        rf"event=decision_sent approval_id={approval_id} "
        rf"approver=alice@example.com decision={verb} answer=200",
        relay.log(),
    )
    assert relay.stop() == 0  # SPEC §4: the reference relay exits 0 on SIGTERM


@pytest.mark.slow
def test_request_wait_reports_each_decision_of_a_quorum_as_it_lands(gate, relay, clis):
    """Regression (new-user review): with quorum 2, ``request --wait`` printed the first
    decision only when its 60 s long-poll chunk ended (the gate's long-poll wakes on the
    resolution only, SPEC §3). Each decision must be reported while the others are awaited."""
    cli = clis(
        "request",
        "-c",
        str(gate.config),
        "--api-url",
        gate.api_url,
        "--pipeline",
        "p",
        "--step",
        "q2",
        "--draft",
        "Zwei Freigaben, bitte: 1.250,00 €",
        "--wait",
    )
    approval_id = cli.wait_for_line(rf"requested approval ({ULID_RE.pattern})").group(1)
    dispatch = relay.wait_dispatch(approval_id)
    cli.wait_for_line(r"dispatched revision 1 to the relay \(attempt 1, acked")  # now waiting
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
    assert (status, answer) == (200, {"status": "recorded", "resolved": False})
    # well inside the 60 s chunk: only a prompt report can pass
    cli.wait_for_line(r"decision approve by alice@example\.com \(operator 101", timeout=10)
    assert "resolved:" not in cli.log()
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, "bob@example.com"))
    assert (status, answer["outcome"]) == (200, "approved")
    code, out, err = cli.finish()
    assert code == 0, err
    assert out == "Zwei Freigaben, bitte: 1.250,00 €".encode()
    assert err.count("decision approve by") == 2, err


@pytest.mark.slow
def test_request_interrupted_prints_a_cancel_command_that_runs_as_printed(gate, relay, clis):
    """Regression (new-user review): the Ctrl-C hint said ``hitl-gate cancel ID`` without the
    config, which fails with "Missing option '-c'". The printed command must work as is."""
    cli = clis(
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
        "Bitte nicht senden",
        "--wait",
    )
    approval_id = cli.wait_for_line(rf"requested approval ({ULID_RE.pattern})").group(1)
    relay.wait_dispatch(approval_id)
    cli.proc.send_signal(signal.SIGINT)
    code, out, err = cli.finish()
    assert code == 130, err
    command = re.search(r"cancel it with: (.+)\)$", err, re.MULTILINE).group(1)
    words = shlex.split(command)
    assert words[:2] == ["hitl-gate", "cancel"] and words[-1] == approval_id, words
    done = run_cli(*words[1:])
    assert done.returncode == 0, done.stderr
    approval = gate.api().get(approval_id)
    assert (approval["state"], approval["outcome"]) == ("resolved", "cancelled")


@pytest.mark.slow
def test_terminal_relay_shows_the_quorum_collected_so_far(tmp_path, spawn, clis):
    """Regression (new-user review): with ``--as alice --as bob`` on a quorum-2 step, bob's
    prompt still read ``quorum 0/2`` after alice's approve was recorded."""
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        "alice@example.com",
        "--as",
        "bob@example.com",
        stdin=b"a\na\n",
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    gate = spawn(write_config(tmp_path, url))
    approval_id = gate.api().create("q2", "Zwei Stimmen")["approval_id"]
    wait_until(
        lambda: gate.api().get(approval_id)["state"] == "resolved",
        what="the terminal relay's two approvals",
    )
    assert gate.api().get(approval_id)["outcome"] == "approved"
    assert relay.stop() == 0
    shown = re.findall(r"approvals: (\d) of 2 collected .* you are (\S+)", relay.stdout.decode())
    assert shown == [("0", "alice@example.com"), ("1", "bob@example.com")], relay.stdout


@pytest.mark.slow
def test_terminal_relay_shows_control_and_invisible_characters_of_a_draft(tmp_path, spawn, clis):
    """Security review: a draft of ``"Transfer 12000 EUR to ATTACKER\r\x1b[2KTransfer 12 EUR to
    ACME"`` showed on a terminal as the second sentence only (carriage return, then "erase
    line"), and the human approved the first. Every control, format (bidi, zero-width) and
    line-separator character is shown as a visible ``<U+XXXX>`` mark, with a warning; what is
    approved is still the draft exactly as sent."""
    draft = (
        "Transfer 12000.00 EUR to ATTACKER\r\x1b[2KTransfer 12.00 EUR to ACME\n"
        "tab\tkept \u202eevil\u202c zero\u200bwidth \u2028 del\x7f c1\x9b end\n"
    )
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        "alice@example.com",
        stdin=b"a\n",
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    gate = spawn(write_config(tmp_path, url))
    approval_id = gate.api().create("q1", draft)["approval_id"]
    wait_until(
        lambda: gate.api().get(approval_id)["state"] == "resolved",
        what="the terminal relay's approve",
    )
    assert gate.api().get(approval_id)["final_body"] == draft
    assert relay.stop() == 0
    shown = relay.stdout.decode()
    assert (
        "\u2502 Transfer 12000.00 EUR to ATTACKER<U+000D><U+001B>[2KTransfer 12.00 EUR to ACME\n"
        "\u2502 tab\tkept <U+202E>evil<U+202C> zero<U+200B>width <U+2028> del<U+007F> c1<U+009B> "
        "end\n"
    ) in shown, shown
    assert "warning: the draft holds 8 control or invisible characters" in shown, shown
    for raw in ("\r", "\x1b", "\u202e", "\u200b", "\u2028", "\x7f", "\x9b"):
        assert raw not in shown, repr(raw)


@pytest.mark.slow
def test_terminal_relay_says_when_the_gate_did_not_record_an_answer(tmp_path, spawn, clis):
    """Pipeline-author review: a human whose answer the gate refused saw it only in the
    relay's log, and a dispatch queued behind a prompt was still shown after its expiry. The
    terminal now says whether each answer was recorded, and skips a dispatch that expired
    before its turn. (A prompt is withdrawn at its own expiry, so the
    refused answer here is one to an approval cancelled while its prompt waited.)"""
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        "alice@example.com",
        stdin=b"",
        keep_stdin=True,
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    gate = spawn(write_config(tmp_path, url))
    api = gate.api()
    first = api.create("q1", "Erste Frage")["approval_id"]
    relay.wait_for_line(rf"event=dispatch_received approval_id={first}")
    second = api.create("short", "Zweite Frage")["approval_id"]  # queued; times out after 3 s
    wait_until(lambda: api.get(second)["dispatch"]["delivered_at"], 10, "the second ack")
    wait_until(lambda: api.get(second)["state"] == "resolved", 10, f"the expiry of {second}")
    status, _ = api.call("POST", f"/v1/approvals/{first}/cancel")
    assert status == 200
    relay.send(b"a\n", close=True)  # the answer to the first prompt comes too late
    relay.wait_for_line(rf"event=decision_sent approval_id={first} .* answer=409")
    relay.wait_for_line(rf"event=dispatch_stale approval_id={second} ")
    assert relay.stop() == 0
    shown = relay.stdout.decode()
    assert "Erste Frage" in shown and "Zweite Frage" not in shown, shown
    assert (
        "The gate did not record your approve: already_resolved (HTTP 409); the approval "
        "was already resolved: cancelled."
    ) in shown, shown
    assert f"Approval {second} expired at " in shown, shown
    assert "before its turn; not shown." in shown, shown


@pytest.mark.slow
def test_terminal_relay_says_when_no_identity_of_its_own_may_decide(tmp_path, spawn, clis):
    """New-user review: ``relay --as carol`` for a step carol is no approver of acked the
    dispatch and only logged ``event=not_in_scope``: the human saw nothing while the
    pipeline waited for the step's timeout."""
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        "zoe@example.com",
        stdin=b"",
        keep_stdin=True,
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    gate = spawn(write_config(tmp_path, url))
    approval_id = gate.api().create("q1", "Nicht für zoe")["approval_id"]
    relay.wait_for_line(rf"event=not_in_scope identity=zoe@example\.com approval_id={approval_id}")
    assert relay.stop() == 0
    shown = relay.stdout.decode()
    assert (
        f"Approval {approval_id}: none of zoe@example.com is among its approvers "
        "(alice@example.com, bob@example.com, carol@example.com); not shown"
    ) in shown, shown
    assert "Nicht für zoe" not in shown


@pytest.mark.slow
def test_reference_relay_names_what_a_dispatch_lacks(clis):
    """Regression (new-user review): a signed dispatch of just ``{"protocol": "hitl/v0"}``
    was refused ``payload_hash_mismatch``; the relay now names the missing field."""
    relay, url = start_reference_relay(clis, "approve")
    full = {
        "protocol": "hitl/v0",
        "approval_id": "01KDWZ8B00J3Q9V5X7Z2M4N6PR",
        "payload_hash": sha256_hash("Hallo"),
        "draft": {"body": "Hallo"},
        "callback": {"url": "http://127.0.0.1:9/hitl/v0/decisions", "nonce": "a" * 32},
        "approvers": ["alice@example.com"],
    }
    cases = [
        ({"protocol": "hitl/v0"}, "approval_id"),
        ({**full, "draft": {"content_type": "text/plain"}}, "draft.body"),
        ({**full, "callback": {"url": full["callback"]["url"]}}, "callback.nonce"),
        ({**full, "approvers": "alice@example.com"}, "approvers"),
    ]
    for envelope, field in cases:
        raw = json.dumps(envelope).encode()
        status, _, answer = http_request(url, "POST", raw, sign_headers(raw))
        assert (status, json.loads(answer)) == (
            400,
            {"status": "invalid", "reason": "invalid_dispatch", "field": field},
        ), envelope
    raw = json.dumps({**full, "payload_hash": sha256_hash("Hallo!")}).encode()
    status, _, answer = http_request(url, "POST", raw, sign_headers(raw))
    assert (status, json.loads(answer)["reason"]) == (400, "payload_hash_mismatch")
    assert relay.stop() == 0


# ---- H02: the bytes on the wire are the bytes signed ------------------------------------


def test_case_h02_dispatch_bytes_are_signed_and_unescaped(gate, relay):
    assert sha256_hash(BATCH_DRAFT) == BATCH_HASH
    before = int(time.time())
    approval = gate.api().create("q1", BATCH_DRAFT, run_id="run-h02")
    approval_id = approval["approval_id"]
    envelope = relay.wait_dispatch(approval_id)
    (record,) = relay.raw_for(approval_id)
    raw, headers = record["raw"], record["headers"]

    header = headers["X-Draftcat-Signature"]
    assert re.fullmatch(r"t=\d+,v1=[0-9a-f]{64}", header), header
    parsed = signing.verify(header, raw, [SECRET], time.time(), 300)
    assert before - 1 <= parsed.t <= time.time() + 1
    assert parsed.v1 == (signing.compute(SECRET, parsed.t, raw),)
    with pytest.raises(ProtocolError) as info:
        signing.verify(header, raw, [OLD_SECRET], time.time(), 300)
    assert info.value.code == "signature_mismatch"
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    assert headers["X-Hitl-Protocol"] == "hitl/v0"

    # the draft travels as raw UTF-8, not \u escapes, and decodes to the original exactly
    assert "Café — naïve résumé 👍".encode() in raw
    assert b"\\u" not in raw
    assert json.loads(raw) == envelope
    assert envelope["draft"] == {"content_type": "text/plain", "body": BATCH_DRAFT}
    assert envelope["payload_hash"] == BATCH_HASH == approval["payload_hash"]

    assert {
        "protocol",
        "approval_id",
        "run_id",
        "pipeline",
        "step",
        "issued_at",
        "expires_at",
        "risk",
        "quorum",
        "approvers",
        "payload_hash",
        "draft",
        "actions",
        "callback",
    } <= set(envelope)
    assert "budget" not in envelope  # no cap configured
    assert envelope["protocol"] == "hitl/v0"
    assert envelope["approval_id"] == approval_id and ULID_RE.fullmatch(approval_id)
    assert (envelope["run_id"], envelope["pipeline"], envelope["step"]) == ("run-h02", "p", "q1")
    assert RFC3339_Z.fullmatch(envelope["issued_at"])
    assert RFC3339_Z.fullmatch(envelope["expires_at"])
    assert (envelope["issued_at"], envelope["expires_at"]) == (
        approval["created_at"],
        approval["expires_at"],
    )
    assert epoch(envelope["expires_at"]) - epoch(envelope["issued_at"]) == 3600
    assert envelope["risk"] == "normal"
    assert envelope["quorum"] == {"required": 1, "collected": 0}
    assert envelope["approvers"] == ["alice@example.com", "bob@example.com", "carol@example.com"]
    assert envelope["actions"] == [
        {"verb": "approve"},
        {"verb": "skip"},
        {"verb": "adjust", "accepts": "text"},
    ]
    assert set(envelope["callback"]) == {"url", "nonce"}
    assert envelope["callback"]["url"] == gate.callback_url
    assert re.fullmatch(r"[0-9a-f]{32}", envelope["callback"]["nonce"])


# ---- expiry (H13) ----------------------------------------------------------------------------


@pytest.mark.slow
def test_case_h13_expiry_exits_4_and_late_decision_is_410(gate, relay, clis):
    cli = clis(
        "request",
        "-c",
        str(gate.config),
        "--api-url",
        gate.api_url,
        "--pipeline",
        "p",
        "--step",
        "short",
        "--draft",
        "expires in 3 s",
        "--wait",
    )
    approval_id = cli.wait_for_line(rf"requested approval ({ULID_RE.pattern})").group(1)
    dispatch = relay.wait_dispatch(approval_id)

    final = gate.api().wait_resolved(approval_id, timeout=15)
    assert (final["state"], final["outcome"], final["final_body"]) == ("resolved", "timeout", None)
    assert final["decisions"] == []
    assert epoch(final["resolved_at"]) >= epoch(final["expires_at"])
    assert final["receipt"] is not None

    code, stdout, stderr = cli.finish()
    assert code == 4, stderr
    assert stdout == b""
    assert re.search(r"^resolved: timeout \(revision 1, ", stderr, re.M), stderr

    # H13: a fresh, validly signed decision after the gate's own clock expired it
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
    assert (status, answer) == (410, {"status": "expired", "reason": "expired"})
    assert gate.api().get(approval_id) == final


# ---- relay down, relay redirecting --------------------------------------------------------


def test_relay_down_then_up_dispatch_is_retried_until_acked(gate, relay):
    relay.status = 503
    approval_id = gate.api().create("q1", "retry me")["approval_id"]
    wait_until(lambda: len(relay.raw_for(approval_id)) >= 2, what="two refused attempts")
    # the relay sees an attempt before the gate has recorded it: wait for the record
    pending = wait_until(
        lambda: (a := gate.api().get(approval_id))["dispatch"]["attempts"] >= 2 and a,
        what="two attempts recorded",
    )
    assert pending["dispatch"]["delivered_at"] is None
    assert pending["dispatch"]["attempts"] >= 2
    assert pending["dispatch"]["last_error"] == "relay answered HTTP 503"

    relay.status = 202
    approval = acked(gate, approval_id)
    assert approval["dispatch"]["attempts"] >= 3
    assert approval["dispatch"]["last_error"] is None
    assert approval["state"] == "pending"
    records = relay.raw_for(approval_id)
    assert [r["status"] for r in records][:2] == [503, 503]
    assert records[-1]["status"] == 202
    # every retry carries the same envelope (same nonce, same bytes), freshly signed
    assert len({r["raw"] for r in records}) == 1
    for r in records:
        signing.verify(r["headers"]["X-Draftcat-Signature"], r["raw"], [SECRET], time.time(), 300)
    # and the acked dispatch is usable
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(relay.wait_dispatch(approval_id))
    )
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )


@pytest.mark.slow
def test_dispatch_never_acked_ends_as_timeout(gate, relay):
    relay.status = 503
    approval_id = gate.api().create("short", "nobody will ever see this")["approval_id"]
    final = gate.api().wait_resolved(approval_id, timeout=15)
    assert (final["state"], final["outcome"], final["final_body"]) == ("resolved", "timeout", None)
    assert final["dispatch"]["delivered_at"] is None
    assert final["dispatch"]["attempts"] >= 2
    assert final["dispatch"]["last_error"] == "relay answered HTTP 503"
    assert relay.dispatches() == []


class RedirectRelay:
    """A relay that answers every POST with ``status`` and ``Location: location``."""

    def __init__(self, status: int, location: str) -> None:
        self.hits: list[tuple[str, str]] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with lock:
                    outer.hits.append((self.command, self.path))
                self.send_response(status)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = _answer  # noqa: N815
            do_GET = _answer  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/relay"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.mark.slow
@pytest.mark.parametrize("status", [302, 307])
def test_redirect_is_not_an_ack_and_is_not_followed(tmp_path, relay, spawn, status):
    redirect = RedirectRelay(status, relay.url)
    try:
        gate = spawn(write_config(tmp_path, redirect.url))
        approval_id = gate.api().create("q1", "where am I going?")["approval_id"]
        wait_until(lambda: len(redirect.hits) >= 3, what="three attempts answered with redirect")
        approval = wait_until(
            lambda: (a := gate.api().get(approval_id))["dispatch"]["attempts"] >= 3 and a,
            what="three attempts recorded",
        )
        assert approval["state"] == "pending"
        assert approval["dispatch"]["delivered_at"] is None
        assert approval["dispatch"]["last_error"] == f"relay answered HTTP {status}"
        assert {hit[0] for hit in redirect.hits} == {"POST"}
        assert relay.received == []  # the Location was never visited
    finally:
        redirect.stop()


# ---- kill -9 and restart ------------------------------------------------------------------


def test_kill9_keeps_pending_quorum_and_expiry(gate, relay, spawn):
    api = gate.api()
    approval_id = api.create("q2", "two of us must agree")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(dispatch, "alice@example.com")
    )
    assert (status, answer) == (200, {"status": "recorded", "resolved": False})
    before = api.get(approval_id)
    assert before["quorum"] == {"required": 2, "collected": 1}

    gate.kill9()
    restarted = spawn(gate.config)
    after = restarted.api().get(approval_id)
    assert after["state"] == "pending"
    assert after["quorum"] == {"required": 2, "collected": 1}
    assert after["expires_at"] == before["expires_at"]
    assert after["created_at"] == before["created_at"]
    assert after["decisions"] == before["decisions"]
    assert after["payload_hash"] == before["payload_hash"]

    status, answer, _ = post_decision(
        restarted.callback_url, decision_body(dispatch, "bob@example.com")
    )
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    final = restarted.api().get(approval_id)
    assert (final["state"], final["outcome"], final["final_body"]) == (
        "resolved",
        "approved",
        "two of us must agree",
    )
    assert [d["identity"] for d in final["decisions"]] == ["alice@example.com", "bob@example.com"]

    proc = run_cli("audit", "verify", "-c", str(gate.config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.decode().startswith("ok: ")


def test_kill9_unacked_dispatch_is_resent_after_restart(gate, relay, spawn):
    relay.status = 503
    approval_id = gate.api().create("q1", "never acked before the crash")["approval_id"]
    # the relay sees an attempt before the gate records it: wait for the record (flaky
    # audit: killed in between, 8 runs in 20 under load restarted with attempts 0)
    wait_until(
        lambda: gate.api().get(approval_id)["dispatch"]["attempts"] >= 1,
        what="a refused attempt recorded",
    )
    gate.kill9()
    killed_at = time.time()
    assert relay.dispatches() == []

    relay.status = 202
    restarted = spawn(gate.config)
    envelope = relay.wait_dispatch(approval_id)
    assert envelope["callback"]["url"] == restarted.callback_url
    assert [r for r in relay.raw_for(approval_id) if r["status"] == 202][0]["at"] > killed_at
    approval = acked(restarted, approval_id)
    assert approval["state"] == "pending"
    assert approval["dispatch"]["attempts"] >= 2
    status, answer, _ = post_decision(restarted.callback_url, decision_body(envelope))
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )


@pytest.mark.slow
def test_kill9_expired_while_down_resolves_timeout_on_restart(gate, relay, spawn):
    approval = gate.api().create("short", "expires while the gate is down")
    approval_id = approval["approval_id"]
    relay.wait_dispatch(approval_id)
    gate.kill9()
    assert time.time() < epoch(approval["expires_at"])  # killed while still pending
    deadline = epoch(approval["expires_at"])
    wait_until(lambda: time.time() > deadline + 0.2, timeout=10, what="expires_at to pass")

    restarted = spawn(gate.config)
    final = restarted.api().wait_resolved(approval_id, timeout=5)
    assert (final["state"], final["outcome"], final["final_body"]) == ("resolved", "timeout", None)
    assert final["expires_at"] == approval["expires_at"]
    assert epoch(final["resolved_at"]) > deadline


# ---- pipeline API ---------------------------------------------------------------------------


def test_api_auth(gate):
    for path in ("/v1/approvals", "/v1/approvals/01ARZ3NDEKTSV4RRFFQ69G5FAV"):
        assert Api(gate.api_url, None).call("GET", path) == (
            401,
            {"status": "unauthorized", "reason": "token_missing"},
        )
        assert Api(gate.api_url, API_TOKEN + "x").call("GET", path) == (
            401,
            {"status": "unauthorized", "reason": "token_invalid"},
        )
    assert Api(gate.api_url, None).call(
        "GET", "/v1/approvals", headers={"Authorization": f"Basic {API_TOKEN}"}
    ) == (401, {"status": "unauthorized", "reason": "token_missing"})
    body = {"pipeline": "p", "step": "q1", "draft": {"body": "x"}}
    assert Api(gate.api_url, "wrong").call("POST", "/v1/approvals", body) == (
        401,
        {"status": "unauthorized", "reason": "token_invalid"},
    )
    assert Api(gate.api_url, None).call("GET", "/healthz") == (
        200,
        {"status": "ok", "schema_version": SCHEMA_VERSION},
    )
    assert gate.api().call("GET", "/v1/approvals?state=all") == (
        200,
        {"items": [], "next_cursor": None},
    )

    # the pipeline credential cannot decide: the callback wants a relay signature
    status, _, raw = http_request(
        gate.callback_url, "POST", b"{}", {"Authorization": f"Bearer {API_TOKEN}"}
    )
    assert (status, json.loads(raw)) == (
        401,
        {"status": "unauthorized", "reason": "signature_missing"},
    )


def test_api_idempotency_key(gate, relay):
    api = gate.api()
    body = {
        "pipeline": "p",
        "step": "q1",
        "run_id": "r1",
        "draft": {"content_type": "text/plain", "body": "Once only ✓"},
    }
    status, first = api.call("POST", "/v1/approvals", body, headers={"Idempotency-Key": "k-1"})
    assert status == 201
    status, again = api.call("POST", "/v1/approvals", body, headers={"Idempotency-Key": "k-1"})
    assert status == 200
    assert again["approval_id"] == first["approval_id"]
    other = dict(body, draft={"content_type": "text/plain", "body": "Once only ✗"})
    assert api.call("POST", "/v1/approvals", other, headers={"Idempotency-Key": "k-1"}) == (
        409,
        {"status": "conflict", "reason": "idempotency_key_reused"},
    )
    status, page = api.call("GET", "/v1/approvals?state=all")
    assert [a["approval_id"] for a in page["items"]] == [first["approval_id"]]
    relay.wait_dispatch(first["approval_id"])
    assert len(relay.raw_for(first["approval_id"])) == 1

    # racing retries with a fresh key: exactly one 201, every answer the same approval
    answers: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def post() -> None:
        answer = api.call("POST", "/v1/approvals", body, headers={"Idempotency-Key": "k-race"})
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=post) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(status for status, _ in answers) == [200] * 7 + [201]
    assert len({answer["approval_id"] for _, answer in answers}) == 1
    assert db_scalar(db_path(gate.config), "SELECT COUNT(*) FROM approvals") == 2


def test_api_unknown_pipeline_or_step(gate):
    api = gate.api()
    assert api.call(
        "POST", "/v1/approvals", {"pipeline": "nope", "step": "q1", "draft": {"body": "x"}}
    ) == (404, {"status": "not_found", "reason": "unknown_pipeline"})
    assert api.call(
        "POST", "/v1/approvals", {"pipeline": "p", "step": "nope", "draft": {"body": "x"}}
    ) == (404, {"status": "not_found", "reason": "unknown_step"})
    assert api.call("GET", "/v1/approvals/01ARZ3NDEKTSV4RRFFQ69G5FAV") == (
        404,
        {"status": "not_found", "reason": "unknown_approval"},
    )


OK_DRAFT = {"content_type": "text/plain", "body": "x"}


BAD_BODIES: list[tuple[bytes | dict[str, Any], str]] = [
    (b"not json", "json"),
    (b"[1, 2]", "json"),
    (b'{"pipeline": "p", "pipeline": "p"}', "json"),
    ({"step": "q1", "draft": OK_DRAFT}, "pipeline"),
    ({"pipeline": 7, "step": "q1", "draft": OK_DRAFT}, "pipeline"),
    ({"pipeline": "  ", "step": "q1", "draft": OK_DRAFT}, "pipeline"),
    ({"pipeline": "p", "draft": OK_DRAFT}, "step"),
    ({"pipeline": "p", "step": "q1"}, "draft"),
    ({"pipeline": "p", "step": "q1", "draft": "x"}, "draft"),
    ({"pipeline": "p", "step": "q1", "draft": {"content_type": "text/plain"}}, "draft.body"),
    ({"pipeline": "p", "step": "q1", "draft": {"body": 5}}, "draft.body"),
    (
        {"pipeline": "p", "step": "q1", "draft": {"body": "x", "content_type": ""}},
        "draft.content_type",
    ),
    ({"pipeline": "p", "step": "q1", "draft": OK_DRAFT, "spend": -1}, "spend"),
    ({"pipeline": "p", "step": "q1", "draft": OK_DRAFT, "spend": "3"}, "spend"),
    ({"pipeline": "p", "step": "q1", "draft": OK_DRAFT, "spend": True}, "spend"),
    # two of these summed to infinity in the day's budget: every dispatch after them failed
    # to encode (security review); a spend above 1e15 is refused
    ({"pipeline": "p", "step": "q1", "draft": OK_DRAFT, "spend": 1.7e308}, "spend"),
    ({"pipeline": "p", "step": "q1", "draft": OK_DRAFT, "spend": 1e15 * 1.0000001}, "spend"),
    ({"pipeline": "p", "step": "q1", "draft": OK_DRAFT, "run_id": 42}, "run_id"),
]


def test_api_bad_bodies_are_400_naming_the_field(gate):
    api = gate.api()
    for body, field in BAD_BODIES:  # one gate for all cases: each answer is checked exactly
        status, answer = api.call("POST", "/v1/approvals", body)
        message = answer.pop("message", None)  # every 400 of the pipeline API says why
        assert (status, answer) == (
            400,
            {"status": "invalid", "reason": f"invalid_{field}", "field": field},
        ), body
        assert isinstance(message, str) and message.strip() and "Traceback" not in message
    assert api.call("GET", "/v1/approvals?state=all") == (200, {"items": [], "next_cursor": None})
    assert db_scalar(db_path(gate.config), "SELECT COUNT(*) FROM approvals") == 0


def test_h16_oversized_draft_is_413_and_nothing_stored(gate):
    api = gate.api()
    db = db_path(gate.config)
    # H16, callback side: a 2 MB decision body is refused before anything else. (First, so
    # the server's lingering read of the unread body is over long before the teardown stop.)
    raw = b"{" + b" " * 2_000_000 + b"}"
    status, _, answer = http_request(gate.callback_url, "POST", raw, sign_headers(raw))
    assert (status, json.loads(answer)) == (413, {"status": "invalid", "reason": "body_too_large"})

    for body in ("a" * (1048576 + 1), "é" * 524288 + "a"):  # 1 MiB + 1 byte (ASCII, 2-byte)
        assert len(body.encode("utf-8")) == 1048577
        assert api.call(
            "POST", "/v1/approvals", {"pipeline": "p", "step": "q1", "draft": {"body": body}}
        ) == (413, {"status": "invalid", "reason": "draft_too_large"})
    assert api.call("GET", "/v1/approvals?state=all") == (200, {"items": [], "next_cursor": None})
    for table in ("approvals", "revisions", "outbox", "audit_log"):
        assert db_scalar(db, f"SELECT COUNT(*) FROM {table}") == 0, table

    # the boundary itself is accepted, and stored untruncated
    exact = "é" * 524287 + "ab"
    created = api.create("q1", exact)
    assert created["payload_hash"] == sha256_hash(exact)
    assert db_scalar(db, "SELECT length(CAST(body AS BLOB)) FROM revisions") == 1048576


@pytest.mark.slow
def test_api_long_poll(gate, relay):
    api = gate.api()
    approval_id = api.create("q1", "wait for me")["approval_id"]
    assert api.get(approval_id, wait=2)["state"] == "pending"
    for bad, said in (
        ("301", "wait must be between 0 and 300 seconds"),
        ("-1", "wait must be between 0 and 300 seconds"),
        ("soon", "wait must be a number of seconds"),
        ("nan", "wait must be a number of seconds"),
    ):
        assert api.call("GET", f"/v1/approvals/{approval_id}?wait={bad}") == (
            400,
            {"status": "invalid", "reason": "invalid_wait", "field": "wait", "message": said},
        )

    # a long-poll in progress is woken by the resolution
    result: dict[str, Any] = {}
    poller = threading.Thread(
        target=lambda: result.update(api.get(approval_id, wait=60)), daemon=True
    )
    poller.start()
    dispatch = relay.wait_dispatch(approval_id)
    status, _, _ = post_decision(gate.callback_url, decision_body(dispatch))
    assert status == 200
    poller.join(15)
    assert not poller.is_alive()
    assert (result["state"], result["outcome"]) == ("resolved", "approved")
    # resolved: answers at once
    assert api.get(approval_id, wait=300)["outcome"] == "approved"


def test_api_list_filters_and_paging(tmp_path, relay, spawn):
    config = add_pipeline(
        write_config(tmp_path, relay.url),
        "p2",
        [{"name": "s", "quorum": 1, "approvers": [101], "timeout": "1h"}],
    )
    gate = spawn(config)
    api = gate.api()
    p_ids = [api.create("q1", f"p draft {i}")["approval_id"] for i in range(7)]
    p2_ids = [api.create("s", f"p2 draft {i}", pipeline="p2")["approval_id"] for i in range(3)]
    cancelled = {p_ids[1], p_ids[4], p2_ids[0]}
    for approval_id in cancelled:
        assert api.call("POST", f"/v1/approvals/{approval_id}/cancel")[0] == 200

    def walk(query: str, limit: int) -> list[str]:
        seen: list[str] = []
        cursor = ""
        for _ in range(20):
            status, page = api.call(
                "GET",
                f"/v1/approvals?{query}&limit={limit}" + (f"&cursor={cursor}" if cursor else ""),
            )
            assert status == 200, page
            assert len(page["items"]) <= limit
            seen += [a["approval_id"] for a in page["items"]]
            if page["next_cursor"] is None:
                return seen
            assert len(page["items"]) == limit
            cursor = page["next_cursor"]
        raise AssertionError("paging did not end")

    everything = set(p_ids + p2_ids)
    for limit in (1, 3, 10, 500):
        ids = walk("state=all", limit)
        assert len(ids) == len(set(ids)) == 10 and set(ids) == everything
        assert ids == sorted(ids)
    assert set(walk("state=pending", 3)) == everything - cancelled
    assert len(walk("state=pending", 3)) == 7
    assert set(walk("state=resolved", 2)) == cancelled
    assert len(walk("state=resolved", 2)) == 3
    assert set(walk("state=all&pipeline=p2", 2)) == set(p2_ids)
    assert set(walk("state=pending&pipeline=p2", 1)) == set(p2_ids) - cancelled
    assert set(walk("state=resolved&pipeline=p", 5)) == {p_ids[1], p_ids[4]}
    assert walk("state=all&pipeline=nope", 5) == []

    status, page = api.call("GET", "/v1/approvals?state=pending&pipeline=p2")
    assert status == 200 and page["next_cursor"] is None
    assert {(a["pipeline"], a["state"]) for a in page["items"]} == {("p2", "pending")}
    assert api.call("GET", "/v1/approvals?state=open") == (
        400,
        {
            "status": "invalid",
            "reason": "invalid_state",
            "field": "state",
            "message": "state must be pending, resolved or all",
        },
    )
    for limit, said in (
        ("0", "limit must be between 1 and 500"),
        ("501", "limit must be between 1 and 500"),
        ("ten", "limit must be an integer"),
    ):
        assert api.call("GET", f"/v1/approvals?limit={limit}") == (
            400,
            {"status": "invalid", "reason": "invalid_limit", "field": "limit", "message": said},
        )
    # Regression (new-user review): ``cursor=garbage`` answered an empty page, 200
    for cursor in ("garbage", p_ids[0].lower(), p_ids[0] + "0", "%20" + p_ids[0]):
        status, answer = api.call("GET", f"/v1/approvals?state=all&cursor={cursor}")
        assert (status, answer["reason"], answer["field"]) == (400, "invalid_cursor", "cursor"), (
            cursor
        )


def test_api_cancel(gate, relay):
    api = gate.api()
    approval_id = api.create("q1", "withdrawn")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    status, answer = api.call("POST", f"/v1/approvals/{approval_id}/cancel")
    assert status == 200
    assert (answer["approval_id"], answer["state"], answer["outcome"], answer["final_body"]) == (
        approval_id,
        "resolved",
        "cancelled",
        None,
    )
    assert answer["receipt"] is not None
    assert api.call("POST", f"/v1/approvals/{approval_id}/cancel") == (
        409,
        {"status": "conflict", "reason": "already_resolved", "outcome": "cancelled"},
    )
    assert api.call("POST", "/v1/approvals/01ARZ3NDEKTSV4RRFFQ69G5FAV/cancel") == (
        404,
        {"status": "not_found", "reason": "unknown_approval"},
    )
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
    assert (status, answer) == (
        409,
        {"status": "already_resolved", "reason": "already_resolved", "outcome": "cancelled"},
    )


def test_request_wait_exits_5_when_cancelled_elsewhere(gate, relay, clis):
    cli = clis(
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
        "cancel me",
        "--wait",
    )
    approval_id = cli.wait_for_line(rf"requested approval ({ULID_RE.pattern})").group(1)
    relay.wait_dispatch(approval_id)
    status, answer = gate.api().call("POST", f"/v1/approvals/{approval_id}/cancel")
    assert (status, answer["outcome"]) == (200, "cancelled")
    code, stdout, stderr = cli.finish()
    assert code == 5, stderr
    assert stdout == b""
    assert re.search(r"^resolved: cancelled \(revision 1, ", stderr, re.M), stderr


@pytest.mark.slow
def test_request_wait_rides_out_a_gate_restart(tmp_path, relay, clis):
    """Pipeline-author review: ``request --wait`` exited 1 "cannot reach the gate" the moment
    the gate restarted, although the approval is durable and still pending (SPEC §8). It now
    says the gate is unreachable and that the approval stays pending, keeps polling with
    backoff, and reports the outcome once the gate is back."""
    config = write_config(tmp_path, relay.url, api={"listen": f"127.0.0.1:{free_port()}"})
    gate = GateProcess(config).start()
    try:
        cli = clis(
            "request",
            "-c",
            str(config),
            "--pipeline",
            "p",
            "--step",
            "q1",
            "--draft",
            "Neustart überstehen\n",
            "--wait",
        )
        approval_id = cli.wait_for_line(rf"requested approval ({ULID_RE.pattern})").group(1)
        dispatch = relay.wait_dispatch(approval_id)
        cli.wait_for_line(r"dispatched revision 1 to the relay")
        assert gate.stop() == 0
        cli.wait_for_line(
            rf"the gate is unreachable \(.*\); approval {approval_id} stays "
            r"pending there: retrying"
        )
        gate = GateProcess(config).start()
        status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
        assert (status, answer["outcome"]) == (200, "approved")
        code, out, err = cli.finish()
        assert code == 0, err
        assert out == "Neustart überstehen\n".encode()
        assert "the gate is reachable again" in err, err
        assert err.count("the gate is unreachable") == 1, err
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.stop()


@pytest.mark.slow
def test_request_wait_retries_the_create_until_the_gate_takes_it(tmp_path, relay, clis):
    """New-user review: operating.md promised that ``request --wait`` retries a create with
    the same Idempotency-Key, but a gate that was down (or answered 503) at the create ended
    it at once with exit 1. It now retries with backoff, with the key given or one of its
    own (so a retry whose first attempt did land makes no second approval), and says so."""
    config = write_config(tmp_path, relay.url, api={"listen": f"127.0.0.1:{free_port()}"})
    cli = clis(
        "request",
        "-c",
        str(config),
        "--pipeline",
        "p",
        "--step",
        "q1",
        "--draft",
        "erst später\n",
        "--wait",
        "--timeout",
        "120",
    )
    line = cli.wait_for_line(
        r"the gate cannot take the request now \(.*\); retrying with "
        r"Idempotency-Key (hitl-request-\S+) every"
    )
    key = line.group(1)
    gate = GateProcess(config).start()
    try:
        approval_id = cli.wait_for_line(rf"requested approval ({ULID_RE.pattern})").group(1)
        assert (
            db_scalar(
                db_path(config),
                f"SELECT idempotency_key FROM approvals WHERE approval_id = '{approval_id}'",
            )
            == key
        )
        dispatch = relay.wait_dispatch(approval_id)
        status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
        assert (status, answer["outcome"]) == (200, "approved")
        code, out, err = cli.finish()
        assert (code, out) == (0, "erst später\n".encode()), err
        assert err.count("the gate cannot take the request now") == 1, err
        assert db_scalar(db_path(config), "SELECT count(*) FROM approvals") == 1
    finally:
        gate.stop()


@pytest.mark.slow
def test_request_wait_timeout_bounds_the_create_and_the_wait_together(tmp_path, relay, clis):
    """Review: the retried create and the wait after it each had the whole --timeout, so
    ``--timeout 8`` could end after ~13 s. One deadline now covers both."""
    config = write_config(tmp_path, relay.url, api={"listen": f"127.0.0.1:{free_port()}"})
    started = time.monotonic()
    cli = clis(
        "request",
        "-c",
        str(config),
        "--pipeline",
        "p",
        "--step",
        "q1",
        "--draft",
        "spät\n",
        "--wait",
        "--timeout",
        "8",
    )
    cli.wait_for_line(r"the gate cannot take the request now")
    # the gate comes up 4 s into the 8 s: the wait that follows may use only what is left
    wait_until(lambda: time.monotonic() - started > 4, 10, "4 s of the timeout to pass")
    gate = GateProcess(config).start()
    up = time.monotonic()
    try:
        cli.wait_for_line(rf"requested approval ({ULID_RE.pattern})")
        code, _, err = cli.finish()
        after_up = time.monotonic() - up
        assert code == 4, err
        assert "still pending after 8 s" in err, err
        # the bug gave the wait after the create a whole new 8 s; the gate was up >= 4 s into
        # them, so the fixed wait has <= 4 s left: the margin absorbs a loaded machine's
        # process start-up, not the bug (a relative bound, not a timing assert)
        assert after_up < 7, f"the wait ran {after_up:.1f} s after the gate was up"
    finally:
        gate.stop()


@pytest.mark.slow
def test_request_wait_that_cannot_create_within_timeout_exits_4(tmp_path):
    """The --timeout bounds the create too (it was ignored while the create was refused or
    blocked): exit 4, and the command to find the request if it did land after all."""
    config = write_config(
        tmp_path, "http://127.0.0.1:9/relay", api={"listen": f"127.0.0.1:{free_port()}"}
    )
    proc = run_cli(
        "request",
        "-c",
        str(config),
        "--pipeline",
        "p",
        "--step",
        "q1",
        "--draft",
        "nie\n",
        "--wait",
        "--timeout",
        "1.5",
        "--idempotency-key",
        "k-9",
    )
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == b""
    err = proc.stderr.decode()
    assert "retrying with Idempotency-Key k-9" in err, err
    assert err.splitlines()[-1] == (
        "Error: the gate did not take the request within 1.5 s: nothing may fire; run the "
        "same command again with --idempotency-key k-9 to find it if it lands later"
    ), err


@pytest.mark.slow
def test_request_replayed_by_idempotency_key_says_so(gate, relay, clis):
    """Pipeline-author review: a request replayed with its Idempotency-Key printed "requested
    approval ..." like a new one, so ``request ... && send`` could not tell it fired before.
    The API answers 200 (not 201); the CLI now says it is the earlier approval, and its state."""
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
        "einmal",
        "--idempotency-key",
        "key-7",
    )
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    approval_id = first.stdout.decode().strip()
    assert re.match(rf"requested approval {approval_id} for p/q1", first.stderr.decode())
    dispatch = relay.wait_dispatch(approval_id)
    again = run_cli(*args)
    assert (again.returncode, again.stdout.decode().strip()) == (0, approval_id)
    assert again.stderr.decode().startswith(
        f"already requested: approval {approval_id} for p/q1 (the same request with "
        "Idempotency-Key key-7 was made before; state pending)"
    ), again.stderr
    status, _, _ = post_decision(gate.callback_url, decision_body(dispatch))
    assert status == 200
    waited = run_cli(*args, "--wait")
    assert waited.returncode == 0 and waited.stdout == b"einmal"
    assert waited.stderr.decode().startswith(
        f"already requested: approval {approval_id} for p/q1 (the same request with "
        "Idempotency-Key key-7 was made before; state resolved, outcome approved)"
    ), waited.stderr


@pytest.mark.slow
def test_request_timeout_prints_the_cancel_command(gate, relay, clis):
    """Pipeline-author review: after ``--timeout`` the message said the action must not fire
    but, unlike Ctrl-C, not how to cancel the approval still pending on the gate."""
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
        "--draft",
        "x",
        "--wait",
        "--timeout",
        "1",
    )
    assert proc.returncode == 4
    line = proc.stderr.decode().splitlines()[-1]
    match = re.fullmatch(
        rf"Error: still pending after 1 s: approval ({ULID_RE.pattern}) \(the "
        r"action must not fire; cancel it with: (.+)\)",
        line,
    )
    assert match, line
    done = run_cli(*shlex.split(match.group(2))[1:])
    assert done.returncode == 0, done.stderr
    assert gate.api().get(match.group(1))["outcome"] == "cancelled"


def test_cancel_of_a_resolved_approval_names_its_outcome(gate, relay):
    """Pipeline-author review: ``cancel`` of an approval that had timed out said only "HTTP 409
    already_resolved"; whether the action may have fired depends on the outcome, so say it."""
    api = gate.api()
    approval_id = api.create("q1", "schon entschieden")["approval_id"]
    status, _, _ = post_decision(gate.callback_url, decision_body(relay.wait_dispatch(approval_id)))
    assert status == 200
    proc = run_cli("cancel", "-c", str(gate.config), "--api-url", gate.api_url, approval_id)
    assert proc.returncode == 1
    assert proc.stderr.decode() == (
        f"Error: approval {approval_id} is already resolved "
        "(outcome approved); nothing changed (HTTP 409 "
        "already_resolved)\n"
    )


# ---- audit trail ----------------------------------------------------------------------------


def _tampered_copy(
    source: Path, directory: Path, relay_url: str, sql: Callable[[sqlite3.Connection], None]
) -> Path:
    directory.mkdir()
    config = write_config(directory, relay_url)
    src = sqlite3.connect(source)
    dst = sqlite3.connect(directory / "gate.db")
    try:
        src.backup(dst)
        with dst:
            sql(dst)
    finally:
        src.close()
        dst.close()
    return config


def _change_byte(conn: sqlite3.Connection) -> None:
    (entry,) = conn.execute("SELECT entry FROM audit_log WHERE seq = 3").fetchone()
    assert entry.count('"operator_id":101') == 1, entry
    conn.execute(
        "UPDATE audit_log SET entry = ? WHERE seq = 3",
        (entry.replace('"operator_id":101', '"operator_id":102'),),
    )


def _delete_middle(conn: sqlite3.Connection) -> None:
    assert conn.execute("DELETE FROM audit_log WHERE seq = 6").rowcount == 1


def _swap_rows(conn: sqlite3.Connection) -> None:
    cols = "approval_id, kind, entry, prev_hash, entry_hash, receipt"
    five = conn.execute(f"SELECT {cols} FROM audit_log WHERE seq = 5").fetchone()
    six = conn.execute(f"SELECT {cols} FROM audit_log WHERE seq = 6").fetchone()
    sets = ", ".join(f"{c.strip()} = ?" for c in cols.split(","))
    conn.execute(f"UPDATE audit_log SET {sets} WHERE seq = 5", six)
    conn.execute(f"UPDATE audit_log SET {sets} WHERE seq = 6", five)


@pytest.mark.slow
def test_audit_verify_detects_tampering_and_export_verifies(tmp_path, gate, relay):
    api = gate.api()
    ids = []
    for verb, step in (("approve", "q1"), ("skip", "q1"), ("cancel", "q1")):
        approval_id = api.create(step, f"audit {verb} ✓")["approval_id"]
        ids.append(approval_id)
        dispatch = relay.wait_dispatch(approval_id)
        acked(gate, approval_id)  # the dispatch_ack entry is written before the decision
        if verb == "cancel":
            assert api.call("POST", f"/v1/approvals/{approval_id}/cancel")[0] == 200
        else:
            status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, verb=verb))
            assert (status, answer["resolved"]) == (200, True)
    db = db_path(gate.config)
    # approve: created, ack, decision, resolved; skip: the same; cancel: created, ack, resolved
    assert db_scalar(db, "SELECT COUNT(*) FROM audit_log") == 11
    kinds = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert [k for (k,) in kinds.execute("SELECT kind FROM audit_log ORDER BY seq")] == [
            "created",
            "dispatch_ack",
            "decision",
            "resolved",
        ] * 2 + ["created", "dispatch_ack", "resolved"]
    finally:
        kinds.close()

    # the resolution's receipt handed to the pipeline is the HMAC of that audit entry's hash
    for approval_id, seq in zip(ids, (4, 8, 11), strict=True):
        receipt = api.get(approval_id)["receipt"]
        entry_hash = db_scalar(db, f"SELECT entry_hash FROM audit_log WHERE seq = {seq}")
        assert receipt == {
            "seq": seq,
            "entry_hash": entry_hash,
            "alg": "hmac-sha256",
            "receipt": hmac.new(
                RECEIPT_KEY.encode(), entry_hash.encode(), hashlib.sha256
            ).hexdigest(),
        }

    proc = run_cli("audit", "verify", "-c", str(gate.config))
    assert (proc.returncode, proc.stdout.decode()) == (
        0,
        "ok: 11 entries, chain and receipts intact\nok: 3 approvals match the audit log\n",
    ), proc.stderr

    assert gate.stop() == 0

    # the first bad entry: the changed one; the one after the deleted one; the first swapped
    # security review: a deleted tail (or the whole log) passed ``-c``, although every
    # resolved approval in the same database holds its resolution's receipt
    def delete_tail(conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM audit_log WHERE seq > 8")

    def delete_all(conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM audit_log")

    for name, tamper, first_bad in (
        ("changed", _change_byte, 3),
        ("deleted", _delete_middle, 7),
        ("swapped", _swap_rows, 5),
        ("tail", delete_tail, 11),
        ("emptied", delete_all, 11),
    ):
        config = _tampered_copy(db, tmp_path / name, relay.url, tamper)
        proc = run_cli("audit", "verify", "-c", str(config))
        out = proc.stdout.decode()
        assert proc.returncode == 1, (name, out, proc.stderr)
        assert len(out.splitlines()) == 1, out
        assert out.startswith(f"TAMPERED: entry {first_bad}: "), (name, out)
        assert "Traceback" not in proc.stderr.decode()
        if name in ("tail", "emptied"):
            assert out.endswith(f"(the receipt stored with approval {ids[2]})\n"), out
            doctor = run_cli("doctor", "-c", str(config))
            assert doctor.returncode == 1, doctor.stdout
            audit_line = next(
                line
                for line in doctor.stdout.decode().splitlines()
                if line.split(" ", 2)[1] == "audit:"
            )
            assert audit_line.startswith("FAIL audit: TAMPERED: entry 11: "), audit_line

    # the original is still intact; its export verifies with the receipt key alone
    export = tmp_path / "audit.jsonl"
    proc = run_cli("audit", "export", "-c", str(gate.config), "-o", str(export))
    assert proc.returncode == 0, proc.stderr
    lines = export.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 11
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, 12))
    proc = run_cli("audit", "verify", "--file", str(export), "--key-env", "HITL_RECEIPT_KEY")
    assert (proc.returncode, proc.stdout.decode()) == (
        0,
        "ok: 11 entries, chain and receipts intact\n",
    ), proc.stderr
    # a different receipt key: the first receipt does not match; named as the key (b02-04)
    proc = run_cli(
        "audit",
        "verify",
        "--file",
        str(export),
        "--key-env",
        "OTHER_KEY",
        env=gate_env(OTHER_KEY="not-the-receipt-key-b4e1c7a92f0d6358"),
    )
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr.decode().startswith(
        "Error: --key-env (OTHER_KEY): the key given does not match this log: entry 1's "
    )
    # a reordered export
    swapped = tmp_path / "swapped.jsonl"
    shutil.copy(export, swapped)
    lines[3], lines[4] = lines[4], lines[3]
    swapped.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_cli("audit", "verify", "--file", str(swapped), "--key-env", "HITL_RECEIPT_KEY")
    assert proc.returncode == 1
    assert proc.stdout.decode().startswith("TAMPERED: entry 5: ")


@pytest.mark.slow
def test_audit_verify_c_finds_approval_records_that_disagree_with_the_log(tmp_path, gate, relay):
    """Someone who can write the database file but holds no key can change a row, not the
    log: ``audit verify -c`` compares the approvals, revisions and decisions tables with the
    verified log and names the first approval that disagrees (known gap until 2026-11-30:
    such edits passed)."""
    api = gate.api()
    ids = {}
    for verb in ("approve", "skip", "pending"):
        approval_id = api.create("q1", f"records {verb} \u2713\n")["approval_id"]
        ids[verb] = approval_id
        dispatch = relay.wait_dispatch(approval_id)
        acked(gate, approval_id)
        if verb != "pending":
            status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, verb=verb))
            assert (status, answer["resolved"]) == (200, True)
    proc = run_cli("audit", "verify", "-c", str(gate.config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.decode().splitlines()[1] == "ok: 3 approvals match the audit log"
    assert gate.stop() == 0
    db = db_path(gate.config)
    approved, skipped, pending = ids["approve"], ids["skip"], ids["pending"]

    def sql(statement: str, *args: object) -> Callable[[sqlite3.Connection], None]:
        def run(conn: sqlite3.Connection) -> None:
            assert conn.execute(statement, args).rowcount >= 1, statement

        return run

    def forged(conn: sqlite3.Connection) -> None:  # an approval row the gate never created
        for table in ("approvals", "revisions"):
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            picked = ", ".join(
                "'00FORGED' "
                if c == "approval_id"
                else (
                    "'n-' || nonce" if c == "nonce" else ("NULL" if c == "idempotency_key" else c)
                )
                for c in columns
            )
            conn.execute(
                f"INSERT INTO {table} SELECT {picked} FROM {table} WHERE approval_id = ?",
                (approved,),
            )

    cases = [
        (
            "body",
            sql("UPDATE revisions SET body = 'pay 9000 EUR' WHERE approval_id = ?", approved),
            approved,
            "revision 1's body hashes to sha256:",
        ),
        (
            "hash",
            sql(
                "UPDATE revisions SET body = 'x', payload_hash = ? WHERE approval_id = ?",
                "sha256:" + hashlib.sha256(b"x").hexdigest(),
                approved,
            ),
            approved,
            "revision 1's body hashes to sha256:",
        ),
        (
            "outcome",
            sql("UPDATE approvals SET outcome = 'approved' WHERE approval_id = ?", skipped),
            skipped,
            "outcome is 'approved' in the approvals table but 'skipped' in audit entry",
        ),
        (
            "resolved",
            sql(
                "UPDATE approvals SET state = 'resolved', outcome = 'approved', "
                "receipt = (SELECT receipt FROM approvals WHERE approval_id = ?) "
                "WHERE approval_id = ?",
                approved,
                pending,
            ),
            pending,
            "state is 'resolved' (approved) in the approvals table but the audit log "
            "holds no resolution",
        ),
        (
            "reopened",
            sql(
                "UPDATE approvals SET state = 'pending', outcome = NULL, receipt = NULL"
                " WHERE approval_id = ?",
                skipped,
            ),
            skipped,
            "state is 'pending' in the approvals table but audit entry",
        ),
        (
            "receipt",
            sql(
                "UPDATE approvals SET receipt = (SELECT receipt FROM approvals WHERE "
                "approval_id = ?) WHERE approval_id = ?",
                skipped,
                approved,
            ),
            approved,
            "its stored receipt is not the receipt of audit entry",
        ),
        (
            "decision gone",
            sql("DELETE FROM decisions WHERE approval_id = ?", approved),
            approved,
            "decision 'approve' by operator 101 on revision 1 of the audit log is "
            "missing from the decisions table",
        ),
        (
            "decision added",
            sql("UPDATE decisions SET operator_id = 102 WHERE approval_id = ?", skipped),
            skipped,
            "decision 'skip' by operator 102 on revision 1 is in the decisions table "
            "but not in the audit log",
        ),
        (
            "row deleted",
            sql("DELETE FROM approvals WHERE approval_id = ?", pending),
            pending,
            "named by audit entry",
        ),
        ("row forged", forged, "00FORGED", "no created entry in the audit log"),
        (
            "step",
            sql("UPDATE approvals SET quorum_required = 2 WHERE approval_id = ?", pending),
            pending,
            "quorum_required is 2 in the approvals table but 1 in audit entry",
        ),
    ]
    for name, tamper, approval_id, reason in cases:
        config = _tampered_copy(db, tmp_path / name.replace(" ", "-"), relay.url, tamper)
        proc = run_cli("audit", "verify", "-c", str(config))
        out = proc.stdout.decode()
        assert proc.returncode == 1, (name, out, proc.stderr)
        assert out.startswith(f"TAMPERED: approval {approval_id}: {reason}"), (name, out)
        assert out.endswith("; the audit log itself verified (10 entries)\n"), (name, out)
        assert len(out.splitlines()) == 1, out
        assert "Traceback" not in proc.stderr.decode()
        if name == "body":  # doctor runs the same check
            doctor = run_cli("doctor", "-c", str(config))
            assert doctor.returncode == 1, doctor.stdout
            assert (
                f"FAIL audit: TAMPERED: approval {approved}: revision 1's body hashes to "
                in doctor.stdout.decode()
            ), doctor.stdout
    doctor = run_cli("doctor", "-c", str(gate.config))
    assert "10 entries, chain, receipts intact; 3 approvals match it" in doctor.stdout.decode()


# ---- process and storage --------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(gate, relay, sig):
    approval_id = gate.api().create("q1", "still pending at stop")["approval_id"]
    relay.wait_dispatch(approval_id)
    assert gate.proc is not None
    gate.proc.send_signal(sig)
    assert gate.proc.wait(20) == 0
    wait_until(lambda: "event=stopped" in gate.log(), what="event=stopped in the log")
    assert "Traceback" not in gate.log()


def test_database_is_wal_and_versioned(gate, relay):
    approval_id = gate.api().create("q1", "on disk")["approval_id"]
    db = db_path(gate.config)
    assert db.exists()
    assert db_scalar(db, "PRAGMA journal_mode") == "wal"
    assert db_scalar(db, "PRAGMA user_version") == SCHEMA_VERSION
    # a 201 answered is on disk: another connection sees the committed row
    assert db_scalar(db, f"SELECT state FROM approvals WHERE approval_id = '{approval_id}'") == (
        "pending"
    )
    assert gate.stop() == 0
    assert db_scalar(db, "PRAGMA journal_mode") == "wal"
    assert db_scalar(db, "PRAGMA user_version") == SCHEMA_VERSION


@pytest.mark.slow
def test_restart_with_another_receipt_key_is_refused(tmp_path, relay):
    """New-user review: ``make demo`` with your own secrets on the demo's old database started
    silently and appended entries receipted with a new key, after which ``audit verify``
    failed for every run. Now the gate refuses to start (exit 2, one line
    naming receipts.key_env) unless a rotation is declared (tests/test_receipt_key.py)."""
    config = write_config(tmp_path, relay.url)
    gate = GateProcess(config).start()
    gate.api().create("q1", "eins")
    assert gate.stop() == 0
    gate = GateProcess(config).start()  # same key: nothing said
    assert gate.stop() == 0
    assert "receipts.key_env" not in gate.log()
    proc = run_cli(
        "serve",
        "-c",
        str(config),
        env=gate_env(HITL_RECEIPT_KEY="another-receipt-key-77-3c9e1a5f0d8b2e46"),
    )
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.decode()
    assert (
        f"{config}: receipts.key_env: HITL_RECEIPT_KEY does not verify the newest audit "
        "entry's receipt (seq " in err
    ), err
    assert "another-receipt-key-77" not in err and "Traceback" not in err
