"""A stream of approvals and decisions through the balancers of ``tests.cluster_gates.Gates``
for the fail-over tests, from a client that retries as the design asks: a request whose
outcome it does not know (no answer, the balancer's 502, a gate's 503) is sent again, the
same bytes (a create: the same Idempotency-Key; a decision: the same signed envelope), until
a gate answers it. ``check()`` then proves on the database that every answered 201/200 is
there, nothing is there twice, each approval resolved once as its decisions say, the log
whole; and that no gate answered a 5xx but 503.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gate.protocol import signing
from gate.protocol.canonical import wire_json
from tests.cluster_gates import Gates
from tests.soak.soak import send
from tests.support import API_TOKEN, SECRET, CaptureRelay, decision_body

APPROVERS = ("alice@example.com", "bob@example.com")  # operators 101, 102 of step q2
OPERATORS = {"alice@example.com": 101, "bob@example.com": 102}


@dataclass
class Sent:
    """One logical request and every try of it: ``fates`` (``answered``, ``unsent``,
    ``indeterminate``, ``unavailable``), the final status and answer."""

    what: str
    fates: list[str] = field(default_factory=list)
    status: int | None = None
    answer: Any = None

    @property
    def unsure(self) -> bool:
        """Whether a try before the answered one may have taken effect."""
        return any(f in ("indeterminate", "unavailable") for f in self.fates)


@dataclass
class Approval:
    approval_id: str
    create: Sent
    decisions: dict[str, Sent] = field(default_factory=dict)


class Stream:
    """Worker threads, each: create a quorum-2 approval (``q2``) through the API balancer,
    take its dispatch from ``relay``, send alice's and bob's approvals through the decision
    balancer. ``start()``, ``decided()`` (answered decisions so far), ``stop()``,
    ``check(rows)``."""

    def __init__(self, gates: Gates, relay: CaptureRelay, workers: int = 3) -> None:
        self.gates = gates
        self.relay = relay
        self.workers = workers
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.approvals: list[Approval] = []
        self.statuses: Counter[int] = Counter()  # every status a gate answered
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def start(self) -> Stream:
        self.threads = [
            threading.Thread(target=self._work, daemon=True, name=f"stream-{i}")
            for i in range(self.workers)
        ]
        for thread in self.threads:
            thread.start()
        return self

    def decided(self) -> int:
        """How many decisions got a gate's definite answer so far."""
        with self.lock:
            return sum(s.status is not None for a in self.approvals for s in a.decisions.values())

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(120)
        if self.errors:
            raise self.errors[0]

    def _work(self) -> None:
        try:
            while not self.stopping.is_set():
                approval = self._create()
                if approval is None:
                    return
                dispatch = self.relay.wait_dispatch(approval.approval_id)
                for who in APPROVERS:
                    raw = wire_json(decision_body(dispatch, who))
                    sent = Sent(f"decision {approval.approval_id} {who}")
                    with self.lock:
                        approval.decisions[who] = sent
                    headers = {"Content-Type": "application/json", "X-Hitl-Protocol": "hitl/v0"}
                    self._until_answered(sent, self.gates.decisions_url, raw, headers, sign=True)
        except BaseException as exc:  # raised by stop()
            self.errors.append(exc)

    def _create(self) -> Approval | None:
        key = uuid.uuid4().hex
        body = (
            b'{"pipeline": "p", "step": "q2", "draft": {"content_type": "text/plain",'
            b' "body": "ship it?"}}'
        )
        headers = {
            "Authorization": f"Bearer {API_TOKEN}",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        }
        sent = Sent(f"create {key}")
        self._until_answered(sent, self.gates.api_url + "/v1/approvals", body, headers)
        if sent.status not in (200, 201):
            raise AssertionError(f"a create answered {sent.status} {sent.answer}")
        approval = Approval(sent.answer["approval_id"], sent)
        with self.lock:
            self.approvals.append(approval)
        return approval

    def _until_answered(
        self, sent: Sent, url: str, body: bytes, headers: dict[str, str], sign: bool = False
    ) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if sign:
                headers["X-Draftcat-Signature"] = signing.sign(SECRET, int(time.time()), body)
            fate, status, answer = send(url, "POST", body, headers, balanced=True)
            sent.fates.append(fate)
            if fate == "unavailable":
                with self.lock:
                    self.statuses[503] += 1
            if fate == "answered":
                sent.status, sent.answer = status, answer
                with self.lock:
                    assert status is not None
                    self.statuses[status] += 1
                return
            self.stopping.wait(0.05)  # no gate could take it now: again, a little later
        raise AssertionError(f"{sent.what}: no gate answered in 120 s: {sent.fates}")

    def check(self, rows: Any) -> list[str]:
        """What is wrong on the database (``rows(sql, *args)``: its rows as tuples), each
        as a sentence; empty when nothing is. The stream's approvals are those of step
        ``q2`` (a test may create others beside it)."""
        problems = [f"a gate answered {s}" for s in self.statuses if s >= 500 and s != 503]
        stored = {
            a: s for a, s in rows("SELECT approval_id, outcome FROM approvals WHERE step = 'q2'")
        }
        counted = Counter(
            (a, op) for a, op in rows("SELECT approval_id, operator_id FROM decisions")
        )
        resolutions = rows("SELECT approval_id FROM audit_log WHERE kind = 'resolved'")
        resolved = Counter(a for (a,) in resolutions)
        for approval in self.approvals:
            aid = approval.approval_id
            if aid not in stored:
                problems.append(f"{aid}: answered {approval.create.status}, not in the database")
                continue
            for who, sent in approval.decisions.items():
                n = counted[(aid, OPERATORS[who])]
                reason = (sent.answer or {}).get("reason")
                if n > 1:
                    problems.append(f"{sent.what}: {n} rows")
                elif sent.status == 200 or reason == "duplicate":
                    if n != 1 or (reason == "duplicate" and not sent.unsure):
                        problems.append(f"{sent.what}: answered {sent.status} {reason}, {n} rows")
                elif n and not sent.unsure:
                    problems.append(f"{sent.what}: refused {sent.status} {reason}, yet recorded")
            both = all(counted[(aid, op)] == 1 for op in OPERATORS.values())
            if resolved[aid] > 1:
                problems.append(f"{aid}: resolved {resolved[aid]} times")
            if both and (stored[aid], resolved[aid]) != ("approved", 1):
                problems.append(f"{aid}: both approved, stored {stored[aid]} {resolved[aid]}x")
        mine = {a.approval_id for a in self.approvals}
        problems += [f"{aid}: not created by the stream" for aid in set(stored) - mine]
        return problems
