"""End-to-end decision handling (SPEC §2) against the real daemon over real HTTP; cases H01-H16.

Every test talks to a real ``python -m gate serve`` dispatching to a real capturing relay.
The module shares one daemon (fixture ``gate``, default test config) and each test opens its
own approvals; tests needing another config start their own daemon (``start_gate``). Nothing
is mocked; synchronisation is by condition with a deadline (``wait_until``, the long-poll),
never by sleeping. Every answer is asserted exactly:
HTTP status and the whole JSON body. After every refusal the approval is re-read and must be
unchanged (SPEC §2: "A refused decision changes nothing but the log and metrics").
"""

from __future__ import annotations

import hashlib
import http.client
import json
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gate.protocol import signing
from gate.protocol.canonical import wire_json
from tests.support import (
    API_TOKEN,
    DEADLINE_S,
    IDENTITIES,
    OLD_SECRET,
    RECEIPT_KEY,
    ROOT,
    SECRET,
    CaptureRelay,
    GateProcess,
    as_json,
    decision_body,
    gate_env,
    http_request,
    post_decision,
    sign_headers,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

# ---------------------------------------------------------------------------------------------
# Shared values
# ---------------------------------------------------------------------------------------------

ALICE, BOB, CAROL = IDENTITIES[:3]
DAVE = "dave@example.com"  # a defined operator who is not in allowed_users
RELAY_BOT = "relay-bot@example.com"  # the relay's service account, not an operator (H11)
CYRILLIC_ALICE = "\u0430lice@example.com"  # U+0430 CYRILLIC SMALL LETTER A (H10)
DRAFT = "Hello, world\n"
CAFE = "Café — naïve résumé 👍\n"
CAFE_HASH = "sha256:c0b8d811c2edb85cfa2cdeee45b1e680c3ee5c286d28c69150649868aa07dfdc"
CAFE_REENCODED_HASH = "sha256:97fe2d5aaf6ba5731999ef64fb912e726246917fb4af150dedfb9eb743487796"
MAX_BODY = 64 * 1024
MAX_INPUT_LENGTH = 50  # security.max_input_length of the test config
SECRET_VALUES = (SECRET, OLD_SECRET, API_TOKEN, RECEIPT_KEY)

RECORDED_PENDING = {"status": "recorded", "resolved": False}
APPROVED = {"status": "recorded", "resolved": True, "outcome": "approved"}
ADJUSTED = {"status": "recorded", "resolved": True, "outcome": "adjusted"}
SKIPPED = {"status": "recorded", "resolved": True, "outcome": "skipped"}
DUPLICATE = {"status": "duplicate", "reason": "duplicate"}
ALREADY_DECIDED = {"status": "already_decided", "reason": "already_decided"}
SUPERSEDED = {"status": "superseded", "reason": "superseded"}
TOO_LARGE = {"status": "invalid", "reason": "body_too_large"}
UNKNOWN_APPROVAL = {"status": "unknown_approval", "reason": "unknown_approval"}
NONCE_MISMATCH = {"status": "forbidden", "reason": "nonce_mismatch"}
HASH_MISMATCH = {"status": "forbidden", "reason": "payload_hash_mismatch"}
NOT_ALLOWED = {"status": "forbidden", "reason": "approver_not_allowed"}
TEXT_REQUIRED = {"status": "invalid", "reason": "adjust_text_required"}
TEXT_TOO_LONG = {"status": "invalid", "reason": "adjust_text_too_long"}


def unauthorized(reason: str) -> dict[str, str]:
    """The 401 body of SPEC §2 checks 2-4."""
    return {"status": "unauthorized", "reason": reason}


def invalid(field: str) -> dict[str, str]:
    """The 400 body of SPEC §2 check 5 (docs/design.md: ``invalid_<field>`` + ``field``)."""
    return {"status": "invalid", "reason": f"invalid_{field}", "field": field}


def already_resolved(outcome: str) -> dict[str, str]:
    """The 409 body of SPEC §2 check 8."""
    return {"status": "already_resolved", "reason": "already_resolved", "outcome": outcome}


def sha256_hash(text: str) -> str:
    """The SPEC §2 payload hash, computed here independently of the gate's code."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# Fixtures: every daemon's log is checked after its test
# ---------------------------------------------------------------------------------------------


def flush_log(proc: GateProcess, step: str = "q1") -> None:
    """Make sure every line the daemon wrote so far has been read: create an approval and
    wait for its ``event=created`` line (stderr is one ordered stream)."""
    approval_id = proc.api().create(step)["approval_id"]
    proc.wait_for_line(re.escape(f"event=created approval_id={approval_id} "))


def assert_daemon_log_clean(proc: GateProcess) -> None:
    """No traceback, no 500, no lock error and no secret value in the daemon's stderr."""
    log = proc.log()
    for needle in ("Traceback", "internal_error", "database is locked", *SECRET_VALUES):
        assert needle not in log, f"daemon log contains {needle!r}"


@pytest.fixture(scope="module")
def relay() -> Iterator[CaptureRelay]:
    """One capturing relay for the module (approval ids keep tests apart)."""
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def gate(relay: CaptureRelay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    """One real daemon with the default test config, shared by the module's tests.

    Starting a daemon costs about a second; every test opens its own approvals, so sharing
    the process keeps the file fast without tests seeing each other's state. Tests that
    need another config start their own daemon with ``start_gate``. After the module the
    daemon must stop cleanly (exit 0) with a clean log.
    """
    proc = GateProcess(write_config(tmp_path_factory.mktemp("gate"), relay.url)).start()
    yield proc
    assert proc.stop() == 0
    wait_until(lambda: "event=stopped" in proc.log(), what="the daemon's last log line")
    assert_daemon_log_clean(proc)


@pytest.fixture(autouse=True)
def _shared_daemon_log_stays_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the shared daemon, its log must still be clean."""
    proc = request.getfixturevalue("gate") if "gate" in request.fixturenames else None
    yield
    if proc is not None:
        assert_daemon_log_clean(proc)


@pytest.fixture
def start_gate(tmp_path, relay: CaptureRelay) -> Iterator[Callable[..., GateProcess]]:
    """Factory: start another gate in its own directory with ``write_config`` overrides.

    Tests using it check that daemon's log themselves (``assert_daemon_log_clean``).
    """
    started: list[GateProcess] = []

    def start(name: str, **overrides: Any) -> GateProcess:
        directory = tmp_path / name
        directory.mkdir()
        proc = GateProcess(write_config(directory, relay.url, **overrides)).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc and proc.proc.poll() is None:
            proc.stop()


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

Result = tuple[int, Any]


def wait_delivered(gate: GateProcess, approval_id: str, revision: int = 1) -> dict[str, Any]:
    """Wait until the gate has recorded the relay's ack of ``revision``; return the approval."""
    api = gate.api()

    def delivered() -> dict[str, Any] | None:
        approval = api.get(approval_id)
        dispatch = approval["dispatch"]
        ok = dispatch["revision"] == revision and dispatch["delivered_at"] is not None
        return approval if ok else None

    return wait_until(delivered, what=f"ack of {approval_id} revision {revision} recorded")


def open_approval(
    gate: GateProcess, relay: CaptureRelay, step: str = "q1", body: str = DRAFT
) -> tuple[str, dict[str, Any]]:
    """Create an approval, wait for its dispatch and for the gate to record the ack.

    Returns ``(approval_id, dispatch envelope)``; from then on the approval object is stable
    until a decision changes it.
    """
    approval = gate.api().create(step, body)
    dispatch = relay.wait_dispatch(approval["approval_id"])
    wait_delivered(gate, approval["approval_id"])
    return approval["approval_id"], dispatch


def post(gate: GateProcess, body: dict[str, Any] | bytes, **kwargs: Any) -> Result:
    """Sign (support's ``post_decision``) and POST a decision; return ``(status, json)``."""
    status, answer, _ = post_decision(gate.callback_url, body, **kwargs)
    return status, answer


def post_raw(gate: GateProcess, raw: bytes, headers: dict[str, str]) -> Result:
    """POST ``raw`` with exactly ``headers`` (no signing added); return ``(status, json)``."""
    status, _, answer = http_request(gate.callback_url, "POST", raw, headers)
    return status, as_json(answer)


def unsigned_headers() -> dict[str, str]:
    return {"Content-Type": "application/json", "X-Hitl-Protocol": "hitl/v0"}


def refused(
    gate: GateProcess,
    approval_id: str,
    send: Callable[[], Result],
    status: int,
    answer: dict[str, Any],
) -> None:
    """Run ``send``; assert it answers exactly ``(status, answer)`` and changed nothing."""
    api = gate.api()
    before = api.get(approval_id)
    assert send() == (status, answer)
    assert api.get(approval_id) == before


def refuse(
    gate: GateProcess,
    approval_id: str,
    body: dict[str, Any] | bytes,
    status: int,
    answer: dict[str, Any],
    **kwargs: Any,
) -> None:
    """Sign and POST ``body``; assert the exact refusal and that the approval is unchanged."""
    refused(gate, approval_id, lambda: post(gate, body, **kwargs), status, answer)


def post_concurrently(url: str, requests: list[tuple[bytes, dict[str, str]]]) -> list[Result]:
    """POST every ``(raw, headers)`` at once: one connection per thread, released by a barrier.

    Returns ``(status, json)`` per request, in the order given.
    """
    parts = urllib.parse.urlsplit(url)
    barrier = threading.Barrier(len(requests))
    results: list[Result | None] = [None] * len(requests)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        raw, headers = requests[index]
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=DEADLINE_S)
        try:
            conn.connect()
            barrier.wait(DEADLINE_S)
            conn.request("POST", parts.path, body=raw, headers=headers)
            resp = conn.getresponse()
            results[index] = (resp.status, as_json(resp.read()))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S * 2)
    assert not errors, errors
    assert all(r is not None for r in results), "a concurrent request did not finish"
    return [r for r in results if r is not None]


def audit_log(gate: GateProcess) -> dict[str | None, list[dict[str, Any]]]:
    """Return the decoded audit entries per approval id via ``hitl-gate audit export``."""
    done = subprocess.run(
        [sys.executable, "-m", "gate", "audit", "export", "-c", str(gate.config)],
        capture_output=True,
        env=gate_env(),
        cwd=ROOT,
        timeout=DEADLINE_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    out: dict[str | None, list[dict[str, Any]]] = {}
    for line in done.stdout.decode("utf-8").splitlines():
        row = json.loads(line)
        out.setdefault(row["approval_id"], []).append(json.loads(row["entry"]))
    return out


def audit_entries(gate: GateProcess, approval_id: str) -> list[dict[str, Any]]:
    """Return the decoded audit entries of one approval."""
    return audit_log(gate).get(approval_id, [])


def decision_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["kind"] == "decision"]


def resolution_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["kind"] == "resolved"]


def future_t(seconds: int) -> int:
    """A ``t`` at most ``seconds`` ahead of any later reading of the clock (floor of now)."""
    return int(time.time()) + seconds


def past_t(seconds: int) -> int:
    """A ``t`` at most ``seconds`` behind the clock when the gate reads it (ceil of now)."""
    return int(time.time()) + 1 - seconds


# ---------------------------------------------------------------------------------------------
# Check 1: body size
# ---------------------------------------------------------------------------------------------


def test_case_h16_decision_body_of_2_mb_is_413_body_too_large(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    body = decision_body(dispatch, padding="x" * (2 * 1024 * 1024))
    raw = wire_json(body)
    assert len(raw) > 2 * 1024 * 1024
    refuse(gate, approval_id, raw, 413, TOO_LARGE)


def test_chunked_decision_body_over_64_kib_is_413_body_too_large(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch, padding="y" * (MAX_BODY + 1)))
    headers = sign_headers(raw)

    def send_chunked() -> Result:
        parts = urllib.parse.urlsplit(gate.callback_url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=DEADLINE_S)
        try:
            chunks = (raw[i : i + 8192] for i in range(0, len(raw), 8192))
            conn.request("POST", parts.path, body=chunks, headers=headers, encode_chunked=True)
            resp = conn.getresponse()
            return resp.status, as_json(resp.read())
        finally:
            conn.close()

    refused(gate, approval_id, send_chunked, 413, TOO_LARGE)


def test_signed_decision_of_exactly_64_kib_is_accepted(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    compact = wire_json(decision_body(dispatch))
    raw = compact + b" " * (MAX_BODY - len(compact))  # JSON allows trailing whitespace
    assert len(raw) == MAX_BODY
    assert post(gate, raw) == (200, APPROVED)


def test_signed_decision_of_64_kib_plus_1_byte_is_413_body_too_large(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    compact = wire_json(decision_body(dispatch))
    raw = compact + b" " * (MAX_BODY + 1 - len(compact))
    refuse(gate, approval_id, raw, 413, TOO_LARGE)


def test_case_h07_100000_unsigned_brackets_is_413_body_too_large(gate, relay):
    approval_id, _ = open_approval(gate, relay)
    refused(
        gate,
        approval_id,
        lambda: post_raw(gate, b"[" * 100_000, unsigned_headers()),
        413,
        TOO_LARGE,
    )


# ---------------------------------------------------------------------------------------------
# Checks 2-4: signature header, window, HMAC
# ---------------------------------------------------------------------------------------------


def test_missing_signature_header_is_401_signature_missing(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    refused(
        gate,
        approval_id,
        lambda: post_raw(gate, raw, unsigned_headers()),
        401,
        unauthorized("signature_missing"),
    )
    refuse(gate, approval_id, raw, 401, unauthorized("signature_missing"), header="")
    refuse(gate, approval_id, raw, 401, unauthorized("signature_missing"), header="   ")


@pytest.mark.parametrize(
    "make_header",
    [
        pytest.param(lambda t, hex_: "garbage", id="no-equals"),
        pytest.param(lambda t, hex_: f"v1={hex_}", id="no-t"),
        pytest.param(lambda t, hex_: f"t={t}", id="no-v1"),
        pytest.param(lambda t, hex_: f"t=abc,v1={hex_}", id="t-not-decimal"),
        pytest.param(lambda t, hex_: f"t={t}.5,v1={hex_}", id="t-fractional"),
        pytest.param(lambda t, hex_: f"t={t},t={t},v1={hex_}", id="t-twice"),
        pytest.param(lambda t, hex_: f"t={t},v1={hex_[:-1]}", id="v1-63-hex"),
        pytest.param(lambda t, hex_: f"t={t},v1={'z' * 64}", id="v1-not-hex"),
    ],
)
def test_malformed_signature_header_is_401_signature_malformed(gate, relay, make_header):
    approval_id, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    t = int(time.time())
    header = make_header(t, signing.compute(SECRET, t, raw))
    refuse(gate, approval_id, raw, 401, unauthorized("signature_malformed"), header=header)


def test_forged_signature_with_wrong_secret_is_401_signature_mismatch(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(
        gate,
        approval_id,
        decision_body(dispatch),
        401,
        unauthorized("signature_mismatch"),
        secret="not-the-relay-secret",
    )


def test_timestamp_301_s_old_is_401_timestamp_out_of_window(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(
        gate,
        approval_id,
        decision_body(dispatch),
        401,
        unauthorized("timestamp_out_of_window"),
        t=int(time.time()) - 301,
    )


def test_timestamp_3600_s_ahead_is_401_timestamp_out_of_window(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(
        gate,
        approval_id,
        decision_body(dispatch),
        401,
        unauthorized("timestamp_out_of_window"),
        t=int(time.time()) + 3600,
    )


def test_window_is_checked_before_hmac(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(
        gate,
        approval_id,
        decision_body(dispatch),
        401,
        unauthorized("timestamp_out_of_window"),
        t=int(time.time()) - 3600,
        secret="not-the-relay-secret",
    )


def test_case_h05_millisecond_timestamp_is_401_timestamp_out_of_window(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    t_ms = int(time.time() * 1000)
    header = f"t={t_ms},v1={signing.compute(SECRET, t_ms, raw)}"  # correct HMAC over "<ms>.body"
    refuse(gate, approval_id, raw, 401, unauthorized("timestamp_out_of_window"), header=header)


def test_case_h06_timestamps_299_s_either_side_are_accepted(gate, relay):
    # The exact ±300 s boundary needs a fixed clock and is tested elsewhere.
    # t is taken right before the post, after the approval is open: the margin to the
    # gate's clock is then 1 s, not the time the create and dispatch took (flaky audit)
    for make_t in (lambda: past_t(299), lambda: future_t(299)):
        approval_id, dispatch = open_approval(gate, relay)
        assert post(gate, decision_body(dispatch), t=make_t()) == (200, APPROVED)
        assert gate.api().get(approval_id)["outcome"] == "approved"


def test_case_h06_timestamps_301_s_old_and_3600_s_ahead_are_refused(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    for t in (int(time.time()) - 301, int(time.time()) + 3600):
        refuse(
            gate,
            approval_id,
            decision_body(dispatch),
            401,
            unauthorized("timestamp_out_of_window"),
            t=t,
        )


def test_signature_is_checked_before_the_body_is_parsed(gate, relay):
    approval_id, _ = open_approval(gate, relay)
    for raw in (b"not json at all", b"{", b"\xff\xfe\x00"):
        refused(
            gate,
            approval_id,
            lambda raw=raw: post_raw(gate, raw, unsigned_headers()),
            401,
            unauthorized("signature_missing"),
        )
        refuse(
            gate,
            approval_id,
            raw,
            401,
            unauthorized("signature_mismatch"),
            secret="not-the-relay-secret",
        )


def test_case_h07_60000_unsigned_brackets_is_401_signature_missing(gate, relay):
    approval_id, _ = open_approval(gate, relay)
    raw = b"[" * 60_000
    assert len(raw) <= MAX_BODY
    refused(
        gate,
        approval_id,
        lambda: post_raw(gate, raw, unsigned_headers()),
        401,
        unauthorized("signature_missing"),
    )


def test_case_h07_60000_signed_brackets_is_400_invalid_json_never_500(gate, relay):
    approval_id, _ = open_approval(gate, relay)
    refuse(gate, approval_id, b"[" * 60_000, 400, invalid("json"))


def test_case_h07_signed_body_starting_with_utf8_bom_is_accepted(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    raw = b"\xef\xbb\xbf" + wire_json(decision_body(dispatch))
    assert post(gate, raw) == (200, APPROVED)
    assert gate.api().get(approval_id)["outcome"] == "approved"


def test_case_h07_bogus_charset_is_ignored_and_bytes_are_utf8(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    body = decision_body(dispatch)
    body["approver"]["channel"] = "Zoë’s phone 👍"
    answer = post(gate, body, headers={"Content-Type": "application/json; charset=bogus"})
    assert answer == (200, APPROVED)
    assert gate.api().get(approval_id)["decisions"][0]["channel"] == "Zoë’s phone 👍"


def test_case_h01_pretty_printed_signed_body_is_accepted(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    pretty = json.dumps(decision_body(dispatch), indent=2, ensure_ascii=False).encode("utf-8")
    assert post(gate, pretty) == (200, APPROVED)
    assert gate.api().get(approval_id)["outcome"] == "approved"


def test_case_h01_compact_form_with_pretty_signature_is_401_signature_mismatch(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    body = decision_body(dispatch)
    pretty = json.dumps(body, indent=2, ensure_ascii=False).encode("utf-8")
    compact = wire_json(body)
    header = signing.sign(SECRET, int(time.time()), pretty)
    refuse(gate, approval_id, compact, 401, unauthorized("signature_mismatch"), header=header)
    # the same header is valid for the bytes it was computed over
    assert post(gate, pretty, header=header) == (200, APPROVED)


def test_case_h03_body_signed_with_trailing_lf_is_accepted(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch)) + b"\n"
    assert post(gate, raw) == (200, APPROVED)


def test_case_h03_newline_added_or_converted_after_signing_is_401(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    compact = wire_json(decision_body(dispatch))
    t = int(time.time())
    signed_bare = signing.sign(SECRET, t, compact)
    signed_lf = signing.sign(SECRET, t, compact + b"\n")
    mismatch = unauthorized("signature_mismatch")
    refuse(gate, approval_id, compact + b"\n", 401, mismatch, header=signed_bare)
    refuse(gate, approval_id, compact + b"\r\n", 401, mismatch, header=signed_lf)
    refuse(gate, approval_id, compact + b"\r\n", 401, mismatch, header=signed_bare)
    # signed as sent, CRLF included: accepted
    assert post(gate, compact + b"\r\n") == (200, APPROVED)


def test_secret_rotation_decision_signed_with_previous_secret_is_accepted(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    assert post(gate, decision_body(dispatch), secret=OLD_SECRET) == (200, APPROVED)
    assert gate.api().get(approval_id)["outcome"] == "approved"


def test_case_h04_two_v1_entries_old_wrong_then_new_right_are_accepted(gate, relay):
    _, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    t = int(time.time())
    wrong = signing.compute("a-retired-secret", t, raw)
    header = f"t={t},v1={wrong},v1={signing.compute(SECRET, t, raw)}"
    assert post(gate, raw, header=header) == (200, APPROVED)


def test_case_h04_v1_for_previous_and_current_secret_are_accepted(gate, relay):
    _, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    t = int(time.time())
    header = f"t={t},v1={signing.compute(OLD_SECRET, t, raw)},v1={signing.compute(SECRET, t, raw)}"
    assert post(gate, raw, header=header) == (200, APPROVED)


@pytest.mark.parametrize(
    "junk",
    ["z" * 64, "0123abcd", "yQ77OMqcZwUcnDbflmyQsgSIglq8XttZqr="],
    ids=["not-hex", "too-short", "base64"],
)
def test_malformed_v1_beside_a_valid_one_is_recorded(gate, relay, junk):
    """A relay (or a proxy) adding a v1 the gate cannot read beside the
    right one had its decision refused signature_malformed; any v1 matching is enough."""
    _, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    t = int(time.time())
    header = f"t={t},v1={junk},v1={signing.compute(SECRET, t, raw)}"
    assert post(gate, raw, header=header) == (200, APPROVED)


def test_only_malformed_or_wrong_v1s_are_refused(gate, relay):
    """The malformed v1 is ignored, not trusted: beside a well-formed wrong one the answer
    is signature_mismatch; with none well formed it stays signature_malformed."""
    approval_id, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    t = int(time.time())
    right = signing.compute(SECRET, t, raw)
    refuse(
        gate,
        approval_id,
        raw,
        401,
        unauthorized("signature_mismatch"),
        header=f"t={t},v1=zz,v1={signing.compute('not-the-relay-secret', t, raw)}",
    )
    refuse(
        gate,
        approval_id,
        raw,
        401,
        unauthorized("signature_malformed"),
        header=f"t={t},v1=zz,v1={right[:-1]}",
    )


@pytest.mark.parametrize(
    "template",
    [
        pytest.param("t={t}, v1={v1}", id="space-after-comma"),
        pytest.param("t = {t} , v1 = {v1}", id="spaces-around-both"),
        pytest.param("v1={v1},t={t}", id="v1-first"),
    ],
)
def test_case_h04_signature_header_is_parsed_leniently(gate, relay, template):
    _, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    t = int(time.time())
    header = template.format(t=t, v1=signing.compute(SECRET, t, raw))
    assert post(gate, raw, header=header) == (200, APPROVED)


# ---------------------------------------------------------------------------------------------
# Check 5: envelope shape
# ---------------------------------------------------------------------------------------------


def test_protocol_header_hitl_v1_is_400(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(
        gate,
        approval_id,
        decision_body(dispatch),
        400,
        {"status": "invalid", "reason": "invalid_protocol", "field": "X-Hitl-Protocol"},
        headers={"X-Hitl-Protocol": "hitl/v1"},
    )


def test_protocol_header_absent_is_accepted(gate, relay):
    _, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    headers = {
        "Content-Type": "application/json",
        "X-Draftcat-Signature": signing.sign(SECRET, int(time.time()), raw),
    }
    assert post_raw(gate, raw, headers) == (200, APPROVED)


def test_decision_timeout_is_400_invalid_decision(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(gate, approval_id, decision_body(dispatch, decision="timeout"), 400, invalid("decision"))


def test_missing_nonce_is_400_invalid_nonce(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    body = decision_body(dispatch)
    del body["nonce"]
    refuse(gate, approval_id, body, 400, invalid("nonce"))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        target = body
        *parents, last = path.split(".")
        for key in parents:
            target = target[key]
        target[last] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(_set("protocol", "hitl/v1"), "protocol", id="protocol-v1"),
        pytest.param(_set("approval_id", 123), "approval_id", id="approval_id-int"),
        pytest.param(_set("nonce", ["n"]), "nonce", id="nonce-list"),
        pytest.param(_set("nonce", ""), "nonce", id="nonce-empty"),
        pytest.param(_set("decision", 1), "decision", id="decision-int"),
        pytest.param(_set("decision", "APPROVE"), "decision", id="decision-not-in-set"),
        pytest.param(_set("payload_hash", None), "payload_hash", id="payload_hash-null"),
        pytest.param(_set("approver", "alice@example.com"), "approver", id="approver-string"),
        pytest.param(_set("approver.id", 7), "approver.id", id="approver.id-int"),
        pytest.param(_set("approver.channel", 7), "approver.channel", id="approver.channel-int"),
        pytest.param(_set("adjust_text", 5), "adjust_text", id="adjust_text-int"),
        pytest.param(_set("decided_at", 1767225600), "decided_at", id="decided_at-int"),
        pytest.param(_set("decided_at", "yesterday"), "decided_at", id="decided_at-not-rfc3339"),
    ],
)
def test_wrong_field_type_is_400_naming_the_field(gate, relay, mutate, field):
    approval_id, dispatch = open_approval(gate, relay)
    body = decision_body(dispatch)
    mutate(body)
    refuse(gate, approval_id, body, 400, invalid(field))


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"not json", id="text"),
        pytest.param(b"", id="empty"),
        pytest.param(b"[1, 2]", id="array"),
        pytest.param(b'"approve"', id="string"),
        pytest.param(b'{"protocol": "hitl/v0", "protocol": "hitl/v0"}', id="duplicate-key"),
        pytest.param(b'{"n": NaN}', id="nan"),
        pytest.param(b'{"protocol": "hitl/v0\xff"}', id="invalid-utf8"),
    ],
)
def test_non_json_body_is_400_invalid_json(gate, relay, raw):
    approval_id, _ = open_approval(gate, relay)
    refuse(gate, approval_id, raw, 400, invalid("json"))


def test_unknown_fields_are_ignored(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    body = decision_body(dispatch, x_future_field={"nested": [1, 2]})
    body["approver"]["x_team"] = "ops"
    assert post(gate, body) == (200, APPROVED)


# ---------------------------------------------------------------------------------------------
# Checks 6-11: approval, nonce, state, revision, hash, approver
# ---------------------------------------------------------------------------------------------


def test_unknown_approval_is_404_unknown_approval(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(
        gate,
        approval_id,
        decision_body(dispatch, approval_id="01KA0000000000000000000000"),
        404,
        UNKNOWN_APPROVAL,
    )


def test_nonce_of_another_approval_is_403_nonce_mismatch(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    _, other = open_approval(gate, relay)
    refuse(
        gate,
        approval_id,
        decision_body(dispatch, nonce=other["callback"]["nonce"]),
        403,
        NONCE_MISMATCH,
    )
    refuse(gate, approval_id, decision_body(dispatch, nonce="0" * 32), 403, NONCE_MISMATCH)


def test_decision_on_resolved_approval_is_409_already_resolved_with_outcome(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    assert post(gate, decision_body(dispatch, BOB)) == (200, APPROVED)
    refuse(gate, approval_id, decision_body(dispatch, CAROL), 409, already_resolved("approved"))
    refuse(
        gate, approval_id, decision_body(dispatch, CAROL, "skip"), 409, already_resolved("approved")
    )


def test_decision_on_cancelled_approval_is_409_already_resolved_cancelled(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    status, _ = gate.api().call("POST", f"/v1/approvals/{approval_id}/cancel")
    assert status == 200
    refuse(gate, approval_id, decision_body(dispatch), 409, already_resolved("cancelled"))


def test_payload_hash_mismatch_is_403(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(
        gate,
        approval_id,
        decision_body(dispatch, payload_hash=sha256_hash("Hello, world")),
        403,
        HASH_MISMATCH,
    )


def test_case_h12_reencoded_hash_is_403_payload_hash_mismatch(gate, relay):
    approval_id, dispatch = open_approval(gate, relay, body=CAFE)
    assert dispatch["payload_hash"] == CAFE_HASH
    assert dispatch["draft"]["body"] == CAFE
    refuse(
        gate,
        approval_id,
        decision_body(dispatch, payload_hash=CAFE_REENCODED_HASH),
        403,
        HASH_MISMATCH,
    )
    assert post(gate, decision_body(dispatch)) == (200, APPROVED)
    assert gate.api().get(approval_id)["final_body"] == CAFE


@pytest.mark.parametrize(
    "identity",
    [
        pytest.param(DAVE, id="defined-not-allowed"),
        pytest.param("op04@example.com", id="allowed-not-in-step"),
        pytest.param("mallory@example.com", id="unknown"),
        pytest.param(CYRILLIC_ALICE, id="cyrillic-lookalike"),
        pytest.param("alice@example.com\u200b", id="zero-width-space"),
    ],
)
def test_approver_out_of_scope_is_403_approver_not_allowed(gate, relay, identity):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(gate, approval_id, decision_body(dispatch, identity), 403, NOT_ALLOWED)


def test_case_h11_relay_service_account_is_403_approver_not_allowed(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    refuse(gate, approval_id, decision_body(dispatch, RELAY_BOT), 403, NOT_ALLOWED)
    assert gate.api().get(approval_id)["quorum"] == {"required": 1, "collected": 0}


# ---------------------------------------------------------------------------------------------
# Check 12: adjust text
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param(" \t\n\r\u00a0\u3000 ", id="whitespace-only"),
        pytest.param(None, id="null"),
        pytest.param(KeyError, id="missing"),
    ],
)
def test_adjust_without_text_is_422_adjust_text_required(gate, relay, text):
    approval_id, dispatch = open_approval(gate, relay)
    body = decision_body(dispatch, verb="adjust", adjust_text=None if text is KeyError else text)
    if text is KeyError:
        del body["adjust_text"]
    refuse(gate, approval_id, body, 422, TEXT_REQUIRED)


def test_adjust_text_over_max_input_length_is_422_adjust_text_too_long(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    for text in ("x" * (MAX_INPUT_LENGTH + 1), "👍" * (MAX_INPUT_LENGTH + 1)):
        refuse(
            gate,
            approval_id,
            decision_body(dispatch, verb="adjust", adjust_text=text),
            422,
            TEXT_TOO_LONG,
        )


def test_adjust_text_of_max_input_length_characters_is_accepted(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    text = "👍" * MAX_INPUT_LENGTH  # 50 characters, 200 UTF-8 bytes
    assert post(gate, decision_body(dispatch, verb="adjust", adjust_text=text)) == (200, ADJUSTED)
    assert gate.api().get(approval_id)["final_body"] == text


# ---------------------------------------------------------------------------------------------
# Check 13: rate limit
# ---------------------------------------------------------------------------------------------


def test_rate_limit_is_429_rate_limited_with_retry_after(start_gate, relay):
    limited = start_gate("rate", security={"rate_limit": 2})
    opened = [open_approval(limited, relay) for _ in range(3)]
    for _, dispatch in opened[:2]:
        assert post(limited, decision_body(dispatch, ALICE)) == (200, APPROVED)
    approval_id, dispatch = opened[2]
    api = limited.api()
    before = api.get(approval_id)
    status, answer, headers = post_decision(limited.callback_url, decision_body(dispatch, ALICE))
    retry_after = int(headers["retry-after"])
    assert 1 <= retry_after <= 60
    assert (status, answer) == (
        429,
        {"status": "rate_limited", "reason": "rate_limited", "retry_after": retry_after},
    )
    assert api.get(approval_id) == before
    # the limit is per approver: bob still decides
    assert post(limited, decision_body(dispatch, BOB)) == (200, APPROVED)
    flush_log(limited)
    assert_daemon_log_clean(limited)


# ---------------------------------------------------------------------------------------------
# Check 14 and replays
# ---------------------------------------------------------------------------------------------


def test_second_decision_by_same_approver_is_409_duplicate_or_already_decided(gate, relay):
    approval_id, dispatch = open_approval(gate, relay, "q2")
    assert post(gate, decision_body(dispatch, ALICE)) == (200, RECORDED_PENDING)
    refuse(gate, approval_id, decision_body(dispatch, ALICE), 409, DUPLICATE)
    refuse(gate, approval_id, decision_body(dispatch, ALICE, "skip"), 409, ALREADY_DECIDED)
    refuse(
        gate,
        approval_id,
        decision_body(dispatch, ALICE, "adjust", adjust_text="Other\n"),
        409,
        ALREADY_DECIDED,
    )
    assert gate.api().get(approval_id)["quorum"] == {"required": 2, "collected": 1}


def test_replay_of_accepted_decision_is_409(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    header = signing.sign(SECRET, int(time.time()), raw)
    assert post(gate, raw, header=header) == (200, APPROVED)
    refuse(gate, approval_id, raw, 409, already_resolved("approved"), header=header)
    pending_id, pending = open_approval(gate, relay, "q2")
    raw = wire_json(decision_body(pending))
    header = signing.sign(SECRET, int(time.time()), raw)
    assert post(gate, raw, header=header) == (200, RECORDED_PENDING)
    refuse(gate, pending_id, raw, 409, DUPLICATE, header=header)


def test_case_h08_same_signed_decision_concurrently_later_and_after_resolution(gate, relay):
    approval_id, dispatch = open_approval(gate, relay, "q2")
    raw = wire_json(decision_body(dispatch, ALICE))
    headers = sign_headers(raw)
    results = post_concurrently(gate.callback_url, [(raw, headers), (raw, headers)])
    assert sorted(results, key=lambda r: r[0]) == [(200, RECORDED_PENDING), (409, DUPLICATE)]
    refused(gate, approval_id, lambda: post_raw(gate, raw, headers), 409, DUPLICATE)
    assert post(gate, decision_body(dispatch, BOB)) == (200, APPROVED)
    refused(
        gate, approval_id, lambda: post_raw(gate, raw, headers), 409, already_resolved("approved")
    )
    approval = gate.api().get(approval_id)
    assert [d["identity"] for d in approval["decisions"]] == [ALICE, BOB]
    entries = audit_entries(gate, approval_id)
    assert [e["data"]["operator_id"] for e in decision_entries(entries)] == [101, 102]
    assert len(resolution_entries(entries)) == 1


# ---------------------------------------------------------------------------------------------
# Quorum and outcomes
# ---------------------------------------------------------------------------------------------


def test_case_h09_same_approver_twice_via_another_channel_keeps_quorum_1_of_2(gate, relay):
    approval_id, dispatch = open_approval(gate, relay, "q2")
    assert post(gate, decision_body(dispatch, ALICE)) == (200, RECORDED_PENDING)
    again = decision_body(dispatch, ALICE)
    again["approver"]["channel"] = "teams"
    refuse(gate, approval_id, again, 409, DUPLICATE)
    assert gate.api().get(approval_id)["quorum"] == {"required": 2, "collected": 1}
    assert post(gate, decision_body(dispatch, BOB)) == (200, APPROVED)
    approval = gate.api().get(approval_id)
    assert approval["quorum"] == {"required": 2, "collected": 2}
    assert [d["operator_id"] for d in approval["decisions"]] == [101, 102]


def test_case_h10_identity_case_and_trailing_space_count_as_the_same_operator(gate, relay):
    approval_id, dispatch = open_approval(gate, relay, "q2")
    assert post(gate, decision_body(dispatch, "Alice@Example.COM")) == (200, RECORDED_PENDING)
    assert gate.api().get(approval_id)["decisions"][0]["operator_id"] == 101
    refuse(gate, approval_id, decision_body(dispatch, "alice@example.com "), 409, DUPLICATE)
    refuse(gate, approval_id, decision_body(dispatch, CYRILLIC_ALICE), 403, NOT_ALLOWED)
    assert gate.api().get(approval_id)["quorum"] == {"required": 2, "collected": 1}
    assert post(gate, decision_body(dispatch, BOB)) == (200, APPROVED)
    assert gate.api().get(approval_id)["quorum"] == {"required": 2, "collected": 2}


def test_case_h10_trailing_space_identity_is_accepted_as_alice(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    assert post(gate, decision_body(dispatch, "alice@example.com ")) == (200, APPROVED)
    assert gate.api().get(approval_id)["decisions"][0]["operator_id"] == 101


def test_skip_is_a_veto_on_quorum_2_after_one_approve(gate, relay):
    approval_id, dispatch = open_approval(gate, relay, "q2")
    assert post(gate, decision_body(dispatch, ALICE)) == (200, RECORDED_PENDING)
    assert post(gate, decision_body(dispatch, BOB, "skip")) == (200, SKIPPED)
    approval = gate.api().wait_resolved(approval_id)
    assert (approval["state"], approval["outcome"], approval["final_body"]) == (
        "resolved",
        "skipped",
        None,
    )
    refuse(gate, approval_id, decision_body(dispatch, CAROL), 409, already_resolved("skipped"))


def test_adjust_with_quorum_1_resolves_adjusted_with_the_new_body(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    text = "Hello, adjusted world\n"
    assert post(gate, decision_body(dispatch, verb="adjust", adjust_text=text)) == (200, ADJUSTED)
    approval = gate.api().wait_resolved(approval_id)
    assert (
        approval["outcome"],
        approval["final_body"],
        approval["payload_hash"],
        approval["revision"],
        approval["quorum"],
    ) == ("adjusted", text, sha256_hash(text), 2, {"required": 1, "collected": 1})


def test_adjust_with_text_equal_to_current_body_counts_as_approve(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    assert post(gate, decision_body(dispatch, verb="adjust", adjust_text=DRAFT)) == (200, APPROVED)
    approval = gate.api().wait_resolved(approval_id)
    assert (
        approval["outcome"],
        approval["final_body"],
        approval["payload_hash"],
        approval["revision"],
    ) == ("approved", DRAFT, sha256_hash(DRAFT), 1)


def test_adjust_with_quorum_2_redispatches_revision_2_and_supersedes_old_nonce(gate, relay):
    approval_id, first = open_approval(gate, relay, "q2")
    text = "Hello, edited world\n"
    assert post(gate, decision_body(first, BOB)) == (200, RECORDED_PENDING)
    assert post(gate, decision_body(first, ALICE, "adjust", adjust_text=text)) == (
        200,
        RECORDED_PENDING,
    )

    second = relay.wait_dispatch(approval_id, revision=2)
    assert second["quorum"] == {"required": 2, "collected": 1}
    assert second["draft"]["body"] == text
    assert second["payload_hash"] == sha256_hash(text) != first["payload_hash"]
    assert second["callback"]["nonce"] != first["callback"]["nonce"]
    approval = wait_delivered(gate, approval_id, revision=2)
    assert (
        approval["state"],
        approval["revision"],
        approval["quorum"],
        approval["payload_hash"],
    ) == ("pending", 2, {"required": 2, "collected": 1}, sha256_hash(text))

    refuse(gate, approval_id, decision_body(first, BOB), 409, SUPERSEDED)
    refuse(gate, approval_id, decision_body(first, CAROL), 409, SUPERSEDED)
    refuse(gate, approval_id, decision_body(second, ALICE), 409, DUPLICATE)  # her edit counts
    refuse(
        gate,
        approval_id,
        decision_body(second, BOB, payload_hash=first["payload_hash"]),
        403,
        HASH_MISMATCH,
    )
    assert post(gate, decision_body(second, BOB)) == (200, ADJUSTED)
    approval = gate.api().wait_resolved(approval_id)
    assert (
        approval["outcome"],
        approval["final_body"],
        approval["payload_hash"],
        approval["revision"],
        approval["quorum"],
    ) == ("adjusted", text, sha256_hash(text), 2, {"required": 2, "collected": 2})


# ---------------------------------------------------------------------------------------------
# Concurrency and aborted clients
# ---------------------------------------------------------------------------------------------


def test_twenty_identical_decisions_in_parallel_record_exactly_once(gate, relay):
    approval_id, dispatch = open_approval(gate, relay)
    raw = wire_json(decision_body(dispatch))
    headers = sign_headers(raw)
    results = post_concurrently(gate.callback_url, [(raw, headers)] * 20)
    assert Counter(json.dumps(r, sort_keys=True) for r in results) == Counter(
        [json.dumps((200, APPROVED), sort_keys=True)]
        + [json.dumps((409, already_resolved("approved")), sort_keys=True)] * 19
    )
    approval = gate.api().get(approval_id)
    assert len(approval["decisions"]) == 1
    assert approval["quorum"] == {"required": 1, "collected": 1}


def test_case_h14_twenty_approvers_at_once_on_quorum_3_record_exactly_three(gate, relay):
    approval_id, dispatch = open_approval(gate, relay, "q3")
    requests = []
    for identity in IDENTITIES:
        raw = wire_json(decision_body(dispatch, identity))
        requests.append((raw, sign_headers(raw)))
    results = post_concurrently(gate.callback_url, requests)
    assert all(status < 500 for status, _ in results)
    assert sorted(json.dumps(r, sort_keys=True) for r in results) == sorted(
        [
            json.dumps(r, sort_keys=True)
            for r in [(200, RECORDED_PENDING)] * 2
            + [(200, APPROVED)]
            + [(409, already_resolved("approved"))] * 17
        ]
    )
    approval = gate.api().get(approval_id)
    assert (approval["state"], approval["outcome"]) == ("resolved", "approved")
    assert len(approval["decisions"]) == 3
    assert approval["quorum"] == {"required": 3, "collected": 3}
    accepted = {IDENTITIES[i] for i, r in enumerate(results) if r[0] == 200}
    assert {d["identity"] for d in approval["decisions"]} == accepted
    entries = audit_entries(gate, approval_id)
    assert len(decision_entries(entries)) == 3
    assert len(resolution_entries(entries)) == 1


def _send_and_drop(
    url: str, raw: bytes, headers: dict[str, str], rng: random.Random, send_bytes: int | None = None
) -> None:
    """Send one HTTP request on a raw socket and close it at once (FIN or RST at random).

    ``send_bytes`` cuts the body short (the client dies mid-request); default: all of it.
    """
    parts = urllib.parse.urlsplit(url)
    head = [
        f"POST {parts.path} HTTP/1.1",
        f"Host: {parts.hostname}:{parts.port}",
        *(f"{k}: {v}" for k, v in headers.items()),
        f"Content-Length: {len(raw)}",
        "Connection: close",
        "",
        "",
    ]
    with socket.create_connection((parts.hostname, parts.port), timeout=DEADLINE_S) as sock:
        if rng.random() < 0.5:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall("\r\n".join(head).encode("ascii") + raw[:send_bytes])
        pause = rng.choice((0.0, 0.0, rng.uniform(0.0, 0.003)))
        if pause:
            time.sleep(pause)  # part of the case's input (random small delay), not a sync


def _pass_through_writer(proc: GateProcess, opened: list[tuple[str, dict[str, Any]]]) -> None:
    """Barrier: a refused decision per approval goes through the single writer after every
    earlier request already queued there; the daemon must also still answer /healthz."""
    status, _, _ = http_request(proc.api_url + "/healthz")
    assert status == 200
    for _, dispatch in opened:
        assert post(proc, decision_body(dispatch, ALICE, nonce="f" * 32)) == (403, NONCE_MISMATCH)


def test_case_h15_clients_closing_at_once_leave_each_decision_all_or_nothing(start_gate, relay):
    allowed = list(range(101, 121))
    proc = start_gate(
        "h15", steps=[{"name": "q20", "quorum": 20, "approvers": allowed, "timeout": "1h"}]
    )
    api = proc.api()
    rng = random.Random(20260101)
    opened = [open_approval(proc, relay, "q20") for _ in range(12)]
    decisions = []
    for aid, dispatch in opened:
        for identity in IDENTITIES:
            decisions.append((aid, identity, wire_json(decision_body(dispatch, identity))))
    rng.shuffle(decisions)
    # 200 clients send a whole signed decision and hang up at once; the other 40 decisions
    # are sent only in the retry phase (so retries meet pending and resolved approvals).
    for _, _, raw in decisions[:200]:
        _send_and_drop(proc.callback_url, raw, sign_headers(raw), rng)
    _pass_through_writer(proc, opened)

    # All or nothing: each recorded decision has exactly one audit entry, and an approval is
    # resolved exactly when all 20 approvers are recorded.
    audit = audit_log(proc)
    recorded: dict[str, set[str]] = {}
    for aid, _ in opened:
        approval = api.get(aid)
        operators = sorted(d["operator_id"] for d in approval["decisions"])
        assert len(operators) == len(set(operators)), (aid, operators)
        logged = sorted(e["data"]["operator_id"] for e in decision_entries(audit.get(aid, [])))
        assert logged == operators, aid
        complete = len(operators) == 20
        assert approval["state"] == ("resolved" if complete else "pending"), aid
        assert len(resolution_entries(audit.get(aid, []))) == (1 if complete else 0), aid
        recorded[aid] = {d["identity"] for d in approval["decisions"]}

    # A retry of each decision (and the first send of the rest) is answered consistently
    # with what was recorded.
    rng.shuffle(decisions)
    for aid, identity, raw in decisions:
        seen = recorded[aid]
        if len(seen) == 20:
            expected: Result = (409, already_resolved("approved"))
        elif identity in seen:
            expected = (409, DUPLICATE)
        else:
            expected = (200, RECORDED_PENDING if len(seen) < 19 else APPROVED)
            seen.add(identity)
        assert post(proc, raw) == expected, (aid, identity)

    audit = audit_log(proc)
    for aid, _ in opened:
        approval = api.get(aid)
        assert (approval["state"], approval["outcome"], len(approval["decisions"])) == (
            "resolved",
            "approved",
            20,
        )
        assert sorted(d["identity"] for d in approval["decisions"]) == sorted(IDENTITIES)
        entries = audit.get(aid, [])
        assert len(decision_entries(entries)) == 20
        assert len(resolution_entries(entries)) == 1
    status, _, _ = http_request(proc.api_url + "/healthz")
    assert status == 200
    flush_log(proc, "q20")
    assert_daemon_log_clean(proc)


def test_client_hanging_up_mid_body_is_not_an_internal_error(start_gate, relay):
    """A client that dies half-way through its body: nothing recorded, no 500, no traceback."""
    proc = start_gate("cut")
    rng = random.Random(7)
    opened = [open_approval(proc, relay) for _ in range(4)]
    before = {aid: proc.api().get(aid) for aid, _ in opened}
    for _aid, dispatch in opened:
        raw = wire_json(decision_body(dispatch))
        for _ in range(5):  # FIN or RST at random, after half the body
            _send_and_drop(proc.callback_url, raw, sign_headers(raw), rng, len(raw) // 2)
    _pass_through_writer(proc, opened)
    assert {aid: proc.api().get(aid) for aid, _ in opened} == before
    flush_log(proc)
    assert_daemon_log_clean(proc)
    for _aid, dispatch in opened:  # the approvals still take a whole decision
        assert post(proc, decision_body(dispatch)) == (200, APPROVED)


# ---------------------------------------------------------------------------------------------
# A refusal of every kind changes nothing; the log stays clean
# ---------------------------------------------------------------------------------------------


def test_refused_decisions_change_neither_approval_nor_audit(gate, relay):
    approval_id, dispatch = open_approval(gate, relay, "q2")
    assert post(gate, decision_body(dispatch, ALICE)) == (200, RECORDED_PENDING)
    before = gate.api().get(approval_id)
    audit_before = audit_entries(gate, approval_id)
    bob = decision_body(dispatch, BOB)
    raw = wire_json(bob)
    now = int(time.time())
    attempts: list[tuple[Callable[[], Result], int, dict[str, Any]]] = [
        (lambda: post(gate, raw + b" " * MAX_BODY), 413, TOO_LARGE),
        (lambda: post_raw(gate, raw, unsigned_headers()), 401, unauthorized("signature_missing")),
        (lambda: post(gate, raw, header="t=x"), 401, unauthorized("signature_malformed")),
        (lambda: post(gate, raw, t=now - 301), 401, unauthorized("timestamp_out_of_window")),
        (lambda: post(gate, raw, secret="forged"), 401, unauthorized("signature_mismatch")),
        (
            lambda: post(gate, decision_body(dispatch, BOB, decision="timeout")),
            400,
            invalid("decision"),
        ),
        (
            lambda: post(gate, decision_body(dispatch, BOB, approval_id="01KA" + "0" * 22)),
            404,
            UNKNOWN_APPROVAL,
        ),
        (lambda: post(gate, decision_body(dispatch, BOB, nonce="0" * 32)), 403, NONCE_MISMATCH),
        (
            lambda: post(gate, decision_body(dispatch, BOB, payload_hash=CAFE_HASH)),
            403,
            HASH_MISMATCH,
        ),
        (lambda: post(gate, decision_body(dispatch, RELAY_BOT)), 403, NOT_ALLOWED),
        (
            lambda: post(gate, decision_body(dispatch, BOB, "adjust", adjust_text=" ")),
            422,
            TEXT_REQUIRED,
        ),
        (
            lambda: post(gate, decision_body(dispatch, BOB, "adjust", adjust_text="z" * 51)),
            422,
            TEXT_TOO_LONG,
        ),
        (lambda: post(gate, decision_body(dispatch, ALICE)), 409, DUPLICATE),
        (lambda: post(gate, decision_body(dispatch, ALICE, "skip")), 409, ALREADY_DECIDED),
    ]
    for send, status, answer in attempts:
        refused(gate, approval_id, send, status, answer)
    assert gate.api().get(approval_id) == before
    assert audit_entries(gate, approval_id) == audit_before


def test_daemon_log_has_no_traceback_and_no_secret_after_mixed_traffic(gate, relay):
    approval_id, dispatch = open_approval(gate, relay, "q2")
    for raw, kwargs in [
        (b"[" * 60_000, {}),
        (b"[" * 100_000, {}),
        (b"\xff\xfe", {}),
        (wire_json(decision_body(dispatch)), {"secret": "forged"}),
        (wire_json(decision_body(dispatch)), {"t": int(time.time() * 1000)}),
        (wire_json(decision_body(dispatch, RELAY_BOT)), {}),
        (wire_json(decision_body(dispatch, decision="timeout")), {}),
    ]:
        status, _ = post(gate, raw, **kwargs)
        assert 400 <= status < 500
    assert post(gate, decision_body(dispatch, ALICE, "adjust", adjust_text="Edited\n")) == (
        200,
        RECORDED_PENDING,
    )
    second = relay.wait_dispatch(approval_id, revision=2)
    assert post(gate, decision_body(second, BOB)) == (200, ADJUSTED)
    assert gate.api().wait_resolved(approval_id)["outcome"] == "adjusted"
    gate.wait_for_line(re.escape(f"event=resolved approval_id={approval_id} outcome=adjusted"))
    flush_log(gate)
    assert_daemon_log_clean(gate)
