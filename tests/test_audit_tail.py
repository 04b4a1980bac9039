"""A consistent deletion of the newest audit entries.

Whoever can write the database file can delete the newest entries of the audit log and the
rows that name them: the chain left over is intact, so only something held **outside** the
file can show what is missing. These tests build one real history with the real daemon (one
approval resolved, two created after it and acked), then tamper with copies of its database
as such an attacker would, and check what catches each deletion:

- the records check of ``audit verify -c`` (a dispatch the outbox says was delivered needs
  its ``dispatch_ack`` entry);
- the ``created_receipt`` every create answer carries, kept by the pipeline
  (``audit verify --expect``);
- the chain heads the gate logs after each commit (``event=audit_head``), kept by a log
  collector (``audit verify --expect-head SEQ:HASH``);

and what nothing catches: a tail erased after the last anchor the verifier holds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gate.audit import chain as audit
from tests.support import (
    RECEIPT_KEY,
    CaptureRelay,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

HEAD = re.compile(r"event=audit_head seq=(\d+) hash=([0-9a-f]{64})\b")


@dataclass(frozen=True)
class History:
    """The daemon-written history every test here starts from (the gate is stopped).

    Audit log: ``resolved`` (entries 1-4: created, dispatch_ack, decision, resolved),
    ``middle`` (5-6: created, dispatch_ack), ``last`` (7-8: created, dispatch_ack), each
    step waited for before the next, so each commit appended one group of entries.
    """

    directory: Path
    config: Path
    db: Path
    relay_url: str
    resolved: str
    middle: str
    last: str
    created: dict[str, Any]  # the 201 answer for ``middle``
    replayed: tuple[int, dict[str, Any]]  # the same create again, same Idempotency-Key
    fetched: dict[str, Any]  # GET of ``middle`` once acked
    fetched_resolved: dict[str, Any]  # GET of ``resolved``
    kept: Path  # ``hitl-gate request --json`` output for ``last``
    heads: list[tuple[int, str]]  # every event=audit_head the daemon logged, in order

    def entry_hash(self, seq: int) -> str:
        return str(_scalar(self.db, f"SELECT entry_hash FROM audit_log WHERE seq = {seq}"))

    def head(self, seq: int) -> str:
        """``SEQ:HASH`` of the head logged at ``seq`` (fails when none was)."""
        hashes = [h for s, h in self.heads if s == seq]
        assert hashes, f"no audit_head logged at entry {seq}: {self.heads}"
        return f"{seq}:{hashes[0]}"

    def copy(self, name: str, tamper: Callable[[sqlite3.Connection], None]) -> Path:
        """A copy of the database changed by ``tamper`` (one transaction, as an attacker
        with the file would), with a config of its own; returns that config."""
        directory = self.directory / name
        directory.mkdir()
        config = write_config(directory, self.relay_url)
        src, dst = sqlite3.connect(self.db), sqlite3.connect(directory / "gate.db")
        try:
            src.backup(dst)
            with dst:
                tamper(dst)
        finally:
            src.close()
            dst.close()
        return config


def _scalar(db: Path, sql: str) -> Any:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def _acked(api: Any, approval_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: (a := api.get(approval_id))["dispatch"]["delivered_at"] and a,
        what=f"dispatch ack of {approval_id}",
    )


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    directory = tmp_path_factory.mktemp("tail")
    relay = CaptureRelay().start()
    gate = GateProcess(write_config(directory, relay.url)).start()
    try:
        api = gate.api()
        resolved = api.create("q1", "tail: resolved \u2713\n")["approval_id"]
        dispatch = relay.wait_dispatch(resolved)
        _acked(api, resolved)
        status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
        assert (status, answer["resolved"]) == (200, True), answer

        body = {
            "pipeline": "p",
            "step": "q1",
            "draft": {"content_type": "text/plain", "body": "tail: middle\n"},
        }
        key = {"Idempotency-Key": "tail-middle"}
        status, created = api.call("POST", "/v1/approvals", body, key)
        assert status == 201, created
        middle = created["approval_id"]
        replayed = api.call("POST", "/v1/approvals", body, key)
        fetched = _acked(api, middle)

        kept = directory / "last-approval.json"  # what a pipeline keeps of its request
        proc = run_cli(
            "request",
            "-c",
            str(gate.config),
            "--api-url",
            gate.api_url,
            "--pipeline",
            "p",
            "--step",
            "q1",
            "--draft",
            "tail: last",
            "--json",
        )
        assert proc.returncode == 0, proc.stderr
        kept.write_bytes(proc.stdout)
        last = json.loads(proc.stdout)["approval_id"]
        _acked(api, last)
        fetched_resolved = api.get(resolved)
        db = directory / "gate.db"
        assert _scalar(db, "SELECT count(*) FROM audit_log") == 8
        newest = _scalar(db, "SELECT entry_hash FROM audit_log WHERE seq = 8")
        try:  # the head of the last commit is logged after it (the writer's own line)
            gate.wait_for_line(f"event=audit_head seq=8 hash={newest}")
        except AssertionError:
            pass  # no head logged at all: the tests that need heads say so
        assert gate.stop() == 0
        heads = [(int(m.group(1)), m.group(2)) for m in HEAD.finditer(gate.log())]
        yield History(
            directory,
            gate.config,
            db,
            relay.url,
            resolved,
            middle,
            last,
            created,
            replayed,
            fetched,
            fetched_resolved,
            kept,
            heads,
        )
    finally:
        if gate.proc is not None and gate.proc.poll() is None:
            gate.stop()
        relay.stop()


def verify(config: Path, *args: str) -> tuple[int, str]:
    """``hitl-gate audit verify -c CONFIG ARGS``: ``(exit code, stdout + stderr)``."""
    proc = run_cli("audit", "verify", "-c", str(config), *args)
    err = proc.stderr.decode()
    assert "Traceback" not in err, err
    return proc.returncode, proc.stdout.decode() + err


def receipt_of(history: History, seq: int) -> dict[str, Any]:
    """The receipt of entry ``seq`` as the gate hands it out (HMAC of its hash)."""
    entry_hash = history.entry_hash(seq)
    return {
        "seq": seq,
        "entry_hash": entry_hash,
        "alg": "hmac-sha256",
        "receipt": hmac.new(RECEIPT_KEY.encode(), entry_hash.encode(), hashlib.sha256).hexdigest(),
    }


# ---- the anchors the gate hands out ----------------------------------------------------------


def test_create_answers_carry_the_receipt_of_their_created_entry(history) -> None:
    """201, the idempotent 200 replay, GET and ``request --json`` all carry
    ``created_receipt``: the receipt of the approval's ``created`` audit entry."""
    assert history.created["created_receipt"] == receipt_of(history, 5)
    assert history.created["receipt"] is None  # pending: no resolution yet
    status, replay = history.replayed
    assert (status, replay["approval_id"]) == (200, history.middle)
    assert replay["created_receipt"] == receipt_of(history, 5)
    assert history.fetched["created_receipt"] == receipt_of(history, 5)
    kept = json.loads(history.kept.read_text(encoding="utf-8"))
    assert kept["created_receipt"] == receipt_of(history, 7)
    assert history.fetched_resolved["created_receipt"] == receipt_of(history, 1)
    assert history.fetched_resolved["receipt"] == receipt_of(history, 4)


def test_the_created_receipt_is_read_through_an_index(history) -> None:
    """The created entry is found by approval_id through the partial index of migration 3,
    not by a scan of the whole log on every GET."""
    from gate.store.approvals import APPROVALS

    CREATED_ENTRY_SQL = APPROVALS.created_sql

    conn = sqlite3.connect(f"file:{history.db}?mode=ro", uri=True)
    try:
        plan = " ".join(
            str(row[-1])
            for row in conn.execute(f"EXPLAIN QUERY PLAN {CREATED_ENTRY_SQL}", (history.middle,))
        )
    finally:
        conn.close()
    assert "USING INDEX audit_log_created" in plan, plan


def test_an_approval_from_before_the_upgrade_carries_its_created_receipt(history) -> None:
    """A database of schema 2 (no index yet): the gate adds the index on start (migration
    3) and answers the created receipt of approvals made before, from their log entries."""

    def schema_2(conn: sqlite3.Connection) -> None:
        # undo migrations 7 and 6, 5, 4, then 3, so the
        # start really migrates from 2
        conn.execute("DROP TABLE approver_invites")
        conn.execute("ALTER TABLE approvals DROP COLUMN approver_signature")
        conn.execute("DROP TABLE approver_credentials")  # its index goes with it
        conn.execute("ALTER TABLE decisions DROP COLUMN credential_id")
        for table in ("question_notices", "question_outbox", "question_versions", "questions"):
            conn.execute(f"DROP TABLE {table}")  # their indexes go with them
        conn.execute("DROP INDEX audit_log_question_created")
        conn.execute("DROP TABLE followup_outbox")
        conn.execute("DROP INDEX approvals_followup_due")
        for table, column in (
            ("decisions", "reason"),
            ("decisions", "on_behalf_of"),
            ("approvals", "followups"),
            ("approvals", "reminders_sent"),
            ("approvals", "escalation_level"),
            ("approvals", "next_followup_at"),
        ):
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("DROP INDEX audit_log_created")
        conn.execute("PRAGMA user_version = 2")

    config = history.copy("schema-2", schema_2)
    gate = GateProcess(config).start()
    try:
        gate.wait_for_line("event=migrated schema_version=3")
        assert gate.api().get(history.last)["created_receipt"] == receipt_of(history, 7)
    finally:
        assert gate.stop() == 0


def test_the_gate_logs_the_chain_head_once_per_commit(history) -> None:
    """One ``event=audit_head`` per commit that appended entries: the decision and the
    resolution it caused (entries 3 and 4) are one commit, so one head, at 4."""
    assert [seq for seq, _ in history.heads] == [1, 2, 4, 5, 6, 7, 8], history.heads
    for seq, entry_hash in history.heads:
        assert entry_hash == history.entry_hash(seq), seq


def test_an_honest_log_passes_with_every_anchor(history) -> None:
    heads = [arg for seq, _ in history.heads for arg in ("--expect-head", history.head(seq))]
    code, out = verify(history.config, "--expect", str(history.kept), *heads)
    assert (code, out) == (
        0,
        "ok: 8 entries, chain and receipts intact; holds the receipt for "
        "entry 7; holds the logged heads at entries 1, 2, 4, 5, 6, 7, 8\n"
        "ok: 3 approvals match the audit log\n",
    )
    # an export too, offline, with the receipt key
    export = history.directory / "honest.jsonl"
    proc = run_cli("audit", "export", "-c", str(history.config), "-o", str(export))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(
        "audit",
        "verify",
        "--file",
        str(export),
        "--key-env",
        "HITL_RECEIPT_KEY",
        "--expect-head",
        history.head(8),
    )
    assert (proc.returncode, proc.stdout.decode()) == (
        0,
        "ok: 8 entries, chain and receipts intact; holds the logged head at entry 8\n",
    )


# ---- (a) the last dispatch_ack deleted -------------------------------------------------------


def test_a_deleted_last_dispatch_ack_is_caught_by_the_records_check(history) -> None:
    """Entry 8 (the relay's ack of ``last``) deleted: nothing in the rows names it, the
    chain left over is intact. The outbox still says the dispatch was delivered (left so,
    the gate does not send it again), so the records check names it."""

    def delete_ack(conn: sqlite3.Connection) -> None:
        assert (
            conn.execute("DELETE FROM audit_log WHERE seq = 8 AND kind = 'dispatch_ack'").rowcount
            == 1
        )

    config = history.copy("ack-deleted", delete_ack)
    code, out = verify(config)
    assert (code, out) == (
        1,
        f"TAMPERED: approval {history.last}: its outbox row says the relay acked the "
        "dispatch of revision 1 (after 1 attempt), but the audit log holds no dispatch_ack "
        "entry for it (deleted?); the audit log itself verified (7 entries)\n",
    )
    doctor = run_cli("doctor", "-c", str(config))
    assert doctor.returncode == 1, doctor.stdout
    assert (
        f"FAIL audit: TAMPERED: approval {history.last}: its outbox row says the relay acked"
    ) in doctor.stdout.decode(), doctor.stdout
    # a logged head catches it too
    assert verify(config, "--expect-head", history.head(8)) == (
        1,
        "TAMPERED: entry 8: missing: the log ends at entry 7, but the gate logged entry 8 "
        f"as its head (entries deleted from the tail) (--expect-head {history.head(8)})\n",
    )


def test_a_deleted_ack_with_its_outbox_row_reset_needs_a_logged_head(history) -> None:
    """The same deletion with the outbox row set back to "never delivered": the rows agree
    with the log again (the gate would dispatch it once more on start); only a head logged
    after the ack shows the deletion."""

    def delete_ack_and_reset(conn: sqlite3.Connection) -> None:
        assert conn.execute("DELETE FROM audit_log WHERE seq = 8").rowcount == 1
        assert (
            conn.execute(
                "UPDATE outbox SET delivered_at = NULL, attempts = 0 WHERE approval_id = ?",
                (history.last,),
            ).rowcount
            == 1
        )

    config = history.copy("ack-deleted-reset", delete_ack_and_reset)
    assert verify(config) == (
        0,
        "ok: 7 entries, chain and receipts intact\nok: 3 approvals match the audit log\n",
    )
    code, out = verify(config, "--expect-head", history.head(8))
    assert code == 1 and out.startswith("TAMPERED: entry 8: missing: "), out


# ---- (b) a whole pending approval erased -----------------------------------------------------


def _erase(approval_id: str) -> Callable[[sqlite3.Connection], None]:
    def erase(conn: sqlite3.Connection) -> None:
        assert (
            conn.execute("DELETE FROM audit_log WHERE approval_id = ?", (approval_id,)).rowcount
            == 2
        )
        for table in ("outbox", "revisions", "decisions", "approvals"):
            conn.execute(f"DELETE FROM {table} WHERE approval_id = ?", (approval_id,))

    return erase


def test_an_erased_pending_approval_is_caught_by_its_receipt_or_a_logged_head(
    history,
) -> None:
    """``last`` erased whole (its rows and entries 7-8): the chain and the records agree,
    so ``audit verify -c`` alone passes; the created receipt the pipeline kept, and any head
    logged from entry 7 on, catch it."""
    config = history.copy("erased", _erase(history.last))
    assert verify(config) == (
        0,
        "ok: 6 entries, chain and receipts intact\nok: 2 approvals match the audit log\n",
    )
    assert verify(config, "--expect", str(history.kept)) == (
        1,
        "TAMPERED: entry 7: missing: the log ends at entry 6, but a receipt for entry 7 "
        f"exists (entries deleted from the tail) (receipt {history.kept})\n",
    )
    for seq in (7, 8):
        assert verify(
            config, "--expect-head", history.head(6), "--expect-head", history.head(seq)
        ) == (
            1,
            f"TAMPERED: entry {seq}: missing: the log ends at entry 6, but the gate logged "
            f"entry {seq} as its head (entries deleted from the tail) "
            f"(--expect-head {history.head(seq)})\n",
        )


def test_a_tail_erased_after_the_last_anchor_held_is_not_caught(history) -> None:
    """What no anchor can show: the verifier's newest anchor is older than the erased tail
    (here: the head logged at 6 and the receipt of ``middle``'s created entry)."""
    config = history.copy("erased-unanchored", _erase(history.last))
    middle = history.directory / "middle.json"
    middle.write_text(json.dumps(history.created), encoding="utf-8")
    assert verify(config, "--expect", str(middle), "--expect-head", history.head(6)) == (
        0,
        "ok: 6 entries, chain and receipts intact; holds the receipt for entry 5; holds "
        "the logged head at entry 6\nok: 2 approvals match the audit log\n",
    )


def test_a_rewritten_log_does_not_hold_the_logged_head(history) -> None:
    """An export verified without a key: ``middle``'s entries taken out and the rest chained
    again (anyone can recompute a hash chain). The chain verifies; the logged head at 6 no
    longer matches what the log now holds at 6, and the head at 8 is missing."""
    export = history.directory / "rewritten.jsonl"
    proc = run_cli("audit", "export", "-c", str(history.config), "-o", str(export))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in export.read_text(encoding="utf-8").splitlines()]
    kept = [row for row in rows if row["approval_id"] != history.middle]
    prev = kept[3]["entry_hash"]
    for seq, row in enumerate(kept[4:], start=5):
        entry = json.loads(row["entry"])
        entry["seq"] = seq
        text, digest, receipt = audit.seal(prev, entry, b"not-the-receipt-key")
        row.update(seq=seq, entry=text, prev_hash=prev, entry_hash=digest, receipt=receipt)
        prev = digest
    export.write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept), encoding="utf-8"
    )
    env = {k: v for k, v in gate_env().items() if k != "HITL_RECEIPT_KEY"}

    def verify_file(*args: str) -> tuple[int, str]:
        proc = run_cli("audit", "verify", "--file", str(export), *args, env=env)
        return proc.returncode, proc.stdout.decode()

    assert verify_file() == (0, "ok: 6 entries, chain intact\n")
    assert verify_file("--expect-head", history.head(6)) == (
        1,
        "TAMPERED: entry 6: entry hash differs from the logged head's (the log was "
        "rewritten up to here, or restored from a backup without this entry and written "
        f"again since) (--expect-head {history.head(6)})\n",
    )
    code, out = verify_file("--expect-head", history.head(8))
    assert code == 1 and out.startswith("TAMPERED: entry 8: missing: the log ends at entry 6"), out


# ---- usage -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["8", "x:" + "a" * 64, "0:" + "a" * 64, "8:" + "a" * 63, "8:" + "g" * 64, "-1:" + "a" * 64, ""],
)
def test_expect_head_that_is_no_seq_and_hash_is_a_usage_error(history, value) -> None:
    proc = run_cli("audit", "verify", "-c", str(history.config), "--expect-head", value)
    assert (proc.returncode, proc.stdout) == (2, b""), proc.stdout
    assert proc.stderr.decode() == (
        f"Error: --expect-head: {value!r} is not SEQ:HASH (an audit entry's seq, 1 or more, "
        "and its entry hash, 64 hex digits, as the gate logs them in event=audit_head)\n"
    )
