"""The outbox contract (``gate.daemon.delivery``), run against every channel: approvals'
dispatches, follow-ups (here: resolution notices), questions' dispatches and questions'
notices. Each guarantee is the delivery loop's, so each channel must show all of them.

A real daemon, a scripted relay on loopback (``tests.outbox_harness.ScriptedRelay``: answers
by POST path and ``run_id``), the SQLite file read back; storage faults are real
(``RLIMIT_FSIZE`` on the writer process); a send that cannot be built comes from stored data
the envelope cannot carry, written with sqlite3 while the daemon runs.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.outbox_harness import FileSizeLimit, ScriptedRelay
from tests.support import (
    ASK_STEP,
    DEADLINE_S,
    Q1_STEP,
    GateProcess,
    logged,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = [
    Q1_STEP,
    {"name": "short", "quorum": 1, "approvers": [101, 102], "timeout": "3s"},
    ASK_STEP,
    {"name": "ask_short", "type": "question", "approvers": [101, 102], "timeout": "3s"},
]
RELAY, NOTICES = "/relay", "/notices"


def _post(gate: GateProcess, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    status, answer = gate.api().call("POST", path, body)
    assert status in (200, 201), (path, status, answer)
    return dict(answer)


def _approval(gate: GateProcess, run_id: str, step: str) -> str:
    return str(gate.api().create(step, "Draft\n", run_id=run_id)["approval_id"])


def _question(gate: GateProcess, run_id: str, step: str) -> str:
    body = {"pipeline": "p", "step": step, "run_id": run_id, "text": "Which supplier?"}
    return str(_post(gate, "/v1/questions", {**body, "response_type": "free_text"})["question_id"])


class Channel:
    """How a test makes one send of a channel and reads its row back; a channel is its
    values."""

    name = ""
    kind = "approvals"  # the API's requests it sends about: approvals or questions
    table = ""
    where = ""  # the row of the request ``?``
    event = ""  # the log event of a failed attempt
    poison = ""  # SQL (``?`` = the id) that makes building the send raise
    error = ""  # ``last_error`` once that happened
    log = "{}"  # how its log lines name the send, ``{}`` = the request's id
    steps = ("q1", "short")  # the step of a request it sends for, and of a short-lived one
    notice = False  # a notice: sent once the request resolved, given up at ``give_up_at``

    @property
    def path(self) -> str:
        """Where the relay receives this channel's sends."""
        return NOTICES if self.notice else RELAY

    def make(self, gate: GateProcess, run_id: str, short: bool = False) -> str:
        """Make a request whose send goes out on this channel (a notice's: cancelled at once);
        return its id."""
        make = _approval if self.kind == "approvals" else _question
        ident = make(gate, run_id, self.steps[1 if short else 0])
        if self.notice:
            _post(gate, f"/v1/{self.kind}/{ident}/cancel")
        return ident

    def log_id(self, ident: str) -> str:
        return self.log.format(ident)

    def row(self, db: Path, ident: str) -> dict[str, Any]:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            conn.row_factory = sqlite3.Row
            found = conn.execute(f"SELECT * FROM {self.table} WHERE {self.where}", (ident,))
            row = found.fetchone()
        return {} if row is None else dict(row)


class ApprovalDispatch(Channel):
    name, table, where = "approval_dispatch", "outbox", "approval_id = ? AND revision = 1"
    event, error = "dispatch_failed", "the dispatch could not be built (ValueError)"
    # a stored budget that no longer encodes as JSON
    poison = """UPDATE approvals SET budget = '{"unit": "EUR", "spent_today": 1e999,
        "cap_today": 20.0, "spent_pipeline": 0.0, "cap_pipeline": null, "this_request": 1.0}'
        WHERE approval_id = ?"""
    log = "approval_id={}"


class FollowUpNotice(Channel):
    name, table, where = "followup_notice", "followup_outbox", "approval_id = ? AND kind = 'notice'"
    event, error = "followup_failed", "the notice could not be built (ValueError)"
    poison = "UPDATE approvals SET outcome = 'bogus' WHERE approval_id = ?"
    log, steps, notice = "approval_id={} kind=notice n=1", ("q1", "q1"), True


class QuestionDispatch(Channel):
    name, table, where = "question_dispatch", "question_outbox", "question_id = ? AND version = 1"
    event, error = "question_dispatch_failed", "the dispatch could not be built (KeyError)"
    poison = "UPDATE question_versions SET question = '{}' WHERE question_id = ?"
    kind, log, steps = "questions", "question_id={} version=1", ("ask", "ask_short")


class QuestionNotice(Channel):
    name, table, where = "question_notice", "question_notices", "question_id = ?"
    event, error = "question_notice_failed", "the notice could not be built (ValueError)"
    poison = "UPDATE questions SET outcome = 'bogus' WHERE question_id = ?"
    kind, log, steps, notice = "questions", "question_id={}", ("ask", "ask"), True


CHANNELS = [ApprovalDispatch(), FollowUpNotice(), QuestionDispatch(), QuestionNotice()]


@pytest.fixture(params=CHANNELS, ids=[c.name for c in CHANNELS])
def channel(request: pytest.FixtureRequest) -> Channel:
    return request.param  # type: ignore[no-any-return]


@contextlib.contextmanager
def running(directory: Path, relay: ScriptedRelay) -> Iterator[tuple[GateProcess, Path]]:
    """A daemon whose dispatches go to ``relay``'s /relay and notices to its /notices."""
    base = relay.url.rsplit("/", 1)[0]
    config = write_config(
        directory,
        relay.url,
        steps=STEPS,
        relay={"questions": True, "notice_url": base + NOTICES, "dispatch_timeout": "6s"},
    )
    gate = GateProcess(config).start()
    try:
        yield gate, directory / "gate.db"
        assert gate.stop() == 0
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.stop()


def write(db: Path, sql: str, ident: str) -> None:
    """Change a stored row behind the daemon's back (CHECK constraints not enforced)."""
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute(sql, (ident,))
        conn.commit()


def test_delivered_and_acked(tmp_path: Path, scripted: ScriptedRelay, channel: Channel) -> None:
    with running(tmp_path, scripted) as (gate, db):
        ident = channel.make(gate, "run")
        wait_until(lambda: channel.row(db, ident).get("delivered_at"), what="the ack recorded")
        row = channel.row(db, ident)
        assert (row["attempts"], row["last_error"]) == (1, None)
        assert scripted.count("run", channel.path) == 1


def test_relay_5xx_is_retried_with_backoff(
    tmp_path: Path, scripted: ScriptedRelay, channel: Channel
) -> None:
    scripted.script = {f"{channel.path} run": (503, 0.0)}
    with running(tmp_path, scripted) as (gate, db):
        ident = channel.make(gate, "run")
        wait_until(lambda: channel.row(db, ident).get("attempts", 0) >= 2, what="two attempts")
        assert channel.row(db, ident)["last_error"] == "relay answered HTTP 503"
        first, second = scripted.arrivals("run", channel.path)[:2]
        assert second - first >= 0.2  # the first retry waits 0.25-0.5 s
        scripted.script = {}
        wait_until(lambda: channel.row(db, ident).get("delivered_at"), what="the ack recorded")
        row = channel.row(db, ident)
        assert row["attempts"] == scripted.count("run", channel.path)
        assert row["last_error"] is None


@pytest.mark.parametrize("answer", [202, 503], ids=["acked", "refused"])
def test_a_result_that_cannot_be_recorded_is_recorded_again_without_a_second_post(
    tmp_path: Path, scripted: ScriptedRelay, channel: Channel, answer: int
) -> None:
    """The relay answers while the database refuses writes: recording is retried (storage
    error retried), the POST is not; once writes work, that one attempt is recorded."""
    fault = FileSizeLimit(tmp_path)
    scripted.script = {f"{channel.path} held": (answer, 3.0)}  # answered 3 s after arrival
    with running(fault.dir, scripted) as (gate, db):
        ident = channel.make(gate, "held")
        wait_until(lambda: scripted.count("held", channel.path) == 1, what="the held POST")
        fault.apply(gate)
        try:
            needle = f"event={channel.event} {channel.log_id(ident)} reason=storage_unavailable"
            wait_until(lambda: gate.log().count(needle) >= 2, what="two failed recordings")
            assert scripted.count("held", channel.path) == 1
        finally:
            scripted.script = {}  # the next POST is acked
            fault.clear(gate)
        wait_until(lambda: channel.row(db, ident).get("delivered_at"), what="the ack recorded")
        # every POST recorded once: the held one, then (after a refusal) one retry
        posts = 1 if answer == 202 else 2
        assert channel.row(db, ident)["attempts"] == scripted.count("held", channel.path) == posts


def test_given_up_after_the_limit(
    tmp_path: Path, scripted: ScriptedRelay, channel: Channel
) -> None:
    """A dispatch is retried until its request expires, never after; a notice until its
    ``give_up_at``, then failed without another POST."""
    scripted.script = {f"{channel.path} run": (503, 0.0)}
    with running(tmp_path, scripted) as (gate, db):
        ident = channel.make(gate, "run", short=True)
        if channel.notice:
            wait_until(lambda: channel.row(db, ident).get("attempts") == 1, what="one attempt")
            write(db, f"UPDATE {channel.table} SET give_up_at = 0 WHERE {channel.where}", ident)
            wait_until(lambda: channel.row(db, ident).get("failed_at"), what="the give-up")
            row = channel.row(db, ident)
            assert row["last_error"] == "not delivered before it was given up"
            assert scripted.count("run", channel.path) == 1
            gate.wait_for_line(rf"event=\w+_given_up {channel.log_id(ident)} ")
        else:
            table = "approvals" if channel.table == "outbox" else "questions"
            key = "approval_id" if table == "approvals" else "question_id"

            def resolved() -> Any:
                with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
                    found = c.execute(
                        f"SELECT expires_at, outcome FROM {table} WHERE {key} = ?", (ident,)
                    ).fetchone()
                return found if found[1] is not None else None

            expires_at, outcome = wait_until(resolved, what="the expiry")
            assert outcome == "timeout"
            arrivals = scripted.arrivals("run", channel.path)
            assert len(arrivals) >= 2
            assert all(at * 1000 < expires_at for at in arrivals)
            assert channel.row(db, ident)["delivered_at"] is None


def test_a_send_that_cannot_be_built_is_recorded_and_retried_with_backoff(
    tmp_path: Path, scripted: ScriptedRelay, channel: Channel
) -> None:
    """A fault while building one send is that attempt's failure, retried with backoff (not
    relaunched at once); nothing is sent after it."""
    scripted.script = {f"{channel.path} poison": (503, 0.0)}
    with running(tmp_path, scripted) as (gate, db):
        ident = channel.make(gate, "poison")
        wait_until(lambda: channel.row(db, ident).get("attempts") == 1, what="one attempt")
        write(db, channel.poison, ident)
        poisoned = time.monotonic()
        wait_until(lambda: channel.row(db, ident)["attempts"] >= 3, DEADLINE_S, "two failures")
        assert time.monotonic() - poisoned >= 0.5  # the second retry waits 0.5-1 s
        row = channel.row(db, ident)
        assert (row["last_error"], row["delivered_at"]) == (channel.error, None)
        faults = logged(gate, f"event={channel.event} {channel.log_id(ident)} attempt=", 2)
        assert faults <= row["attempts"], faults
        assert scripted.count("poison", channel.path) == 1
