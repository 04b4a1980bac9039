"""Races against one real daemon: many identical and different decisions at once, for quorum
1, 2 and 3, while the expiry scheduler resolves other approvals at the same moment.

SPEC §2: "Recording, nonce burning, quorum counting and resolution happen in one database
transaction: two decisions racing can never both resolve, nor both count for one approver."

Every race is real HTTP from one thread per request, each on its own connection, released
together by a barrier. Meanwhile a stream of approvals on a 2 s step is created (one every
25 ms or so); the barrier opens 10 ms before one of them expires, and some of the racing
decisions are on the stream's approvals, so the scheduler's ``timeout`` transactions
interleave with the decisions. The last test races a burst of creates through the
dispatcher: every approval is sent to the relay once and acked once. Checked:
exactly-once resolution (one ``resolved`` audit entry per approval), exactly ``quorum``
decisions recorded for an approve race, every other answer a 409 with the right reason (or
410 ``expired``), the stored decisions equal to the 200 answers, no 5xx, and no
``database is locked`` (nor traceback) in the daemon's log. At the end of the module the
whole database must satisfy the soak's invariants and ``hitl-gate audit verify`` exits 0.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gate.protocol.canonical import wire_json
from tests.soak.soak import check_database, replay_decisions, rfc3339_ms, ro_connect
from tests.support import (
    API_TOKEN,
    DEADLINE_S,
    IDENTITIES,
    ROOT,
    CaptureRelay,
    GateProcess,
    as_json,
    decision_body,
    gate_env,
    sign_headers,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OPS = list(range(101, 107))  # alice, bob, carol, op04, op05, op06
IDENT = {op: IDENTITIES[op - 101] for op in OPS}
RACE_STEPS = [
    {"name": "r1", "quorum": 1, "approvers": OPS, "timeout": "1h"},
    {"name": "r2", "quorum": 2, "approvers": OPS, "timeout": "1h"},
    {"name": "r3", "quorum": 3, "approvers": OPS, "timeout": "1h"},
    {"name": "exp", "quorum": 1, "approvers": OPS, "timeout": "2s"},
]
EXPIRY_MS = 2000
EXPIRING = 200  # at most this many approvals on the 2 s step per race, ~25 ms apart
EXPIRING_DECIDED = 6  # of which the 1st, 3rd, ... 11th also get racing decisions
RACED = 3  # approvals per race on the quorum step

RECORDED_PENDING = {"status": "recorded", "resolved": False}
DUPLICATE = {"status": "duplicate", "reason": "duplicate"}
ALREADY_DECIDED = {"status": "already_decided", "reason": "already_decided"}
SUPERSEDED = {"status": "superseded", "reason": "superseded"}
EXPIRED = {"status": "expired", "reason": "expired"}
LOG_NEEDLES = ("database is locked", "Traceback", "internal_error", "event=expiry_failed")


def resolved(outcome: str) -> dict[str, Any]:
    return {"status": "recorded", "resolved": True, "outcome": outcome}


def already_resolved(outcome: str) -> dict[str, str]:
    return {"status": "already_resolved", "reason": "already_resolved", "outcome": outcome}


# ---------------------------------------------------------------------------------------------
# One daemon for the module
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def relay() -> Iterator[CaptureRelay]:
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def gate(relay: CaptureRelay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    """The daemon every race runs against; at the end: clean stop, clean log, whole database
    consistent, audit chain intact."""
    directory = tmp_path_factory.mktemp("races")
    proc = GateProcess(
        write_config(
            directory,
            relay.url,
            steps=RACE_STEPS,
            security={"rate_limit": 1_000_000, "max_input_length": 200},
        )
    ).start()
    yield proc
    assert proc.stop() == 0
    assert_log_clean(proc)
    with contextlib.closing(ro_connect(directory / "gate.db")) as conn:
        problems, _ = check_database(conn)
    assert problems == {"duplicates": [], "problems": []}
    done = subprocess.run(
        [sys.executable, "-m", "gate", "audit", "verify", "-c", str(proc.config)],
        capture_output=True,
        env=gate_env(),
        cwd=ROOT,
        timeout=DEADLINE_S * 3,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)


def assert_log_clean(proc: GateProcess) -> None:
    log = proc.log()
    for needle in LOG_NEEDLES:
        assert needle not in log, f"daemon log contains {needle!r}"


@pytest.fixture(autouse=True)
def _log_stays_clean(gate: GateProcess) -> Iterator[None]:
    yield
    assert_log_clean(gate)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


@dataclass
class Req:
    """One racing request: ``who`` = (approval_id, operator id or "cancel", what)."""

    who: tuple[str, Any, str]
    url: str
    raw: bytes
    headers: dict[str, str]
    status: int = 0
    answer: Any = None


def create(gate: GateProcess, step: str, body: str) -> dict[str, Any]:
    return gate.api().create(step, body)


def decision(
    gate: GateProcess,
    dispatch: dict[str, Any],
    op: int,
    verb: str = "approve",
    identity: str | None = None,
    adjust_text: str | None = None,
    copies: int = 1,
) -> list[Req]:
    """``copies`` identical requests (same bytes, same signature header) of one decision."""
    body = decision_body(dispatch, identity or IDENT[op], verb, adjust_text=adjust_text)
    raw = wire_json(body)
    headers = sign_headers(raw)
    return [
        Req((dispatch["approval_id"], op, verb), gate.callback_url, raw, headers)
        for _ in range(copies)
    ]


def cancel(gate: GateProcess, approval_id: str) -> Req:
    return Req(
        (approval_id, "cancel", "cancel"),
        f"{gate.api_url}/v1/approvals/{approval_id}/cancel",
        b"",
        {"Authorization": f"Bearer {API_TOKEN}"},
    )


def fire(requests: list[Req], at: Callable[[], float] | None = None) -> tuple[float, float]:
    """POST every request at once (one thread and connection each, released by a barrier
    whose action, once every thread is connected, waits until wall-clock ``at()``); fills
    ``status``/``answer``.

    Returns the wall-clock window (release, last answer)."""
    released: list[float] = []

    def go() -> None:
        if at is not None:
            delay = at() - time.time()
            if delay > 0:
                time.sleep(delay)  # the point of the race is this moment
        released.append(time.time())

    barrier = threading.Barrier(len(requests), action=go)
    errors: list[BaseException] = []

    def worker(req: Req) -> None:
        parts = urllib.parse.urlsplit(req.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=DEADLINE_S * 3)
        try:
            conn.connect()
            barrier.wait(DEADLINE_S * 3)
            conn.request("POST", parts.path, body=req.raw, headers=req.headers)
            resp = conn.getresponse()
            req.status, req.answer = resp.status, as_json(resp.read())
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(r,)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S * 6)
    assert not errors, errors
    assert all(r.status for r in requests), "a racing request got no answer"
    return released[0], time.time()


class Expiring:
    """Approvals on the 2 s step created about 25 ms apart by a background thread until
    ``join()``, so from 2 s after the start on they expire one after another, whenever the
    race runs (however long the preparation took on a loaded machine)."""

    def __init__(self, gate: GateProcess) -> None:
        self.gate = gate
        self.ids: list[str] = []
        self.expires: dict[str, int] = {}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._create)
        self._thread.start()

    def _create(self) -> None:
        try:
            for n in range(EXPIRING):
                if self._stop.is_set():
                    return
                answer = create(self.gate, "exp", f"expiring {n}\n")
                self.expires[answer["approval_id"]] = rfc3339_ms(answer["expires_at"])
                self.ids.append(answer["approval_id"])
                time.sleep(0.025)  # spread the expiries out in time
        except BaseException as exc:
            self.errors.append(exc)

    def first(self, n: int) -> list[str]:
        deadline = time.monotonic() + DEADLINE_S
        while len(self.ids) < n:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, "expiring approvals were not created"
            time.sleep(0.01)
        return self.ids[:n]

    def moment(self, decided: list[str], not_before_ms: int = 0) -> float:
        """Return a release time 10 ms before the next ``expires_at`` of an approval without
        decisions, at least 15 ms from now: that approval expires while the race runs."""
        earliest = max(not_before_ms, int(time.time() * 1000) + 15)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            upcoming = [
                self.expires[a]
                for a in list(self.ids)
                if a not in decided and self.expires[a] >= earliest
            ]
            if upcoming:
                return min(upcoming) / 1000 - 0.01
            assert time.monotonic() < deadline, "the expiring stream stalled"
            time.sleep(0.005)

    def join(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE_S * 3)
        assert not self.errors, self.errors


def db_rows(gate: GateProcess, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with contextlib.closing(ro_connect(gate.config.parent / "gate.db")) as conn:
        return [dict(r) for r in conn.execute(sql, args)]


def audit_kinds(gate: GateProcess, approval_id: str) -> Counter[str]:
    return Counter(
        r["kind"]
        for r in db_rows(gate, "SELECT kind FROM audit_log WHERE approval_id = ?", (approval_id,))
    )


def resolution(gate: GateProcess, approval_id: str) -> dict[str, Any]:
    rows = db_rows(
        gate,
        "SELECT entry FROM audit_log WHERE approval_id = ? AND kind = 'resolved'",
        (approval_id,),
    )
    assert len(rows) == 1, f"{approval_id} has {len(rows)} resolved entries"
    return json.loads(rows[0]["entry"])["data"]


def expiring_decisions(gate: GateProcess, relay: CaptureRelay, ids: list[str]) -> list[Req]:
    """Two approvers, two identical copies each, on each of ``ids`` (quorum 1, 2 s)."""
    out: list[Req] = []
    for approval_id in ids:
        dispatch = relay.wait_dispatch(approval_id)
        out += decision(gate, dispatch, 101, copies=2) + decision(gate, dispatch, 102, copies=2)
    return out


def check_expiring(
    gate: GateProcess, expiring: Expiring, requests: list[Req], window: tuple[float, float]
) -> None:
    """Each expiring approval resolved once: ``approved`` by exactly one 200 that came in
    before ``expires_at`` (the other answers 409 already_resolved), or ``timeout`` at or after
    ``expires_at`` (its decisions 410 expired). At least one approval reached its ``expires_at``
    while the race was running and timed out."""
    expiring.join()
    api = gate.api()
    during = 0
    for approval_id in expiring.ids:
        approval = api.wait_resolved(approval_id)
        mine = [r for r in requests if r.who[0] == approval_id]
        accepted = [r for r in mine if r.status == 200]
        assert audit_kinds(gate, approval_id)["resolved"] == 1
        assert resolution(gate, approval_id)["outcome"] == approval["outcome"]
        resolved_at = rfc3339_ms(approval["resolved_at"])
        if approval["outcome"] == "timeout":
            assert resolved_at >= expiring.expires[approval_id]
            assert accepted == [] and approval["decisions"] == []
            assert all((r.status, r.answer) == (410, EXPIRED) for r in mine)
            # the scheduler woke for it while the racing requests were being handled
            during += window[0] * 1000 <= expiring.expires[approval_id] <= window[1] * 1000
        else:
            assert approval["outcome"] == "approved"
            assert [(r.status, r.answer) for r in accepted] == [(200, resolved("approved"))]
            assert len(approval["decisions"]) == 1
            assert (
                rfc3339_ms(approval["decisions"][0]["recorded_at"]) < expiring.expires[approval_id]
            )
            assert all(
                (r.status, r.answer) == (409, already_resolved("approved"))
                for r in mine
                if r.status != 200
            )
    assert during >= 1, (
        "no approval expired while the race ran",
        window,
        sorted(expiring.expires.values()),
    )


def no_5xx(requests: list[Req]) -> None:
    bad = [(r.who, r.status, r.answer) for r in requests if r.status >= 500]
    assert bad == []


def start_race(
    gate: GateProcess, relay: CaptureRelay, step: str, body: str
) -> tuple[Expiring, list[dict[str, Any]], list[str]]:
    """Start the expiring stream, open ``RACED`` approvals on ``step``; return the stream,
    their dispatches and the expiring approvals that get decisions too."""
    expiring = Expiring(gate)
    dispatches = []
    for n in range(RACED):
        approval_id = create(gate, step, f"{body} {n}\n")["approval_id"]
        dispatches.append(relay.wait_dispatch(approval_id))
    return expiring, dispatches, expiring.first(2 * EXPIRING_DECIDED)[0::2]


def fire_at(expiring: Expiring, decided: list[str]) -> Callable[[], float]:
    """Release the race 10 ms before the next approval of the stream without decisions
    expires (the ones with decisions expire just before or just after)."""
    return lambda: expiring.moment(decided)


# ---------------------------------------------------------------------------------------------
# Approve races: identical and different approvals, quorum 1, 2 and 3
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("quorum", [1, 2, 3])
def test_approve_race_records_exactly_quorum_and_resolves_once(gate, relay, quorum):
    """Six approvers approve at once, alice eight times with the same signed bytes, the others
    three times, bob also in another spelling: exactly ``quorum`` operators are recorded, one
    answer resolves, every other answer is 409 duplicate (an operator already recorded,
    before the resolution) or 409 already_resolved."""
    expiring, dispatches, decided = start_race(gate, relay, f"r{quorum}", "approve race")
    requests: list[Req] = []
    for dispatch in dispatches:
        requests += decision(gate, dispatch, 101, copies=8)
        for op in OPS[1:]:
            requests += decision(gate, dispatch, op, copies=3)
        requests += decision(gate, dispatch, 102, identity="  BOB@Example.com ", copies=2)
    requests += expiring_decisions(gate, relay, decided)
    window = fire(requests, at=fire_at(expiring, decided))
    no_5xx(requests)

    api = gate.api()
    for dispatch in dispatches:
        approval_id = dispatch["approval_id"]
        mine = [r for r in requests if r.who[0] == approval_id]
        accepted = [r for r in mine if r.status == 200]
        winners = [r.who[1] for r in accepted]
        assert len(accepted) == quorum and len(set(winners)) == quorum
        assert sorted(r.answer == resolved("approved") for r in accepted) == [False] * (
            quorum - 1
        ) + [True]
        assert all(r.answer in (RECORDED_PENDING, resolved("approved")) for r in accepted)
        for r in mine:
            if r.status == 200:
                continue
            assert (r.status, r.answer) in ((409, DUPLICATE), (409, already_resolved("approved")))
            if r.answer == DUPLICATE:
                assert r.who[1] in winners  # only an operator already recorded
        if quorum == 1:
            assert all(r.answer == already_resolved("approved") for r in mine if r.status != 200)
        approval = api.get(approval_id)
        assert (approval["state"], approval["outcome"]) == ("resolved", "approved")
        assert approval["quorum"] == {"required": quorum, "collected": quorum}
        assert sorted(d["operator_id"] for d in approval["decisions"]) == sorted(winners)
        kinds = audit_kinds(gate, approval_id)
        assert (kinds["resolved"], kinds["decision"]) == (1, quorum)
        assert sorted(resolution(gate, approval_id)["approved_by"]) == sorted(winners)
    check_expiring(gate, expiring, requests, window)


# ---------------------------------------------------------------------------------------------
# Mixed races: approve, skip, adjust (new text and same text) and cancel at once
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("quorum", [1, 2, 3])
def test_mixed_race_resolves_exactly_once_and_stores_exactly_the_accepted(gate, relay, quorum):
    """Alice sends approve, skip and adjust at once (one may count); bob approves twice;
    carol skips twice; op04 adjusts twice; op05 adjusts to the same text (an approve) and
    approves; op06 approves; the pipeline cancels. Exactly one answer resolves and the stored
    outcome is that one; the stored decisions are exactly the 200 answers, and replayed
    through the quorum rules they give the stored outcome; every other answer is a 409 with
    a reason that fits what won."""
    expiring, dispatches, decided = start_race(gate, relay, f"r{quorum}", "mixed race")
    requests: list[Req] = []
    for dispatch in dispatches:
        current = dispatch["draft"]["body"]
        requests += (
            decision(gate, dispatch, 101, "approve", copies=2)
            + decision(gate, dispatch, 101, "skip")
            + decision(gate, dispatch, 101, "adjust", adjust_text="alice's edit")
            + decision(gate, dispatch, 102, "approve", copies=2)
            + decision(gate, dispatch, 103, "skip", copies=2)
            + decision(gate, dispatch, 104, "adjust", adjust_text="op04's edit", copies=2)
            + decision(gate, dispatch, 105, "adjust", adjust_text=current)
            + decision(gate, dispatch, 105, "approve")
            + decision(gate, dispatch, 106, "approve")
            + [cancel(gate, dispatch["approval_id"])]
        )
    requests += expiring_decisions(gate, relay, decided)
    window = fire(requests, at=fire_at(expiring, decided))
    no_5xx(requests)

    api = gate.api()
    for dispatch in dispatches:
        approval_id = dispatch["approval_id"]
        mine = [r for r in requests if r.who[0] == approval_id]
        approval = api.get(approval_id)
        outcome = approval["outcome"]
        assert approval["state"] == "resolved"
        resolving = [
            r
            for r in mine
            if r.status == 200 and (r.who[1] == "cancel" or r.answer.get("resolved"))
        ]
        assert len(resolving) == 1, [(r.who, r.answer) for r in resolving]
        won = resolving[0]
        if won.who[1] == "cancel":
            assert outcome == "cancelled" and won.answer["outcome"] == "cancelled"
        else:
            assert won.answer == resolved(outcome)
        assert audit_kinds(gate, approval_id)["resolved"] == 1
        assert resolution(gate, approval_id)["outcome"] == outcome

        accepted = [r for r in mine if r.status == 200 and r.who[1] != "cancel"]
        stored = db_rows(
            gate,
            "SELECT * FROM decisions WHERE approval_id = ? ORDER BY decision_id",
            (approval_id,),
        )
        assert sorted((d["operator_id"], d["decision"]) for d in stored) == sorted(
            (r.who[1], r.who[2]) for r in accepted
        )
        assert len({r.who[1] for r in accepted}) == len(accepted)  # one per operator
        assert audit_kinds(gate, approval_id)["decision"] == len(stored)
        first_body = dispatch["draft"]["body"]
        model = replay_decisions(quorum, first_body, stored)
        assert model.problems == []
        if won.who[1] == "cancel":
            assert model.outcome is None
        else:
            assert model.outcome == outcome
        assert approval["revision"] == model.revision
        collected = approval["quorum"]["collected"]
        assert collected <= quorum and collected == len(model.counted)
        if outcome in ("approved", "adjusted"):
            assert collected == quorum

        for r in mine:
            if r.status == 200:
                continue
            if r.who[1] == "cancel":
                assert (r.status, r.answer) == (
                    409,
                    {
                        "status": "conflict",  # pipeline API
                        "reason": "already_resolved",
                        "outcome": outcome,
                    },
                )
                continue
            assert r.status == 409, (r.who, r.status, r.answer)
            assert r.answer in (
                DUPLICATE,
                ALREADY_DECIDED,
                SUPERSEDED,
                already_resolved(outcome),
            ), (r.who, r.answer)
            if r.answer == SUPERSEDED:
                assert model.revision > 1  # only once an adjust made a new revision
            if r.answer in (DUPLICATE, ALREADY_DECIDED):
                assert r.who[1] in {a.who[1] for a in accepted} or (
                    model.revision > 1 and model.bodies[2][1] == r.who[1]
                )
    check_expiring(gate, expiring, requests, window)


# ---------------------------------------------------------------------------------------------
# A burst of one identical decision on many approvals while they all expire
# ---------------------------------------------------------------------------------------------


def test_identical_burst_on_approvals_expiring_now_resolves_each_once(gate, relay):
    """Every other one of twenty approvals on the 2 s step is hit by the same signed approve
    four times right around its expiry, while the others expire: each resolves once,
    approved by one 200 or timed out with only 410s."""
    expiring = Expiring(gate)
    ids = expiring.first(20)
    middle = (expiring.expires[ids[0]] + expiring.expires[ids[-1]]) // 2
    ids = ids[0::2]
    requests: list[Req] = []
    for approval_id in ids:
        requests += decision(gate, relay.wait_dispatch(approval_id), 103, copies=4)
    window = fire(requests, at=lambda: expiring.moment(ids, middle))
    no_5xx(requests)
    check_expiring(gate, expiring, requests, window)


# ---------------------------------------------------------------------------------------------
# Dispatch: a burst of creates is dispatched and acked exactly once per approval
# ---------------------------------------------------------------------------------------------


def test_dispatch_burst_each_approval_is_sent_once_and_acked_once(gate, relay):
    """200 approvals created at once (the relay acks every dispatch after 20 ms): the relay
    receives each approval exactly once, and each ack is one outbox update and one
    ``dispatch_ack`` audit entry (SPEC §7: one entry per dispatch ack). A dispatch already
    acked is never sent again: the dispatcher's list of due rows can be read just before an
    in-flight attempt records its ack, and must not start that attempt again."""
    requests = [
        Req(
            ("create", n, "create"),
            f"{gate.api_url}/v1/approvals",
            json.dumps(
                {
                    "pipeline": "p",
                    "step": "r2",
                    "draft": {"content_type": "text/plain", "body": f"burst {n}\n"},
                }
            ).encode("utf-8"),
            {"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"},
        )
        for n in range(200)
    ]
    relay.delay_s = 0.02
    try:
        fire(requests)
        no_5xx(requests)
        assert [r.status for r in requests] == [201] * len(requests)
        ids = [r.answer["approval_id"] for r in requests]
        for approval_id in ids:
            relay.wait_dispatch(approval_id)
        marks = ", ".join("?" for _ in ids)

        def all_acked() -> bool:
            rows = db_rows(
                gate,
                f"SELECT COUNT(*) AS n FROM outbox WHERE approval_id IN "
                f"({marks}) AND delivered_at IS NOT NULL",
                tuple(ids),
            )
            return rows[0]["n"] == len(ids)

        wait_until(all_acked, what="every burst dispatch acked and recorded")
        # one more approval through the same dispatcher: by its ack, any attempt the loop
        # started from a stale list of due rows has been sent and recorded too
        sentinel = create(gate, "r1", "sentinel\n")["approval_id"]
        relay.wait_dispatch(sentinel)
        wait_until(
            lambda: gate.api().get(sentinel)["dispatch"]["delivered_at"],
            what="the sentinel's ack recorded",
        )
    finally:
        relay.delay_s = 0.0
    received = Counter(r["approval_id"] for r in relay.dispatches(acked_only=False))
    acks = Counter(
        r["approval_id"]
        for r in db_rows(
            gate,
            f"SELECT approval_id FROM audit_log WHERE kind = 'dispatch_ack' AND approval_id "
            f"IN ({marks})",
            tuple(ids),
        )
    )
    outbox = db_rows(
        gate, f"SELECT approval_id, attempts FROM outbox WHERE approval_id IN ({marks})", tuple(ids)
    )
    assert {r["approval_id"]: r["attempts"] for r in outbox} == dict.fromkeys(ids, 1)
    assert {a: received[a] for a in ids if received[a] != 1} == {}, "sent more than once"
    assert {a: acks[a] for a in ids if acks[a] != 1} == {}, "dispatch_ack entries per approval"
