"""The inbox operated like the gate: ``GET /healthz`` (no sign-in) and ``GET /metrics``
(Prometheus text, the metrics token) of a real ``hitl-gate inbox serve`` beside a real gate,
with sign-ins and decisions made over real HTTP by a software passkey."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.inbox_harness import InboxWorld, start_world
from tests.support import API_TOKEN, http_request, wait_until
from tests.test_metrics import INBOX_ALERTS, Samples, _rules, _series_names, parse_scrape, value

pytestmark = pytest.mark.e2e

TOKEN_CONFIG = {"metrics_token_env": "HITL_API_TOKEN"}  # any variable the test's env sets


@pytest.fixture
def world(tmp_path: Path) -> Iterator[InboxWorld]:
    started = start_world(tmp_path, inbox_config=TOKEN_CONFIG)
    yield started
    started.stop()


def health(world: InboxWorld) -> tuple[int, Any]:
    assert world.inbox is not None
    status, headers, raw = http_request(world.inbox.base + "/healthz")
    assert headers["content-type"].startswith("application/json"), headers
    return status, json.loads(raw)


def scrape(world: InboxWorld, token: str | None = API_TOKEN) -> tuple[int, bytes]:
    assert world.inbox is not None
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    status, _, raw = http_request(world.inbox.base + "/metrics", headers=headers)
    return status, raw


def samples(world: InboxWorld) -> Samples:
    status, raw = scrape(world)
    assert status == 200, raw
    return parse_scrape(raw)[1]


def test_inbox_healthz_is_ok_then_names_the_unreachable_gate(world: InboxWorld) -> None:
    status, body = health(world)
    assert status == 200, body
    assert body["status"] == "ok" and isinstance(body["schema_version"], int), body
    assert set(body) == {"status", "schema_version"}  # nothing else: no identity, no draft

    assert world.gate is not None
    world.gate.stop()
    status, body = wait_until(
        lambda: (answer := health(world))[0] == 503 and answer, what="healthz 503"
    )
    assert body["status"] == "unavailable" and body["reason"] == "gate_unreachable", body
    assert "cannot reach the gate" in body["message"], body
    assert value(samples(world), "hitl_inbox_gate_errors_total", call="credentials") >= 1

    world.start_gate()
    status, body = wait_until(lambda: (a := health(world))[0] == 200 and a, what="healthz 200")
    assert body["status"] == "ok"


class NoBackend(BaseHTTPRequestHandler):
    """A balancer in front of the gate with no gate behind it: 502, an HTML page."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
        self.send_response(502)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *_: object) -> None:
        pass


def test_inbox_healthz_says_a_gate_behind_a_5xx_is_unreachable_not_refused(
    world: InboxWorld,
) -> None:
    """``gate_refused`` means the gate answered and said no (a wrong secret); a balancer's
    502 is no answer from the gate."""
    assert world.gate is not None
    world.gate.stop()
    balancer = ThreadingHTTPServer(("127.0.0.1", world.gate_port), NoBackend)
    threading.Thread(target=balancer.serve_forever, daemon=True).start()
    try:
        status, body = wait_until(
            lambda: (a := health(world))[0] == 503 and "502" in a[1]["message"] and a,
            what="healthz naming the 502",
        )
    finally:
        balancer.shutdown()
        balancer.server_close()
    assert body["reason"] == "gate_unreachable", body


def test_inbox_metrics_need_the_token_and_count_signins_and_decisions(
    world: InboxWorld,
) -> None:
    assert scrape(world, token=None)[0] == 401
    assert scrape(world, token="not-the-token")[0] == 401
    before = samples(world)
    assert value(before, "hitl_inbox_items_waiting") == 0
    assert value(before, "hitl_inbox_signins_total", result="ok") == 0
    assert value(before, "hitl_inbox_decisions_total", verb="approve") == 0
    assert value(before, "hitl_inbox_mails_total", result="sent") == 0

    client = world.client()
    refused = client.signin(world.passkeys[101], origin="http://localhost:1")
    assert refused.status == 401, refused.text
    assert client.signin(world.passkeys[101]).status == 200
    assert world.gate is not None and world.inbox is not None
    approval_id = world.gate.api().create("q1", body="Pay 12 EUR")["approval_id"]
    world.inbox.wait_item(approval_id)
    assert value(samples(world), "hitl_inbox_items_waiting") == 1
    decided = client.decide(approval_id, world.passkeys[101])
    assert decided.status == 200, decided.text

    after = samples(world)
    assert value(after, "hitl_inbox_signins_total", result="ok") == 1
    assert value(after, "hitl_inbox_signins_total", result="failed") == 1
    assert value(after, "hitl_inbox_decisions_total", verb="approve") == 1
    assert value(after, "hitl_inbox_gate_errors_total", call="decision") == 0
    wait_until(
        lambda: value(samples(world), "hitl_inbox_items_waiting") == 0,
        what="the resolved item no longer waiting",
    )
    text = scrape(world)[1].decode()
    assert "Pay 12 EUR" not in text and "alice" not in text and approval_id not in text
    exposed = {name for name, _ in after}
    for rule in _rules(INBOX_ALERTS):  # the shipped alerts use only series the inbox exposes
        names = _series_names(rule["expr"]) - {"up"}
        assert names <= exposed, (rule["alert"], names - exposed)
        assert rule["labels"]["severity"] in ("critical", "warning"), rule


def test_inbox_metrics_without_a_token_configured_answer_404_in_words(tmp_path: Path) -> None:
    started = start_world(tmp_path, enrol=())
    try:
        status, raw = scrape(started)
    finally:
        started.stop()
    body = json.loads(raw)
    assert status == 404, raw
    assert body["reason"] == "metrics_off" and "metrics_token_env" in body["message"], body


def test_inbox_healthz_is_503_once_a_newer_inbox_migrated_its_database(
    world: InboxWorld,
) -> None:
    """New-user report: a running older inbox's ``/healthz`` reported the schema version a
    newer inbox had migrated its database to, past what it knows. It answers 503
    ``schema_too_new`` naming both numbers, as the gate does."""
    import sqlite3

    from gate.inbox.schema import MIGRATIONS

    assert world.inbox is not None
    assert health(world) == (200, {"status": "ok", "schema_version": len(MIGRATIONS)})
    conn = sqlite3.connect(world.inbox.db)
    try:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    finally:
        conn.close()

    assert health(world) == (
        503,
        {
            "status": "unavailable",
            "reason": "schema_too_new",
            "message": f"The database's schema is version {len(MIGRATIONS) + 1}; this inbox"
            f" knows up to {len(MIGRATIONS)} (a newer hitl-inbox migrated it: replace this"
            " inbox by the newer version).",
        },
    )
