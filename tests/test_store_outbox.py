"""The store's one outbox contract (``gate.store.outbox``) on a real database: plan, queue
and record an attempt over each delivery table, with each family's own end rule."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.store.connection import connect, migrate
from gate.store.outbox import (
    DISPATCHES,
    FOLLOWUPS,
    QUESTION_DISPATCHES,
    QUESTION_NOTICES,
    Attempt,
    DueDispatch,
    DueFollowUp,
    DueNotice,
    OutboxTable,
    plan,
)
from gate.store.tx import WriteTx

NOW = 1_767_225_600_000
LATER = NOW + 60_000


@pytest.fixture
def tx(tmp_path: Path) -> Iterator[WriteTx]:
    """A write transaction's statements over a migrated database with one pending approval
    (``A1``, revision 1) and one pending question (``Q1``, version 1)."""
    conn = connect(tmp_path / "gate.db")
    migrate(conn)
    tx = WriteTx(conn)
    common: dict[str, Any] = {
        "run_id": "r",
        "pipeline": "p",
        "step": "s",
        "risk": "low",
        "scope": [[101, "alice"]],
        "state": "pending",
        "created_at": NOW,
        "expires_at": NOW + 3_600_000,
    }
    tx.approvals.insert(
        {"approval_id": "A1", "content_type": "text/plain", "quorum_required": 1, "revision": 1}
        | {"request_hash": "sha256:a"}
        | common
    )
    tx.questions.insert(
        {"question_id": "Q1", "version": 1, "request_body_hash": "sha256:q", "answer_salt": "00"}
        | common
    )
    yield tx
    conn.close()


def row_of(tx: WriteTx, table: str, where: str, *args: Any) -> sqlite3.Row:
    return tx._conn.execute(f"SELECT * FROM {table} WHERE {where}", args).fetchone()


@pytest.mark.parametrize(
    ("outbox", "request_id"),
    [
        pytest.param(DISPATCHES, "A1", id="outbox"),
        pytest.param(QUESTION_DISPATCHES, "Q1", id="question_outbox"),
    ],
)
def test_outbox_plan_dispatch_only_of_a_pending_request_current_version(
    tx: WriteTx, outbox: OutboxTable[DueDispatch], request_id: str
) -> None:
    tx.outbox.queue(outbox, (request_id, 1), NOW)

    assert plan(tx._conn, outbox, NOW, 10) == ([DueDispatch(request_id, 1, 0, NOW)], NOW)
    assert plan(tx._conn, outbox, NOW - 1, 10) == ([], NOW)

    kind = tx.approvals if request_id == "A1" else tx.questions
    kind.set_version(request_id, 2)  # superseded: not due, and no next time either

    assert plan(tx._conn, outbox, NOW, 10) == ([], None)


@pytest.mark.parametrize(
    ("outbox", "key"),
    [
        pytest.param(DISPATCHES, ("A1", 1), id="outbox"),
        pytest.param(QUESTION_DISPATCHES, ("Q1", 1), id="question_outbox"),
    ],
)
def test_outbox_dispatch_counts_every_attempt_and_an_ack_ends_it(
    tx: WriteTx, outbox: OutboxTable[DueDispatch], key: tuple[str, int]
) -> None:
    tx.outbox.queue(outbox, key, NOW)
    where = f"{outbox.columns[0]} = ?"
    attempted = tx.outbox.attempted

    assert attempted(outbox, key, NOW, acked=False, error="e", retry_at_ms=LATER) == Attempt(
        "retry", 1
    )
    assert row_of(tx, outbox.table, where, key[0])["next_attempt_at"] == LATER
    assert attempted(outbox, key, LATER, acked=True, error=None, retry_at_ms=LATER + 1) == (
        Attempt("delivered", 2)
    )
    acked = row_of(tx, outbox.table, where, key[0])
    assert (acked["delivered_at"], acked["next_attempt_at"], acked["last_error"]) == (
        LATER,
        LATER,
        None,
    )
    assert attempted(outbox, key, LATER, acked=True, error=None, retry_at_ms=None) is None
    with pytest.raises(ValueError, match="never dropped"):
        attempted(outbox, key, LATER, acked=False, error="off", retry_at_ms=None)


@pytest.mark.parametrize(
    ("outbox", "values", "due"),
    [
        pytest.param(
            FOLLOWUPS,
            ("A1", "notice", 1, 1),
            DueFollowUp("A1", "notice", 1, 1, 0, NOW, LATER),
            id="followup_outbox",
        ),
        pytest.param(
            QUESTION_NOTICES, ("Q1", 1), DueNotice("Q1", 1, 0, NOW, LATER), id="question_notices"
        ),
    ],
)
def test_outbox_send_with_a_give_up_time_retries_until_then(
    tx: WriteTx, outbox: OutboxTable[Any], values: tuple[Any, ...], due: Any
) -> None:
    assert tx.outbox.queue(outbox, values, NOW, LATER, once=True)
    assert not tx.outbox.queue(outbox, values, NOW, LATER, once=True)  # queued once
    key = values[: outbox.key]
    attempted = tx.outbox.attempted

    assert plan(tx._conn, outbox, NOW, 10) == ([due], NOW)
    assert attempted(outbox, key, NOW, acked=False, error="e", retry_at_ms=NOW + 1) == Attempt(
        "retry", 1
    )
    assert attempted(outbox, key, NOW, acked=False, error="e", retry_at_ms=LATER) == Attempt(
        "failed", 2
    )
    assert plan(tx._conn, outbox, LATER, 10) == ([], None)
    assert attempted(outbox, key, NOW, acked=True, error=None, retry_at_ms=None) is None


@pytest.mark.parametrize(
    ("outbox", "values"),
    [
        pytest.param(FOLLOWUPS, ("A1", "reminder", 1, 1), id="followup_outbox"),
        pytest.param(QUESTION_NOTICES, ("Q1", 1), id="question_notices"),
    ],
)
def test_outbox_a_drop_fails_the_row_and_is_no_attempt(
    tx: WriteTx, outbox: OutboxTable[Any], values: tuple[Any, ...]
) -> None:
    tx.outbox.queue(outbox, values, NOW, LATER)
    key = values[: outbox.key]

    dropped = tx.outbox.attempted(outbox, key, NOW, acked=False, error="off", retry_at_ms=None)

    assert dropped == Attempt("failed", 0)
    where = " AND ".join(f"{column} = ?" for column in outbox.columns[: outbox.key])
    row = row_of(tx, outbox.table, where, *key)
    assert (row["failed_at"], row["last_error"], row["attempts"]) == (NOW, "off", 0)


def test_outbox_queue_refuses_an_unknown_kind_or_a_misplaced_give_up_time(tx: WriteTx) -> None:
    with pytest.raises(ValueError, match="unknown kind"):
        tx.outbox.queue(FOLLOWUPS, ("A1", "nudge", 1, 1), NOW, LATER)
    with pytest.raises(ValueError, match="give-up time"):
        tx.outbox.queue(FOLLOWUPS, ("A1", "notice", 1, 1), NOW)
    with pytest.raises(ValueError, match="give-up time"):
        tx.outbox.queue(DISPATCHES, ("A1", 1), NOW, LATER)
    with pytest.raises(sqlite3.IntegrityError):  # not ``once``: a second row is an error
        tx.outbox.queue(FOLLOWUPS, ("A1", "notice", 1, 1), NOW, LATER)
        tx.outbox.queue(FOLLOWUPS, ("A1", "notice", 1, 1), NOW, LATER)
