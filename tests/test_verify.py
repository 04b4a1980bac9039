"""Tests for ``hitl-gate verify`` (SPEC §6): the real CLI against the reference relay and
against misbehaving relays, plus direct tests of the judges and of the gate-side probe.

The CLI runs are slow-ish (each waits a 3 s grace after the decision, one relay holds its ack
for 8 s), so the module fixture ``fleet`` starts every relay and every ``verify`` subprocess at
once; each test then waits for, and judges, its own run. Relays are real aiohttp servers on
loopback (``tests/badrelays.py``) or the reference relay as ``python -m gate relay``.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import pytest

from gate.protocol import DECISIONS_PATH
from gate.tools.conformance import ephemeral, probes, runner
from gate.tools.conformance.checks import (
    ACK_LIMIT_S,
    Observed,
    judge_ack,
    judge_decision,
    judge_refusal,
    probe,
)
from gate.tools.conformance.notices import (
    NOTICE_CHECKS,
    judge_no_decision,
    judge_notice_ack,
    judge_notice_refusal,
)
from tests.badrelays import (
    BadRelay,
    Misbehaviour,
    PermissiveServer,
    hmac_hex,
    sha256_hash,
    signature_valid,
)
from tests.support import ROOT, SECRET, CliProcess, free_port, gate_env

APPROVER = "alice@example.com"
OUTSIDER = "mallory@example.com"
WRONG_HASH = "sha256:" + "0" * 64
WRONG_NONCE = "f" * 32
ALL_CHECKS = [
    "relay.ack",
    "relay.decision_received",
    "relay.decision_signed",
    "relay.decision_in_window",
    "relay.nonce",
    "relay.payload_hash_echo",
    "relay.approver_in_scope",
    "relay.decision_accepted",
    "relay.refuses_bad_signature",
    "relay.refuses_stale_timestamp",
    "gate.replay_refused",
    "gate.mutated_hash_refused",
    "gate.out_of_scope_refused",
]
GATE_SIDE = frozenset(
    {"gate.replay_refused", "gate.mutated_hash_refused", "gate.out_of_scope_refused"}
)
DECISION_SIDE = frozenset(
    {
        "relay.decision_signed",
        "relay.decision_in_window",
        "relay.nonce",
        "relay.payload_hash_echo",
        "relay.approver_in_scope",
        "relay.decision_accepted",
    }
)
REFERENCE = "reference"
NEVER_TIMEOUT_S = 3.0
GRACE_S = 3.0


@dataclass(frozen=True)
class Scenario:
    """One ``verify`` run: the relay (None = the reference relay), CLI options, expectations.

    ``fails`` is the exact set of check names that must FAIL; ``skips`` the exact set that
    cannot run because of them (reported SKIP, never PASS); ``observed`` maps a check name
    to a substring its ``observed`` text must contain (what the relay did).
    """

    relay: Misbehaviour | None
    fails: frozenset[str] = frozenset()
    observed: dict[str, str] = field(default_factory=dict)
    skips: frozenset[str] = frozenset()
    timeout: float = 15.0
    text: bool = False
    public_url: bool = False
    unreachable: bool = False
    notices: bool = False  # verify --notices: the notice checks follow

    @property
    def checks(self) -> list[str]:
        """Every check the run reports, in report order."""
        return ALL_CHECKS + list(NOTICE_CHECKS) if self.notices else ALL_CHECKS


SCENARIOS: dict[str, Scenario] = {
    REFERENCE: Scenario(None),
    "reference-text": Scenario(None, text=True),
    "reference-public-url": Scenario(None, public_url=True),
    "reference-notices": Scenario(None, notices=True),
    # an honest v0 relay that acks whatever it does not understand, notices unverified
    "acks-notices-blindly": Scenario(
        Misbehaviour(blind_notices=True),
        frozenset({"relay.notice_refuses_bad_signature"}),
        {"relay.notice_refuses_bad_signature": "a notice with a bad signature was accepted"},
        notices=True,
    ),
    # a relay that waits for its human inside the dispatch request: acks after 8 s
    "holds-ack-8s": Scenario(
        Misbehaviour(hold_s=8.0), frozenset({"relay.ack"}), {"relay.ack": "HTTP 202 after"}
    ),
    "echoes-wrong-hash": Scenario(
        Misbehaviour(payload_hash=WRONG_HASH),
        frozenset({"relay.payload_hash_echo", "relay.decision_accepted"}),
        skips=GATE_SIDE,
        observed={
            "relay.payload_hash_echo": WRONG_HASH,
            "relay.decision_accepted": "payload_hash_mismatch",
        },
    ),
    "echoes-wrong-hash-text": Scenario(
        Misbehaviour(payload_hash=WRONG_HASH),
        frozenset({"relay.payload_hash_echo", "relay.decision_accepted"}),
        skips=GATE_SIDE,
        text=True,
    ),
    # verifies dispatches with the shared secret but signs its decisions with another one:
    # the decision's t is correct, so only the signature check (and what follows) fails
    "signs-with-wrong-secret": Scenario(
        Misbehaviour(sign_secret="not-the-shared-secret"),
        frozenset({"relay.decision_signed", "relay.decision_accepted"}),
        skips=GATE_SIDE,
        observed={
            "relay.decision_signed": "signature_mismatch",
            "relay.decision_accepted": "signature_mismatch",
        },
    ),
    "answers-out-of-scope": Scenario(
        Misbehaviour(approver=OUTSIDER),
        frozenset({"relay.approver_in_scope", "relay.decision_accepted"}),
        skips=GATE_SIDE,
        observed={
            "relay.approver_in_scope": OUTSIDER,
            "relay.decision_accepted": "approver_not_allowed",
        },
    ),
    "echoes-wrong-nonce": Scenario(
        Misbehaviour(nonce=WRONG_NONCE),
        frozenset({"relay.nonce", "relay.decision_accepted"}),
        skips=GATE_SIDE,
        observed={"relay.nonce": WRONG_NONCE, "relay.decision_accepted": "nonce_mismatch"},
    ),
    "signs-in-milliseconds": Scenario(
        Misbehaviour(ms_timestamps=True),
        frozenset({"relay.decision_in_window", "relay.decision_accepted"}),
        skips=GATE_SIDE,
        observed={
            "relay.decision_in_window": "away",
            "relay.decision_accepted": "timestamp_out_of_window",
        },
    ),
    # checks the timestamp but not the HMAC: forwards a badly signed dispatch to its human
    "forwards-bad-signature": Scenario(
        Misbehaviour(verify_hmac=False),
        frozenset({"relay.refuses_bad_signature"}),
        {"relay.refuses_bad_signature": "a decision came back"},
    ),
    "forwards-stale-timestamp": Scenario(
        Misbehaviour(verify_window=False),
        frozenset({"relay.refuses_stale_timestamp"}),
        {"relay.refuses_stale_timestamp": "a decision came back"},
    ),
    "verifies-nothing": Scenario(
        Misbehaviour(verify_hmac=False, verify_window=False),
        frozenset({"relay.refuses_bad_signature", "relay.refuses_stale_timestamp"}),
        {
            "relay.refuses_bad_signature": "a decision came back",
            "relay.refuses_stale_timestamp": "a decision came back",
        },
    ),
    # answers 401 as it should, but shows the refused dispatches to its human anyway
    "refuses-but-forwards": Scenario(
        Misbehaviour(forward_refused=True),
        frozenset({"relay.refuses_bad_signature", "relay.refuses_stale_timestamp"}),
        {
            "relay.refuses_bad_signature": "a decision came back",
            "relay.refuses_stale_timestamp": "a decision came back",
        },
    ),
    "never-answers": Scenario(
        Misbehaviour(answer=False),
        frozenset({"relay.decision_received"}),
        skips=DECISION_SIDE | GATE_SIDE,
        observed={"relay.decision_received": f"no decision arrived within {NEVER_TIMEOUT_S:g} s"},
        timeout=NEVER_TIMEOUT_S,
    ),
    # configured with another secret: refuses even the real dispatch, so nothing is acked
    "refuses-everything": Scenario(
        Misbehaviour(secret="a-different-secret"),
        frozenset({"relay.ack", "relay.decision_received"}),
        skips=DECISION_SIDE | GATE_SIDE,
        observed={"relay.ack": "HTTP 401", "relay.decision_received": "not acked"},
        timeout=60.0,
    ),
    # Regression (review): answers the dispatch 500 yet decides: the decision is judged (it
    # was accepted), not reported as missing "because the dispatch was not acked"
    "acks-500-then-decides": Scenario(
        Misbehaviour(ack_status=500),
        frozenset({"relay.ack"}),
        observed={
            "relay.ack": "HTTP 500",
            "relay.decision_received": "although the dispatch was not acked",
            "relay.decision_accepted": 'gate answered 200 {"status": "recorded"',
        },
    ),
    # nothing listens at RELAY_URL: a failed check (exit 1), not a usage error
    "unreachable": Scenario(
        None,
        frozenset(
            {
                "relay.ack",
                "relay.decision_received",
                "relay.refuses_bad_signature",
                "relay.refuses_stale_timestamp",
            }
        ),
        skips=DECISION_SIDE | GATE_SIDE,
        observed={
            "relay.ack": "ClientConnectorError",
            "relay.decision_received": "not acked",
            "relay.refuses_bad_signature": "answered no dispatch",
        },
        timeout=60.0,
        unreachable=True,
    ),
}
FAILING = [name for name, s in SCENARIOS.items() if s.fails and not s.text]


@dataclass
class Result:
    """What one ``verify`` run did: exit code, stdout, stderr, wall time in seconds."""

    code: int
    stdout: str
    stderr: str
    elapsed_s: float

    def report(self) -> dict[str, Any]:
        """The ``--json`` report."""
        try:
            return json.loads(self.stdout)
        except ValueError as exc:
            raise AssertionError(
                f"stdout is not JSON ({exc}):\n{self.stdout}\nstderr:\n{self.stderr}"
            ) from exc


class Run:
    """A ``python -m gate verify`` subprocess started now; ``result()`` waits for it."""

    def __init__(self, *args: str) -> None:
        self.started = time.monotonic()
        self.ended: float | None = None
        self.cli = CliProcess("verify", *args, env=gate_env())
        self._watch = threading.Thread(target=self._wait, daemon=True)
        self._watch.start()

    def _wait(self) -> None:
        self.cli.proc.wait()
        self.ended = time.monotonic()

    def result(self, timeout: float = 90.0) -> Result:
        """Wait for the exit; return the result."""
        code, out, err = self.cli.finish(timeout)
        self._watch.join(10)
        assert self.ended is not None
        return Result(code, out.decode("utf-8"), err, self.ended - self.started)

    def kill(self) -> None:
        """Kill the process if it still runs."""
        if self.cli.proc.poll() is None:
            self.cli.proc.kill()
            self.cli.proc.wait(10)


@dataclass
class Fleet:
    """The reference relay, the misbehaving relays, and one verify run per scenario."""

    reference_url: str
    reference: CliProcess
    relays: dict[str, BadRelay]
    runs: dict[str, Run]
    public_port: int = 0


def verify_args(
    url: str, timeout: float, *, as_json: bool = True, extra: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The CLI arguments of one verify run."""
    args = (
        url,
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--approver",
        APPROVER,
        "--timeout",
        f"{timeout:g}",
        *extra,
    )
    return (*args, "--json") if as_json else args


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """Start every relay and every scenario's verify run at once (they run in parallel)."""
    reference = CliProcess(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--auto",
        "approve",
        "--as",
        APPROVER,
        env=gate_env(),
    )
    relays: dict[str, BadRelay] = {}
    runs: dict[str, Run] = {}
    try:
        url = reference.wait_for_line(r"event=relay_listening url=(\S+)").group(1)
        fl = Fleet(url, reference, relays, runs)
        for name, scenario in SCENARIOS.items():
            extra: tuple[str, ...] = ()
            if scenario.public_url:
                fl.public_port = free_port()
                extra = (
                    "--listen",
                    f"127.0.0.1:{fl.public_port}",
                    "--public-url",
                    f"http://localhost:{fl.public_port}/",
                )
            if scenario.notices:
                extra = (*extra, "--notices")
            target = url
            if scenario.unreachable:
                target = f"http://127.0.0.1:{free_port()}/relay"
            if scenario.relay is not None:
                relays[name] = BadRelay(scenario.relay).start()
                target = relays[name].url + "relay"
            runs[name] = Run(
                *verify_args(target, scenario.timeout, as_json=not scenario.text, extra=extra)
            )
        yield fl
    finally:
        for run in runs.values():
            run.kill()
        for relay in relays.values():
            relay.stop()
        reference.stop()


def failed_names(report: dict[str, Any]) -> set[str]:
    """Names of the failed checks in a JSON report (not those that could not run)."""
    return {c["name"] for c in report["checks"] if not c["ok"] and not c["skipped"]}


def skipped_names(report: dict[str, Any]) -> set[str]:
    """Names of the checks that could not run (never passed: ``ok`` is False)."""
    return {c["name"] for c in report["checks"] if c["skipped"] and not c["ok"]}


# ---- the real CLI against the reference relay -------------------------------------------------


@pytest.mark.e2e
def test_reference_relay_passes_every_check(fleet: Fleet) -> None:
    result = fleet.runs[REFERENCE].result()
    assert result.code == 0, result
    report = result.report()
    assert report["ok"] is True
    assert [c["name"] for c in report["checks"]] == ALL_CHECKS
    for check in report["checks"]:
        assert check["ok"] is True, check
        assert check["observed"] and check["fix"] == "", check
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/hitl/v0/decisions", report["callback_url"])
    assert "Error" not in result.stderr and "Traceback" not in result.stderr
    # the reference relay refused the two bad dispatches itself
    fleet.reference.wait_for_line(r"event=dispatch_refused reason=signature_mismatch")
    fleet.reference.wait_for_line(r"event=dispatch_refused reason=timestamp_out_of_window")


@pytest.mark.e2e
def test_reference_relay_passes_the_notice_checks(fleet: Fleet) -> None:
    result = fleet.runs["reference-notices"].result()
    assert result.code == 0, result
    report = result.report()
    assert [c["name"] for c in report["checks"]] == ALL_CHECKS + list(NOTICE_CHECKS)
    assert failed_names(report) == set() and skipped_names(report) == set(), report
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["relay.notice_ack"]["observed"].startswith("HTTP 200 after")
    assert "401" in by_name["relay.notice_refuses_bad_signature"]["observed"]
    # the reference relay took the signed notice as a notice, not as a request
    fleet.reference.wait_for_line(r"event=notice_received approval_id=\S+ outcome=cancelled")


@pytest.mark.e2e
def test_reference_relay_text_report(fleet: Fleet) -> None:
    result = fleet.runs["reference-text"].result()
    assert result.code == 0, result
    lines = result.stdout.splitlines()
    assert lines[0].startswith("hitl/v0 conformance of the relay (callback http://")
    for name in ALL_CHECKS:
        assert any(re.match(rf"PASS\s+{re.escape(name)}\s+\S", line) for line in lines), name
    assert not any(line.startswith("FAIL") or "fix:" in line for line in lines), result.stdout
    assert lines[-1] == f"{len(ALL_CHECKS)}/{len(ALL_CHECKS)} checks passed: CONFORMANT"


@pytest.mark.e2e
def test_public_url_is_the_callback_the_relay_uses(fleet: Fleet) -> None:
    result = fleet.runs["reference-public-url"].result()
    report = result.report()
    assert result.code == 0, result
    assert report["callback_url"] == f"http://localhost:{fleet.public_port}/hitl/v0/decisions"
    assert failed_names(report) == set()


# ---- the real CLI against misbehaving relays --------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("name", FAILING)
def test_misbehaving_relay_fails_exactly_the_right_checks(fleet: Fleet, name: str) -> None:
    scenario = SCENARIOS[name]
    result = fleet.runs[name].result()
    assert result.code == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    report = result.report()
    assert report["ok"] is False
    by_name = {c["name"]: c for c in report["checks"]}
    assert len(by_name) == len(report["checks"]), "a check is reported twice"
    assert failed_names(report) == set(scenario.fails), json.dumps(report, indent=1)
    assert skipped_names(report) == set(scenario.skips), json.dumps(report, indent=1)
    # every check is always reported, in the same order (review: 7 instead of 13 before)
    assert [c["name"] for c in report["checks"]] == scenario.checks
    for check in report["checks"]:
        assert check["observed"], check  # what the relay did
        if check["ok"]:
            assert check["fix"] == "", check
        else:
            assert check["fix"].strip(), check  # what it should do instead
        assert "{'" not in check["observed"], check  # JSON as on the wire, not a Python repr
    for check_name, text in scenario.observed.items():
        assert text in by_name[check_name]["observed"], by_name[check_name]
    for check_name in scenario.skips:
        # e.g. the relay's decision is the template of the gate-side probes: none, none run
        assert by_name[check_name]["observed"].startswith("not run"), by_name[check_name]


@pytest.mark.e2e
def test_relay_on_another_secret_is_told_to_check_the_secret_first(fleet: Fleet) -> None:
    """New-user review: the hint for a refused (401) dispatch spoke only of raw body bytes;
    the usual cause is simply a relay holding another secret."""
    ack = {c["name"]: c for c in fleet.runs["refuses-everything"].result().report()["checks"]}
    assert ack["relay.ack"]["fix"].startswith(
        "check that the relay holds the same secret as --secret-env (the most common cause)"
    )


@pytest.mark.e2e
def test_holding_relay_really_acked_late(fleet: Fleet) -> None:
    result = fleet.runs["holds-ack-8s"].result()
    ack = {c["name"]: c for c in result.report()["checks"]}["relay.ack"]
    seconds = float(re.search(r"after ([0-9.]+) s", ack["observed"]).group(1))
    assert ACK_LIMIT_S < seconds < 10.0
    assert "2xx" in ack["fix"] and "5 s" in ack["fix"]
    # its decision (sent while holding) was still judged, and accepted by the gate
    assert fleet.relays["holds-ack-8s"].decided()[0]["status"] == 200


def _exit_after_real_dispatch(fleet: Fleet, name: str) -> float:
    """Seconds from the real (last) dispatch reaching the relay to the verify process's exit."""
    run = fleet.runs[name]
    run.result()
    assert run.ended is not None
    return run.ended - fleet.relays[name].dispatches[-1]["at"]


@pytest.mark.e2e
def test_never_answering_relay_fails_after_timeout(fleet: Fleet) -> None:
    result = fleet.runs["never-answers"].result()
    report = result.report()
    # waited --timeout for the human, then the grace for stray decisions; not much longer
    # (the upper bound only tells "timeout + grace" from a wait of another order, e.g. the
    # default --timeout; on a loaded 2-core host the process exit itself lagged past +8 s)
    waited = _exit_after_real_dispatch(fleet, "never-answers")
    assert NEVER_TIMEOUT_S + GRACE_S - 0.1 <= waited < NEVER_TIMEOUT_S + GRACE_S + 20, waited
    assert "--timeout" in {c["name"]: c for c in report["checks"]}["relay.decision_received"]["fix"]
    assert fleet.relays["never-answers"].decided() == []
    assert [d["status"] for d in fleet.relays["never-answers"].dispatches] == [401, 401, 202]


@pytest.mark.e2e
def test_unacked_dispatch_is_not_waited_for(fleet: Fleet) -> None:
    # --timeout 60, but the relay refused the dispatch: there is no human to wait for
    # the bound is half of that --timeout: it tells "did not wait for the human" apart from
    # "waited", not how fast the machine is (GRACE_S + 8 failed under load)
    waited = _exit_after_real_dispatch(fleet, "refuses-everything")
    assert waited < 30.0, waited
    assert fleet.relays["refuses-everything"].decided() == []


@pytest.mark.e2e
@pytest.mark.parametrize(
    "name",
    [
        "forwards-bad-signature",
        "forwards-stale-timestamp",
        "verifies-nothing",
        "refuses-but-forwards",
    ],
)
def test_forwarding_relays_really_forwarded(fleet: Fleet, name: str) -> None:
    """Sanity of the setup: these relays did answer the bad dispatches (else the test proves
    nothing), and their decision for the real dispatch was accepted."""
    result = fleet.runs[name].result()
    assert result.code == 1
    decided = fleet.relays[name].decided()
    assert len({d["body"]["approval_id"] for d in decided}) >= 2, decided
    assert all(d["status"] == 200 for d in decided), decided


@pytest.mark.e2e
def test_failing_relay_text_report(fleet: Fleet) -> None:
    scenario = SCENARIOS["echoes-wrong-hash-text"]
    result = fleet.runs["echoes-wrong-hash-text"].result()
    assert result.code == 1, result
    lines = result.stdout.splitlines()
    failed = {}
    for i, line in enumerate(lines):
        match = re.match(r"FAIL\s+(\S+)\s+(\S.*)", line)
        if match:
            failed[match.group(1)] = lines[i + 1]
    assert set(failed) == set(scenario.fails), result.stdout
    for fix_line in failed.values():
        assert re.match(r"\s+fix: \S", fix_line), fix_line
    skipped = {m.group(1) for line in lines if (m := re.match(r"SKIP\s+(\S+)\s+not run: ", line))}
    assert skipped == set(scenario.skips), result.stdout
    passed = len(ALL_CHECKS) - len(scenario.fails) - len(scenario.skips)
    assert lines[-1] == (
        f"{passed}/{len(ALL_CHECKS)} checks passed, {len(scenario.skips)} not run: NOT CONFORMANT"
    )


# ---- the gate-side negative checks can fail ---------------------------------------------------


EXPECTATIONS = [
    ("gate.replay_refused", 409, ("already_resolved", "duplicate")),
    ("gate.mutated_hash_refused", 403, ("payload_hash_mismatch",)),
    ("gate.out_of_scope_refused", 403, ("approver_not_allowed",)),
]


@pytest.fixture
def server_factory() -> Iterator[Any]:
    """Start PermissiveServers answering a canned status and body; stopped after the test."""
    started: list[PermissiveServer] = []

    def make(status: int = 200, answer: Any = None) -> PermissiveServer:
        server = PermissiveServer(status, answer).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


async def _probe(
    url: str,
    name: str,
    status: int,
    reasons: tuple[str, ...],
    body: bytes = b'{"protocol":"hitl/v0"}',
    headers: dict[str, str] | None = None,
) -> Any:
    async with aiohttp.ClientSession(trust_env=False) as session:
        return await probe(
            session,
            url,
            body,
            headers or {"X-Draftcat-Signature": "t=1,v1=ab"},
            name,
            status,
            reasons,
        )


@pytest.mark.parametrize(("name", "status", "reasons"), EXPECTATIONS)
async def test_probe_fails_against_a_gate_that_accepts_everything(
    server_factory: Any, name: str, status: int, reasons: tuple[str, ...]
) -> None:
    server = server_factory()
    body = b'{"protocol":"hitl/v0","approval_id":"x"}'
    headers = {"X-Draftcat-Signature": "t=1,v1=" + "a" * 64, "X-Hitl-Protocol": "hitl/v0"}
    result = await _probe(server.url + "hitl/v0/decisions", name, status, reasons, body, headers)
    assert result.name == name
    assert result.ok is False
    assert "200" in result.observed and "recorded" in result.observed
    assert str(status) in result.fix and reasons[0] in result.fix
    # it really POSTed these bytes and headers
    [seen] = server.requests()
    assert (seen["method"], seen["path"], seen["raw"]) == ("POST", "/hitl/v0/decisions", body)
    assert seen["headers"]["x-draftcat-signature"] == headers["X-Draftcat-Signature"]


@pytest.mark.parametrize(("name", "status", "reasons"), EXPECTATIONS)
async def test_probe_fails_against_a_gate_that_refuses_for_another_reason(
    server_factory: Any, name: str, status: int, reasons: tuple[str, ...]
) -> None:
    # a gate that refuses everything (e.g. a broken signature check) must not pass either
    unauthorized = server_factory(401, {"status": "unauthorized", "reason": "signature_mismatch"})
    result = await _probe(unauthorized.url, name, status, reasons)
    assert result.ok is False and result.fix, result
    # right status, wrong reason
    wrong_reason = server_factory(status, {"status": "forbidden", "reason": "nonce_mismatch"})
    result = await _probe(wrong_reason.url, name, status, reasons)
    assert result.ok is False and result.fix, result
    # right reason, wrong status
    wrong_status = server_factory(400, {"status": "invalid", "reason": reasons[0]})
    result = await _probe(wrong_status.url, name, status, reasons)
    assert result.ok is False and result.fix, result
    # not JSON
    text = server_factory(status, f"{reasons[0]}")
    result = await _probe(text.url, name, status, reasons)
    assert result.ok is False and result.fix, result


@pytest.mark.parametrize(("name", "status", "reasons"), EXPECTATIONS)
async def test_probe_passes_on_the_spec_answer(
    server_factory: Any, name: str, status: int, reasons: tuple[str, ...]
) -> None:
    for reason in reasons:
        server = server_factory(status, {"status": "x", "reason": reason})
        result = await _probe(server.url, name, status, reasons)
        assert result.ok is True and result.fix == "", result


async def test_probe_fails_when_the_gate_is_unreachable() -> None:
    result = await _probe(
        f"http://127.0.0.1:{free_port()}/hitl/v0/decisions",
        "gate.replay_refused",
        409,
        ("already_resolved",),
    )
    assert result.ok is False and "no answer" in result.observed and result.fix


@pytest.mark.e2e
async def test_verify_reports_a_permissive_gate(
    fleet: Fleet, server_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole run, with the reference relay's real decision as template, but the gate-side
    probes sent to a server that accepts everything: all three gate checks must FAIL."""
    permissive = server_factory()
    original = runner.gate_side

    async def redirected(run: Any, decision: Any) -> Any:
        local_url = permissive.url.rstrip("/") + DECISIONS_PATH
        return await original(replace(run, local_url=local_url), decision)

    monkeypatch.setattr(runner, "gate_side", redirected)
    report = await runner.run_verify(
        fleet.reference_url, SECRET, APPROVER, "127.0.0.1:0", None, 15.0
    )
    data = report.as_json()
    assert report.ok is False
    assert [c["name"] for c in data["checks"]] == ALL_CHECKS
    assert failed_names(data) == set(GATE_SIDE), json.dumps(data, indent=1)
    for check in data["checks"]:
        if not check["ok"]:
            assert "answered 200" in check["observed"] and check["fix"], check
    # the probes were otherwise valid decisions: signed with the shared secret, and the two
    # crafted ones differ from an acceptable decision only in the field under test
    replay, mutated, outsider = (json.loads(r["raw"]) for r in permissive.requests())
    for request in permissive.requests():
        assert signature_valid(request["headers"]["x-draftcat-signature"], request["raw"], SECRET)
    assert replay["approver"]["id"] == APPROVER
    assert replay["approval_id"] != mutated["approval_id"] == outsider["approval_id"]
    assert mutated["nonce"] == outsider["nonce"]
    assert outsider["payload_hash"] == sha256_hash(probes.DRAFT)
    assert mutated["payload_hash"] != outsider["payload_hash"]
    assert mutated["payload_hash"][:-1] == outsider["payload_hash"][:-1]
    assert mutated["approver"]["id"] == APPROVER
    assert outsider["approver"]["id"] == ephemeral.OUTSIDER


# ---- judges, directly -------------------------------------------------------------------------


def test_judge_ack() -> None:
    assert judge_ack(202, None, 0.05).ok
    assert judge_ack(200, None, ACK_LIMIT_S).ok  # 5 s inclusive
    late = judge_ack(202, None, ACK_LIMIT_S + 0.01)
    assert not late.ok and "HTTP 202" in late.observed and late.fix
    for status, error in [
        (None, "no answer within 10 s"),
        (401, "relay answered HTTP 401"),
        (None, "ClientConnectorError: refused"),
    ]:
        result = judge_ack(status, error, 0.1)
        assert result.name == "relay.ack" and not result.ok and result.fix
        assert error in result.observed


def test_verify_ack_hint_follows_the_relays_reason() -> None:
    """A relay refusing the real dispatch as timestamp_out_of_window was
    told to check its secret; its reason now picks the hint (the clocks differ)."""
    clock = judge_ack(401, "relay answered HTTP 401: timestamp_out_of_window", 0.1)
    assert not clock.ok and "timestamp_out_of_window" in clock.observed
    assert clock.fix.startswith("set the relay's clock and this host's by NTP"), clock.fix
    for error in ("relay answered HTTP 401: signature_mismatch", "relay answered HTTP 401"):
        secret = judge_ack(401, error, 0.1)
        assert secret.fix.startswith("check that the relay holds the same secret"), error


def _obs(raw: bytes = b"{}", status: int = 200) -> Observed:
    return Observed(raw, {}, time.time(), status, {"status": "recorded"})


def test_judge_refusal() -> None:
    name = "relay.refuses_bad_signature"
    for status, error in [
        (401, "relay answered HTTP 401"),
        (400, "relay answered HTTP 400"),
        (None, "no answer within 10 s"),
    ]:
        result = judge_refusal(name, status, error, "a bad signature", [])
        assert result.ok and result.name == name and result.fix == "", result
    accepted = judge_refusal(name, 202, None, "a bad signature", [])
    assert not accepted.ok and "HTTP 202" in accepted.observed and accepted.fix
    for status, error in [(401, "relay answered HTTP 401"), (202, None)]:
        forwarded = judge_refusal(name, status, error, "a bad signature", [_obs()])
        assert not forwarded.ok and "decision came back" in forwarded.observed, forwarded
        assert "X-Draftcat-Signature" in forwarded.fix


NONCE = "0123456789abcdef" * 2
HASH = sha256_hash("Grüße\r\n")


def _decision(
    *,
    secret: str = SECRET,
    t: int | None = None,
    header: str | None = None,
    status: int = 200,
    raw: bytes | None = None,
    protocol_header: str = "hitl/v0",
    **fields: Any,
) -> Observed:
    body = {
        "protocol": "hitl/v0",
        "approval_id": "01J0",
        "nonce": NONCE,
        "decision": "approve",
        "payload_hash": HASH,
        "approver": {"id": APPROVER, "display": None, "channel": "x"},
        "adjust_text": None,
        "decided_at": "2026-01-01T00:00:00Z",
    }
    body.update(fields)
    data = raw if raw is not None else json.dumps(body).encode("utf-8")
    ts = int(time.time()) if t is None else t
    headers = {
        "content-type": "application/json",
        "x-hitl-protocol": protocol_header,
        "x-draftcat-signature": header
        if header is not None
        else f"t={ts},v1={hmac_hex(secret, ts, data)}",
    }
    if header == "":
        del headers["x-draftcat-signature"]
    return Observed(
        data,
        headers,
        time.time(),
        status,
        {"status": "recorded"} if status == 200 else {"status": "forbidden"},
    )


def _judge(decision: Observed, now: float | None = None) -> dict[str, Any]:
    results = judge_decision(
        decision, SECRET, time.time() if now is None else now, 300.0, NONCE, HASH, APPROVER
    )
    for r in results:
        assert r.observed, r
        assert bool(r.fix) != r.ok, r  # a failure says what to do; a pass says nothing
    return {r.name: r for r in results}


def _failed(decision: Observed, now: float | None = None) -> set[str]:
    return {name for name, r in _judge(decision, now).items() if not r.ok}


def test_judge_decision_accepts_a_conformant_decision() -> None:
    judged = _judge(_decision())
    assert list(judged) == [
        "relay.decision_signed",
        "relay.decision_in_window",
        "relay.nonce",
        "relay.payload_hash_echo",
        "relay.approver_in_scope",
        "relay.decision_accepted",
    ]
    assert all(r.ok for r in judged.values())
    # identities compare after trim + casefold; BOM, several v1 (rotation) and no protocol
    # header are all fine
    assert _failed(_decision(approver={"id": "  ALICE@Example.com ", "channel": "x"})) == set()
    raw = (
        b"\xef\xbb\xbf"
        + json.dumps(
            {
                "protocol": "hitl/v0",
                "nonce": NONCE,
                "payload_hash": HASH,
                "approver": {"id": APPROVER},
            }
        ).encode()
    )
    assert _failed(_decision(raw=raw)) == set()
    t = int(time.time())
    data = json.dumps(
        {"protocol": "hitl/v0", "nonce": NONCE, "payload_hash": HASH, "approver": {"id": APPROVER}}
    ).encode()
    rotated = f"t={t}, v1={hmac_hex('old', t, data)} , v1={hmac_hex(SECRET, t, data)}"
    assert _failed(_decision(raw=data, header=rotated)) == set()
    no_header = _decision()
    no_header.headers.pop("x-hitl-protocol")
    assert _failed(no_header) == set()


def test_judge_decision_timestamp_window() -> None:
    now = time.time()
    t = int(now)
    assert _failed(_decision(t=t - 300), now=t) == set()  # inclusive
    assert _failed(_decision(t=t + 300), now=t) == set()
    assert _failed(_decision(t=t - 301), now=t) == {"relay.decision_in_window"}
    assert _failed(_decision(t=t + 301), now=t) == {"relay.decision_in_window"}
    ms = _judge(_decision(t=t * 1000), now=t)["relay.decision_in_window"]
    assert not ms.ok and "unix time in seconds" in ms.fix


def test_judge_decision_signature() -> None:
    # wrong secret: the signature fails; the timestamp was fine, so the window check passes
    judged = _judge(_decision(secret="wrong-secret"))
    assert not judged["relay.decision_signed"].ok
    assert "signature_mismatch" in judged["relay.decision_signed"].observed
    assert {n for n, r in judged.items() if not r.ok} == {"relay.decision_signed"}
    # no usable header: neither can be checked
    for header in ["", "garbage", "t=abc,v1=" + "0" * 64, "t=1"]:
        assert _failed(_decision(header=header)) == {
            "relay.decision_signed",
            "relay.decision_in_window",
        }, header
    # signed over other bytes than those sent
    data = json.dumps({"protocol": "hitl/v0"}).encode()
    t = int(time.time())
    assert "relay.decision_signed" in _failed(
        _decision(header=f"t={t},v1={hmac_hex(SECRET, t, data + b' ')}")
    )


def test_judge_decision_fields() -> None:
    assert _failed(_decision(nonce="other")) == {"relay.nonce"}
    assert _failed(_decision(payload_hash=HASH.upper())) == {"relay.payload_hash_echo"}
    assert _failed(_decision(approver={"id": OUTSIDER})) == {"relay.approver_in_scope"}
    assert _failed(_decision(approver=APPROVER)) == {"relay.approver_in_scope"}
    assert _failed(_decision(approver=None)) == {"relay.approver_in_scope"}
    assert _failed(_decision(protocol="hitl/v1")) == {"relay.protocol"}
    assert _failed(_decision(protocol_header="hitl/v1")) == {"relay.protocol"}
    refused = _judge(_decision(status=403))["relay.decision_accepted"]
    assert not refused.ok and "403" in refused.observed
    assert _failed(_decision(raw=b"not json", status=400)) == {
        "relay.decision_parses",
        "relay.protocol",
        "relay.nonce",
        "relay.payload_hash_echo",
        "relay.approver_in_scope",
        "relay.decision_accepted",
    }


# ---- usage errors -----------------------------------------------------------------------------


@pytest.mark.e2e
def test_usage_errors_exit_2(relay: Any) -> None:
    """Each usage error exits 2 with one ``Error:`` line, no report, and no dispatch sent.

    The invocations run in parallel (each is a Python start-up)."""
    env = gate_env(HITL_EMPTY="")
    env.pop("HITL_VERIFY_NOT_SET", None)
    ok = ("--secret-env", "HITL_RELAY_SECRET", "--approver", APPROVER, "--timeout", "3")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    cases: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
        (
            (relay.url, "--secret-env", "HITL_VERIFY_NOT_SET", "--approver", APPROVER),
            ("--secret-env", "HITL_VERIFY_NOT_SET"),
        ),
        (
            (relay.url, "--secret-env", "HITL_EMPTY", "--approver", APPROVER),
            ("--secret-env", "HITL_EMPTY"),
        ),
        (("127.0.0.1:8091", *ok), ("RELAY_URL",)),
        (("ftp://127.0.0.1/relay", *ok), ("RELAY_URL",)),
        ((relay.url, *ok, "--listen", "unix:/tmp/hitl-verify.sock"), ("--listen", "unix")),
        ((relay.url, *ok, "--listen", "127.0.0.1:99999"), ("--listen",)),
        ((relay.url, *ok, "--listen", f"127.0.0.1:{port}"), ("--listen", "cannot listen")),
        ((relay.url, *ok, "--timeout", "0"), ("--timeout",)),
        ((relay.url, "--secret-env", "HITL_RELAY_SECRET"), ("--approver",)),
        # new-user review 2026-11-30: these printed a ConfigError traceback and exited 1
        ((relay.url, *ok[:2], "--approver", "", *ok[4:]), ("--approver", "empty")),
        ((relay.url, *ok[:2], "--approver", " ", *ok[4:]), ("--approver",)),
        ((relay.url, *ok, "--public-url", "ftp://x"), ("--public-url",)),
        (("http://", *ok), ("RELAY_URL",)),
        (("http://[::1", *ok), ("RELAY_URL",)),
        (("http://127.0.0.1:99999/", *ok), ("RELAY_URL",)),
    ]
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "gate", "verify", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=ROOT,
            )
            for args, _ in cases
        ]
        outputs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        busy.close()
    for (args, words), proc, (out, err) in zip(cases, procs, outputs, strict=True):
        stderr = err.decode("utf-8")
        assert proc.returncode == 2, (args, proc.returncode, out, stderr)
        assert out == b"", (args, out)
        assert "Traceback" not in stderr, stderr
        errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, (args, stderr)
        for word in words:
            assert word in errors[0], (args, errors[0])
    time.sleep(0.2)
    assert relay.received == [], "a usage error still dispatched"


def test_notice_judges() -> None:
    assert judge_notice_ack(200, None, 0.1).ok
    late = judge_notice_ack(200, None, ACK_LIMIT_S + 0.5)
    assert not late.ok and late.fix
    assert not judge_notice_ack(404, "HTTP 404", 0.1).ok
    assert judge_notice_refusal(401, "HTTP 401").ok
    accepted = judge_notice_refusal(202, None)
    assert not accepted.ok and "accepted" in accepted.observed
    assert not judge_notice_refusal(None, "ClientConnectorError").ok
    assert judge_no_decision([], 3.0).ok
    answered = judge_no_decision([_obs()], 3.0)
    assert not answered.ok and '"type":"notice"' in answered.fix
