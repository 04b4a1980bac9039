"""The ``cluster`` section's fail-over figures: three PostgreSQL gates behind the balancer
(``bench.pgsetup``), one of them killed with SIGKILL (its whole process tree) at a time.

1. **Requests**: a gate that does not hold the timers' lease is killed while decisions are
   posted one after the other through the balancer (each on a new connection, as a relay
   would); reported: the time from the kill to the first 200 answer after it, from which
   gate, every answer to a request sent after the kill (status, gate, when), and when
   haproxy's health check marked the dead gate down.
2. **Timers**: an approval on a step that reminds every second; once its first reminder
   arrived at the capture relay, the lease holder is killed; reported: the time from the
   kill to the arrival of the next reminder (another gate took the lease over), against the
   lease's TTL + 1 s.

Both are single measurements per run (the kill's moment against the renewal and health
check phases varies: compare several runs).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

from bench.common import (
    API_TOKEN,
    IDENTITIES,
    PIPELINE,
    SECRET,
    decision_bytes,
    draft_body,
    sign,
)
from bench.pgsetup import FOLLOWED_STEP, PgGates, Postgres, hostport, kill9
from gate.daemon.cluster import LEASE_TTL_S
from tests.balancer import SERVED_BY

if TYPE_CHECKING:
    from bench.cluster import Running
    from bench.common import Helper
    from bench.run import Bench

WARM = 6  # decisions through the balancer before the kill (every gate served some)
AFTER = 12  # decisions sent after the kill
REQUESTS_DEADLINE_S = 10.0
REMINDER_DEADLINE_S = LEASE_TTL_S + 20


def _call(
    url: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    host, port = hostport(url)
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _api(url: str, method: str, path: str, payload: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"}
    body = b"" if payload is None else json.dumps(payload).encode("utf-8")
    status, _, raw = _call(url, method, path, body, headers)
    if status >= 300:
        raise RuntimeError(f"{method} {path} answered {status}: {raw[:300]!r}")
    return json.loads(raw)


def _holder(running: Running) -> int:
    """The index of the gate holding the timers' lease (each gate's /healthz says whether
    it does); waits until one does."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for index, url in enumerate(running.api_urls):
            proc = running.daemons[index].proc
            if proc is None or proc.poll() is not None:
                continue  # killed
            if _api(url, "GET", "/healthz").get("cluster", {}).get("lease_holder"):
                return index
        time.sleep(0.1)
    raise RuntimeError("no gate took the timers' lease within 60 s")


def _decide(decisions_url: str, envelope: dict[str, Any], n: int) -> tuple[int, str]:
    """Post one signed approve decision for ``envelope`` through ``decisions_url``: the
    answer's status and the gate that served it (``X-Served-By``)."""
    body = decision_bytes(
        envelope["approval_id"],
        envelope["nonce"],
        envelope["payload_hash"],
        IDENTITIES[n % len(IDENTITIES)],
    )
    headers = {
        "Content-Type": "application/json",
        "X-Hitl-Protocol": "hitl/v0",
        "X-Draftcat-Signature": sign(SECRET, int(time.time()), body),
    }
    path = urllib.parse.urlsplit(decisions_url).path
    try:
        status, answer_headers, _ = _call(decisions_url, "POST", path, body, headers)
    except OSError:
        return 0, ""
    return status, answer_headers.get(SERVED_BY.lower(), "")


def requests_failover(bench: Bench, running: Running, relay: Helper, victim: int) -> dict:
    """Kill gate ``victim`` between decisions posted through the balancer (module docstring,
    1.)."""
    assert running.balancer is not None
    count = WARM + AFTER
    bench.create_approvals(running.api_urls[0], count, 4)
    envelopes = bench.wait_captured(relay, count)
    warm = [_decide(running.decisions_url, e, n) for n, e in enumerate(envelopes[:WARM])]
    if any(status != 200 for status, _ in warm):
        raise RuntimeError(f"decisions before the kill were not all 200: {warm}")
    name = f"g{victim}"
    redispatched = running.balancer.redispatches()
    killed_at = time.monotonic()
    kill9(running.daemons[victim])
    answers: list[dict[str, Any]] = []
    down_s = None
    for n, envelope in enumerate(envelopes[WARM:], start=WARM):
        sent = time.monotonic() - killed_at
        status, served_by = _decide(running.decisions_url, envelope, n)
        answered = time.monotonic() - killed_at
        answers.append(
            {"sent_s": sent, "answered_s": answered, "status": status, "gate": served_by}
        )
        if down_s is None and running.balancer.servers().get(name) == "DOWN":
            down_s = time.monotonic() - killed_at
        if answered > REQUESTS_DEADLINE_S:
            break
    deadline = killed_at + REQUESTS_DEADLINE_S
    while down_s is None and time.monotonic() < deadline:
        if running.balancer.servers().get(name) == "DOWN":
            down_s = time.monotonic() - killed_at
        time.sleep(0.02)
    first_ok = next((a for a in answers if a["status"] == 200), None)
    return {
        "killed": name,
        "first_answer": answers[0] if answers else None,
        "first_ok_s": None if first_ok is None else first_ok["answered_s"],
        "first_ok_gate": None if first_ok is None else first_ok["gate"],
        "answers_after_kill": answers,
        "not_ok_after_kill": sum(1 for a in answers if a["status"] != 200),
        "served_by_killed_after_kill": sum(1 for a in answers if a["gate"] == name),
        "redispatched": running.balancer.redispatches() - redispatched,
        "marked_down_s": down_s,
    }


def _reminders(bench: Bench, relay: Helper, approval_id: str) -> list[tuple[int, float]]:
    """``(n, arrival unix time)`` of each reminder of ``approval_id`` the relay got."""
    got = bench.relay_get(relay, "/reminders")
    return [(int(r["n"]), float(r["at"])) for r in got if r["approval_id"] == approval_id]


def timers_failover(bench: Bench, running: Running, relay: Helper, survivor: int) -> dict:
    """Kill the lease holder once a reminding approval got its first reminder (module
    docstring, 2.); ``survivor`` is a gate that stays up (the approval is created there)."""
    holder = _holder(running)
    if holder == survivor:  # the lease moved meanwhile: keep the approval on a live gate
        survivor = next(
            n
            for n, d in enumerate(running.daemons)
            if n != holder and d.proc is not None and d.proc.poll() is None
        )
    created = _api(
        running.api_urls[survivor],
        "POST",
        "/v1/approvals",
        {
            "pipeline": PIPELINE,
            "step": FOLLOWED_STEP,
            "run_id": "bench-failover",
            "draft": {"content_type": "text/plain", "body": draft_body(0)},
        },
    )
    approval_id = created["approval_id"]
    deadline = time.monotonic() + 60
    while not _reminders(bench, relay, approval_id):
        if time.monotonic() > deadline:
            raise RuntimeError("no first reminder within 60 s")
        time.sleep(0.05)
    killed_at = time.time()
    kill9(running.daemons[holder])
    sent_before = max(n for n, _ in _reminders(bench, relay, approval_id))
    deadline = time.monotonic() + REMINDER_DEADLINE_S
    while not (later := [at for n, at in _reminders(bench, relay, approval_id) if n > sent_before]):
        if time.monotonic() > deadline:
            return {"killed": f"g{holder}", "next_reminder_s": None, "lease_ttl_s": LEASE_TTL_S}
        time.sleep(0.02)
    return {
        "killed": f"g{holder}",
        "reminders_before_kill": sent_before,
        "next_reminder_s": min(later) - killed_at,
        "lease_ttl_s": LEASE_TTL_S,
        "reminder_every_s": 1.0,
    }


def run(bench: Bench, postgres: Postgres) -> dict[str, Any]:
    """Three PostgreSQL gates behind the balancer: the request fail-over (a gate that does
    not hold the lease killed), then the timers' (the holder killed)."""
    from bench.run import _progress

    directory = bench.tmp / "cluster" / "failover"
    relay = bench.relay(directory, "capture")
    try:
        running = PgGates(postgres, 3, balanced=True).start(bench, directory, relay.url)
        try:
            holder = _holder(running)
            victim = (holder + 1) % 3
            survivor = (holder + 2) % 3
            _progress("cluster: fail-over (kill -9 of a gate under the balancer)")
            requests = requests_failover(bench, running, relay, victim)
            _progress("cluster: fail-over (kill -9 of the lease holder)")
            timers = timers_failover(bench, running, relay, survivor)
        finally:
            running.stop()
    finally:
        relay.stop()
    return {"gates": 3, "requests": requests, "timers": timers}
