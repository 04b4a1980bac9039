"""A new user's first steps with approver keys (new-user pass): the reference relay
refuses a key file others can read and a public key given for its private one, warns when a
signed step's dispatch reaches it without ``--approver-key``, and shows why the gate refused
a signed decision; ``approvers add-key|invite`` say what is wrong with a private key, a TTL
out of range or a label too long; ``audit signatures --approval`` says when nothing is signed;
``verify``'s report keeps its columns for the long check names.

Real processes: ``python -m gate relay|serve|keygen|approvers|audit``; the SQLite file and
the relay's terminal (its stdout) read back.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.core.credentials import MAX_LABEL_CHARS
from gate.tools.conformance.checks import CheckResult
from gate.tools.conformance.report import Report
from tests.support import CliProcess, run_cli, write_config
from tests.test_approver_audit import Log, _created
from tests.test_relay_signing import (
    ALICE,
    ENV,
    decisions,
    enrol,
    keygen,
    start_gate,
    start_relay,
)

BOB_OPERATOR = "102"


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


def one_error_line(done: Any) -> str:
    """The single stderr line of a finished CLI run that exited 2."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    [line] = done.stderr.decode().strip().splitlines()
    return str(line)


# ---- hitl-gate relay --approver-key ----------------------------------------------------------


@pytest.mark.e2e
def test_relay_approver_key_readable_by_others_is_refused_like_the_gates_key(
    tmp_path: Path,
) -> None:
    private, _ = keygen(tmp_path / "keys")
    private.chmod(0o644)
    done = run_cli(
        "relay", "--secret-env", "HITL_RELAY_SECRET", "--approver-key", str(private), env=ENV
    )
    assert one_error_line(done) == (
        f"Error: --approver-key: {private}: mode 0644 lets other users read or change the "
        "private key; chmod 600 it"
    )


@pytest.mark.e2e
def test_relay_approver_key_given_the_public_half_says_so(tmp_path: Path) -> None:
    _, public = keygen(tmp_path / "keys")
    done = run_cli(
        "relay", "--secret-env", "HITL_RELAY_SECRET", "--approver-key", str(public), env=ENV
    )
    assert one_error_line(done) == (
        f"Error: --approver-key: {public}: this is a public key: give the private .key file"
    )


def asking_relay(start: Callable[..., Any], *extra: str) -> tuple[CliProcess, str]:
    """A relay that asks (no --auto), answered by a script on stdin: ``a`` approves."""
    relay = start(
        CliProcess(
            "relay",
            "--listen",
            "127.0.0.1:0",
            "--secret-env",
            "HITL_RELAY_SECRET",
            "--as",
            ALICE,
            *extra,
            stdin=b"a\n",
            keep_stdin=True,
            env=ENV,
        )
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    return relay, url


@pytest.mark.e2e
def test_relay_without_approver_key_warns_once_per_signed_dispatch(
    tmp_path: Path, processes: Callable[..., Any]
) -> None:
    relay, url = start_relay(processes, "approve")
    gate = start_gate(processes, tmp_path, url)
    approval_id = gate.api().create(step="req")["approval_id"]
    relay.wait_for_line(rf"event=decision_sent approval_id={approval_id} .* answer=403 ")
    warned = [
        line
        for line in relay.log().splitlines()
        if "event=approver_signature_unsigned" in line and approval_id in line
    ]
    assert len(warned) == 1, relay.log()
    assert "required" in warned[0] and "--approver-key" in warned[0], warned[0]
    assert decisions(gate, approval_id) == []


@pytest.mark.e2e
def test_relay_terminal_shows_the_detail_of_a_refused_signature(
    tmp_path: Path, processes: Callable[..., Any]
) -> None:
    private, public = keygen(tmp_path / "keys")
    relay, url = asking_relay(processes, "--approver-key", str(private))
    gate = start_gate(processes, tmp_path, url)
    done = run_cli(  # bob's key, used by a relay that decides as alice
        "approvers",
        "add-key",
        "-c",
        str(gate.config),
        "--api-url",
        gate.api_url,
        BOB_OPERATOR,
        "--public-key",
        str(public),
        env=ENV,
    )
    assert done.returncode == 0, done.stderr
    approval_id = gate.api().create(step="req")["approval_id"]
    relay.wait_for_line(rf"event=decision_sent approval_id={approval_id} .* answer=403 ")
    relay.stop()
    terminal = relay.stdout.decode()
    assert (
        "The gate did not record your approve: approver_signature_invalid: wrong_operator "
        "(HTTP 403)." in terminal
    ), terminal
    assert decisions(gate, approval_id) == []


@pytest.mark.e2e
def test_relay_with_the_enrolled_key_is_not_warned(
    tmp_path: Path, processes: Callable[..., Any]
) -> None:
    private, public = keygen(tmp_path / "keys")
    relay, url = start_relay(processes, "approve", "--approver-key", str(private))
    gate = start_gate(processes, tmp_path, url)
    enrol(gate, public)
    approval_id = gate.api().create(step="req")["approval_id"]
    gate.api().wait_resolved(approval_id)
    relay.wait_for_line(rf"event=decision_sent approval_id={approval_id} .* answer=200 ")
    assert "approver_signature_unsigned" not in relay.log()


# ---- hitl-gate approvers add-key / invite ----------------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config naming the admin token (no daemon: these refusals come before any call)."""
    return write_config(
        tmp_path, "http://127.0.0.1:9/", api={"admin_token_env": "HITL_ADMIN_TOKEN"}
    )


@pytest.mark.e2e
def test_approvers_add_key_given_the_private_half_says_so(tmp_path: Path, config: Path) -> None:
    private, _ = keygen(tmp_path / "keys")
    done = run_cli(
        "approvers", "add-key", "-c", str(config), "101", "--public-key", str(private), env=ENV
    )
    assert one_error_line(done) == (
        f"Error: --public-key: {private}: this is a private key: give its public half (.pub)"
    )


@pytest.mark.e2e
@pytest.mark.parametrize("ttl", ["0", "0s", "30", "59s", "24h1s", "90000"])
def test_approvers_invite_ttl_out_of_range_names_the_range(config: Path, ttl: str) -> None:
    done = run_cli("approvers", "invite", "-c", str(config), "101", "--ttl", ttl, env=ENV)
    assert one_error_line(done) == (
        f"Error: --ttl: {ttl!r} is out of range: an invite lasts 60s..24h "
        "(a plain number is seconds)"
    )


@pytest.mark.e2e
def test_approvers_invite_ttl_that_is_no_duration_says_so(config: Path) -> None:
    done = run_cli("approvers", "invite", "-c", str(config), "101", "--ttl", "4 hours", env=ENV)
    assert one_error_line(done) == (
        "Error: --ttl: invalid duration '4 hours' (use e.g. 90s, 30m, 4h)"
    )


@pytest.mark.e2e
@pytest.mark.parametrize("command", ["add-key", "invite"])
def test_approvers_label_too_long_is_refused_before_the_call(
    tmp_path: Path, config: Path, command: str
) -> None:
    _, public = keygen(tmp_path / "keys")
    extra = ["--public-key", str(public)] if command == "add-key" else []
    label = "x" * (MAX_LABEL_CHARS + 1)
    done = run_cli(
        "approvers", command, "-c", str(config), "101", *extra, "--label", label, env=ENV
    )
    assert one_error_line(done) == (
        f"Error: --label: {MAX_LABEL_CHARS + 1} characters; a label is at most {MAX_LABEL_CHARS}"
    )


# ---- hitl-gate audit signatures --approval -------------------------------------------------


@pytest.mark.e2e
def test_audit_signatures_for_an_approval_without_a_signed_decision_exits_1(
    tmp_path: Path,
) -> None:
    log = Log()
    approval_id = "01JUNSIGNED000000000000000"
    _created(log, approval_id)
    path = log.write(tmp_path / "audit.jsonl")
    done = run_cli("audit", "signatures", "--file", str(path), "--approval", approval_id)
    assert done.returncode == 1
    assert (done.stdout, done.stderr.decode()) == (
        b"",
        f"no signed decision for approval {approval_id} in this log\n",
    )
    done = run_cli("audit", "signatures", "--file", str(path))  # the whole log: nothing, fine
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"no signed decisions\n")


# ---- hitl-gate verify's report -------------------------------------------------------------


def test_verify_report_aligns_the_longest_check_name() -> None:
    names = ["relay.ack", "gate.assertion_not_in_batch_refused", "relay.decision_signed"]
    report = Report(
        "http://127.0.0.1:1/",
        [CheckResult(name, i != 1, f"observed {i}", "fix it") for i, name in enumerate(names)],
    )
    lines = [line for line in report.as_text().splitlines() if re.match(r"(PASS|FAIL)  ", line)]
    assert [line.index("observed") for line in lines] == [6 + len(names[1]) + 1] * 3, lines
