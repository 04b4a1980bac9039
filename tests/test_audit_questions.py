"""Questions in the audit checks: ``audit verify -c`` compares each question's rows
with its entries, the offline export verification covers question entries, ``doctor`` passes
a healthy database with questions.

One real daemon (with a signing key) makes a history with every question outcome (answered
after a revision, answered, cancelled, timed out, pending) next to an approval, then stops;
each test copies that directory and edits the SQLite file the way someone holding no key
could, then runs the real CLI.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.protocol.answer import build_answer
from tests.support import (
    CaptureRelay,
    GateProcess,
    free_port,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)
from tests.test_signed_audit import no_secret_env, sign_config

pytestmark = pytest.mark.e2e

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
    {"name": "quick", "type": "question", "approvers": [101, 102], "timeout": "2s"},
]
# what a question or an answer in the history says: no audit message may quote it
TEXTS = ("Which supplier?", "What PO?", "globex", "PO-9", "Quick one?")


def _rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _edit(db: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute(sql, args).rowcount >= 1, sql
        conn.commit()
    finally:
        conn.close()


class History:
    """The directory of the finished history (config, gate.db, keys) and its question ids
    by what happened to them."""

    def __init__(
        self, directory: Path, ids: dict[str, str], public_key: Path, views: list[Any]
    ) -> None:
        self.directory = directory
        self.ids = ids
        self.public_key = public_key
        self.views = views  # GET /v1/questions/{id} of every question, at the end

    def copy(self, to: Path) -> Path:
        """A copy of the history under ``to``; returns its config path."""
        shutil.copytree(self.directory, to / "h")
        return to / "h" / "config.yaml"


@pytest.fixture(scope="module")
def relay() -> Iterator[CaptureRelay]:
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory, relay: CaptureRelay) -> History:
    directory = tmp_path_factory.mktemp("qaudit")
    config = write_config(directory, relay.url, steps=STEPS, relay={"questions": True})
    public, _ = sign_config(config)
    gate = GateProcess(config).start()
    db = directory / "gate.db"
    api = gate.api()
    try:

        def ask(step: str = "ask", **fields: Any) -> str:
            body = {"pipeline": "p", "step": step, "text": "Which supplier?", **fields}
            status, out = api.call("POST", "/v1/questions", body)
            assert status == 201, out
            return str(out["question_id"])

        def acked(question_id: str, version: int = 1) -> dict[str, Any]:
            wait_until(
                lambda: _rows(
                    db,
                    "SELECT 1 FROM question_outbox WHERE question_id = ? AND version = ?"
                    " AND delivered_at IS NOT NULL",
                    question_id,
                    version,
                ),
                what="question dispatch ack",
            )
            return next(
                d
                for d in relay.dispatches()
                if d.get("question_id") == question_id and d.get("version") == version
            )

        def answer(dispatch: dict[str, Any], value: Any) -> None:
            body = build_answer(
                question_id=dispatch["question_id"],
                nonce=dispatch["callback"]["nonce"],
                request_hash=dispatch["request_hash"],
                value=value,
                approver_id=dispatch["approvers"][0],
                decided_at_ms=int(time.time() * 1000),
            )
            status, out, _ = post_decision(gate.callback_url, body)
            assert status == 200, out

        ids = {"timeout": ask("quick", text="Quick one?", response_type="free_text")}
        wait_until(
            lambda: (
                _rows(db, "SELECT outcome FROM questions WHERE question_id = ?", ids["timeout"])
                == [("timeout",)]
            ),
            what="the quick question to time out",
        )
        ids["cancelled"] = ask(response_type="free_text")
        acked(ids["cancelled"])
        assert api.call("POST", f"/v1/questions/{ids['cancelled']}/cancel")[0] == 200
        ids["revised"] = ask(response_type="free_text")
        acked(ids["revised"])
        status, _ = api.call("POST", f"/v1/questions/{ids['revised']}/revise", {"text": "What PO?"})
        assert status == 200
        answer(acked(ids["revised"], 2), "PO-9")
        ids["pending"] = ask(response_type="multi_choice", options=["a", "b"])
        acked(ids["pending"])
        api.create(step="q1")
        ids["answered"] = ask(response_type="single_choice", options=["acme", "globex"])
        answer(acked(ids["answered"]), "globex")  # the newest entries: answered, resolved
        views = [api.call("GET", f"/v1/questions/{qid}")[1] for qid in ids.values()]
    finally:
        assert gate.stop() == 0
    kinds = _rows(db, "SELECT kind FROM audit_log ORDER BY seq DESC LIMIT 2")
    assert kinds == [("question_resolved",), ("question_answered",)]
    return History(directory, ids, public, views)


def verify_c(config: Path) -> tuple[int, str]:
    proc = run_cli("audit", "verify", "-c", str(config))
    out = proc.stdout.decode() + proc.stderr.decode()
    assert "Traceback" not in out, out
    return proc.returncode, out


def assert_quotes_nothing(out: str) -> None:
    for text in TEXTS:
        assert text not in out, f"the audit check quoted {text!r}: {out}"


def test_audit_questions_verify_c_passes_with_every_outcome(
    history: History, tmp_path: Path
) -> None:
    config = history.copy(tmp_path)
    outcomes = _rows(
        config.parent / "gate.db", "SELECT outcome, version FROM questions ORDER BY question_id"
    )
    assert sorted(outcomes, key=repr) == sorted(
        [("timeout", 1), ("cancelled", 1), ("answered", 2), (None, 1), ("answered", 1)], key=repr
    )

    code, out = verify_c(config)

    assert code == 0, out
    assert "ok: 1 approvals match the audit log" in out
    assert "ok: 5 questions match the audit log" in out


TAMPERS = {
    "answer_edited": (
        "answered",
        "UPDATE questions SET answer = '\"acme\"' WHERE question_id = ?",
        "the answer in the questions table does not hash to the value_hash of audit entry",
    ),
    "question_text_edited": (
        "revised",
        "UPDATE question_versions SET question = replace(question, 'What PO?', 'What SO?')"
        " WHERE question_id = ? AND version = 2",
        "version 2's question does not hash to the request_hash of audit entry",
    ),
    "outcome_changed": (
        "cancelled",
        "UPDATE questions SET outcome = 'timeout' WHERE question_id = ?",
        "outcome is 'timeout' in the questions table but 'cancelled' in audit entry",
    ),
    "answerer_changed": (
        "revised",
        "UPDATE questions SET answered_by = 102 WHERE question_id = ?",
        "answered_by is 102 in the questions table but 101 in audit entry",
    ),
    "answer_identity_rewritten": (
        "revised",
        "UPDATE questions SET answer_identity = 'bob@example.com' WHERE question_id = ?",
        "answer_identity in the questions table is not the identity of operator 101",
    ),
    "answer_identity_cleared": (
        "answered",
        "UPDATE questions SET answer_identity = NULL WHERE question_id = ?",
        "answer_identity in the questions table is not the identity of operator",
    ),
    "resolved_row_put_back_to_pending": (
        "timeout",
        "UPDATE questions SET state = 'pending', outcome = NULL, receipt = NULL"
        " WHERE question_id = ?",
        "state is 'pending' in the questions table but audit entry",
    ),
    "row_deleted": (
        "pending",
        "DELETE FROM questions WHERE question_id = ?",
        "missing from the questions table (deleted?)",
    ),
    "ack_undone": (
        "pending",
        "UPDATE question_outbox SET delivered_at = NULL WHERE question_id = ?",
        "its outbox row says the dispatch of version 1 was never acked, but audit entry",
    ),
}


@pytest.mark.parametrize("case", list(TAMPERS), ids=list(TAMPERS))
def test_audit_questions_verify_c_names_an_edited_question(
    history: History, tmp_path: Path, case: str
) -> None:
    which, sql, reason = TAMPERS[case]
    config = history.copy(tmp_path)
    question_id = history.ids[which]
    _edit(config.parent / "gate.db", sql, question_id)

    code, out = verify_c(config)

    assert code == 1, out
    assert f"TAMPERED: question {question_id}: " in out and reason in out, out
    assert "the audit log itself verified" in out
    assert_quotes_nothing(out)


def test_audit_questions_verify_c_names_a_question_row_made_outside_the_gate(
    history: History, tmp_path: Path
) -> None:
    config = history.copy(tmp_path)
    db = config.parent / "gate.db"
    _edit(
        db,
        "INSERT INTO questions (question_id, run_id, pipeline, step, risk, scope, version,"
        " state, created_at, expires_at, request_body_hash, answer_salt)"
        " SELECT '01ZZZZZZZZZZZZZZZZZZZZZZZZ', run_id, pipeline, step, risk, scope, 1, 'pending',"
        " created_at, expires_at, 'x', answer_salt FROM questions WHERE question_id = ?",
        history.ids["pending"],
    )

    code, out = verify_c(config)

    assert code == 1, out
    assert (
        "TAMPERED: question 01ZZZZZZZZZZZZZZZZZZZZZZZZ: no question_created entry in the audit "
        "log (row inserted outside the gate?)"
    ) in out


def test_audit_questions_deleted_answered_entry_is_caught_by_the_chain(
    history: History, tmp_path: Path
) -> None:
    config = history.copy(tmp_path)
    db = config.parent / "gate.db"
    ((seq,),) = _rows(
        db,
        "SELECT seq FROM audit_log WHERE approval_id = ? AND kind = 'question_answered'",
        history.ids["revised"],
    )
    _edit(db, "DELETE FROM audit_log WHERE seq = ?", seq)

    code, out = verify_c(config)

    assert code == 1, out
    assert out.startswith(f"TAMPERED: entry {seq + 1}: "), out


def test_audit_questions_deleted_newest_entries_are_caught_by_the_stored_receipt(
    history: History, tmp_path: Path
) -> None:
    config = history.copy(tmp_path)
    db = config.parent / "gate.db"
    question_id = history.ids["answered"]
    _edit(
        db,
        "DELETE FROM audit_log WHERE approval_id = ?"
        " AND kind IN ('question_answered', 'question_resolved')",
        question_id,
    )

    code, out = verify_c(config)

    assert code == 1, out
    assert f"(the receipt stored with question {question_id})" in out, out


def test_audit_questions_value_hash_is_salted_per_question(
    history: History, tmp_path: Path
) -> None:
    """B3: a short answer cannot be recovered from an export by hashing guesses: the
    value_hash is over a random 16-byte salt per question (kept in its row, never in the log
    or the API) and the canonical JSON of the value."""
    config = history.copy(tmp_path)
    db = config.parent / "gate.db"
    salts = dict(_rows(db, "SELECT question_id, answer_salt FROM questions"))
    assert len(salts) == 5 and len(set(salts.values())) == 5
    assert all(len(bytes.fromhex(salt)) == 16 for salt in salts.values())
    qid = history.ids["answered"]
    (answer,) = _rows(db, "SELECT answer FROM questions WHERE question_id = ?", qid)[0]
    (entry,) = _rows(
        db,
        "SELECT entry FROM audit_log WHERE approval_id = ? AND kind = 'question_answered'",
        qid,
    )[0]
    logged = json.loads(entry)["data"]["value_hash"]
    canonical = answer.encode("utf-8")
    assert canonical == b'"globex"'
    salted = hashlib.sha256(bytes.fromhex(salts[qid]) + canonical).hexdigest()
    assert logged == "sha256:" + salted
    assert logged != "sha256:" + hashlib.sha256(canonical).hexdigest()
    export = tmp_path / "audit.jsonl"
    assert run_cli("audit", "export", "-c", str(config), "-o", str(export)).returncode == 0
    text = export.read_text(encoding="utf-8")
    views = json.dumps(history.views)
    for salt in salts.values():
        assert salt not in text and salt not in views
    assert all("answer_salt" not in view for view in history.views)


def test_audit_questions_export_verifies_offline_and_catches_an_edited_entry(
    history: History, tmp_path: Path
) -> None:
    config = history.copy(tmp_path)
    export = tmp_path / "audit.jsonl"
    proc = run_cli("audit", "export", "-c", str(config), "-o", str(export))
    assert proc.returncode == 0, proc.stderr
    lines = export.read_text(encoding="utf-8").splitlines()
    kinds = {json.loads(line)["kind"] for line in lines}
    assert {"question_created", "question_revised", "question_answered"} <= kinds
    assert {"question_resolved", "question_dispatch_ack"} <= kinds

    with_key = run_cli("audit", "verify", "--file", str(export), "--key-env", "HITL_RECEIPT_KEY")
    offline = run_cli(
        "audit",
        "verify",
        "--file",
        str(export),
        "--public-key",
        str(history.public_key),
        env=no_secret_env(),
    )
    assert with_key.returncode == 0 and b"chain and receipts intact" in with_key.stdout
    assert offline.returncode == 0 and b"chain and signatures intact" in offline.stdout

    # a value_hash swapped in the exported question_answered entry
    index, obj = next(
        (i, json.loads(line))
        for i, line in enumerate(lines)
        if json.loads(line)["kind"] == "question_answered"
    )
    entry = json.loads(obj["entry"])
    entry["data"]["value_hash"] = "sha256:" + "0" * 64
    obj["entry"] = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    lines[index] = json.dumps(obj)
    export.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_cli(
        "audit",
        "verify",
        "--file",
        str(export),
        "--public-key",
        str(history.public_key),
        env=no_secret_env(),
    )
    assert proc.returncode == 1
    assert proc.stdout.decode().startswith(f"TAMPERED: entry {obj['seq']}: "), proc.stdout


def test_audit_questions_doctor_passes_a_database_with_questions(
    history: History, relay: CaptureRelay, tmp_path: Path
) -> None:
    config = history.copy(tmp_path)

    proc = run_cli("doctor", "-c", str(config), timeout=60)

    out = proc.stdout.decode()
    assert proc.returncode == 0, out + proc.stderr.decode()
    assert "PASS audit: " in out and "1 approvals match it, 5 questions too" in out, out
    assert "PASS question dispatch: every pending question's dispatch was acked" in out, out
    assert "question relay" not in out  # questions go to relay.url, probed by the relay check


def test_audit_questions_doctor_probes_a_separate_question_relay(
    history: History, relay: CaptureRelay, tmp_path: Path
) -> None:
    config = history.copy(tmp_path)
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["relay"]["question_url"] = f"http://127.0.0.1:{free_port()}/questions"
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    proc = run_cli("doctor", "-c", str(config), timeout=60)

    out = proc.stdout.decode()
    assert proc.returncode == 1, out
    assert "PASS relay: " in out, out
    assert f"FAIL question relay: {data['relay']['question_url']} unreachable: " in out, out


def test_audit_questions_doctor_names_an_undelivered_question(
    history: History, relay: CaptureRelay, tmp_path: Path
) -> None:
    config = history.copy(tmp_path)
    _edit(
        config.parent / "gate.db",
        "UPDATE question_outbox SET delivered_at = NULL, attempts = 3,"
        " last_error = 'relay answered HTTP 401: signature_mismatch' WHERE question_id = ?",
        history.ids["pending"],
    )

    proc = run_cli("doctor", "-c", str(config), timeout=60)

    out = proc.stdout.decode()
    assert proc.returncode == 1, out
    assert (
        "FAIL question dispatch: 1 pending question not delivered to the question relay; "
        "latest error: relay answered HTTP 401: signature_mismatch (the relay holds a "
        "different secret from relay.secret_env"
    ) in out, out
