"""``hitl-gate doctor``: one line per check, exit 0/1, against a real daemon and real relays.

The gate runs as ``python -m gate serve`` with a capturing relay (an aiohttp server that
answers HEAD with 405: reachable); doctor runs as ``python -m gate doctor``. The clock
judge is also tested directly with fixed times.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import socketserver
import sqlite3
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path

import pytest
import yaml

from gate.protocol.canonical import canonical_json
from gate.tools.doctor_relay import CLOCK_WARN_S, RELEASE_DATE, RelayProbe, check_clock
from gate.trust.keys import generate
from tests.badrelays import BadRelay, Misbehaviour
from tests.support import (
    ROOT,
    CaptureRelay,
    CliProcess,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    refused_dispatch,
    run_cli,
    wait_until,
    write_config,
)

NAMES = [
    "config",
    "followups",
    "secrets",
    "keys",
    "database",
    "audit",
    "relay",
    "dispatch",
    "passkeys",
    "clock",
]


def doctor(config: Path, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    proc = run_cli("doctor", "-c", str(config), env=env or gate_env(), timeout=60)
    assert proc.stderr == b"", proc.stderr.decode()
    return proc.returncode, proc.stdout.decode("utf-8").splitlines()


def line_of(lines: list[str], name: str) -> str:
    found = [line for line in lines if line.split(" ", 1)[1].startswith(name + ":")]
    assert len(found) == 1, lines
    return found[0]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resolve_one(gate: GateProcess, relay: CaptureRelay) -> None:
    """Create an approval and approve it, so the audit log holds created/ack/decision/resolution."""
    api = gate.api()
    approval = api.create("q1")
    dispatch = relay.wait_dispatch(approval["approval_id"])
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
    assert status == 200, answer
    assert api.wait_resolved(approval["approval_id"])["outcome"] == "approved"


# --------------------------------------------------------------------------- whole runs


@pytest.mark.e2e
def test_doctor_all_pass_against_running_gate_and_relay(gate, relay, tmp_path):
    resolve_one(gate, relay)

    code, lines = doctor(tmp_path / "config.yaml")

    assert code == 0, lines
    assert [line.split(" ", 2)[1].rstrip(":") for line in lines] == NAMES
    assert all(line.startswith("PASS ") for line in lines), lines
    assert "integrity ok" in line_of(lines, "database")
    assert "chain, receipts intact" in line_of(lines, "audit")
    assert "answered HTTP 405 to HEAD" in line_of(lines, "relay")  # POST-only relay: reachable
    assert "the relay's Date header" in line_of(lines, "clock")
    assert line_of(lines, "followups") == (
        "PASS followups: 0 steps remind, 0 steps escalate, 0 delegations in force, no notices"
    )


@pytest.mark.e2e
def test_doctor_names_followups_and_warns_of_a_given_up_notice(tmp_path, relay):
    """The followups line says what the config plans (the notice URL redacted);
    a notice given up (here: notices turned off by a reload before it was acked) is a
    dispatch WARN naming how many, and doctor still exits 0."""
    steps = [
        {"name": "q1", "quorum": 1, "approvers": [101, 102], "timeout": "1h"},
        {
            "name": "fu",
            "quorum": 1,
            "approvers": [101],
            "timeout": "1h",
            "remind_after": "30m",
            "escalate": [{"after": "40m", "to": [102]}, {"after": "50m", "to": [103]}],
        },
        {"name": "r2", "quorum": 1, "approvers": [101], "timeout": "1h", "remind_every": "20m"},
    ]
    config = write_config(
        tmp_path,
        relay.url,
        steps=steps,
        relay={"notices": True, "notice_url": "http://user:pw@127.0.0.1:9/notices?token=s3"},
    )
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["delegations"] = [{"from": 101, "to": 104, "until": "2099-01-01T00:00:00Z"}]
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    gate = GateProcess(config).start()
    try:
        api = gate.api()
        approval_id = api.create("q1")["approval_id"]
        dispatch = relay.wait_dispatch(approval_id)
        status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
        assert status == 200, answer
        db = tmp_path / "gate.db"

        def notice_row() -> sqlite3.Row | None:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            conn.row_factory = sqlite3.Row
            try:
                return conn.execute(
                    "SELECT * FROM followup_outbox WHERE approval_id = ? AND kind = 'notice'",
                    (approval_id,),
                ).fetchone()
            finally:
                conn.close()

        # nothing listens on port 9: the attempt fails; then notices are turned off
        wait_until(lambda: (r := notice_row()) is not None and r["attempts"] >= 1)
        data["relay"]["notices"] = False
        del data["relay"]["notice_url"]
        config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        assert gate.proc is not None
        gate.proc.send_signal(signal.SIGHUP)
        gate.wait_for_line(r"event=reloaded ")
        row = wait_until(
            lambda: (r := notice_row()) is not None and r["failed_at"] is not None and r,
            timeout=30,
            what="the notice given up",
        )
        assert row["last_error"] == "notices are turned off"
        followups_line = (
            "PASS followups: 2 steps remind, 1 step escalates (2 levels), "
            "1 delegation in force, no notices"
        )
        code, lines = doctor(config)
        assert code == 0, lines
        assert line_of(lines, "followups") == followups_line
        assert line_of(lines, "dispatch") == (
            "WARN dispatch: every pending approval's dispatch was acked; but 1 follow-up send "
            "given up in the last 24 h (1 notice); latest error: notices are turned off"
        )
        # with notices on, the line names where they go, without credentials or query
        data["relay"]["notices"] = True
        data["relay"]["notice_url"] = "http://user:pw@127.0.0.1:9/notices?token=s3"
        config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        code, lines = doctor(config)
        assert line_of(lines, "followups") == followups_line.replace(
            "no notices", "notices to http://127.0.0.1:9/notices?<redacted>"
        )
        assert "s3" not in "\n".join(lines) and "pw" not in "\n".join(lines)
    finally:
        gate.stop()


@pytest.mark.e2e
def test_database_is_created_owner_only_and_doctor_warns_when_others_can_read_it(
    gate, relay, tmp_path
):
    """Security review: outside systemd (umask 022) the database, which holds drafts, final
    bodies, permits and the nonces of pending approvals, was created 0644, and doctor said
    nothing. It is created 0600 whatever the umask (SQLite gives -wal/-shm the same mode);
    doctor warns about a database file others may read."""
    resolve_one(gate, relay)
    db = tmp_path / "gate.db"
    for path in (db, tmp_path / "gate.db-wal", tmp_path / "gate.db-shm"):
        assert path.stat().st_mode & 0o777 == 0o600, (path, oct(path.stat().st_mode))
    db.chmod(0o644)
    code, lines = doctor(tmp_path / "config.yaml")
    assert code == 0, lines
    assert line_of(lines, "database") == (
        f"WARN database: {db} is readable by others (mode 0644; it holds drafts, final "
        f"bodies and permits): chmod 600 {db}"
    )


@pytest.mark.e2e
def test_doctor_fails_dispatch_when_the_relay_refuses_the_gates_signature(tmp_path):
    """New-user review: with the relay started on another secret every dispatch was answered
    401 and nothing was ever decided, yet doctor said PASS seven times. It now reads the
    un-acked dispatches of pending approvals and names the likely cause."""
    from tests.test_outages import ScriptedRelay

    relay = ScriptedRelay().start()
    relay.status = 401
    try:
        config = write_config(tmp_path, relay.url)
        refused_dispatch(config)
        code, lines = doctor(config)
    finally:
        relay.stop()
    assert code == 1, lines
    assert line_of(lines, "dispatch") == (
        "FAIL dispatch: 1 pending approval not delivered to the relay; latest error: relay "
        "answered HTTP 401 (the relay refused the gate's signature: do the relay and "
        "relay.secret_env hold the same secret?)"
    )


RELAY_REFUSALS = {
    # a relay whose clock is 10 minutes ahead judges every fresh dispatch out of its window
    "clock-10-min-off": (
        Misbehaviour(clock_offset_s=600),
        "timestamp_out_of_window",
        "the relay's clock and this host's differ by more than the relay accepts, 300 s in "
        "hitl/v0: set both clocks by NTP; the secret is not the cause",
    ),
    "another-secret": (
        Misbehaviour(secret="the-relay-holds-another-secret"),
        "signature_mismatch",
        "the relay holds a different secret from relay.secret_env: give both the same secret",
    ),
}


@pytest.mark.e2e
@pytest.mark.parametrize("case", list(RELAY_REFUSALS))
def test_relay_refusal_reason_reaches_last_error_log_hops_and_doctor(tmp_path, case):
    """A relay refusing every dispatch with 401 and a JSON ``reason`` was
    reported as a bare ``relay answered HTTP 401`` in ``dispatch.last_error``, the log and
    ``request --wait``, and doctor blamed the secret even when the clocks differed. The
    relay's reason now travels to all four, and doctor's hint follows it."""
    misbehaviour, reason, hint = RELAY_REFUSALS[case]
    relay = BadRelay(misbehaviour).start()
    try:
        config = write_config(tmp_path, relay.url)
        gate = GateProcess(config).start()
        try:
            error = f"relay answered HTTP 401: {reason}"
            cli = CliProcess(
                "request",
                "-c",
                str(config),
                "--api-url",
                gate.api_url,
                "--pipeline",
                "p",
                "--step",
                "q1",
                "--draft",
                "refused",
                "--wait",
            )
            try:
                cli.wait_for_line(re.escape(f"dispatch not acked yet: {error} (retrying)"))
            finally:
                cli.stop()
            api = gate.api()
            (pending,) = api.call("GET", "/v1/approvals?state=pending")[1]["items"]
            assert pending["dispatch"]["last_error"] == error
            gate.wait_for_line(re.escape(f"error='{error}'"))
            assert relay.dispatches and all(d["refused"] == reason for d in relay.dispatches)
        finally:
            gate.stop()
        code, lines = doctor(config)
    finally:
        relay.stop()
    assert code == 1, lines
    assert line_of(lines, "dispatch") == (
        f"FAIL dispatch: 1 pending approval not delivered to the relay; latest error: "
        f"{error} ({hint})"
    )


@pytest.mark.e2e
def test_doctor_checks_signatures_with_a_signing_key(tmp_path, relay):
    _, _, kid = generate(tmp_path / "keys")
    config = write_config(tmp_path, relay.url)
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["receipts"]["signing_key_file"] = "keys/hitl-gate-ed25519.key"
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    gate = GateProcess(config).start()
    try:
        resolve_one(gate, relay)

        code, lines = doctor(config)
    finally:
        gate.stop()

    assert code == 0, lines
    assert line_of(lines, "keys") == f"PASS keys: signing key {kid}"
    assert "chain, receipts, signatures intact" in line_of(lines, "audit")


@pytest.mark.e2e
def test_doctor_relay_down_fails_relay_and_writes_nothing(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/hook?sig=query-secret-5e1f"
    config = write_config(tmp_path, url, relay={"dispatch_timeout": "2s"})

    code, lines = doctor(config)

    assert code == 1, lines
    relay_line = line_of(lines, "relay")
    assert relay_line.startswith("FAIL relay: http://127.0.0.1:"), relay_line
    assert "/hook?<redacted> unreachable: " in relay_line
    assert "query-secret-5e1f" not in "\n".join(lines)
    assert line_of(lines, "database").startswith("WARN database: ")  # not created yet
    assert line_of(lines, "audit").startswith("SKIP audit: no database yet")
    assert line_of(lines, "clock").startswith("PASS clock: ")
    assert not (tmp_path / "gate.db").exists()  # doctor never creates the database


@pytest.mark.e2e
def test_doctor_tampered_audit_fails_audit(gate, relay, tmp_path):
    resolve_one(gate, relay)
    assert gate.stop() == 0
    db = tmp_path / "gate.db"
    with sqlite3.connect(db, isolation_level=None) as conn:
        entry = json.loads(conn.execute("SELECT entry FROM audit_log WHERE seq = 2").fetchone()[0])
        entry["at"] = "2000-01-01T00:00:00Z"
        conn.execute(
            "UPDATE audit_log SET entry = ? WHERE seq = 2", (canonical_json(entry).decode("utf-8"),)
        )
    conn.close()

    code, lines = doctor(tmp_path / "config.yaml")

    assert code == 1, lines
    assert line_of(lines, "audit") == (
        "FAIL audit: TAMPERED: entry 2: entry hash does not match its content (changed) "
        "(1 entries before it verified)"
    )
    assert line_of(lines, "database").startswith("PASS database: ")
    assert line_of(lines, "relay").startswith("PASS relay: ")


@pytest.mark.e2e
def test_doctor_missing_secret_fails_secrets(gate, relay, tmp_path):
    resolve_one(gate, relay)
    env = gate_env()
    del env["HITL_RECEIPT_KEY"]

    code, lines = doctor(tmp_path / "config.yaml", env)

    assert code == 1, lines
    assert line_of(lines, "secrets") == (
        "FAIL secrets: receipts.key_env: environment variable HITL_RECEIPT_KEY is not set"
    )
    audit_line = line_of(lines, "audit")
    assert audit_line.startswith("PASS audit: ") and "receipts not checked" in audit_line


@pytest.mark.e2e
def test_doctor_checks_receipts_with_the_receipt_key_alone(gate, relay, tmp_path):
    """Regression (operator review): with only HITL_RECEIPT_KEY set, the audit line said
    "receipts not checked: no receipt key" because the other secrets were missing."""
    resolve_one(gate, relay)
    env = {
        k: v
        for k, v in gate_env().items()
        if k not in ("HITL_RELAY_SECRET", "HITL_RELAY_SECRET_OLD", "HITL_API_TOKEN")
    }
    code, lines = doctor(tmp_path / "config.yaml", env)
    assert code == 1, lines  # the secrets check still fails
    assert line_of(lines, "secrets").startswith("FAIL secrets: relay.secret_env: ")
    audit_line = line_of(lines, "audit")
    assert audit_line.startswith("PASS audit: ") and "receipts" in audit_line, audit_line
    assert "receipts not checked" not in audit_line, audit_line
    # and a wrong receipt key is caught, not ignored, and named as the key setting (b02-04)
    env["HITL_RECEIPT_KEY"] = "a-different-receipt-key-0e5c9a2d7f1b4836"
    code, lines = doctor(tmp_path / "config.yaml", env)
    assert line_of(lines, "audit").startswith(
        "FAIL audit: the newest audit entry's receipt (seq 4) does not verify with "
        "receipts.key_env (HITL_RECEIPT_KEY), so the gate refuses to start"
    ), lines


@pytest.mark.e2e
def test_doctor_invalid_config_fails_and_skips_the_rest(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("relay: {}\n", encoding="utf-8")

    code, lines = doctor(config)

    assert code == 1, lines
    assert lines[0].startswith("FAIL config: ") and "hitl-gate check-config -c" in lines[0]
    assert lines[1:] == [f"SKIP {name}: needs a valid config" for name in NAMES[1:]]


@pytest.mark.e2e
def test_doctor_database_failing_integrity_check(tmp_path):
    db = tmp_path / "gate.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE t (x, y)")
    conn.execute("CREATE INDEX i ON t (x)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(n, -n) for n in range(10)])
    conn.execute("PRAGMA writable_schema = ON")  # the index no longer matches its definition
    conn.execute("UPDATE sqlite_schema SET sql = 'CREATE INDEX i ON t (y)' WHERE name = 'i'")
    conn.close()
    config = write_config(tmp_path, f"http://127.0.0.1:{closed_port()}/")

    code, lines = doctor(config)

    assert code == 1, lines
    database = line_of(lines, "database")
    assert database.startswith(f"FAIL database: {db}: integrity_check: row "), database
    assert "missing from index i" in database
    assert line_of(lines, "audit").startswith("FAIL audit: ")  # no audit_log table


@pytest.mark.e2e
def test_doctor_not_a_database(tmp_path):
    (tmp_path / "gate.db").write_bytes(b"not sqlite at all\n" * 100)
    config = write_config(tmp_path, f"http://127.0.0.1:{closed_port()}/")

    code, lines = doctor(config)

    assert code == 1
    assert line_of(lines, "database").startswith("FAIL database: ")
    assert "not a database" in line_of(lines, "database")


# --------------------------------------------------------------------------- relay answers


class _OptionsOnly(socketserver.BaseRequestHandler):
    """Hangs up on HEAD; answers OPTIONS 204 with a Date header ``skew_s`` behind."""

    skew_s = 0.0

    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            data += chunk
        if data.startswith(b"OPTIONS "):
            date = formatdate(time.time() - self.skew_s, usegmt=True)
            self.request.sendall(
                f"HTTP/1.1 204 No Content\r\nDate: {date}\r\nConnection: close\r\n\r\n".encode(
                    "ascii"
                )
            )


@pytest.fixture
def options_only() -> Iterator[tuple[str, type[_OptionsOnly]]]:
    handler = type("Handler", (_OptionsOnly,), {"skew_s": 0.0})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", handler
    server.shutdown()
    server.server_close()


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("skew_s", "clock"),
    [(0, "PASS"), (120, "WARN"), (400, "FAIL")],
    ids=["in-sync", "2-minutes-off", "beyond-max-skew"],
)
def test_doctor_relay_answering_only_options_and_its_clock(tmp_path, options_only, skew_s, clock):
    url, handler = options_only
    handler.skew_s = skew_s
    config = write_config(tmp_path, url)

    code, lines = doctor(config)

    assert "answered HTTP 204 to OPTIONS" in line_of(lines, "relay"), lines
    assert line_of(lines, "relay").startswith("PASS relay: ")
    assert line_of(lines, "clock").startswith(f"{clock} clock: "), lines
    assert code == (1 if clock == "FAIL" else 0), lines


# --------------------------------------------------------------------------- clock judge

NOW = 1_800_000_000.0  # 2027-01-15


def probe(date_s: float | None) -> RelayProbe:
    return RelayProbe("HEAD", 405, date_s, NOW, 0.01)


@pytest.mark.parametrize(
    ("date_s", "label"),
    [
        (None, "PASS"),
        (NOW - 1, "PASS"),
        (NOW + CLOCK_WARN_S, "PASS"),
        (NOW - CLOCK_WARN_S - 2, "WARN"),
        (NOW + 299, "WARN"),
        (NOW - 301, "FAIL"),
        (NOW + 3600, "FAIL"),
    ],
    ids=[
        "no-date",
        "1s",
        "at-warn-limit",
        "past-warn-limit",
        "inside-max-skew",
        "past-max-skew",
        "an-hour",
    ],
)
def test_doctor_clock_against_relay_date(date_s, label):
    assert check_clock(NOW, probe(date_s), 300.0).label == label


def test_doctor_clock_before_release_date_fails():
    result = check_clock(0.4, None, 300.0)

    assert not result.ok
    assert result.detail == (  # fixed width, as every time a person reads
        f"system clock says 1970-01-01T00:00:00.400Z, before this release "
        f"({RELEASE_DATE}); set the clock (NTP)"
    )


def test_doctor_release_date_is_the_newest_changelog_date():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    dates = re.findall(r"^## .*?(\d{4}-\d{2}-\d{2})", text, re.MULTILINE)

    assert dates and RELEASE_DATE == max(dates), (
        "bump gate.tools.doctor_relay.RELEASE_DATE with a release"
    )


@pytest.mark.e2e
def test_doctor_leaves_nothing_beside_a_backup_copy(gate, relay, tmp_path):
    """Regression (operator review): doctor on a WAL-mode backup (sqlite3 ``.backup``) left
    ``-wal``/``-shm`` files beside it, though it promises to write nothing."""
    resolve_one(gate, relay)
    backup_dir = tmp_path / "backup"
    backup_dir.mkdir()
    src = sqlite3.connect(tmp_path / "gate.db")
    dst = sqlite3.connect(backup_dir / "gate.db")
    src.backup(dst)
    dst.execute("PRAGMA journal_mode = WAL")
    dst.close()
    src.close()
    (backup_dir / "gate.db").chmod(0o600)  # a backup holds what the database holds
    assert sorted(p.name for p in backup_dir.iterdir()) == ["gate.db"]
    data = yaml.safe_load((tmp_path / "config.yaml").read_text(encoding="utf-8"))
    data["storage"]["path"] = str(backup_dir / "gate.db")
    config = tmp_path / "backup.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, lines = doctor(config)
    assert str(backup_dir / "gate.db") in line_of(lines, "database"), lines
    assert line_of(lines, "database").startswith("PASS database: "), lines
    assert line_of(lines, "audit").startswith("PASS audit: "), lines
    assert sorted(p.name for p in backup_dir.iterdir()) == ["gate.db"]


@pytest.mark.e2e
def test_doctor_warns_about_a_credentials_directory_others_can_read(gate, relay, tmp_path):
    """Regression (operator review): secrets in a 0755 directory of 0644 files (a hand-made
    $CREDENTIALS_DIRECTORY) passed without a word; docs/operating.md asks for 0700/0600."""
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    env = gate_env()
    for name in ("HITL_RELAY_SECRET", "HITL_API_TOKEN", "HITL_RECEIPT_KEY"):
        (creds / name).write_text(env.pop(name) + "\n", encoding="utf-8")
        (creds / name).chmod(0o600)
    env["CREDENTIALS_DIRECTORY"] = str(creds)
    code, lines = doctor(tmp_path / "config.yaml", env)
    assert line_of(lines, "secrets").startswith("PASS secrets: "), lines
    (creds / "HITL_API_TOKEN").chmod(0o644)
    creds.chmod(0o755)
    code, lines = doctor(tmp_path / "config.yaml", env)
    assert code == 0, lines  # a warning, not a failure
    line = line_of(lines, "secrets")
    assert line.startswith("WARN secrets: ") and "chmod go-rwx" in line, line
    assert f"{creds} is mode 0755" in line and "HITL_API_TOKEN is mode 0644" in line, line
    assert "HITL_RECEIPT_KEY is mode" not in line, line
