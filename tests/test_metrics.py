"""``GET /metrics`` on a real daemon: exact counter values after a create, an accepted and two
refused decisions, an expiry, cancels, a relay failure and a pending approval; Prometheus
naming conventions; bearer auth; OpenMetrics on request.

Dispatch counts are checked against what the capturing relay really received (every POST it
answered, 2xx or not), since retries of a failing dispatch are timed by backoff and jitter.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gate.daemon.relay_http import post_signed
from tests.support import (
    API_TOKEN,
    DEADLINE_S,
    ROOT,
    CaptureRelay,
    GateProcess,
    decision_body,
    http_request,
    post_decision,
    wait_until,
    write_config,
    writer_pid,
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# the alerts on series only a gate on PostgreSQL exposes (tests/test_daemon_cluster.py)
CLUSTER_ALERTS = ("HitlGateNoTimersHolder", "HitlGateClockSkew", "HitlGateConfigDivergent")


def scrape_raw(
    gate: GateProcess, headers: dict[str, str] | None = None, token: str | None = API_TOKEN
) -> tuple[int, dict[str, str], bytes]:
    hdrs = dict(headers or {})
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    return http_request(gate.api_url + "/metrics", headers=hdrs)


def scrape(gate: GateProcess) -> tuple[dict[str, Any], Samples]:
    """Return ``(families by name, {(sample name, sorted labels): value})``."""
    status, headers, raw = scrape_raw(gate)
    assert status == 200, raw
    assert headers["content-type"].startswith("text/plain; version=0.0.4"), headers
    return parse_scrape(raw)


def parse_scrape(raw: bytes) -> tuple[dict[str, Any], Samples]:
    """A Prometheus text scrape as ``(families by name, {(sample name, sorted labels): value})``."""
    families = {f.name: f for f in text_string_to_metric_families(raw.decode("utf-8"))}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """``{label value: sample value}`` for every sample ``name`` (one label)."""
    return {dict(key[1])[label]: v for key, v in samples.items() if key[0] == name}


def ms(rfc3339: str) -> int:
    return round(datetime.fromisoformat(rfc3339).timestamp() * 1000)


@pytest.fixture
def relay() -> Iterator[CaptureRelay]:
    capture = CaptureRelay().start()
    yield capture
    capture.stop()


@pytest.fixture
def gate(tmp_path: Path, relay: CaptureRelay) -> Iterator[GateProcess]:
    process = GateProcess(write_config(tmp_path, relay.url)).start()
    yield process
    if process.proc is not None and process.proc.poll() is None:
        assert process.stop() == 0


def dispatches_settled(gate: GateProcess, relay: CaptureRelay) -> Samples:
    """Wait until every POST the relay answered is counted; return the samples then."""

    def settled() -> Samples | None:
        _, samples = scrape(gate)
        received = list(relay.received)
        if value(samples, "hitl_gate_dispatch_attempts_total") != len(received):
            return None
        return samples

    return wait_until(settled, what="dispatch attempts counted")


@pytest.mark.e2e
def test_metrics_count_what_happened_exactly(gate: GateProcess, relay: CaptureRelay) -> None:
    api = gate.api()
    families, samples = scrape(gate)
    # every series exists at 0 before anything happened; scrape-time gauges are there too
    assert by_label(samples, "hitl_gate_approvals_created_total", "step") == {
        "q1": 0,
        "q2": 0,
        "q3": 0,
        "short": 0,
    }
    assert by_label(samples, "hitl_gate_approvals_resolved_total", "outcome") == {
        "approved": 0,
        "adjusted": 0,
        "skipped": 0,
        "timeout": 0,
        "cancelled": 0,
    }
    assert value(samples, "hitl_gate_approvals_pending") == 0
    assert value(samples, "hitl_gate_oldest_pending_age_seconds") == 0
    assert value(samples, "hitl_gate_dispatch_attempts_total") == 0
    assert "hitl_gate_relay_up" not in families  # no attempt yet since start
    assert "hitl_gate_relay_last_ack_age_seconds" not in families

    # A: created, dispatched, approved
    a = api.create("q1", body="metrics A")["approval_id"]
    dispatch_a = relay.wait_dispatch(a)
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch_a))
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    a_view = api.get(a)
    # two refusals: a replay (after parsing: logged with the approval_id), an unsigned one
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch_a))
    assert (status, answer["reason"]) == (409, "already_resolved")
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch_a), header="")
    assert (status, answer["reason"]) == (401, "signature_missing")
    gate.wait_for_line(
        f"event=decision_refused status=409 reason=already_resolved approval_id={a}$"
    )
    gate.wait_for_line("event=decision_refused status=401 reason=signature_missing$")

    # C: cancelled after its dispatch; B: expires (step "short", 3 s)
    c = api.create("q1", body="metrics C")["approval_id"]
    relay.wait_dispatch(c)
    assert api.call("POST", f"/v1/approvals/{c}/cancel")[0] == 200
    b = api.create("short", body="metrics B")["approval_id"]
    relay.wait_dispatch(b)
    assert api.wait_resolved(b)["outcome"] == "timeout"

    # D: the relay fails (503) until D is cancelled
    relay.status = 503
    d = api.create("q2", body="metrics D")["approval_id"]
    wait_until(lambda: relay.raw_for(d), what="a refused dispatch of D")
    assert api.call("POST", f"/v1/approvals/{d}/cancel")[0] == 200
    relay.status = 202
    samples = dispatches_settled(gate, relay)
    assert value(samples, "hitl_gate_relay_up") == 0  # the latest attempt failed

    # E: stays pending, its dispatch acked
    before_e = time.time()
    e = api.create("q1", body="metrics E")["approval_id"]
    relay.wait_dispatch(e)
    samples = dispatches_settled(gate, relay)
    after = time.time()

    assert by_label(samples, "hitl_gate_approvals_created_total", "step") == {
        "q1": 3,
        "q2": 1,
        "q3": 0,
        "short": 1,
    }
    assert by_label(samples, "hitl_gate_approvals_resolved_total", "outcome") == {
        "approved": 1,
        "adjusted": 0,
        "skipped": 0,
        "timeout": 1,
        "cancelled": 2,
    }
    assert by_label(samples, "hitl_gate_decisions_accepted_total", "decision") == {
        "approve": 1,
        "skip": 0,
        "adjust": 0,
    }
    assert by_label(samples, "hitl_gate_decisions_refused_total", "reason") == {
        "already_resolved": 1,
        "signature_missing": 1,
    }

    # time to decision: A only (timeouts and cancels are no decisions), exactly its times
    labels = {"pipeline": "p", "step": "q1"}
    assert value(samples, "hitl_gate_time_to_decision_seconds_count", **labels) == 1
    assert (
        value(samples, "hitl_gate_time_to_decision_seconds_sum", **labels)
        == (ms(a_view["resolved_at"]) - ms(a_view["created_at"])) / 1000
    )
    assert not [
        k
        for k in samples
        if k[0] == "hitl_gate_time_to_decision_seconds_count" and dict(k[1])["step"] != "q1"
    ]

    received = list(relay.received)
    acked = [r for r in received if 200 <= r["status"] < 300]
    refused = [r for r in received if r["status"] == 503]
    assert len(acked) == 4 and refused and len(acked) + len(refused) == len(received)
    assert value(samples, "hitl_gate_dispatch_attempts_total") == len(received)
    assert by_label(samples, "hitl_gate_dispatch_failures_total", "reason") == {
        "http_status": len(refused),
        "timeout": 0,
        "connection": 0,
    }
    assert value(samples, "hitl_gate_dispatch_ack_seconds_count") == 4
    assert value(samples, "hitl_gate_dispatch_ack_seconds_bucket", le="+Inf") == 4
    assert 0 < value(samples, "hitl_gate_dispatch_ack_seconds_sum") < 4 * 2.0

    assert value(samples, "hitl_gate_approvals_pending") == 1
    assert 0 <= value(samples, "hitl_gate_oldest_pending_age_seconds") <= after - before_e + 0.01
    assert value(samples, "hitl_gate_relay_up") == 1
    last_ack = value(samples, "hitl_gate_relay_last_ack_timestamp_seconds")
    assert before_e - 0.01 <= last_ack <= after + 0.01
    assert 0 <= value(samples, "hitl_gate_relay_last_ack_age_seconds") <= after - before_e + 0.01


@pytest.mark.e2e
def test_metric_names_follow_prometheus_conventions(gate: GateProcess, relay: CaptureRelay) -> None:
    api = gate.api()
    created = api.create("q1", body="names")["approval_id"]
    post_decision(gate.callback_url, decision_body(relay.wait_dispatch(created)))
    families, samples = scrape(gate)
    assert set(families) == {
        "hitl_gate_build_info",
        "hitl_gate_approvals_created",
        "hitl_gate_approvals_resolved",
        "hitl_gate_decisions_accepted",
        "hitl_gate_decisions_refused",
        "hitl_gate_dispatch_attempts",
        "hitl_gate_dispatch_failures",
        "hitl_gate_dispatch_ack_seconds",
        "hitl_gate_time_to_decision_seconds",
        "hitl_gate_delegated_decisions",
        "hitl_gate_approvals_pending",
        "hitl_gate_oldest_pending_age_seconds",
        "hitl_gate_relay_up",
        "hitl_gate_relay_last_ack_timestamp_seconds",
        "hitl_gate_relay_last_ack_age_seconds",
        "hitl_gate_writer_unanswered_seconds",
        "hitl_gate_notices",
        "hitl_gate_questions_created",
        "hitl_gate_questions_resolved",
        "hitl_gate_questions_pending",
        "hitl_gate_answers",
        "hitl_gate_reminders_sent",
        "hitl_gate_escalations",
        "hitl_gate_followups_failed",
        "hitl_gate_batch_jobs",
        "hitl_gate_write_lock_seconds",
    }
    for family in families.values():
        assert family.documentation, family.name
        if family.type == "counter":
            assert {s.name for s in family.samples} <= {family.name + "_total"}, family.name
        elif family.type == "histogram":  # a unit: seconds, or jobs per batch
            assert family.name.endswith(("_seconds", "_batch_jobs")), family.name
        else:
            assert family.type == "gauge", family.name
    # no counter "_created" series beside the counters, no process/platform collectors
    assert not [name for name, _ in samples if name.endswith("_created")]
    assert all(name.startswith("hitl_gate_") for name, _ in samples)
    assert value(samples, "hitl_gate_build_info", version=__import__("gate").__version__) == 1


@pytest.mark.e2e
def test_metrics_need_the_bearer_token_and_speak_openmetrics(gate: GateProcess) -> None:
    status, _, raw = scrape_raw(gate, token=None)
    assert status == 401 and b'"token_missing"' in raw
    status, _, raw = scrape_raw(gate, token="wrong")
    assert status == 401 and b'"token_invalid"' in raw
    status, headers, raw = scrape_raw(
        gate, {"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text"), headers
    assert raw.endswith(b"# EOF\n")
    for accept in ("text/plain; version=abc", "application/openmetrics-text; q=0", "*/*"):
        status, headers, raw = scrape_raw(gate, {"Accept": accept})
        assert (status, headers["content-type"]) == (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
        ), (accept, raw)
    status, headers, raw = http_request(
        gate.api_url + "/metrics", "HEAD", headers={"Authorization": f"Bearer {API_TOKEN}"}
    )
    assert (status, raw) == (200, b"")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_dispatch_failures_are_classified() -> None:
    async with aiohttp.ClientSession() as session:
        result = await post_signed(
            session, f"http://127.0.0.1:{_closed_port()}/relay", b"{}", "s", int(time.time()), 2.0
        )
    assert (result.status, result.failure) == (None, "connection")


# ---- monitoring: the writer gauge, and the shipped alert rules ----------------------------

ALERTS = ROOT / "deploy" / "prometheus" / "hitl-gate-alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "hitl-gate-alerts.test.yml"
INBOX_ALERTS = ROOT / "deploy" / "prometheus" / "hitl-gate-inbox-alerts.yml"
INBOX_ALERT_TESTS = ROOT / "deploy" / "prometheus" / "hitl-gate-inbox-alerts.test.yml"
OPERATING = ROOT / "docs" / "operating.md"
# PromQL words of the rules that are not series names
PROMQL_WORDS = {
    *("sum", "rate", "increase", "by", "and", "or", "unless", "max", "min", "avg", "abs"),
}


@pytest.mark.e2e
def test_writer_gauge_shows_a_stalled_writer(gate: GateProcess, relay: CaptureRelay) -> None:
    """A stuck database writer made /healthz answer 503 but nothing a Prometheus alert could
    use: ``hitl_gate_writer_unanswered_seconds`` is the age of the oldest write the writer
    process has not answered (0 when none waits); /metrics answers meanwhile (reads do not
    go through the writer)."""
    assert value(scrape(gate)[1], "hitl_gate_writer_unanswered_seconds") == 0
    pid = writer_pid(gate)
    created: dict[str, Any] = {}
    os.kill(pid, signal.SIGSTOP)
    try:
        holder = threading.Thread(
            target=lambda: created.update(gate.api().create("q1")), daemon=True
        )
        holder.start()
        waited = wait_until(
            lambda: value(scrape(gate)[1], "hitl_gate_writer_unanswered_seconds"),
            what="the held create to show in the writer gauge",
        )
        assert waited > 0 and not created  # the create is still waiting for the writer
    finally:
        os.kill(pid, signal.SIGCONT)
    holder.join(DEADLINE_S)
    assert created["state"] == "pending"
    wait_until(
        lambda: value(scrape(gate)[1], "hitl_gate_writer_unanswered_seconds") == 0,
        what="the gauge back at 0 once the writer answered",
    )


def _rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    groups = yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _series_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (label matchers, ranges, ``by (...)``
    lists and numbers left out)."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\bby\s*\([^)]*\)", " ", expr)
    return {
        word for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare) if word not in PROMQL_WORDS
    }


def _scrape_config() -> str:
    """The Prometheus configuration block of docs/operating.md's Monitoring section."""
    text = OPERATING.read_text(encoding="utf-8").split("\n## 9. Monitoring\n", 1)[1]
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    (config,) = [b for b in blocks if "scrape_configs:" in b]
    return config


@pytest.mark.e2e
def test_alert_rules_use_only_metrics_the_running_gate_exposes(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    """Every hitl_gate_* series an alert selects is in a real scrape (after one dispatch was
    acked, so the relay gauges exist); the only other series is Prometheus' own ``up`` of
    the job named in docs/operating.md's scrape config."""
    approval = gate.api().create("q1", body="monitored")["approval_id"]
    relay.wait_dispatch(approval)

    def with_relay_gauges() -> set[str] | None:
        names = {name for name, _ in scrape(gate)[1]}
        return names if "hitl_gate_relay_up" in names else None

    exposed = wait_until(with_relay_gauges, what="the relay gauges")
    job = yaml.safe_load(_scrape_config())["scrape_configs"][0]["job_name"]
    rules = _rules()
    assert {rule["alert"] for rule in rules} == {
        "HitlGateDown",
        "HitlGateRelayUnreachable",
        "HitlGateQuestionRelayUnreachable",
        "HitlGateDispatchFailureRate",
        "HitlGateApprovalWaitingLong",
        "HitlGateWriterStalled",
        *CLUSTER_ALERTS,
    }
    for rule in rules:
        if rule["alert"] == "HitlGateQuestionRelayUnreachable":
            continue  # a gate with a question relay: tests/test_question_metrics.py
        if rule["alert"] in CLUSTER_ALERTS:
            continue  # gates on PostgreSQL: tests/test_daemon_cluster.py
        names = _series_names(rule["expr"])
        assert names, rule
        assert names - {"up"} <= exposed, (rule["alert"], names - exposed)
        if "up" in names:
            assert f'up{{job="{job}"}}' in rule["expr"], rule
        assert rule["labels"]["severity"] in ("critical", "warning"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule


@pytest.mark.e2e
def test_alert_rules_and_scrape_config_pass_promtool(tmp_path: Path) -> None:
    """``promtool check rules`` and the rules' unit tests (each alert quiet, then firing), the
    gate's and the inbox's, and the scrape config of docs/operating.md (syntax: its files
    live on the Prometheus host). Skipped without promtool only outside CI (``.ci/run``
    installs it: Debian ``prometheus``)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("HITL_CI") or os.environ.get("CI"):
            pytest.fail("promtool is missing in CI (apt-get install prometheus)")
        pytest.skip("needs promtool (Debian: apt-get install --no-install-recommends prometheus)")
    config = tmp_path / "prometheus.yml"
    config.write_text(_scrape_config(), encoding="utf-8")
    for args in (
        ["check", "rules", str(ALERTS)],
        ["test", "rules", str(ALERT_TESTS)],
        ["check", "rules", str(INBOX_ALERTS)],
        ["test", "rules", str(INBOX_ALERT_TESTS)],
        ["check", "config", "--syntax-only", str(config)],
    ):
        result = subprocess.run(
            [promtool, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ALERTS.parent,
        )
        assert result.returncode == 0, (args, result.stdout + result.stderr)
        assert "SUCCESS" in result.stdout + result.stderr, (args, result.stdout)
