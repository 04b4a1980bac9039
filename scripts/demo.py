"""The main job, end to end: gate + reference relay + a pipeline that blocks on approval.

Starts ``hitl-gate serve`` on config.example.yaml (embedded SQLite under var/), the
reference relay as a separate process over HTTP (``hitl-gate relay --auto approve``),
runs ``hitl-gate request --wait`` for an invoice follow-up email, prints every hop,
verifies the audit chain, and stops everything cleanly. Exit 0 only if all of it worked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config.example.yaml"
# Demo secrets only (32+ bytes, as check-config asks); real deployments set their own, e.g.
# from `openssl rand -hex 32`, in the service environment.
DEMO_ENV = {
    "HITL_RELAY_SECRET": "demo-relay-secret-change-me-8f2c41d0",
    "HITL_API_TOKEN": "demo-api-token-change-me-5b7e93a1c6",
    "HITL_RECEIPT_KEY": "demo-receipt-key-change-me-2d94f0e7",
}
DRAFT = """Subject: Zahlungserinnerung – Rechnung 2026-114

Hallo Anna Müller,

kurze Erinnerung: Rechnung 2026-114 über 1.240,00 € war am 15. November fällig.
Könnten Sie den Betrag bis Freitag überweisen? Bei Fragen melden Sie sich gern.

Viele Grüße
Zoë Ørsted · Buchhaltung
"""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gate", *args]


class Proc:
    """A child process whose stderr is echoed with a prefix and searchable."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            print(f"  [{self.name}] {line}", flush=True)
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if m := regex.search(line):
                        return m
                if self.proc.poll() is not None:
                    sys.exit(f"demo: {self.name} exited with {self.proc.returncode}")
                left = deadline - time.monotonic()
                if left <= 0:
                    sys.exit(f"demo: {self.name} did not log {pattern!r} in {timeout:g} s")
                self.cond.wait(min(left, 0.2))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


def main() -> int:
    env = dict(os.environ)
    for key, value in DEMO_ENV.items():
        env.setdefault(key, value)
    env["PYTHONUNBUFFERED"] = "1"
    print(f"== 1. check the config: {CONFIG.name}")
    subprocess.run(cli("check-config", "-c", str(CONFIG)), env=env, check=True)
    if (ROOT / "var" / "hitl-gate.db").exists():  # a database from an earlier run
        earlier = subprocess.run(
            cli("audit", "verify", "-c", str(CONFIG)), env=env, capture_output=True, text=True
        )
        if earlier.returncode != 0:
            print(f"   {(earlier.stdout + earlier.stderr).strip()}")
            print(
                f"demo: FAILED: {ROOT / 'var'} holds a database from an earlier run whose "
                "audit log does not verify with these secrets (written with another "
                "HITL_RECEIPT_KEY?); run `make clean` (it removes var/) and try again"
            )
            return 1

    print("== 2. start the gate (callback 127.0.0.1:8089, API 127.0.0.1:8090, SQLite var/)")
    gate = Proc("gate", cli("serve", "-c", str(CONFIG)), env)
    relay = None
    try:
        gate.wait_for(r"event=listening")
        print("== 3. start the reference relay as its own process (127.0.0.1:8091, --auto approve)")
        relay = Proc(
            "relay",
            cli(
                "relay",
                "--listen",
                "127.0.0.1:8091",
                "--secret-env",
                "HITL_RELAY_SECRET",
                "--as",
                "alice@example.com",
                "--auto",
                "approve",
            ),
            env,
        )
        relay.wait_for(r"event=relay_listening")

        print("== 4. the pipeline asks for approval of the draft and blocks (request --wait)")
        print("   draft:\n" + "\n".join("   | " + line for line in DRAFT.splitlines()))
        result = subprocess.run(
            cli(
                "request",
                "-c",
                str(CONFIG),
                "--pipeline",
                "invoice-due-diligence",
                "--step",
                "send-followup",
                "--run-id",
                f"demo-{int(time.time())}",
                "--draft-file",
                "-",
                "--wait",
                "--timeout",
                "60",
            ),
            input=DRAFT.encode("utf-8"),
            env=env,
            capture_output=True,
            cwd=ROOT,
        )
        for line in result.stderr.decode("utf-8", "replace").splitlines():
            print(f"  [pipeline] {line}")
        print(f"== 5. request exited {result.returncode}; final body the action may use:")
        final = result.stdout.decode("utf-8")
        print("\n".join("   | " + line for line in final.splitlines()))
        if result.returncode != 0 or final != DRAFT:
            print("demo: FAILED: the approval did not come back approved with the same body")
            return 1

        print("== 6. verify the audit chain and its receipts")
        verify = subprocess.run(cli("audit", "verify", "-c", str(CONFIG)), env=env)
        if verify.returncode != 0:
            print("demo: FAILED: the audit log does not verify (see the line above)")
            return 1
    finally:
        print("== 7. stop everything (SIGTERM)")
        codes = {p.name: p.stop() for p in (relay, gate) if p is not None}
        print(f"   exit codes: {codes}")
    if any(codes.values()):
        print("demo: FAILED: a process did not stop cleanly")
        return 1
    print(
        "demo: OK — dispatched, decided by alice@example.com, approved, receipt issued, "
        "audit intact"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
