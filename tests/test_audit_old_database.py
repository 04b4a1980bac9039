"""``audit verify`` (and doctor's audit check) on a database an older gate wrote: every
existing log keeps verifying.

``tests/fixtures/old_gate/gate.db`` was written by a real daemon of commit 1d4bfc3
(``tests/fixtures/old_gate/make_db.py``, which says what its history holds: every approval
and question outcome, an escalation, a policy's decision, an approver key enrolled, used and
revoked). Today's CLI must find its chain, receipts, signatures, anchors and every
approval's and question's rows intact, from the database and from an export of it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import run_cli, write_config
from tests.test_signed_audit import no_secret_env

pytestmark = pytest.mark.e2e

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_gate"
HEAD = (FIXTURE / "head.txt").read_text(encoding="utf-8").strip()
RECEIPT_SEQ = json.loads((FIXTURE / "receipt.json").read_text(encoding="utf-8"))["receipt"]["seq"]


def _config(tmp_path: Path) -> Path:
    """A config naming a copy of the old database (the test receipt key; no signing key:
    its public half is given with --public-key)."""
    shutil.copyfile(FIXTURE / "gate.db", tmp_path / "gate.db")
    return write_config(tmp_path, "http://127.0.0.1:9/hitl")


def _cli(*args: str, secrets: bool = True) -> tuple[int, str, str]:
    proc = run_cli(*args, **({} if secrets else {"env": no_secret_env()}))
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "Traceback" not in err, err
    return proc.returncode, out, err


def test_audit_old_database_verifies_with_every_check_and_anchor(tmp_path: Path) -> None:
    config = _config(tmp_path)
    args = ["--public-key", str(FIXTURE / "audit.pub"), "--expect-head", HEAD]
    args += ["--expect", str(FIXTURE / "receipt.json")]

    code, out, err = _cli("audit", "verify", "-c", str(config), *args)

    assert (code, err) == (0, ""), out + err
    seq = HEAD.split(":")[0]
    assert out.splitlines() == [
        f"ok: {seq} entries, chain, receipts and signatures intact; holds the receipt for "
        f"entry {RECEIPT_SEQ}; holds the logged head at entry {seq}",
        "ok: 1 approver signatures verified",
        "ok: 9 approvals match the audit log",
        "ok: 5 questions match the audit log",
    ]


def test_audit_old_database_export_verifies_offline(tmp_path: Path) -> None:
    config = _config(tmp_path)
    export = tmp_path / "audit.jsonl"
    assert _cli("audit", "export", "-c", str(config), "-o", str(export))[0] == 0
    public = ["--public-key", str(FIXTURE / "audit.pub")]

    code, out, err = _cli(
        "audit", "verify", "--file", str(export), *public, "--expect-head", HEAD, secrets=False
    )
    listed = _cli("audit", "signatures", "--file", str(export), "--json", secrets=False)

    assert code == 0, out + err
    assert out.startswith(f"ok: {HEAD.split(':')[0]} entries, chain and signatures intact")
    assert "ok: 1 approver signatures verified" in out
    assert listed[0] == 0, listed
    (signed,) = [json.loads(line) for line in listed[1].splitlines()]
    assert (signed["decision"], signed["verified"], signed["type"]) == ("approve", True, "ed25519")


def test_audit_old_database_passes_the_doctors_audit_check(tmp_path: Path) -> None:
    config = _config(tmp_path)

    code, out, err = _cli("doctor", "-c", str(config))

    seq = HEAD.split(":")[0]
    line = next((x for x in out.splitlines() if x.startswith("PASS audit: ")), None)
    assert line == (
        f"PASS audit: {seq} entries, chain, receipts intact; 9 approvals match it, 5 questions too"
    ), out + err
