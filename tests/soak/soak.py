"""Crash-safety soak: the real daemon under mixed load, ``kill -9`` at random moments, then proof.

    python -m tests.soak.soak --kills 60 --seconds-between 0.5-3 --seed 7   (docs/fuzzing.md)

A load generator (threads in this process, real HTTP) creates approvals on steps with quorum
1, 2 and 3 (some with 2-4 s timeouts so expiries happen all the time), posts signed decisions
from several approvers (approve / skip / adjust, identities in several spellings), re-sends
decisions that were already accepted, and cancels. The relay is a ``CaptureRelay`` that
answers 503 to a share of dispatches (and is sometimes slow), so some dispatches are un-acked
when the daemon dies. Every answer is recorded: each create that got 201, each decision that
got 200 (approval, revision, identity, decision), each cancel, and the ``expires_at`` of each
approval as first seen.

The daemon (``python -m gate serve``, unchanged) is SIGKILLed after a random delay drawn from
``--seconds-between`` and restarted on the same config and database (new ports); N times.
After each kill the database file is read directly (read-only): every answered 201/200 so
far must be in it, ``expires_at`` values must not have moved, and the un-acked dispatches of
pending approvals are noted. After the last kill the load stops, the relay stops failing, the
daemon runs until every short approval has expired and every dispatch of a pending approval
is acked, stops cleanly (exit 0), and the whole database is checked:

* losses: every 201 approval and every 200 decision (same revision, identity, decision,
  adjust_text, decided_at) and every 200 cancel is there; every ``resolved: true`` answer
  matches the stored outcome;
* duplicates: no approval has two ``resolved`` audit entries, no (approval, revision,
  operator) has two decisions, a re-sent accepted decision is never accepted again, the
  quorum counted never exceeds the required one (the decisions are replayed through an
  independent model of SPEC §2 "Quorum and outcomes" and must give the stored outcome);
* phantoms: every stored approval, decision and cancellation comes from a request that was
  answered 200/201 or never answered (the daemon died) -- a refused request changes nothing;
* audit: one ``created`` and one ``decision`` entry per row, one ``dispatch_ack`` per acked
  outbox row, ``hitl-gate audit verify -c CONFIG`` exits 0;
* expiry: every ``expires_at`` is the one first seen, timeouts resolve at or after it, what
  expired while the daemon was down resolved ``timeout`` after the restart, no decision was
  recorded at or after ``expires_at``;
* dispatch: every dispatch un-acked at a kill was re-sent by a later daemon and acked
  (``outbox.delivered_at``), unless the approval resolved or moved to a new revision first;
* no 5xx answer, and no ``Traceback`` / ``database is locked`` / ``internal_error`` in any
  daemon log.

Prints the figures; exits 1 on any loss, duplicate, phantom or other problem, else 0.
``tests/test_soak.py`` runs a short version in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from gate.errors import GateError
from gate.protocol import signing
from gate.protocol.canonical import wire_json
from gate.protocol.envelope import build_decision
from tests.balancer import SERVED_BY
from tests.support import (
    API_TOKEN,
    IDENTITIES,
    ROOT,
    SECRET,
    CaptureRelay,
    GateProcess,
    gate_env,
    write_config,
)

# ---------------------------------------------------------------------------------------------
# The soak's configuration
# ---------------------------------------------------------------------------------------------

OPERATOR = {100 + i: ident for i, ident in enumerate(IDENTITIES, 1)}  # 101 -> alice, ...
IDENTITY_TO_OPERATOR = {ident: op for op, ident in OPERATOR.items()}

# name, quorum, approvers, timeout, weight of creates
STEPS: list[dict[str, Any]] = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103, 104], "timeout": "1h"},
    {"name": "q2", "quorum": 2, "approvers": [101, 102, 103, 104], "timeout": "1h"},
    {"name": "q3", "quorum": 3, "approvers": [101, 102, 103, 104, 105], "timeout": "1h"},
    {"name": "s1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "2s"},
    {"name": "s2", "quorum": 2, "approvers": [101, 102, 103], "timeout": "3s"},
    {"name": "s3", "quorum": 3, "approvers": [101, 102, 103, 104], "timeout": "4s"},
]
STEP_WEIGHTS = [0.18, 0.18, 0.14, 0.17, 0.17, 0.16]
SHORT_STEPS = ("s1", "s2", "s3")
QUORUM = {s["name"]: s["quorum"] for s in STEPS}
SECURITY = {"rate_limit": 1_000_000, "max_input_length": 200}
MAX_OPEN = 150  # creates pause while this many approvals are open, so decisions catch up
LOG_NEEDLES = (
    "Traceback",
    "database is locked",
    "internal_error",
    "event=expiry_failed",
    "event=dispatch_loop_failed",
    "storage_unavailable",
)
FIRED = ("approved", "adjusted")
UNKNOWN = ("indeterminate", "unavailable")  # fates of a request that may or may not have committed


def parse_range(text: str) -> tuple[float, float]:
    """Parse ``A-B`` (seconds, floats, A <= B) as used by ``--seconds-between``."""
    low, sep, high = text.partition("-")
    if not sep:
        value = float(text)
        return value, value
    a, b = float(low), float(high)
    if a < 0 or b < a:
        raise argparse.ArgumentTypeError(f"bad range {text!r}: need 0 <= A <= B")
    return a, b


def rfc3339_ms(text: str) -> int:
    """Parse an RFC 3339 UTC timestamp (``...Z``, optional fraction) into unix milliseconds."""
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(dt.timestamp()) * 1000 + dt.microsecond // 1000


def now_ms() -> int:
    return int(time.time() * 1000)


def left_alone(envelope: dict[str, Any]) -> bool:
    """Whether the load leaves this approval to expire: 40 % of the short steps' approvals,
    chosen by a hash of the id (stable across workers)."""
    return (
        envelope["step"] in SHORT_STEPS
        and zlib.crc32(envelope["approval_id"].encode("ascii")) % 10 < 4
    )


# ---------------------------------------------------------------------------------------------
# HTTP: one connection per request, telling "never sent" apart from "no answer"
# ---------------------------------------------------------------------------------------------


def send(
    url: str,
    method: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: float = 30.0,
    balanced: bool = False,
) -> tuple[str, int | None, Any]:
    """One real HTTP request. Returns ``(fate, status, json)``.

    ``fate`` is ``unsent`` when the connection could not be opened (the daemon cannot have
    seen the request), ``indeterminate`` when it broke after connecting (the daemon may or
    may not have committed it), ``answered`` otherwise.

    ``balanced``: ``url`` is a balancer (tests/balancer.py) in front of several gates. A 5xx
    without its ``X-Served-By`` is the balancer's own: its 503 (no gate up) ``unsent``, any
    other (the gate died holding the request) ``indeterminate``. A gate's 503 is
    ``unavailable`` (status None, its answer kept): the gate could not tell whether its
    storage committed (PostgreSQL restarted under it), so the request may or may not have
    taken effect, like an unanswered one.
    """
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        try:
            conn.connect()
        except OSError:
            return "unsent", None, None
        try:
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException):
            return "indeterminate", None, None
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = {"unparsable": raw[:200].decode("utf-8", "replace")}
        if balanced and resp.status >= 500 and resp.getheader(SERVED_BY) is None:
            # the balancer's own 503: no gate was up to take it; its 502/504: the gate died
            return ("unsent" if resp.status == 503 else "indeterminate"), None, None
        if balanced and resp.status == 503:
            return "unavailable", None, answer
        return "answered", resp.status, answer
    finally:
        conn.close()


def ro_connect(db_path: Path) -> sqlite3.Connection:
    """Open the gate's database read-only (URI ``mode=ro``); rows as ``sqlite3.Row``."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30.0)
    conn.row_factory = sqlite3.Row
    return conn


# ---------------------------------------------------------------------------------------------
# The relay: a CaptureRelay that sometimes answers 503 and is sometimes slow
# ---------------------------------------------------------------------------------------------


class FlakyRelay(CaptureRelay):
    """A ``CaptureRelay`` answering 503 to ``fail_rate`` of dispatches, slow on ``slow_rate``.

    Keeps, per (approval, revision), the latest envelope and the arrival times of the
    dispatches it acked (2xx); ``on_dispatch`` is called with every envelope.
    """

    def __init__(self, seed: str, on_dispatch: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self.fail_rate = 0.0
        self.slow_rate = 0.0
        self.on_dispatch = on_dispatch
        self._rng = random.Random(seed)
        self.envelopes: dict[str, dict[int, dict[str, Any]]] = {}
        self.acked_at: dict[tuple[str, int], list[float]] = defaultdict(list)
        self.arrived_at: dict[tuple[str, int], list[float]] = defaultdict(list)
        self.answers: Counter[int] = Counter()
        self.bad_signatures = 0

    async def _handle(self, request: web.Request) -> web.Response:
        arrived = time.time()
        raw = await request.read()
        try:  # a dispatch must be signed with the current secret (SPEC §2)
            signing.verify(request.headers.get("X-Draftcat-Signature"), raw, [SECRET], arrived, 300)
            ok_sig = True
        except GateError:
            ok_sig = False
        envelope = json.loads(raw)
        status = 503 if self._rng.random() < self.fail_rate else 202
        delay = self._rng.uniform(0.05, 0.5) if self._rng.random() < self.slow_rate else 0.0
        if delay:
            await asyncio.sleep(delay)
        key = (envelope["approval_id"], int(envelope.get("revision", 1)))
        with self._cond:
            if not ok_sig:
                self.bad_signatures += 1
            self.envelopes.setdefault(key[0], {})[key[1]] = envelope
            self.arrived_at[key].append(arrived)
            if 200 <= status < 300:
                self.acked_at[key].append(arrived)
            self.answers[status] += 1
        self.on_dispatch(envelope)
        return web.json_response({"status": "ok" if status < 300 else "unavailable"}, status=status)

    def latest(self, approval_id: str) -> dict[str, Any] | None:
        """Return the envelope of the highest revision received for ``approval_id``."""
        with self._cond:
            revs = self.envelopes.get(approval_id)
            return revs[max(revs)] if revs else None

    def arrived_after_ms(self, approval_id: str, revision: int, at_ms: int) -> int:
        """How many dispatches of (approval, revision) arrived in a millisecond after
        ``at_ms`` (unix ms)."""
        with self._cond:
            return sum(
                int(t * 1000) > at_ms for t in self.arrived_at.get((approval_id, revision), [])
            )

    def acked_after(self, approval_id: str, revision: int, at: float) -> bool:
        """True if a dispatch of (approval, revision) that arrived after ``at`` was acked."""
        with self._cond:
            return any(t > at for t in self.acked_at.get((approval_id, revision), []))


# ---------------------------------------------------------------------------------------------
# What the load generator sent and what it got back
# ---------------------------------------------------------------------------------------------


@dataclass
class CreateAttempt:
    run_id: str
    step: str
    body: str
    fate: str = ""
    status: int | None = None
    approval_id: str | None = None
    expires_at: str | None = None
    answered_at: float = 0.0
    receipt: dict[str, Any] | None = None  # the 201's created_receipt


@dataclass
class DecisionAttempt:
    approval_id: str
    revision: int
    identity: str
    operator_id: int
    verb: str
    adjust_text: str | None
    decided_at: str
    raw: bytes
    replay_of: int | None = None  # index of the accepted decision this re-sends
    fate: str = ""
    status: int | None = None
    answer: Any = None
    answered_at: float = 0.0


@dataclass
class CancelAttempt:
    approval_id: str
    fate: str = ""
    status: int | None = None
    answer: Any = None
    answered_at: float = 0.0


@dataclass
class Kill:
    index: int
    at: float  # wall clock right after the process was reaped
    restarted_at: float = 0.0  # wall clock just before the next daemon was spawned
    unacked: list[tuple[str, int]] = field(default_factory=list)
    pending_expires: dict[str, int] = field(default_factory=dict)


@dataclass
class Figures:
    """What the soak prints; ``ok`` is False on any loss, duplicate, phantom or problem."""

    seed: int = 0
    kills_planned: int = 0
    kills_survived: int = 0
    duration_s: float = 0.0
    creates_attempted: int = 0
    creates_201: int = 0
    creates_indeterminate: int = 0
    creates_indeterminate_committed: int = 0
    decisions_attempted: int = 0
    decisions_200: int = 0
    decisions_verified: int = 0
    decisions_resolving: int = 0
    decisions_indeterminate: int = 0
    decisions_indeterminate_committed: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    replays_sent: int = 0
    cancels_attempted: int = 0
    cancels_200: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    expired_while_down: int = 0
    unacked_at_kill: int = 0
    unacked_resent_acked: int = 0
    unacked_resolved_first: int = 0
    dispatches_503: int = 0
    dispatches_2xx: int = 0
    audit_entries: int = 0
    checks_at_kills: int = 0
    losses: int = 0
    duplicates: int = 0
    phantoms: int = 0
    five_xx: int = 0
    problems: list[str] = field(default_factory=list)
    # several gates on PostgreSQL (tests/soak/cluster.py)
    gates: int = 1
    gate_kills: int = 0
    pg_restarts: int = 0
    writer_freezes: int = 0
    freezes_holding_lock: int = 0
    served_while_frozen: int = 0
    gate_cuts: int = 0
    cut_recover_max_s: float = 0.0
    unavailable_503: int = 0
    recover_max_s: float = 0.0
    heads_anchored: int = 0
    receipts_anchored: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.losses or self.duplicates or self.phantoms or self.five_xx or self.problems
        )

    def assert_passed(self, kills: int) -> str:
        """Assert a run that survived ``kills`` disruptions with nothing lost, doubled,
        invented or answered 5xx, whose load exercised what the checks are about; return
        the report (printed first, so a failing test shows it)."""
        report = self.report()
        print(report)
        assert self.ok, report
        assert self.kills_survived == kills, report
        assert (self.losses, self.duplicates, self.phantoms, self.five_xx) == (0, 0, 0, 0), report
        assert self.creates_201 > 0 and self.decisions_200 > 0, report
        assert self.decisions_verified == self.decisions_200, report
        assert self.decisions_resolving > 0 and self.replays_sent > 0, report
        assert self.outcomes["timeout"] > 0, report
        assert self.audit_entries > 0, report
        return report

    def report(self) -> str:
        """Return the figures as text, one line each, then up to 40 problems."""
        refused = ", ".join(f"{k} {v}" for k, v in sorted(self.refusals.items())) or "none"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        lines = [
            f"soak seed={self.seed} duration={self.duration_s:.1f}s",
            f"kills survived:          {self.kills_survived}/{self.kills_planned}",
            f"creates:                 {self.creates_attempted} attempted, {self.creates_201} "
            f"got 201, {self.creates_indeterminate} unanswered "
            f"({self.creates_indeterminate_committed} committed)",
            f"decisions 200:           {self.decisions_200} "
            f"({self.decisions_resolving} resolving) of {self.decisions_attempted} attempted",
            f"decisions verified:      {self.decisions_verified}",
            f"decisions unanswered:    {self.decisions_indeterminate} "
            f"({self.decisions_indeterminate_committed} committed)",
            f"refused (expected):      {refused}",
            f"accepted ones re-sent:   {self.replays_sent} (never accepted twice)",
            f"cancels:                 {self.cancels_200} got 200 of {self.cancels_attempted}",
            f"outcomes:                {outcomes}",
            f"expired while down:      {self.expired_while_down} (resolved timeout on restart)",
            f"un-acked at a kill:      {self.unacked_at_kill} ({self.unacked_resent_acked} "
            f"re-sent and acked, {self.unacked_resolved_first} resolved/superseded first)",
            f"relay answers:           2xx {self.dispatches_2xx}, 503 {self.dispatches_503}",
            f"found right after kills: {self.checks_at_kills} answered 201/200 (cumulative, "
            "read from the dead daemon's file)",
            f"audit entries verified:  {self.audit_entries}",
            f"losses:                  {self.losses}",
            f"duplicates:              {self.duplicates}",
            f"phantoms:                {self.phantoms}",
            f"5xx:                     {self.five_xx}",
            f"other problems:          {len(self.problems)}",
        ]
        if self.gates > 1:
            lines[2:2] = [
                f"gates:                   {self.gates} on one PostgreSQL, behind haproxy",
                f"disruptions:             {self.gate_kills} gate kill -9s, {self.pg_restarts} "
                f"PostgreSQL immediate restarts (slowest gate back in {self.recover_max_s:.2f} s)",
                f"                         {self.writer_freezes} writers frozen "
                f"({self.freezes_holding_lock} holding the lock; {self.served_while_frozen} "
                "answered 200/201 by the others meanwhile)",
                f"                         {self.gate_cuts} gates cut off from PostgreSQL "
                f"(slowest back in {self.cut_recover_max_s:.2f} s)",
                f"answered 503:            {self.unavailable_503} (outcome unknown: checked "
                "like unanswered ones)",
                f"audit anchors:           {self.heads_anchored} logged heads, "
                f"{self.receipts_anchored} kept created_receipts",
            ]
        lines += [f"  PROBLEM: {p}" for p in self.problems[:40]]
        if len(self.problems) > 40:
            lines.append(f"  ... and {len(self.problems) - 40} more")
        lines.append("RESULT: " + ("PASS" if self.ok else "FAIL"))
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# An independent model of SPEC §2 "Quorum and outcomes", and the database invariants
# ---------------------------------------------------------------------------------------------


@dataclass
class Replayed:
    outcome: str | None
    revision: int
    counted: list[int]
    bodies: dict[int, tuple[str, int | None]]  # revision -> (body, created_by)
    problems: list[str]


def replay_decisions(quorum: int, first_body: str, rows: Iterable[dict[str, Any]]) -> Replayed:
    """Replay accepted decisions (in recording order) through SPEC §2's quorum rules.

    ``approve`` counts a distinct operator on the current revision; ``skip`` vetoes;
    ``adjust`` with a new text makes revision n+1 counted as its author's approval (an
    adjust to the same text is an approve). Reports a decision on a stale revision, one
    after resolution, and an operator counted twice.
    """
    revision, body = 1, first_body
    bodies: dict[int, tuple[str, int | None]] = {1: (first_body, None)}
    counted: list[int] = []
    outcome: str | None = None
    problems: list[str] = []
    for row in rows:
        op = int(row["operator_id"])
        if outcome is not None:
            problems.append(f"decision {row['decision_id']} recorded after resolution {outcome}")
        if int(row["revision"]) != revision:
            problems.append(
                f"decision {row['decision_id']} on revision {row['revision']} "
                f"while revision {revision} was current"
            )
        if row["decision"] == "skip":
            outcome = outcome or "skipped"
            continue
        if row["decision"] == "adjust" and row["adjust_text"] != body:
            revision += 1
            body = row["adjust_text"]
            bodies[revision] = (body, op)
            counted = [op]
        else:
            if op in counted:
                problems.append(f"operator {op} counted twice on revision {revision}")
                continue
            counted.append(op)
        if outcome is None and len(counted) >= quorum:
            outcome = "approved" if revision == 1 else "adjusted"
    return Replayed(outcome, revision, counted, bodies, problems)


def check_database(conn: sqlite3.Connection) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Check the invariants that hold for any gate database, from the file alone.

    Returns ``(problems by category, facts)``: categories ``duplicates`` (two resolutions,
    a double count, quorum exceeded) and ``problems`` (anything else inconsistent); facts
    are per-approval data the caller compares with what it sent (``approvals``,
    ``decisions``, ``audit_count``).
    """
    out: dict[str, list[str]] = {"duplicates": [], "problems": []}
    dup, bad = out["duplicates"].append, out["problems"].append
    approvals = {r["approval_id"]: dict(r) for r in conn.execute("SELECT * FROM approvals")}
    revisions: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in conn.execute("SELECT * FROM revisions"):
        revisions[r["approval_id"]][int(r["revision"])] = dict(r)
    decisions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in conn.execute("SELECT * FROM decisions ORDER BY decision_id"):
        decisions[r["approval_id"]].append(dict(r))
    outbox: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in conn.execute("SELECT * FROM outbox"):
        outbox[r["approval_id"]][int(r["revision"])] = dict(r)
    audit: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    audit_count = 0
    for r in conn.execute("SELECT seq, approval_id, kind, entry FROM audit_log ORDER BY seq"):
        entry = json.loads(r["entry"])
        entry["_seq"] = int(r["seq"])
        if entry["kind"] != r["kind"] or entry["approval_id"] != r["approval_id"]:
            bad(f"audit seq {r['seq']}: columns differ from the entry")
        audit[r["approval_id"]].append(entry)
        audit_count += 1

    for row in conn.execute(
        "SELECT approval_id, revision, operator_id, COUNT(*) AS n FROM "
        "decisions GROUP BY 1, 2, 3 HAVING COUNT(*) > 1"
    ):
        dup(
            f"{row['approval_id']}: {row['n']} decisions by operator {row['operator_id']} "
            f"on revision {row['revision']}"
        )

    for aid, a in approvals.items():
        quorum = int(a["quorum_required"])
        scope = {int(op) for op, _ in json.loads(a["scope"])}
        revs = revisions.get(aid, {})
        rows = decisions.get(aid, [])
        entries = audit.get(aid, [])
        kinds = Counter(e["kind"] for e in entries)
        if 1 not in revs:
            bad(f"{aid}: no revision 1")
            continue
        model = replay_decisions(quorum, revs[1]["body"], rows)
        for p in model.problems:
            (dup if "counted twice" in p else bad)(f"{aid}: {p}")
        if sorted(revs) != list(range(1, len(revs) + 1)) or int(a["revision"]) != len(revs):
            bad(f"{aid}: revisions {sorted(revs)} but current revision {a['revision']}")
        if model.revision != int(a["revision"]):
            bad(f"{aid}: decisions give revision {model.revision}, stored {a['revision']}")
        for n, (body, by) in model.bodies.items():
            stored = revs.get(n)
            if stored is None or stored["body"] != body or stored["created_by"] != by:
                bad(f"{aid}: revision {n} differs from the adjust that made it")
        resolved = [e for e in entries if e["kind"] == "resolved"]
        if len(resolved) > 1:
            dup(
                f"{aid}: resolved {len(resolved)} times "
                f"({', '.join(e['data']['outcome'] for e in resolved)})"
            )
        if a["state"] == "pending":
            if resolved:
                bad(f"{aid}: pending but has a resolved audit entry")
            if model.outcome is not None:
                bad(f"{aid}: pending although its decisions resolve it {model.outcome}")
            if len(model.counted) >= quorum:
                dup(f"{aid}: pending with {len(model.counted)} approvals counted >= {quorum}")
        else:
            if len(resolved) != 1:
                bad(f"{aid}: resolved {a['outcome']} with {len(resolved)} resolved entries")
            if model.outcome is not None and a["outcome"] != model.outcome:
                bad(f"{aid}: outcome {a['outcome']}, its decisions give {model.outcome}")
            if model.outcome is None and a["outcome"] not in ("timeout", "cancelled"):
                bad(f"{aid}: outcome {a['outcome']} without the decisions for it")
            if resolved:
                data = resolved[0]["data"]
                if data["outcome"] != a["outcome"] or data["revision"] != a["revision"]:
                    bad(f"{aid}: resolved entry {data} differs from the approval")
                expected = model.counted if a["outcome"] in FIRED else []
                if sorted(data["approved_by"]) != sorted(expected):
                    dup(f"{aid}: approved_by {data['approved_by']}, counted {expected}")
                if a["outcome"] in FIRED and len(data["approved_by"]) != quorum:
                    dup(f"{aid}: {len(data['approved_by'])} approvals counted for quorum {quorum}")
                receipt = json.loads(a["receipt"]) if a["receipt"] else None
                if not receipt or receipt.get("seq") != resolved[0]["_seq"]:
                    bad(f"{aid}: receipt {receipt} is not the resolution's")
            if a["outcome"] == "timeout" and int(a["resolved_at"]) < int(a["expires_at"]):
                bad(f"{aid}: timed out at {a['resolved_at']} before expires_at {a['expires_at']}")
        if kinds["created"] != 1:
            bad(f"{aid}: {kinds['created']} created entries")
        else:
            created = next(e for e in entries if e["kind"] == "created")
            if created["data"]["expires_at"] != a["expires_at"]:
                bad(
                    f"{aid}: expires_at {a['expires_at']} but created with "
                    f"{created['data']['expires_at']}"
                )
        if kinds["decision"] != len(rows):
            (dup if kinds["decision"] > len(rows) else bad)(
                f"{aid}: {kinds['decision']} decision entries for {len(rows)} decisions"
            )
        for row in rows:
            if int(row["operator_id"]) not in scope:
                bad(f"{aid}: decision by operator {row['operator_id']} outside the scope")
            if int(row["recorded_at"]) >= int(a["expires_at"]):
                bad(
                    f"{aid}: decision {row['decision_id']} recorded at {row['recorded_at']}, "
                    f"not before expires_at {a['expires_at']}"
                )
        # order by the chain, not by clock readings (each transaction reads the clock before
        # it waits for the writer): no decision entry after the resolution entry
        if resolved and any(
            e["_seq"] > resolved[0]["_seq"] for e in entries if e["kind"] == "decision"
        ):
            bad(f"{aid}: a decision entry follows the resolution in the audit log")
        acks = Counter(int(e["data"]["revision"]) for e in entries if e["kind"] == "dispatch_ack")
        for n, count in acks.items():
            if count > 1:
                dup(f"{aid}: {count} dispatch_ack entries for revision {n}")
        for n, box in outbox.get(aid, {}).items():
            delivered = box["delivered_at"] is not None
            if delivered != (acks.get(n, 0) >= 1):
                bad(
                    f"{aid}: outbox revision {n} delivered={delivered} but "
                    f"{acks.get(n, 0)} dispatch_ack entries"
                )
        if set(outbox.get(aid, {})) - set(revs):
            bad(f"{aid}: outbox rows for unknown revisions")
    facts = {
        "approvals": approvals,
        "decisions": decisions,
        "outbox": outbox,
        "revisions": revisions,
        "audit_count": audit_count,
    }
    return out, facts


# ---------------------------------------------------------------------------------------------
# The soak
# ---------------------------------------------------------------------------------------------


class Soak:
    """One soak run: see the module docstring. ``run()`` returns the Figures."""

    def __init__(
        self,
        kills: int,
        between: tuple[float, float],
        seed: int,
        *,
        workers: int = 4,
        fail_rate: float = 0.25,
        slow_rate: float = 0.1,
        drain_timeout: float = 90.0,
        workdir: Path | None = None,
        say: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.kills = kills
        self.between = between
        self.seed = seed
        self.workers = workers
        self.fail_rate = fail_rate
        self.slow_rate = slow_rate
        self.drain_timeout = drain_timeout
        self.say = say
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="hitl-soak-"))
        self.db_path = self.dir / "gate.db"
        self.rng = random.Random(seed)
        self.fig = Figures(seed=seed, kills_planned=kills)
        self.lock = threading.Lock()
        self.up = threading.Event()
        self.stop = threading.Event()
        self.callback_url = ""
        self.api_url = ""
        self.creates: list[CreateAttempt] = []
        self.decisions: list[DecisionAttempt] = []
        self.cancels: list[CancelAttempt] = []
        self.accepted: list[int] = []  # indexes of 200 decisions (for re-sends)
        self.open: list[str] = []
        self.open_set: set[str] = set()
        self.closed: set[str] = set()
        self.expires_first: dict[str, int] = {}
        self.kill_log: list[Kill] = []
        self.logs: list[str] = []
        self.gate: GateProcess | None = None
        self.relay: FlakyRelay | None = None
        self.errors: list[BaseException] = []
        self.config: Path | None = None

    # ---- where the gate is: one SQLite gate here; tests/soak/cluster.py puts several on one
    # PostgreSQL behind a balancer (it overrides these) ---------------------------------------

    balanced = False  # requests go through a balancer (``send(balanced=True)``)
    log_needles = LOG_NEEDLES
    resend_proof = True  # an un-acked dispatch acked later proves a re-send after the kill

    def _send(
        self, url: str, method: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[str, int | None, Any]:
        return send(url, method, body, headers, balanced=self.balanced)

    def _connect(self) -> contextlib.AbstractContextManager[Any]:
        """A read-only connection to the gate's database (``execute`` with ``?``
        placeholders, rows by index and by column name), closed on exit."""
        return contextlib.closing(ro_connect(self.db_path))

    def _prepare(self) -> None:
        """Write the config (the relay runs)."""
        assert self.relay is not None
        self.config = write_config(self.dir, self.relay.url, steps=STEPS, security=SECURITY)

    def _tool_env(self) -> dict[str, str]:
        """The environment of ``hitl-gate audit verify``."""
        return gate_env()

    def _audit_anchors(self) -> list[str]:
        """More ``audit verify`` options: anchors held outside the database."""
        return []

    # ---- shared state ----------------------------------------------------------------------

    def _on_dispatch(self, envelope: dict[str, Any]) -> None:
        aid = envelope["approval_id"]
        with self.lock:
            if aid not in self.open_set and aid not in self.closed:
                self.open_set.add(aid)
                self.open.append(aid)

    def _close(self, aid: str) -> None:
        with self.lock:
            self.closed.add(aid)
            if aid in self.open_set:
                self.open_set.discard(aid)
                self.open.remove(aid)

    def _problem(self, text: str) -> None:
        with self.lock:
            self.fig.problems.append(text)

    # ---- load generator ------------------------------------------------------------------

    def _worker(self, index: int) -> None:
        rng = random.Random(f"{self.seed}-worker-{index}")
        counter = 0
        try:
            while not self.stop.is_set():
                if not self.up.wait(0.1):
                    continue
                with self.lock:
                    callback, api = self.callback_url, self.api_url
                    n_open = len(self.open)
                roll = rng.random()
                counter += 1
                if n_open == 0 or (roll < 0.28 and n_open < MAX_OPEN):
                    self._create(rng, api, f"soak-{self.seed}-{index}-{counter}")
                elif roll < 0.33:
                    self._replay(rng, callback)
                elif roll < 0.37:
                    self._cancel(rng, api)
                else:
                    self._decide(rng, callback)
        except BaseException as exc:  # reported by run()
            self.errors.append(exc)
            self.stop.set()

    def _create(self, rng: random.Random, api: str, run_id: str) -> None:
        step = rng.choices([s["name"] for s in STEPS], STEP_WEIGHTS)[0]
        body = rng.choice(["Hello, world\n", "Café — naïve 👍\n", "line 1\r\nline 2", "x"])
        body = f"{body} #{run_id}"
        attempt = CreateAttempt(run_id, step, body)
        with self.lock:
            self.creates.append(attempt)
        payload = {
            "pipeline": "p",
            "step": step,
            "run_id": run_id,
            "draft": {"content_type": "text/plain", "body": body},
        }
        fate, status, answer = self._send(
            api + "/v1/approvals",
            "POST",
            json.dumps(payload).encode("utf-8"),
            {"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"},
        )
        with self.lock:
            attempt.fate, attempt.status, attempt.answered_at = fate, status, time.time()
            if status == 201:
                attempt.approval_id = answer["approval_id"]
                attempt.expires_at = answer["expires_at"]
                attempt.receipt = answer.get("created_receipt")
                self.expires_first.setdefault(
                    answer["approval_id"], rfc3339_ms(answer["expires_at"])
                )

    def _pick(self, rng: random.Random) -> dict[str, Any] | None:
        with self.lock:
            if not self.open:
                return None
            aid = rng.choice(self.open)
        assert self.relay is not None
        return self.relay.latest(aid)

    def _decide(self, rng: random.Random, callback: str) -> None:
        envelope = self._pick(rng)
        if envelope is None:
            return
        if left_alone(envelope) and now_ms() < rfc3339_ms(envelope["expires_at"]):
            return  # left to expire; decided only after expires_at (410 expired)
        identity = rng.choice(envelope["approvers"])
        spelled = rng.random()
        if spelled < 0.07:
            identity = identity.upper()
        elif spelled < 0.12:
            identity = f"  {identity} "
        roll = rng.random()
        verb, text = "approve", None
        if roll < 0.07:
            verb = "skip"
        elif roll < 0.27:
            verb = "adjust"
            text = (
                envelope["draft"]["body"]
                if rng.random() < 0.15
                else f"edited by {identity.strip()} {rng.randrange(10**6)}"
            )
        body = build_decision(
            approval_id=envelope["approval_id"],
            nonce=envelope["callback"]["nonce"],
            decision=verb,
            payload_hash=envelope["payload_hash"],
            approver_id=identity,
            decided_at_ms=now_ms(),
            channel=rng.choice(["teams", "slack", "mail"]),
            adjust_text=text,
        )
        attempt = DecisionAttempt(
            envelope["approval_id"],
            int(envelope.get("revision", 1)),
            identity,
            IDENTITY_TO_OPERATOR[identity.strip().casefold()],
            verb,
            text,
            body["decided_at"],
            wire_json(body),
        )
        self._post_decision(attempt, callback)

    def _replay(self, rng: random.Random, callback: str) -> None:
        with self.lock:
            if not self.accepted:
                return
            position = rng.choice(self.accepted)
            original = self.decisions[position]
        attempt = DecisionAttempt(
            original.approval_id,
            original.revision,
            original.identity,
            original.operator_id,
            original.verb,
            original.adjust_text,
            original.decided_at,
            original.raw,
            replay_of=position,
        )
        self._post_decision(attempt, callback)

    def _post_decision(self, attempt: DecisionAttempt, callback: str) -> None:
        with self.lock:
            self.decisions.append(attempt)
            position = len(self.decisions) - 1
        headers = {
            "Content-Type": "application/json",
            "X-Hitl-Protocol": "hitl/v0",
            "X-Draftcat-Signature": signing.sign(SECRET, int(time.time()), attempt.raw),
        }
        fate, status, answer = self._send(callback, "POST", attempt.raw, headers)
        with self.lock:
            attempt.fate, attempt.status, attempt.answer = fate, status, answer
            attempt.answered_at = time.time()
            if status == 200:
                self.accepted.append(position)
        reason = answer.get("reason") if isinstance(answer, dict) else None
        if (status == 200 and answer.get("resolved")) or reason in ("already_resolved", "expired"):
            self._close(attempt.approval_id)

    def _cancel(self, rng: random.Random, api: str) -> None:
        with self.lock:
            if not self.open:
                return
            aid = rng.choice(self.open)
        attempt = CancelAttempt(aid)
        with self.lock:
            self.cancels.append(attempt)
        fate, status, answer = self._send(
            api + f"/v1/approvals/{aid}/cancel",
            "POST",
            b"",
            {"Authorization": f"Bearer {API_TOKEN}"},
        )
        with self.lock:
            attempt.fate, attempt.status, attempt.answer = fate, status, answer
            attempt.answered_at = time.time()
        if status in (200, 409):
            self._close(aid)

    # ---- the daemon ------------------------------------------------------------------------

    def _start_gate(self) -> float:
        """Start a daemon on the same config and database; return the wall-clock time just
        before it was spawned (nothing can be decided after that moment by an earlier one)."""
        assert self.config is not None
        gate = GateProcess(self.config)
        spawned = time.time()
        gate.start()
        with self.lock:
            self.gate = gate
            self.callback_url, self.api_url = gate.callback_url, gate.api_url
        self.up.set()
        return spawned

    def _kill(self, index: int) -> Kill:
        assert self.gate is not None
        self.up.clear()
        self.gate.kill9()
        kill = Kill(index, time.time())
        self.logs.append(self.gate.log())
        return kill

    # ---- checks right after a kill ---------------------------------------------------------

    def _check_after_kill(self, kill: Kill) -> None:
        """Read the dead daemon's database: everything answered so far is there."""
        with self.lock:
            created = [c for c in self.creates if c.status == 201 and c.answered_at < kill.at]
            accepted = [d for d in self.decisions if d.status == 200 and d.answered_at < kill.at]
        with self._connect() as conn:
            ids = {
                r[0]: int(r[1])
                for r in conn.execute("SELECT approval_id, expires_at FROM approvals")
            }
            keys = {
                (r[0], int(r[1]), int(r[2])): (r[3], r[4], r[5])
                for r in conn.execute(
                    "SELECT approval_id, revision, operator_id, decision, adjust_text, decided_at "
                    "FROM decisions"
                )
            }
            kill.unacked = [
                (r[0], int(r[1]))
                for r in conn.execute(
                    "SELECT o.approval_id, o.revision FROM outbox o JOIN approvals a "
                    "ON a.approval_id = o.approval_id WHERE o.delivered_at IS NULL "
                    "AND a.state = 'pending' AND a.revision = o.revision"
                )
            ]
            kill.pending_expires = {
                r[0]: int(r[1])
                for r in conn.execute(
                    "SELECT approval_id, expires_at FROM approvals WHERE state = 'pending'"
                )
            }
        for c in created:
            if c.approval_id not in ids:
                self._loss(
                    f"kill {kill.index}: approval {c.approval_id} (201) is not in the database"
                )
        for d in accepted:
            got = keys.get((d.approval_id, d.revision, d.operator_id))
            if got != (d.verb, d.adjust_text, d.decided_at):
                self._loss(
                    f"kill {kill.index}: accepted decision {d.approval_id} rev "
                    f"{d.revision} by {d.identity!r} ({d.verb}) is not in the database"
                )
        with self.lock:
            for aid, ms in ids.items():
                first = self.expires_first.setdefault(aid, ms)
                if first != ms:
                    self.fig.problems.append(
                        f"kill {kill.index}: {aid} expires_at moved {first} -> {ms}"
                    )
            self.fig.checks_at_kills += len(created) + len(accepted)

    def _loss(self, text: str) -> None:
        with self.lock:
            self.fig.losses += 1
            self.fig.problems.append("LOSS " + text)

    # ---- run -------------------------------------------------------------------------------

    def run(self) -> Figures:
        """Run the soak; always stops the daemon and the relay. Returns the figures."""
        started = time.monotonic()
        self.relay = FlakyRelay(f"{self.seed}-relay", self._on_dispatch).start()
        self.relay.fail_rate, self.relay.slow_rate = self.fail_rate, self.slow_rate
        self._prepare()
        threads = [
            threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"soak-worker-{i}")
            for i in range(self.workers)
        ]
        try:
            self._start_gate()
            for thread in threads:
                thread.start()
            for index in range(1, self.kills + 1):
                if self.stop.wait(self.rng.uniform(*self.between)):
                    break
                self._disrupt(index)
                self.fig.kills_survived = index
            self.stop.set()
            for thread in threads:
                thread.join(60)
            if self.errors:
                raise self.errors[0]
            self._drain()
            self._stop_gates()
            self._verify()
        finally:
            self.stop.set()
            self.up.set()
            self._end_gates()
            if self.relay is not None:
                self.relay.stop()
            self.fig.duration_s = time.monotonic() - started
        return self.fig

    def _disrupt(self, index: int) -> None:
        """Kill the daemon (-9), check its database, restart it."""
        kill = self._kill(index)
        self._check_after_kill(kill)
        kill.restarted_at = self._start_gate()
        self.kill_log.append(kill)
        self.say(
            f"kill {index}/{self.kills}: {len(kill.unacked)} un-acked, "
            f"{len(kill.pending_expires)} pending; restarted"
        )

    def _stop_gates(self) -> None:
        """The clean stop after the drain (exit 0 expected); its log kept."""
        assert self.gate is not None
        code = self.gate.stop()
        self.logs.append(self.gate.log())
        if code != 0:
            self._problem(f"the daemon's clean stop exited {code}")

    def _end_gates(self) -> None:
        """Leave nothing running (after a failure half-way)."""
        if self.gate is not None and self.gate.proc and self.gate.proc.poll() is None:
            self.gate.kill9()

    def _drain(self) -> None:
        """Relay healthy again; wait until no short approval is pending and every pending
        approval's current dispatch is acked."""
        assert self.relay is not None
        self.relay.fail_rate = 0.0
        self.relay.slow_rate = 0.0
        deadline = time.monotonic() + self.drain_timeout
        marks = ", ".join("?" for _ in SHORT_STEPS)
        while True:
            with self._connect() as conn:
                short = conn.execute(
                    f"SELECT COUNT(*) FROM approvals WHERE state = 'pending' AND step IN ({marks})",
                    SHORT_STEPS,
                ).fetchone()[0]
                unacked = conn.execute(
                    "SELECT COUNT(*) FROM outbox o JOIN approvals a ON a.approval_id = "
                    "o.approval_id WHERE o.delivered_at IS NULL AND a.state = 'pending' "
                    "AND a.revision = o.revision"
                ).fetchone()[0]
            if short == 0 and unacked == 0:
                return
            if time.monotonic() > deadline:
                self._problem(
                    f"after {self.drain_timeout:g} s of drain: {short} short approvals "
                    f"still pending, {unacked} dispatches of pending approvals "
                    "un-acked"
                )
                return
            time.sleep(0.2)

    # ---- final verification ------------------------------------------------------------------

    def _verify(self) -> None:
        fig = self.fig
        assert self.relay is not None and self.config is not None
        with self._connect() as conn:
            by_kind, facts = check_database(conn)
        fig.duplicates += len(by_kind["duplicates"])
        fig.problems += [f"DUPLICATE {p}" for p in by_kind["duplicates"]]
        fig.problems += by_kind["problems"]
        approvals: dict[str, dict[str, Any]] = facts["approvals"]
        decisions: dict[str, list[dict[str, Any]]] = facts["decisions"]
        outbox: dict[str, dict[int, dict[str, Any]]] = facts["outbox"]
        fig.audit_entries = facts["audit_count"]

        # creates: 201 -> stored as answered; every stored approval comes from a create
        by_run = {a["run_id"]: a for a in approvals.values()}
        fig.creates_attempted = len(self.creates)
        for c in self.creates:
            stored = by_run.get(c.run_id)
            if c.status == 201:
                fig.creates_201 += 1
                if stored is None or stored["approval_id"] != c.approval_id:
                    self._loss(f"approval {c.approval_id} (201, run {c.run_id}) is missing")
                elif stored["step"] != c.step or rfc3339_ms(c.expires_at or "") != int(
                    stored["expires_at"]
                ):
                    fig.problems.append(
                        f"{c.approval_id}: stored step/expires_at differ from the 201 answer"
                    )
            elif c.fate in UNKNOWN:
                fig.creates_indeterminate += 1
                fig.creates_indeterminate_committed += stored is not None
            elif stored is not None:
                fig.phantoms += 1
                fig.problems.append(
                    f"PHANTOM approval {stored['approval_id']} from a create "
                    f"answered {c.status} ({c.fate})"
                )
            if c.fate == "answered" and c.status not in (201,):
                fig.problems.append(f"create {c.run_id} answered {c.status}")
            if c.status is not None and c.status >= 500:
                fig.five_xx += 1
        known_runs = {c.run_id: c for c in self.creates}
        for a in approvals.values():
            if a["run_id"] not in known_runs:
                fig.phantoms += 1
                fig.problems.append(f"PHANTOM approval {a['approval_id']}: unknown run_id")
            else:
                c = known_runs[a["run_id"]]
                first = facts["revisions"][a["approval_id"]].get(1)
                if first is None or first["body"] != c.body:
                    fig.problems.append(
                        f"{a['approval_id']}: stored draft differs from the one sent"
                    )

        # decisions: 200 -> stored exactly; every stored one was answered 200 or unanswered
        stored_keys: dict[tuple[str, int, int], dict[str, Any]] = {}
        for aid, rows in decisions.items():
            for row in rows:
                stored_keys[(aid, int(row["revision"]), int(row["operator_id"]))] = row
        sent_ok: dict[tuple[Any, ...], list[DecisionAttempt]] = defaultdict(list)
        fig.decisions_attempted = len(self.decisions)
        accepted_per_key: Counter[tuple[str, int, int]] = Counter()
        for d in self.decisions:
            if d.status is not None and d.status >= 500:
                fig.five_xx += 1
                fig.problems.append(
                    f"5xx: decision on {d.approval_id} answered {d.status} {d.answer}"
                )
            if d.replay_of is not None:
                fig.replays_sent += 1
            full_key = (
                d.approval_id,
                d.revision,
                d.operator_id,
                d.verb,
                d.adjust_text,
                d.decided_at,
                d.identity,
            )
            if d.status == 200:
                accepted_per_key[(d.approval_id, d.revision, d.operator_id)] += 1
                if accepted_per_key[(d.approval_id, d.revision, d.operator_id)] > 1:
                    fig.duplicates += 1
                    fig.problems.append(
                        f"DUPLICATE operator {d.operator_id} accepted twice on {d.approval_id} "
                        f"rev {d.revision} ({'re-sent' if d.replay_of is not None else 'new'} "
                        f"{d.verb} by {d.identity!r})"
                    )
                fig.decisions_200 += 1
                if d.answer.get("resolved"):
                    fig.decisions_resolving += 1
                    stored_outcome = approvals.get(d.approval_id, {}).get("outcome")
                    if stored_outcome != d.answer.get("outcome"):
                        self._loss(
                            f"{d.approval_id}: answered resolved "
                            f"{d.answer.get('outcome')}, stored {stored_outcome}"
                        )
                row = stored_keys.get((d.approval_id, d.revision, d.operator_id))
                if row is not None and (
                    row["decision"],
                    row["adjust_text"],
                    row["decided_at"],
                    row["identity"],
                ) == (d.verb, d.adjust_text, d.decided_at, d.identity):
                    fig.decisions_verified += 1
                else:
                    self._loss(
                        f"accepted decision {d.approval_id} rev {d.revision} by "
                        f"{d.identity!r} ({d.verb}) is not in the database"
                    )
            elif d.fate == "answered":
                reason = (d.answer or {}).get("reason", f"http_{d.status}")
                fig.refusals[f"{d.status} {reason}"] += 1
                if reason not in (
                    "duplicate",
                    "already_decided",
                    "already_resolved",
                    "superseded",
                    "expired",
                ):
                    fig.problems.append(
                        f"decision on {d.approval_id} by {d.identity!r} "
                        f"refused unexpectedly: {d.status} {d.answer}"
                    )
            elif d.fate in UNKNOWN:
                fig.decisions_indeterminate += 1
            if d.fate in ("answered", *UNKNOWN) and d.status in (200, None):
                sent_ok[full_key].append(d)
        for key, row in stored_keys.items():
            full_key = key + (
                row["decision"],
                row["adjust_text"],
                row["decided_at"],
                row["identity"],
            )
            origin = sent_ok.get(full_key)
            if not origin:
                fig.phantoms += 1
                fig.problems.append(
                    f"PHANTOM decision {row['decision_id']} on {key[0]}: no "
                    "request was accepted or left unanswered for it"
                )
            elif all(o.status is None for o in origin):
                fig.decisions_indeterminate_committed += 1

        # cancels
        fig.cancels_attempted = len(self.cancels)
        cancelled_ok = {c.approval_id for c in self.cancels if c.status == 200 or c.fate in UNKNOWN}
        for c in self.cancels:
            if c.status is not None and c.status >= 500:
                fig.five_xx += 1
                fig.problems.append(f"5xx: cancel of {c.approval_id} answered {c.status}")
            if c.status == 200:
                fig.cancels_200 += 1
                if approvals.get(c.approval_id, {}).get("outcome") != "cancelled":
                    self._loss(
                        f"{c.approval_id}: cancel answered 200, stored "
                        f"{approvals.get(c.approval_id, {}).get('outcome')}"
                    )
            elif c.fate == "answered" and not (
                c.status == 409 and (c.answer or {}).get("reason") == "already_resolved"
            ):
                fig.problems.append(f"cancel of {c.approval_id} answered {c.status} {c.answer}")
        for a in approvals.values():
            if a["outcome"] == "cancelled" and a["approval_id"] not in cancelled_ok:
                fig.phantoms += 1
                fig.problems.append(f"PHANTOM cancellation of {a['approval_id']}")
            fig.outcomes[a["outcome"] or "pending"] += 1

        # expiry: unchanged expires_at; what expired while down resolved as timeout
        for aid, a in approvals.items():
            first = self.expires_first.get(aid)
            if first is not None and first != int(a["expires_at"]):
                fig.problems.append(f"{aid}: expires_at moved {first} -> {a['expires_at']}")
            if a["step"] in SHORT_STEPS and a["state"] != "resolved":
                fig.problems.append(f"{aid}: short approval still pending after the drain")
        for kill in self.kill_log:
            for aid, expires in kill.pending_expires.items():
                if expires > kill.restarted_at * 1000:
                    continue
                fig.expired_while_down += 1
                a = approvals[aid]
                if a["outcome"] != "timeout":
                    fig.problems.append(
                        f"{aid} expired while the daemon was down (kill "
                        f"{kill.index}) but resolved {a['outcome']}"
                    )

        # dispatch: un-acked at a kill -> re-sent by a later daemon and acked
        for kill in self.kill_log:
            for aid, revision in kill.unacked:
                fig.unacked_at_kill += 1
                a = approvals[aid]
                box = outbox[aid][revision]
                if box["delivered_at"] is not None:
                    if not self.resend_proof or self.relay.acked_after(aid, revision, kill.at):
                        fig.unacked_resent_acked += 1
                    else:
                        fig.problems.append(
                            f"{aid} rev {revision}: acked but never re-sent after kill {kill.index}"
                        )
                elif a["state"] == "resolved" or int(a["revision"]) != revision:
                    fig.unacked_resolved_first += 1
                else:
                    fig.problems.append(
                        f"{aid} rev {revision}: un-acked at kill {kill.index} and still un-acked"
                    )
        for aid, boxes in outbox.items():
            for revision, box in boxes.items():
                if box["delivered_at"] is None:
                    continue
                again = self.relay.arrived_after_ms(aid, revision, int(box["delivered_at"]))
                if again:
                    fig.duplicates += 1
                    fig.problems.append(
                        f"DUPLICATE {aid} rev {revision} dispatched {again} "
                        "more time(s) after its ack was recorded"
                    )
        for aid, a in approvals.items():
            if a["state"] == "pending":
                box = outbox[aid].get(int(a["revision"]))
                if box is None or box["delivered_at"] is None:
                    fig.problems.append(f"{aid}: pending, current dispatch never acked")
        with self.relay._cond:
            fig.dispatches_503 = self.relay.answers[503]
            fig.dispatches_2xx = sum(v for k, v in self.relay.answers.items() if k < 300)
            if self.relay.bad_signatures:
                fig.problems.append(f"{self.relay.bad_signatures} dispatches badly signed")

        # daemon logs and the audit chain
        for number, text in enumerate(self.logs, 1):
            for needle in self.log_needles:
                if needle in text:
                    line = next(ln for ln in text.splitlines() if needle in ln)
                    fig.problems.append(f"daemon {number} log has {needle!r}: {line[:200]}")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gate",
                "audit",
                "verify",
                "-c",
                str(self.config),
                *self._audit_anchors(),
            ],
            capture_output=True,
            env=self._tool_env(),
            cwd=ROOT,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            fig.problems.append(
                f"audit verify exited {done.returncode}: {done.stdout!r} {done.stderr!r}"
            )


def run_soak(kills: int, between: tuple[float, float], seed: int, **options: Any) -> Figures:
    """Run one soak (see ``Soak``) and return its figures."""
    return Soak(kills, between, seed, **options).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak.soak",
        description="Kill -9 the real gate under mixed load N times, then prove nothing was "
        "lost, doubled or invented. Exit 0 only with zero losses/problems.",
    )
    parser.add_argument("--kills", type=int, default=20, help="kill -9 + restart cycles")
    parser.add_argument(
        "--seconds-between",
        type=parse_range,
        default=(0.5, 3.0),
        metavar="A-B",
        help="random delay before each kill (s), e.g. 0.5-3",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--workers", type=int, default=4, help="load generator threads")
    parser.add_argument(
        "--fail-rate", type=float, default=0.25, help="share of dispatches the relay answers 503"
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        help="seconds allowed for expiries and re-dispatch after the load",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="directory for config and database (default: a temp dir)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("-q", "--quiet", action="store_true", help="no per-kill progress")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    workdir = args.workdir
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    soak = Soak(
        args.kills,
        args.seconds_between,
        seed,
        workers=args.workers,
        fail_rate=args.fail_rate,
        drain_timeout=args.drain_timeout,
        workdir=workdir,
        say=(lambda _m: None) if args.quiet else (lambda m: print(m, flush=True)),
    )
    print(
        f"soak: {args.kills} kills, {args.seconds_between[0]:g}-{args.seconds_between[1]:g} "
        f"s apart, seed {seed}, {args.workers} workers, work dir {soak.dir}",
        flush=True,
    )
    figures = soak.run()
    print(figures.report(), flush=True)
    if figures.ok and not args.keep and args.workdir is None:
        shutil.rmtree(soak.dir, ignore_errors=True)
    elif not figures.ok:
        print(f"work dir kept for inspection: {soak.dir}")
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())
