"""Baseline for ``audit verify``: a bare hashlib/hmac loop over the same entries, own process.

    python -m bench.auditbase DB --key-env VAR

Reads every audit row of DB into memory first (timed separately, as ``read_s``), then times
only the loop a verifier cannot avoid: SHA-256 over previous hash + entry bytes, compare with
the stored hash and prev_hash, HMAC receipt, compare. Prints one JSON object. Imports nothing
from the gate.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sqlite3
import sys
import time

GENESIS = "0" * 64


def main() -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.auditbase")
    parser.add_argument("db")
    parser.add_argument("--key-env", required=True)
    args = parser.parse_args()
    key = os.environ[args.key_env].encode("utf-8")
    t0 = time.perf_counter()
    conn = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True)
    rows = [
        (entry.encode("utf-8"), prev, digest, receipt)
        for entry, prev, digest, receipt in conn.execute(
            "SELECT entry, prev_hash, entry_hash, receipt FROM audit_log ORDER BY seq"
        )
    ]
    conn.close()
    read_s = time.perf_counter() - t0
    sha256 = hashlib.sha256
    compare = hmac.compare_digest
    new_hmac = hmac.new
    ok = True
    t1 = time.perf_counter()
    prev = GENESIS
    for entry, prev_hash, entry_hash, receipt in rows:
        digest = sha256(prev.encode("ascii") + entry).hexdigest()
        if (
            prev_hash != prev
            or not compare(digest, entry_hash)
            or not compare(new_hmac(key, digest.encode("ascii"), sha256).hexdigest(), receipt)
        ):
            ok = False
            break
        prev = digest
    loop_s = time.perf_counter() - t1
    sys.stdout.write(
        json.dumps(
            {
                "entries": len(rows),
                "ok": ok,
                "read_s": read_s,
                "loop_s": loop_s,
                "entries_per_s": len(rows) / loop_s if loop_s else 0.0,
            }
        )
        + "\n"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
