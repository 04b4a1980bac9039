"""Logs: ``serve --log-format json`` writes one JSON object per line (ts, level, logger, event,
the message's fields as keys); every line about an approval carries its approval_id; no
secret, token, nonce, draft body or adjust text reaches a line. The text format stays the
default (every other test reads it).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.logs import JsonFormatter, parse_fields
from tests.support import (
    ROOT,
    Api,
    CaptureRelay,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
APPROVAL_EVENTS = {"created", "decision", "resolved", "dispatched", "dispatch_failed"}


def marker(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


SECRETS = {
    "HITL_RELAY_SECRET": marker("relay-secret"),
    "HITL_RELAY_SECRET_OLD": marker("old-relay-secret"),
    "HITL_API_TOKEN": marker("api-token"),
    "HITL_RECEIPT_KEY": marker("receipt-key"),
}


class JsonGate(GateProcess):
    """``python -m gate serve --log-format json``."""

    def start(self) -> JsonGate:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gate", "serve", "-c", str(self.config), "--log-format", "json"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=ROOT,
        )
        threading.Thread(target=self._read, daemon=True).start()
        listening = json.loads(self.wait_for_line(r'"event": "listening"').string)
        self.callback_url = listening["callback"] + "/hitl/v0/decisions"
        self.api_url = listening["api"]
        return self

    def api(self) -> Api:
        return Api(self.api_url, SECRETS["HITL_API_TOKEN"])


@pytest.fixture
def relay() -> Iterator[CaptureRelay]:
    capture = CaptureRelay().start()
    yield capture
    capture.stop()


@pytest.mark.e2e
def test_json_lines_carry_approval_ids_and_no_secrets(tmp_path: Path, relay: CaptureRelay) -> None:
    gate = JsonGate(write_config(tmp_path, relay.url), env=gate_env(**SECRETS)).start()
    secret = SECRETS["HITL_RELAY_SECRET"]
    api = gate.api()
    drafts = [marker("draft") for _ in range(4)]
    adjust_text = marker("adjust")
    try:
        # approved
        approved = api.create("q1", body=drafts[0])["approval_id"]
        first = relay.wait_dispatch(approved)
        assert post_decision(gate.callback_url, decision_body(first), secret=secret)[0] == 200
        # adjusted (quorum 2: a second revision is dispatched), then approved by bob
        adjusted = api.create("q2", body=drafts[1])["approval_id"]
        second = relay.wait_dispatch(adjusted)
        assert (
            post_decision(
                gate.callback_url,
                decision_body(second, verb="adjust", adjust_text=adjust_text),
                secret=secret,
            )[0]
            == 200
        )
        revised = relay.wait_dispatch(adjusted, revision=2)
        assert (
            post_decision(
                gate.callback_url, decision_body(revised, "bob@example.com"), secret=secret
            )[0]
            == 200
        )
        # refused: a wrong payload hash (parsed: carries the approval_id), a bad signature
        refused = api.create("q1", body=drafts[2])["approval_id"]
        third = relay.wait_dispatch(refused)
        status, answer, _ = post_decision(
            gate.callback_url,
            decision_body(third, payload_hash="sha256:" + "0" * 64),
            secret=secret,
        )
        assert (status, answer["reason"]) == (403, "payload_hash_mismatch")
        status, answer, _ = post_decision(
            gate.callback_url, decision_body(third), secret=marker("wrong-secret")
        )
        assert (status, answer["reason"]) == (401, "signature_mismatch")
        # the relay fails, then the approval is cancelled
        relay.status = 503
        failing = api.create("q1", body=drafts[3])["approval_id"]
        gate.wait_for_line(f'"event": "dispatch_failed", "approval_id": "{failing}"')
        assert api.call("POST", f"/v1/approvals/{failing}/cancel")[0] == 200
        relay.status = 202
        gate.wait_for_line(f'"event": "resolved", "approval_id": "{failing}"')
    finally:
        assert gate.stop() == 0
    nonces = [d["callback"]["nonce"] for d in relay.dispatches(acked_only=False)]
    ids = {approved, adjusted, refused, failing}

    lines = gate.log().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    for record in records:
        assert TS.fullmatch(record["ts"]), record
        assert record["level"] in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}, record
        assert isinstance(record["event"], str) and record["event"], record
        assert isinstance(record["logger"], str), record
    for line, record in zip(lines, records, strict=True):
        named = [i for i in ids if i in line]
        if named:  # a line about an approval names it in its approval_id field
            assert named == [record.get("approval_id")], line
        if record["event"] in APPROVAL_EVENTS:
            assert record.get("approval_id") in ids, line
        for forbidden in [*SECRETS.values(), *drafts, adjust_text, *nonces]:
            assert forbidden not in line, (forbidden, line)

    events = [r["event"] for r in records]
    assert events[-1] == "stopped" and "listening" in events
    refusals = [r for r in records if r["event"] == "decision_refused"]
    assert [(r["status"], r["reason"], r.get("approval_id")) for r in refusals] == [
        (403, "payload_hash_mismatch", refused),
        (401, "signature_mismatch", None),
    ]
    assert {r["outcome"] for r in records if r["event"] == "resolved"} == {
        "approved",
        "adjusted",
        "cancelled",
    }
    failed = next(r for r in records if r["event"] == "dispatch_failed")
    assert (failed["level"], failed["error"], failed["revision"]) == (
        "WARNING",
        "relay answered HTTP 503",
        1,
    )
    created = next(r for r in records if r["event"] == "created")
    assert created["payload_hash"].startswith("sha256:") and created["quorum"] == 1


@pytest.mark.e2e
def test_config_errors_are_json_lines_too(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/relay")
    env = gate_env(**SECRETS)
    del env["HITL_API_TOKEN"]
    result = run_cli("serve", "-c", str(config), "--log-format", "json", env=env)
    assert result.returncode == 2, result.stderr
    records = [json.loads(line) for line in result.stderr.decode().splitlines()]
    assert records and all(
        r["event"] == "config_invalid" and r["level"] == "ERROR" for r in records
    )
    assert any("HITL_API_TOKEN" in r["error"] for r in records)


@pytest.mark.e2e
def test_text_stays_the_default(tmp_path: Path, relay: CaptureRelay) -> None:
    gate = GateProcess(write_config(tmp_path, relay.url)).start()
    try:
        created = gate.api().create("q1", body="text default")["approval_id"]
        line = gate.wait_for_line(f"event=created approval_id={created} ").string
        assert re.match(
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO gate\.core\.service "
            r"event=created ",
            line,
        ), line
    finally:
        assert gate.stop() == 0
    assert wait_until(lambda: not any(ln.startswith("{") for ln in gate.lines))


# ---- the formatter alone -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "fields", "text"),
    [
        (
            "event=dispatched approval_id=01J9 revision=2 attempt=1 status=202",
            {
                "event": "dispatched",
                "approval_id": "01J9",
                "revision": 2,
                "attempt": 1,
                "status": 202,
            },
            "",
        ),
        (
            "event=dispatch_failed error='relay answered HTTP 503' retry_in_s=0.5",
            {"event": "dispatch_failed", "error": "relay answered HTTP 503", "retry_in_s": 0.5},
            "",
        ),
        (
            'event=x error="it\'s a=b" status=None',
            {"event": "x", "error": "it's a=b", "status": None},
            "",
        ),
        (
            "event=storage_unavailable db=/var/gate.db error=disk I/O error",
            {"event": "storage_unavailable", "db": "/var/gate.db", "error": "disk I/O error"},
            "",
        ),
        ("Error handling request", {}, "Error handling request"),
        ("Task failed event=boom", {"event": "boom"}, "Task failed"),
    ],
)
def test_parse_fields(message: str, fields: dict[str, Any], text: str) -> None:
    assert parse_fields(message) == (fields, text)


def _format(msg: str, *args: Any, exc: bool = False) -> dict[str, Any]:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            exc_info = sys.exc_info()
    record = logging.LogRecord("gate.x", logging.ERROR, __file__, 1, msg, args, exc_info)
    record.created = 1785663065.25
    return json.loads(JsonFormatter().format(record))


def test_json_formatter_shapes_a_line() -> None:
    assert _format("event=created approval_id=%s level=%s", "01J9", "high") == {
        "ts": "2026-08-02T09:31:05.250Z",
        "level": "ERROR",
        "logger": "gate.x",
        "event": "created",
        "approval_id": "01J9",
        "level_": "high",
    }
    plain = _format("something %s", "happened", exc=True)
    assert (plain["event"], plain["text"]) == ("unstructured", "something happened")
    assert plain["exception"].startswith("Traceback") and "RuntimeError: boom" in plain["exception"]
