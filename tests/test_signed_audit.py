"""Signed audit entries (SPEC §7): known answers, keygen, and tamper tests on real exports.

The known answers in conformance/vectors/audit_entry.json are recomputed here with hashlib,
hmac and cryptography directly (not through gate.audit.chain), then through the gate's code, and
the one-entry OpenSSL and Node.js recipes of docs/auditing.md are run against them. The
tamper tests use the export of a real ``hitl-gate serve`` with a signing key, verified by
``hitl-gate audit verify --file ... --public-key ...`` in an environment without any secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from gate.audit import chain as audit
from gate.audit.chain import GENESIS_HASH, AuditRow
from gate.audit.export import export_line, parse_export_line
from gate.audit.receipts import check_receipt, receipt_object
from gate.protocol.canonical import canonical_json
from gate.store import Store
from gate.store.schema import MIGRATIONS
from gate.trust import keys
from tests.support import (
    RECEIPT_KEY,
    ROOT,
    CaptureRelay,
    GateProcess,
    Named,
    decision_body,
    gate_env,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)

VECTORS = ROOT / "conformance" / "vectors"
DOCS = ROOT / "docs" / "auditing.md"
AID = "01KDWZ8B00J3Q9V5X7Z2M4N6PR"
T0 = 1767225600000
KEY_ID_RE = re.compile(r"ed25519:[0-9a-f]{16}")


# ---- helpers shared with test_permits.py and test_self_approval.py ---------------------------


def sign_config(
    config: Path, *, lifetime: str = "15m", key_dir: str = "keys", trusted: tuple[str, ...] = ()
) -> tuple[Path, str]:
    """Give ``config`` a fresh signing key under ``key_dir`` (next to it); return (pub, key id)."""
    _, public, kid = keys.generate(config.parent / key_dir)
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["receipts"].update(
        signing_key_file=f"{key_dir}/{keys.PRIVATE_KEY_NAME}", permit_lifetime=lifetime
    )
    if trusted:
        data["receipts"]["trusted_public_keys"] = list(trusted)
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return public, kid


def no_secret_env() -> dict[str, str]:
    """The environment of a verifier who holds no secret at all."""
    return {k: v for k, v in gate_env().items() if not k.startswith("HITL_")}


def verify_export(export: Path, *public: Path, expect: tuple[Path, ...] = ()) -> tuple[int, str]:
    args = ["audit", "verify", "--file", str(export)]
    for key in public:
        args += ["--public-key", str(key)]
    for receipt in expect:
        args += ["--expect", str(receipt)]
    proc = run_cli(*args, env=no_secret_env())
    assert "Traceback" not in proc.stderr.decode(), proc.stderr.decode()
    return proc.returncode, proc.stdout.decode() + proc.stderr.decode()


def export_of(config: Path, out: Path) -> list[str]:
    proc = run_cli("audit", "export", "-c", str(config), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out.read_text(encoding="utf-8").splitlines()


def doc_block(marker: str) -> str:
    """The fenced code block that follows ``<!-- test: marker -->`` in docs/auditing.md."""
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(rf"<!-- test: {re.escape(marker)} -->\n```\w*\n(.*?)\n```", text, re.S)
    assert found, f"docs/auditing.md has no block marked {marker}"
    return found.group(1) + "\n"


# ---- known answers --------------------------------------------------------------------------


def load_vectors() -> dict[str, Any]:
    return json.loads((VECTORS / "audit_entry.json").read_text(encoding="utf-8"))


(VEC,) = load_vectors()["cases"]  # one signed chain: its key, receipt key and rows


def test_signed_audit_vector_key_id_is_sha256_of_raw_public_key() -> None:
    key = VEC["key"]
    private = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(key["private_seed_hex"]))
    public_raw = bytes.fromhex(key["public_raw_hex"])
    # RFC 8032 7.1 TEST 1
    assert key["public_raw_hex"] == (
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    )
    assert keys.raw_public(private.public_key()) == public_raw
    assert key["key_id"] == "ed25519:" + hashlib.sha256(public_raw).hexdigest()[:16]
    assert keys.key_id(load_pem_public_key(key["public_pem"].encode())) == key["key_id"]  # type: ignore[arg-type]


@pytest.mark.parametrize("case", VEC["rows"], ids=[f"{r['seq']}_{r['kind']}" for r in VEC["rows"]])
def test_signed_audit_vector_by_hand(case: dict[str, Any]) -> None:
    """Recompute every field with hashlib/hmac/cryptography only, as another implementation
    would."""
    entry_bytes = json.dumps(
        case["entry_object"], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    assert entry_bytes.decode("utf-8") == case["canonical_entry"]
    digest = hashlib.sha256(case["prev_hash"].encode("ascii") + entry_bytes).hexdigest()
    assert digest == case["entry_hash"]
    assert (
        hmac.new(
            VEC["receipt_key_utf8"].encode(), digest.encode("ascii"), hashlib.sha256
        ).hexdigest()
        == case["receipt"]
    )
    private = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(VEC["key"]["private_seed_hex"]))
    signature = private.sign(digest.encode("ascii"))
    assert signature.hex() == case["signature"]  # Ed25519 is deterministic
    private.public_key().verify(bytes.fromhex(case["signature"]), digest.encode("ascii"))
    assert case["key_id"] == VEC["key"]["key_id"]


def test_signed_audit_vector_through_gate_code() -> None:
    signer = keys.Signer.from_private_key(
        Ed25519PrivateKey.from_private_bytes(bytes.fromhex(VEC["key"]["private_seed_hex"]))
    )
    key = VEC["receipt_key_utf8"].encode()
    rows, prev = [], GENESIS_HASH
    for case in VEC["rows"]:
        obj = case["entry_object"]
        entry = audit.make_entry(
            obj["seq"], obj["kind"], obj["approval_id"], _ms(obj["at"]), obj["data"]
        )
        assert canonical_json(entry).decode() == case["canonical_entry"]
        entry_json, digest, receipt = audit.seal(prev, entry, key)
        assert (entry_json, digest, receipt) == (
            case["canonical_entry"],
            case["entry_hash"],
            case["receipt"],
        )
        assert audit.sign(signer, digest) == (case["key_id"], case["signature"])
        row = AuditRow(
            obj["seq"],
            obj["approval_id"],
            obj["kind"],
            entry_json,
            prev,
            digest,
            receipt,
            case["key_id"],
            case["signature"],
        )
        assert export_line(row) == case["export_line"]
        assert parse_export_line(case["export_line"]) == row
        rows.append(row)
        prev = digest
    public = keys.trusted([signer.public_key])
    assert audit.verify(rows, key, public) == audit.VerifyResult(True, 2, signed=2)
    assert audit.verify(rows, None, public).ok


def _ms(rfc3339: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_signed_audit_vector_verifies_with_openssl(tmp_path: Path) -> None:
    case = VEC["rows"][1]
    (tmp_path / "hitl-gate-ed25519.pub").write_text(VEC["key"]["public_pem"], encoding="ascii")
    (tmp_path / "msg").write_bytes(case["entry_hash"].encode("ascii"))
    (tmp_path / "sig").write_bytes(bytes.fromhex(case["signature"]))
    cmd = [
        "openssl",
        "pkeyutl",
        "-verify",
        "-pubin",
        "-inkey",
        "hitl-gate-ed25519.pub",
        "-rawin",
        "-in",
        "msg",
        "-sigfile",
        "sig",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "Signature Verified Successfully" in proc.stdout, proc

    (tmp_path / "msg").write_bytes(VEC["rows"][0]["entry_hash"].encode("ascii"))
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode != 0


# ---- audit.verify with public keys (pure) -----------------------------------------------------


def signed_chain(signers: list[keys.Signer | None], key: bytes = b"k") -> list[AuditRow]:
    """A chain whose entry i is signed by ``signers[i]`` (None: unsigned)."""
    rows, prev = [], GENESIS_HASH
    for seq, signer in enumerate(signers, 1):
        entry = audit.make_entry(seq, "decision", AID, T0 + seq, {"n": seq, "note": "Zoë 👍"})
        entry_json, digest, receipt = audit.seal(prev, entry, key)
        kid, sig = audit.sign(signer, digest) if signer else (None, None)
        rows.append(AuditRow(seq, AID, "decision", entry_json, prev, digest, receipt, kid, sig))
        prev = digest
    return rows


def new_signer() -> keys.Signer:
    return keys.Signer.from_private_key(Ed25519PrivateKey.generate())


def test_signed_audit_unsigned_prefix_before_signing_was_enabled_verifies() -> None:
    s = new_signer()
    rows = signed_chain([None, None, s, s])

    assert audit.verify(rows, b"k", keys.trusted([s.public_key])) == audit.VerifyResult(
        True, 4, signed=2
    )


@pytest.mark.parametrize(
    ("layout", "first_bad", "reason"),
    [
        ("SSNS", 3, "not signed, after signed entries"),
        ("SSSN", 4, "not signed, after signed entries"),
        ("NNNN", 4, "not signed: no entry of this log is signed"),
        ("SSXS", 3, "which is not a trusted public key"),
    ],
    ids=["gap_after_signed", "unsigned_tail", "nothing_signed", "untrusted_key"],
)
def test_signed_audit_verify_requires_signatures(layout: str, first_bad: int, reason: str) -> None:
    s, x = new_signer(), new_signer()
    rows = signed_chain([{"S": s, "N": None, "X": x}[c] for c in layout])

    result = audit.verify(rows, None, keys.trusted([s.public_key]))
    assert (result.ok, result.first_bad_seq) == (False, first_bad)
    assert reason in result.reason
    assert audit.verify(rows, b"k").ok  # without public keys only the chain is checked


def test_signed_audit_rotation_needs_every_public_key() -> None:
    old, new = new_signer(), new_signer()
    rows = signed_chain([old, old, new, new])

    assert audit.verify(rows, None, keys.trusted([old.public_key, new.public_key])).ok
    only_new = audit.verify(rows, None, keys.trusted([new.public_key]))
    assert (only_new.ok, only_new.first_bad_seq) == (False, 1)
    assert f"signed by key {old.key_id}, which is not a trusted public key" in only_new.reason
    only_old = audit.verify(rows, None, keys.trusted([old.public_key]))
    assert (only_old.ok, only_old.first_bad_seq) == (False, 3)


def test_signed_audit_rechained_forgery_fails_on_signature() -> None:
    s = new_signer()
    rows = signed_chain([s, s, s, s])
    # an attacker changes entry 2 and recomputes every later hash; they cannot re-sign
    forged, prev = rows[:1], rows[0].entry_hash
    for row in rows[1:]:
        entry_json = row.entry.replace('"n":2', '"n":9')
        digest = audit.chain_hash(prev, entry_json.encode())
        forged.append(
            AuditRow(
                row.seq,
                AID,
                row.kind,
                entry_json,
                prev,
                digest,
                row.receipt,
                row.key_id,
                row.signature,
            )
        )
        prev = digest

    result = audit.verify(forged, None, keys.trusted([s.public_key]))
    assert (result.ok, result.first_bad_seq) == (False, 2)
    assert "signature does not verify" in result.reason


def test_signed_audit_check_receipt() -> None:
    s = new_signer()
    rows = signed_chain([s, s, s, s])
    public = keys.trusted([s.public_key])
    held = receipt_object(rows[3])
    assert held["key_id"] == s.key_id and held["signature_alg"] == "ed25519"

    assert check_receipt(rows, held, b"k", public) is None
    seq, reason = check_receipt(rows[:2], held, None, public) or (0, "")
    assert seq == 4 and reason.startswith("missing: the log ends at entry 2")
    fake = dict(held, entry_hash="ab" * 32)
    assert "not a genuine receipt" in (check_receipt(rows, fake, None, public) or ())[1]
    assert "HMAC does not match" in (check_receipt(rows, fake, b"k", None) or ())[1]
    with pytest.raises(ValueError):
        check_receipt(rows, {"seq": "4"}, None, public)


def test_signed_audit_old_export_lines_parse_as_unsigned() -> None:
    line = (
        '{"seq":1,"approval_id":null,"kind":"created","entry":"{}","prev_hash":"0",'
        '"entry_hash":"1","receipt":"2"}'
    )

    row = parse_export_line(line)
    assert (row.key_id, row.signature) == (None, None)


async def test_signed_audit_migration_2_keeps_old_entries(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    entry = audit.make_entry(1, "created", AID, T0, {"pipeline": "p"})
    entry_json, digest, receipt = audit.seal(GENESIS_HASH, entry, b"k")
    conn.execute(
        "INSERT INTO audit_log VALUES (1, ?, 'created', ?, ?, ?, ?)",
        (AID, entry_json, GENESIS_HASH, digest, receipt),
    )
    conn.close()

    store = Store(path)
    await store.open()
    try:
        assert await store.schema_version() == len(MIGRATIONS) >= 2  # 2 and what followed
        rows = [row async for row in store.audit_rows()]
        s = new_signer()
        store.bind(
            lambda tx, _: tx.append_audit("resolved", AID, T0 + 1, {"outcome": "approved"}, b"k", s)
        )
        await store.transact(Named("resolve"))
        rows = [row async for row in store.audit_rows()]
    finally:
        await store.close()
    assert (rows[0].key_id, rows[0].signature) == (None, None)
    assert rows[1].key_id == s.key_id
    assert audit.verify(rows, b"k", keys.trusted([s.public_key])) == audit.VerifyResult(
        True, 2, signed=1
    )


# ---- keygen -----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_keygen_writes_0600_private_key_and_prints_key_id(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    proc = run_cli("keygen", "--out", str(out))

    assert proc.returncode == 0, proc.stderr
    kid = proc.stdout.decode().strip()
    assert KEY_ID_RE.fullmatch(kid), kid
    private, public = out / "hitl-gate-ed25519.key", out / "hitl-gate-ed25519.pub"
    assert os.stat(private).st_mode & 0o777 == 0o600
    assert os.stat(public).st_mode & 0o777 == 0o644
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----\n")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----\n")
    assert keys.key_id(keys.load_public_key(public)) == kid
    assert keys.key_id(keys.load_private_key(private).public_key()) == kid
    assert proc.stderr.decode().splitlines() == [
        f"wrote {private} (private key, mode 0600: receipts.signing_key_file)",
        f"wrote {public} (public key: give it to verifiers)",
    ]

    again = run_cli("keygen", "--out", str(out))
    assert again.returncode == 1
    assert again.stderr.decode() == (
        f"Error: {private} already exists; refusing to overwrite a key\n"
    )
    assert keys.key_id(keys.load_public_key(public)) == kid


def test_keys_loading_refuses_wrong_files(tmp_path: Path) -> None:
    _, public, _ = keys.generate(tmp_path)
    private = tmp_path / keys.PRIVATE_KEY_NAME
    with pytest.raises(keys.KeyFileError, match="is a private key"):
        keys.load_public_key(private)
    with pytest.raises(keys.KeyFileError, match="not an unencrypted PEM private key"):
        keys.load_private_key(_chmod(public, 0o600))
    for mode in (0o604, 0o660):
        os.chmod(private, mode)
        with pytest.raises(keys.KeyFileError, match=rf"mode {mode:04o} lets other users"):
            keys.load_private_key(private)
    os.chmod(private, 0o640)  # group-readable, e.g. a systemd credential: fine
    assert keys.load_private_key(private)


def _chmod(path: Path, mode: int) -> Path:
    os.chmod(path, mode)
    return path


@pytest.mark.e2e
def test_check_config_names_a_bad_signing_key_file(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/relay")
    sign_config(config)
    os.chmod(tmp_path / "keys" / keys.PRIVATE_KEY_NAME, 0o644)
    data = yaml.safe_load(config.read_text())
    data["receipts"]["trusted_public_keys"] = ["nowhere.pub"]
    config.write_text(yaml.safe_dump(data))

    for command in ("check-config", "serve"):
        proc = run_cli(command, "-c", str(config))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.decode().splitlines()[-2:] == [
            f"{config}: receipts.signing_key_file: {tmp_path}/keys/{keys.PRIVATE_KEY_NAME}: "
            "mode 0644 lets other users read or change the private key; chmod 600 it",
            f"{config}: receipts.trusted_public_keys[0]: {tmp_path}/nowhere.pub: no such file",
        ]


# ---- a real signed gate and its export --------------------------------------------------------


class SignedHistory:
    """A signed gate's history: approve, skip, cancel (11 entries), exported, gate stopped."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.relay = CaptureRelay().start()
        self.config = write_config(directory, self.relay.url)
        self.public, self.key_id = sign_config(self.config)
        self.gate = GateProcess(self.config).start()
        self.receipts: list[dict[str, Any]] = []

    def run(self) -> None:
        api = self.gate.api()
        for verb in ("approve", "skip", "cancel"):
            approval_id = api.create("q1", f"signed {verb} ✓")["approval_id"]
            dispatch = self.relay.wait_dispatch(approval_id)
            wait_until(
                lambda a=approval_id: api.get(a)["dispatch"]["delivered_at"], what="dispatch ack"
            )
            if verb == "cancel":
                assert api.call("POST", f"/v1/approvals/{approval_id}/cancel")[0] == 200
            else:
                status, answer, _ = post_decision(
                    self.gate.callback_url, decision_body(dispatch, verb=verb)
                )
                assert (status, answer["resolved"]) == (200, True)
            self.receipts.append(api.get(approval_id)["receipt"])
        assert self.gate.stop() == 0
        self.relay.stop()
        self.export = self.directory / "audit.jsonl"
        self.lines = export_of(self.config, self.export)

    def write(self, name: str, lines: list[str]) -> Path:
        path = self.directory / name
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    def receipt_file(self, index: int, **changes: Any) -> Path:
        path = self.directory / f"receipt-{index}-{len(changes)}.json"
        path.write_text(json.dumps({**self.receipts[index], **changes}), encoding="utf-8")
        return path


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SignedHistory]:
    h = SignedHistory(tmp_path_factory.mktemp("signed"))
    try:
        h.run()
        yield h
    finally:
        if h.gate.proc is not None and h.gate.proc.poll() is None:
            h.gate.stop()


@pytest.mark.e2e
def test_signed_audit_every_entry_and_receipt_is_signed(history: SignedHistory) -> None:
    rows = [json.loads(line) for line in history.lines]
    assert [r["seq"] for r in rows] == list(range(1, 12))
    public = keys.load_public_key(history.public)
    for r in rows:
        assert r["key_id"] == history.key_id
        public.verify(bytes.fromhex(r["signature"]), r["entry_hash"].encode("ascii"))
    for receipt, seq in zip(history.receipts, (4, 8, 11), strict=True):
        entry_hash = rows[seq - 1]["entry_hash"]
        assert receipt == {
            "seq": seq,
            "entry_hash": entry_hash,
            "alg": "hmac-sha256",
            "receipt": hmac.new(
                RECEIPT_KEY.encode(), entry_hash.encode(), hashlib.sha256
            ).hexdigest(),
            "key_id": history.key_id,
            "signature": rows[seq - 1]["signature"],
            "signature_alg": "ed25519",
        }


@pytest.mark.e2e
def test_signed_audit_export_verifies_with_public_key_only(history: SignedHistory) -> None:
    assert verify_export(history.export, history.public) == (
        0,
        "ok: 11 entries, chain and signatures intact\n",
    )
    assert verify_export(history.export, history.public, expect=(history.receipt_file(2),)) == (
        0,
        "ok: 11 entries, chain and signatures intact; holds the receipt for entry 11\n",
    )
    proc = run_cli("audit", "verify", "-c", str(history.config))
    assert (proc.returncode, proc.stdout.decode()) == (
        0,
        "ok: 11 entries, chain, receipts and signatures intact\n"
        "ok: 3 approvals match the audit log\n",
    ), proc.stderr


@pytest.mark.e2e
def test_signed_audit_verify_of_the_database_needs_no_private_key(
    history: SignedHistory, tmp_path: Path
) -> None:
    """Regression (operator review): a copy of the config elsewhere (its relative
    signing_key_file missing there) could not verify: exit 2 for the private key, which a
    verifier never needs. With --public-key it verifies; without, the error says so."""
    data = yaml.safe_load(history.config.read_text(encoding="utf-8"))
    data["storage"]["path"] = str(history.config.parent / data["storage"]["path"])
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(yaml.safe_dump(data), encoding="utf-8")
    proc = run_cli("audit", "verify", "-c", str(elsewhere), "--public-key", str(history.public))
    assert (proc.returncode, proc.stdout.decode()) == (
        0,
        "ok: 11 entries, chain, receipts and signatures intact\n"
        "ok: 3 approvals match the audit log\n",
    ), proc.stderr
    proc = run_cli("audit", "verify", "-c", str(elsewhere))
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "receipts.signing_key_file: " in err, err
    assert "give its public key with --public-key" in err, err


def _change_byte(lines: list[str]) -> list[str]:
    row = json.loads(lines[2])
    assert row["entry"].count('"operator_id":101') == 1
    row["entry"] = row["entry"].replace('"operator_id":101', '"operator_id":102')
    return lines[:2] + [json.dumps(row, ensure_ascii=False, separators=(",", ":"))] + lines[3:]


def _rechain_from(lines: list[str], index: int) -> list[str]:
    """Change entry ``index`` + 1 and recompute every later hash, as an attacker without keys."""
    out = [json.loads(line) for line in lines]
    out[index]["entry"] = out[index]["entry"].replace('"operator_id":101', '"operator_id":102')
    prev = out[index]["prev_hash"]
    for row in out[index:]:
        row["prev_hash"] = prev
        row["entry_hash"] = prev = audit.chain_hash(prev, row["entry"].encode("utf-8"))
    return [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in out]


def _strip(lines: list[str], which: Callable[[int], bool]) -> list[str]:
    out = []
    for i, line in enumerate(lines):
        row = json.loads(line)
        if which(i):
            row["key_id"] = row["signature"] = None
        out.append(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
    return out


TAMPERS: list[tuple[str, Callable[[list[str]], list[str]], str]] = [
    (
        "change_a_byte",
        _change_byte,
        "TAMPERED: entry 3: entry hash does not match its content (changed)",
    ),
    (
        "change_and_rechain",
        lambda ls: _rechain_from(ls, 2),
        "TAMPERED: entry 3: signature does not verify with key {kid} (changed or forged)",
    ),
    (
        "drop_a_line",
        lambda ls: ls[:5] + ls[6:],
        "TAMPERED: entry 7: expected entry 6, found 7 (deleted or inserted entry)",
    ),
    (
        "swap_two_lines",
        lambda ls: ls[:4] + [ls[5], ls[4]] + ls[6:],
        "TAMPERED: entry 6: expected entry 5, found 6 (deleted or inserted entry)",
    ),
    (
        "insert_a_line",
        lambda ls: ls[:4] + [ls[3]] + ls[4:],
        "TAMPERED: entry 4: expected entry 5, found 4 (deleted or inserted entry)",
    ),
    (
        "strip_last_signature",
        lambda ls: _strip(ls, lambda i: i == 10),
        "TAMPERED: entry 11: not signed, after signed entries (signature stripped, or entry "
        "added without the signing key)",
    ),
    (
        "strip_every_signature",
        lambda ls: _strip(ls, lambda i: True),
        "TAMPERED: entry 11: not signed: no entry of this log is signed, so nothing proves who "
        "wrote it",
    ),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("name", "tamper", "message"), TAMPERS, ids=[t[0] for t in TAMPERS])
def test_signed_audit_tampered_export_names_first_bad_entry(
    history: SignedHistory, name: str, tamper: Callable[[list[str]], list[str]], message: str
) -> None:
    path = history.write(f"{name}.jsonl", tamper(list(history.lines)))

    code, out = verify_export(path, history.public)
    assert code == 1, out
    assert out.startswith(message.format(kid=history.key_id) + " ("), out
    assert len(out.splitlines()) == 1


@pytest.mark.e2e
def test_signed_audit_dropped_tail_is_caught_by_expect(history: SignedHistory) -> None:
    path = history.write("truncated.jsonl", history.lines[:8])
    last_receipt = history.receipt_file(2)

    # the log alone cannot show a deleted tail ...
    assert verify_export(path, history.public) == (
        0,
        "ok: 8 entries, chain and signatures intact\n",
    )
    # ... whoever holds a later receipt can
    assert verify_export(path, history.public, expect=(last_receipt,)) == (
        1,
        "TAMPERED: entry 11: missing: the log ends at entry 8, but a receipt for entry 11 "
        f"exists (entries deleted from the tail) (receipt {last_receipt})\n",
    )
    # an earlier receipt is still held; an approval object works as a receipt file too
    approval = history.directory / "approval.json"
    approval.write_text(json.dumps({"approval_id": "x", "receipt": history.receipts[1]}))
    assert verify_export(path, history.public, expect=(approval,)) == (
        0,
        "ok: 8 entries, chain and signatures intact; holds the receipt for entry 8\n",
    )


@pytest.mark.e2e
def test_audit_verify_of_an_empty_export_or_without_keys_says_what_it_did_not_prove(
    history: SignedHistory,
) -> None:
    """Security review: an empty export answered "ok: 0 entries" (exit 0), and a re-chained
    forgery verified without any key printed a plain "ok". An empty export is refused (an
    export of a gate that did anything is never empty); without --public-key or --key-env
    the verdict says that nothing authenticated the entries."""
    empty = history.write("empty.jsonl", [])
    assert verify_export(empty, history.public) == (
        1,
        "TAMPERED: the export holds no entries (nothing to verify)\n",
    )
    proc = run_cli(
        "audit",
        "verify",
        "--file",
        str(history.write("all.jsonl", history.lines)),
        env=no_secret_env(),
    )
    assert proc.returncode == 0
    assert proc.stdout.decode() == f"ok: {len(history.lines)} entries, chain intact\n"
    assert proc.stderr.decode() == (
        "warning: no key was given, so nothing authenticated the entries: anyone can re-chain "
        "an edited log; verify with --public-key (or --key-env)\n"
    )


@pytest.mark.e2e
def test_signed_audit_made_up_receipt_is_not_genuine(history: SignedHistory) -> None:
    forged = history.receipt_file(2, seq=12, entry_hash="ab" * 32)

    code, out = verify_export(history.export, history.public, expect=(forged,))
    assert code == 1
    assert out == (
        f"TAMPERED: entry 12: the receipt's signature does not verify with key "
        f"{history.key_id} (changed or forged) (not a genuine receipt) "
        f"(receipt {forged})\n"
    )


@pytest.mark.e2e
def test_signed_audit_wrong_public_key(history: SignedHistory, tmp_path: Path) -> None:
    _, other, other_id = keys.generate(tmp_path)

    assert verify_export(history.export, other) == (
        1,
        f"TAMPERED: entry 1: signed by key {history.key_id}, which is not a trusted public "
        "key (0 entries before it verified)\n",
    )
    # rotation: trusting both keys is fine
    assert verify_export(history.export, other, history.public)[0] == 0
    assert other_id != history.key_id


@pytest.mark.e2e
def test_signed_audit_usage_errors(history: SignedHistory, tmp_path: Path) -> None:
    private = history.directory / "keys" / keys.PRIVATE_KEY_NAME
    code, out = verify_export(history.export, private)
    assert (code, out) == (
        2,
        f"Error: --public-key: {private}: is a private key; give the "
        "public key file (hitl-gate-ed25519.pub)\n",
    )
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"seq": 3}')
    code, out = verify_export(history.export, history.public, expect=(bogus,))
    assert (code, out) == (2, f"Error: --expect: {bogus} holds no receipt (seq, entry_hash)\n")


@pytest.mark.e2e
@pytest.mark.toolchain
@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_signed_audit_docs_node_snippet_verifies_export(
    history: SignedHistory, tmp_path: Path
) -> None:
    script = tmp_path / "verify-audit.mjs"
    script.write_text(doc_block("node-audit"), encoding="utf-8")

    def node(export: Path) -> tuple[int, str]:
        proc = subprocess.run(
            ["node", str(script), str(export), str(history.public)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return proc.returncode, proc.stdout + proc.stderr

    assert node(history.export) == (0, "ok: 11 entries\n")
    for name, tamper, _ in TAMPERS:
        code, out = node(history.write(f"node-{name}.jsonl", tamper(list(history.lines))))
        assert code == 1 and out.startswith("TAMPERED: "), (name, out)


# ---- rotation and enabling signing on a running history, through the daemon -----------------


@pytest.mark.e2e
def test_signed_audit_enable_then_rotate_key(tmp_path: Path) -> None:
    relay = CaptureRelay().start()
    try:
        config = write_config(tmp_path, relay.url)

        def one_approval() -> None:
            gate = GateProcess(config).start()
            try:
                api = gate.api()
                approval_id = api.create("q1", "rotate me")["approval_id"]
                dispatch = relay.wait_dispatch(approval_id)
                wait_until(
                    lambda: api.get(approval_id)["dispatch"]["delivered_at"], what="dispatch ack"
                )
                status, _, _ = post_decision(gate.callback_url, decision_body(dispatch))
                assert status == 200
            finally:
                assert gate.stop() == 0

        one_approval()  # unsigned: before signing was enabled
        first_pub, first_id = sign_config(config, key_dir="k1")
        one_approval()
        second_pub, second_id = sign_config(
            config, key_dir="k2", trusted=(f"k1/{keys.PUBLIC_KEY_NAME}",)
        )
        one_approval()
    finally:
        relay.stop()
    lines = export_of(config, tmp_path / "audit.jsonl")
    rows = [json.loads(line) for line in lines]
    # created, dispatch_ack, decision, resolved per approval
    assert [r["key_id"] for r in rows] == [None] * 4 + [first_id] * 4 + [second_id] * 4

    export = tmp_path / "audit.jsonl"
    assert verify_export(export, first_pub, second_pub) == (
        0,
        "ok: 12 entries, chain and signatures intact\n",
    )
    assert verify_export(export, second_pub) == (
        1,
        f"TAMPERED: entry 5: signed by key {first_id}, which is not a trusted public key "
        "(4 entries before it verified)\n",
    )
    # the gate's own config trusts both (signing key + trusted_public_keys)
    proc = run_cli("audit", "verify", "-c", str(config))
    assert (proc.returncode, proc.stdout.decode()) == (
        0,
        "ok: 12 entries, chain, receipts and signatures intact\n"
        "ok: 3 approvals match the audit log\n",
    ), proc.stderr


@pytest.mark.e2e
def test_audit_verify_input_it_cannot_read_is_not_tampering(tmp_path: Path) -> None:
    """Regression (new-user review): a missing or undecodable export file and a config whose
    database does not exist exited 1, the code for "tampered", so a script could not tell a
    typo from an attack. Now: nothing could be checked -> exit 2 with one line; a line of a
    readable export that is no audit entry -> exit 1, named like any bad entry."""
    not_utf8 = tmp_path / "latin1.jsonl"
    not_utf8.write_bytes(b'{"seq": 1, "entry": "caf\xe9"}\n')
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("this is not json\n", encoding="utf-8")
    config = write_config(tmp_path, "http://127.0.0.1:9/relay", db="never-created.db")
    cases = [
        (["--file", str(tmp_path / "missing.jsonl")], 2, "cannot read"),
        (["--file", str(not_utf8)], 2, "cannot read"),
        (["-c", str(config)], 2, "no database at"),
        (["--file", str(garbage)], 1, "TAMPERED: line 1 of"),
    ]
    for args, code, text in cases:
        proc = run_cli(
            "audit", "verify", *args, env=no_secret_env() if "--file" in args else gate_env()
        )
        out = proc.stdout.decode() + proc.stderr.decode()
        assert proc.returncode == code, (args, out)
        assert text in out, (args, out)
        assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "never-created.db").exists()  # verify creates nothing


def test_unauthenticated_receipt_is_not_called_a_deleted_tail() -> None:
    """New-user review: ``audit verify --file X --expect fake.json``
    without a key reported a made-up receipt as a deleted tail. Without a receipt key or a
    public key the receipt is not authenticated, and the verdict must say so."""
    s = new_signer()
    rows = signed_chain([s, s, s, s])
    made_up = {"seq": 9, "entry_hash": "ab" * 32, "receipt": "cd" * 32}
    seq, reason = check_receipt(rows, made_up, None, None) or (0, "")
    assert seq == 9 and reason.startswith("missing: the log ends at entry 4")
    assert "not authenticated" in reason and "(entries deleted from the tail)" not in reason
    unsigned_with_public = check_receipt(rows, made_up, None, keys.trusted([s.public_key]))
    assert unsigned_with_public is not None and "not authenticated" in unsigned_with_public[1]
    held = receipt_object(rows[3])  # genuine and signed: authenticated by its signature
    seq, reason = check_receipt(rows[:2], held, None, keys.trusted([s.public_key])) or (0, "")
    assert "entries deleted from the tail" in reason
