"""The HMAC receipt key (``receipts.key_env``) against an existing audit log.

A gate started with another receipt key than the one its log was written with refuses to
start (exit 2, one line naming ``receipts.key_env``) and writes nothing, unless a rotation
is declared with ``receipts.previous_key_env``: then it writes one ``receipt_key_rotated``
entry (receipted with the new key) and goes on. ``audit verify`` checks each entry with the
key of its span (``-c``: the config's keys; ``--file``: ``--key-env`` repeated), so an old
key cannot vouch for entries after the rotation; a key that does not match a log's first
entry is named as such, not as tampering. ``doctor`` names the settings.

Real daemons (``python -m gate serve``), a real relay on loopback, real signed decisions,
the real SQLite file, the real CLI; no mocks.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.audit import chain as audit
from gate.audit.export import export_line
from tests.support import (
    CaptureRelay,
    CliProcess,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

OLD = "receipt-key-old-5b1e0c9d3a7f2e64"
NEW = "receipt-key-new-a7d42f1c8e0b5d93"
OLD_VAR = "HITL_RECEIPT_KEY_OLD"
ROTATED = "receipt_key_rotated"
REFUSAL = (
    "receipts.key_env: HITL_RECEIPT_KEY does not verify the newest audit entry's "
    "receipt (seq {seq}); a typo? To rotate the key, set receipts.previous_key_env to "
    "the variable holding the old key"
)
NO_MATCH = "the key given does not match this log"
# keys the log was not written with (32 bytes: shorter ones are refused or warned about)
TYPO = "a-typo-key-77-0f3d8c1a6e2b94572c"
OLDER_TYPO = "older-typo-88-6b2e9d0c4a7f1358e3"
NOT_THIS = "not-this-logs-key-4a9c0e7d2b5f8136"


def db_of(config: Path) -> Path:
    return config.parent / yaml.safe_load(config.read_text(encoding="utf-8"))["storage"]["path"]


def audit_rows(db: Path) -> list[tuple[Any, ...]]:
    """Every audit_log row as stored (read-only connection)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT * FROM audit_log ORDER BY seq").fetchall()
    finally:
        conn.close()


def mac(key: str, entry_hash: str) -> str:
    return hmac.new(key.encode(), entry_hash.encode("ascii"), hashlib.sha256).hexdigest()


def resolve_one(gate: GateProcess, relay: CaptureRelay, body: str = "Hallo\n") -> None:
    """Create an approval and approve it with a real signed decision."""
    api = gate.api()
    approval = api.create("q1", body)
    dispatch = relay.wait_dispatch(approval["approval_id"])
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
    assert status == 200, answer
    assert api.wait_resolved(approval["approval_id"])["outcome"] == "approved"


def set_receipts(config: Path, **receipts: Any) -> Path:
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["receipts"].update(receipts)
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return config


def not_log_lines(stderr: bytes) -> list[str]:
    """stderr lines that are not the daemon's log lines (``<UTC time> <LEVEL> ...``)."""
    return [
        line
        for line in stderr.decode().splitlines()
        if not (line[:4].isdigit() and line[10:11] == "T" and " event=" in line)
    ]


def serve_refused(config: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """Run ``serve`` until it exits or starts listening; a start is a failure (the daemon is
    stopped). Returns (exit code, stderr lines that are not log lines)."""
    proc = CliProcess("serve", "-c", str(config), env=env)
    wait_until(
        lambda: proc.proc.poll() is not None or "event=listening " in proc.log(),
        what="serve to exit or to listen",
    )
    if proc.proc.poll() is None:
        proc.stop()
        raise AssertionError("the gate started:\n" + proc.log())
    code, _, err = proc.finish()
    assert "Traceback" not in err, err
    for name in ("HITL_RECEIPT_KEY", OLD_VAR):  # never a key in the output
        assert name not in env or env[name] not in err, err
    return code, not_log_lines(err.encode())


def rotated_log(tmp_path: Path, relay: CaptureRelay) -> tuple[Path, dict[str, str], int]:
    """A log written with OLD (one approval), then a start with NEW and previous_key_env =
    OLD's variable, and one more approval. Returns (config, env, seq of the rotation)."""
    config = write_config(tmp_path, relay.url)
    gate = GateProcess(config, gate_env(HITL_RECEIPT_KEY=OLD)).start()
    resolve_one(gate, relay)
    assert gate.stop() == 0
    before = audit_rows(db_of(config))
    set_receipts(config, previous_key_env=OLD_VAR)
    env = gate_env(HITL_RECEIPT_KEY=NEW, **{OLD_VAR: OLD})
    gate = GateProcess(config, env).start()
    rotation = len(before) + 1
    line = gate.wait_for_line(r"event=receipt_key_rotated .*").group(0)
    assert f"seq={rotation}" in line, line
    resolve_one(gate, relay, "zweite\n")
    assert gate.stop() == 0
    assert OLD not in gate.log() and NEW not in gate.log()
    return config, env, rotation


# --------------------------------------------------------------------------- serve


def test_serve_refuses_another_receipt_key_and_writes_nothing(tmp_path, relay):
    config = write_config(tmp_path, relay.url)
    gate = GateProcess(config).start()
    resolve_one(gate, relay)
    assert gate.stop() == 0
    db = db_of(config)
    before = audit_rows(db)
    assert len(before) == 4

    code, lines = serve_refused(config, gate_env(HITL_RECEIPT_KEY=TYPO))
    assert (code, lines) == (2, [f"{config}: " + REFUSAL.format(seq=4)])
    assert audit_rows(db) == before

    # a previous key declared that does not match either: refused the same way, nothing written
    set_receipts(config, previous_key_env=OLD_VAR)
    code, lines = serve_refused(config, gate_env(HITL_RECEIPT_KEY=TYPO, **{OLD_VAR: OLDER_TYPO}))
    assert (code, lines) == (
        2,
        [
            f"{config}: receipts.key_env: neither HITL_RECEIPT_KEY nor receipts.previous_key_env "
            f"({OLD_VAR}) verifies the newest audit entry's receipt (seq 4); a typo? "
            "receipts.previous_key_env must hold the key the log was written with"
        ],
    )
    assert audit_rows(db) == before

    # the right key, with a previous key declared: starts, writes nothing (no rotation)
    gate = GateProcess(config, gate_env(**{OLD_VAR: OLDER_TYPO})).start()
    assert gate.stop() == 0
    assert "receipt_key_rotated" not in gate.log()
    assert audit_rows(db) == before


def test_declared_rotation_writes_one_entry_and_verifies_each_span(tmp_path, relay):
    config, env, rotation = rotated_log(tmp_path, relay)
    db = db_of(config)
    rows = audit_rows(db)
    assert len(rows) == rotation + 4
    kinds = [row[2] for row in rows]
    assert kinds.count(ROTATED) == 1 and kinds[rotation - 1] == ROTATED
    seq, approval_id, _, entry, _, entry_hash, receipt = rows[rotation - 1][:7]
    assert approval_id is None
    assert json.loads(entry)["data"] == {
        "previous_key_last_seq": rotation - 1,
        "key_env": "HITL_RECEIPT_KEY",
        "previous_key_env": OLD_VAR,
    }
    # each entry is receipted with the key of its span, the rotation with the new one
    assert [row[6] for row in rows] == [
        mac(OLD if row[0] < rotation else NEW, row[5]) for row in rows
    ]
    assert OLD not in entry and NEW not in entry

    # a restart with the same declaration writes nothing more
    gate = GateProcess(config, env).start()
    assert gate.stop() == 0
    assert "receipt_key_rotated" not in gate.log()
    assert audit_rows(db) == rows

    proc = run_cli("audit", "verify", "-c", str(config), env=env)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert proc.stdout.decode().splitlines()[0] == (
        f"ok: {len(rows)} entries, chain and receipts intact (receipt keys: {OLD_VAR} for "
        f"entries 1-{rotation - 1}, HITL_RECEIPT_KEY from entry {rotation})"
    )

    export = tmp_path / "audit.jsonl"
    assert run_cli("audit", "export", "-c", str(config), "-o", str(export), env=env).returncode == 0
    for order in ((OLD_VAR, "HITL_RECEIPT_KEY"), ("HITL_RECEIPT_KEY", OLD_VAR)):
        proc = run_cli(
            "audit",
            "verify",
            "--file",
            str(export),
            "--key-env",
            order[0],
            "--key-env",
            order[1],
            env=env,
        )
        assert proc.returncode == 0, (order, proc.stdout, proc.stderr)
        assert proc.stdout.decode().startswith(f"ok: {len(rows)} entries, chain and receipts")

    # one key alone: named as the key that does not match, not as tampering
    proc = run_cli(
        "audit", "verify", "--file", str(export), "--key-env", "HITL_RECEIPT_KEY", env=env
    )
    assert (proc.returncode, proc.stdout) == (1, b""), proc.stderr
    assert NO_MATCH in proc.stderr.decode() and "entry 1" in proc.stderr.decode()
    proc = run_cli("audit", "verify", "--file", str(export), "--key-env", OLD_VAR, env=env)
    assert (proc.returncode, proc.stdout) == (1, b""), proc.stderr
    assert NO_MATCH in proc.stderr.decode()
    assert f"entry {rotation}" in proc.stderr.decode(), proc.stderr

    proc = run_cli("doctor", "-c", str(config), env=env, timeout=60)
    audit_line = next(
        line for line in proc.stdout.decode().splitlines() if line.split(" ", 2)[1] == "audit:"
    )
    assert audit_line.startswith("PASS audit: "), audit_line


def forged_after(rows: list[tuple[Any, ...]], kind: str, key: str) -> tuple[Any, ...]:
    """An entry chained after ``rows`` and receipted with ``key`` (what someone holding that
    key and write access to the file or an export can make)."""
    seq, prev = rows[-1][0] + 1, rows[-1][5]
    data = (
        {"previous_key_last_seq": seq - 1}
        if kind == ROTATED
        else {"operator_id": 101, "decision": "approve"}
    )
    entry = audit.make_entry(seq, kind, None, 1767225600000, data)
    entry_json, digest, _ = audit.seal(prev, entry, key.encode())
    return (seq, None, kind, entry_json, prev, digest, mac(key, digest), None, None)


def test_old_key_cannot_vouch_for_entries_after_the_rotation(tmp_path, relay):
    config, env, rotation = rotated_log(tmp_path, relay)
    rows = audit_rows(db_of(config))
    last = rows[-1][0]
    for kind, reason in (
        ("decision", "receipt does not match"),
        (ROTATED, "receipt key an earlier span of this log used"),
    ):
        forged = forged_after(rows, kind, OLD)
        # in an export, verified with both keys
        export = tmp_path / f"forged-{kind}.jsonl"
        export.write_text(
            "".join(export_line(audit.AuditRow(*row)) + "\n" for row in [*rows, forged]),
            encoding="utf-8",
        )
        proc = run_cli(
            "audit",
            "verify",
            "--file",
            str(export),
            "--key-env",
            OLD_VAR,
            "--key-env",
            "HITL_RECEIPT_KEY",
            env=env,
        )
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        out = proc.stdout.decode()
        assert out.startswith(f"TAMPERED: entry {last + 1}: ") and reason in out, out
        # in a copy of the database, verified with the config's two keys
        copy_dir = tmp_path / f"copy-{kind}"
        copy_dir.mkdir()
        shutil.copy(db_of(config), copy_dir / "gate.db")
        conn = sqlite3.connect(copy_dir / "gate.db", isolation_level=None)
        conn.execute("INSERT INTO audit_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", forged)
        conn.close()
        copy = shutil.copy(config, copy_dir / "config.yaml")
        proc = run_cli("audit", "verify", "-c", str(copy), env=env)
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        out = proc.stdout.decode()
        assert out.startswith(f"TAMPERED: entry {last + 1}: ") and reason in out, out
        # and the gate does not take the forged entry for a rotation still to be written
        code, lines = serve_refused(copy, env)
        assert code == 1 and len(lines) == 1 and "receipts.previous_key_env" in lines[0], lines
        assert f"entry {rotation}" in lines[0] and "audit verify" in lines[0], lines


def test_wrong_key_on_a_fresh_log_says_the_key_given_does_not_match(gate, relay, tmp_path):
    resolve_one(gate, relay)
    assert gate.stop() == 0
    wrong = gate_env(HITL_RECEIPT_KEY=NOT_THIS, OTHER_KEY=NOT_THIS)
    proc = run_cli("audit", "verify", "-c", str(gate.config), env=wrong)
    assert (proc.returncode, proc.stdout) == (1, b""), proc.stdout
    err = proc.stderr.decode()
    assert err.startswith("Error: receipts.key_env (HITL_RECEIPT_KEY): " + NO_MATCH), err
    assert "entry 1" in err and "TAMPERED" not in err and len(err.splitlines()) == 1

    export = tmp_path / "audit.jsonl"
    assert run_cli("audit", "export", "-c", str(gate.config), "-o", str(export)).returncode == 0
    proc = run_cli("audit", "verify", "--file", str(export), "--key-env", "OTHER_KEY", env=wrong)
    assert (proc.returncode, proc.stdout) == (1, b""), proc.stdout
    err = proc.stderr.decode()
    assert err.startswith("Error: --key-env (OTHER_KEY): " + NO_MATCH), err
    # the right key still verifies it
    proc = run_cli("audit", "verify", "--file", str(export), "--key-env", "HITL_RECEIPT_KEY")
    assert proc.returncode == 0, proc.stderr


RETIRED_AT = (
    "the log went over to a new receipt key at entry {seq} (receipt_key_rotated) and "
    "receipts.key_env (HITL_RECEIPT_KEY) holds the retired one: a gate running with this "
    "config answers 503 receipt_key_retired, and one starting refuses to; set "
    "receipts.key_env to the variable holding the new key"
)


def test_doctor_names_the_receipt_key_settings(tmp_path, relay):
    config = write_config(tmp_path, relay.url)
    gate = GateProcess(config).start()
    resolve_one(gate, relay)
    assert gate.stop() == 0

    def audit_line(env: dict[str, str]) -> tuple[int, str]:
        proc = run_cli("doctor", "-c", str(config), env=env, timeout=60)
        line = next(
            line for line in proc.stdout.decode().splitlines() if line.split(" ", 2)[1] == "audit:"
        )
        return proc.returncode, line

    code, line = audit_line(gate_env(HITL_RECEIPT_KEY=TYPO))
    assert code == 1 and line.startswith("FAIL audit: "), line
    assert "receipts.key_env" in line and "receipts.previous_key_env" in line, line
    assert "TAMPERED" not in line and TYPO not in line, line

    # the right key, but entry 1's receipt changed: the newest entry shows the key is right
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    shutil.copy(db_of(config), copy_dir / "gate.db")
    conn = sqlite3.connect(copy_dir / "gate.db", isolation_level=None)
    conn.execute("UPDATE audit_log SET receipt = ? WHERE seq = 1", ("0" * 64,))
    conn.close()
    proc = run_cli("doctor", "-c", str(shutil.copy(config, copy_dir / "config.yaml")), timeout=60)
    changed = next(
        line for line in proc.stdout.decode().splitlines() if line.split(" ", 2)[1] == "audit:"
    )
    assert changed.startswith("FAIL audit: ") and "was changed" in changed, changed

    # a rotation declared but not written yet (the gate writes it at its next start)
    set_receipts(config, previous_key_env=OLD_VAR)
    pending = gate_env(HITL_RECEIPT_KEY=NEW, **{OLD_VAR: gate_env()["HITL_RECEIPT_KEY"]})
    code, line = audit_line(pending)
    assert line.startswith("WARN audit: ") and "next start" in line, line
    gate = GateProcess(config, pending).start()
    assert gate.stop() == 0
    code, line = audit_line(pending)
    assert line.startswith("PASS audit: "), line
    # previous_key_env dropped after the rotation: the newer span is checked, the older named
    set_receipts(config, previous_key_env=None)
    code, line = audit_line(gate_env(HITL_RECEIPT_KEY=NEW))
    assert line.startswith("PASS audit: ") and "from entry 5" in line, line
    # a config still holding the retired key (a gate not restarted with the new one)
    code, line = audit_line(gate_env())
    assert (code, line) == (1, "FAIL audit: " + RETIRED_AT.format(seq=5)), line


def test_check_config_checks_previous_key_env(tmp_path, relay):
    config = set_receipts(write_config(tmp_path, relay.url), previous_key_env=OLD_VAR)
    proc = run_cli("check-config", "-c", str(config))
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [
        f"{config}: receipts.previous_key_env: environment variable {OLD_VAR} is not set"
    ]
    same = gate_env(**{OLD_VAR: gate_env()["HITL_RECEIPT_KEY"]})
    proc = run_cli("check-config", "-c", str(config), env=same)
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [
        f"{config}: receipts.previous_key_env: {OLD_VAR} has the same value as "
        "HITL_RECEIPT_KEY (receipts.key_env); each secret must be distinct"
    ]
    set_receipts(config, previous_key_env="HITL_RECEIPT_KEY")
    proc = run_cli("check-config", "-c", str(config))
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [
        f"{config}: receipts.previous_key_env: must differ from receipts.key_env "
        "(HITL_RECEIPT_KEY is used for both)"
    ]
    set_receipts(config, previous_key_env=OLD_VAR)
    proc = run_cli("check-config", "-c", str(config), env=gate_env(**{OLD_VAR: OLD}))
    assert proc.returncode == 0, proc.stderr
