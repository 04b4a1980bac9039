"""What the benchmark sections share: config, secrets, processes, /proc sampling, statistics.

Every component under test runs as its own process: the gate (``python -m gate serve``),
the relay (``python -m bench.relay``), the baseline endpoint (``python -m bench.baseline``)
and the load generator (``python -m bench.loadgen``). This module only starts, watches and
measures them.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# Secrets are benchmark-only values passed through the environment (never in the YAML).
SECRET_ENV = "BENCH_HITL_RELAY_SECRET"
TOKEN_ENV = "BENCH_HITL_API_TOKEN"
RECEIPT_ENV = "BENCH_HITL_RECEIPT_KEY"
ADMIN_ENV = "BENCH_HITL_ADMIN_TOKEN"  # enrols the approver keys of ``SIGNED_STEP``
SECRET = "bench-relay-secret-3b9d7e0a51c4f826"
API_TOKEN = "bench-api-token-5c1e08f3b2a9d647"
RECEIPT_KEY = "bench-receipt-key-8a47c1f0e93d52b6"
ADMIN_TOKEN = "bench-admin-token-7f3a91c0d2e84b65"

PIPELINE = "bench"
STEP = "q1"
SIGNED_STEP = "q1s"  # as q1, with approver_signature: required (bench.signed)
STEP_TIMEOUT = "4h"
# Eight operators in scope of the quorum-1 step; decisions are spread over them.
IDENTITIES = [f"op{n:02d}@bench.example" for n in range(1, 9)]
OPERATOR_IDS = [100 + n for n in range(1, 9)]
RISK = "normal"
CONTENT_TYPE = "text/plain"

LISTENING = re.compile(r"event=listening callback=(\S+) api=(\S+)")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def scope() -> list[list[Any]]:
    """The frozen scope the gate stores for the bench step: ``[[operator_id, identity], ...]``."""
    return [[op_id, ident] for op_id, ident in zip(OPERATOR_IDS, IDENTITIES, strict=True)]


def draft_body(i: int) -> str:
    """A realistic draft (~300 bytes, non-ASCII, trailing newline); varies with ``i``."""
    return (
        f"Hallo Anna,\n\nRechnung 2026-{i:06d} über 1.240,00 € ist seit 14 Tagen fällig. "
        "Wir bitten um Überweisung bis Freitag auf das bekannte Konto; bei Rückfragen "
        "melden Sie sich gern direkt bei mir.\n\nViele Grüße\nJörg — Buchhaltung\n"
    )


def bench_env(**extra: str) -> dict[str, str]:
    """Environment for every spawned process: this one plus the benchmark secrets."""
    env = dict(os.environ)
    env.update(
        {SECRET_ENV: SECRET, TOKEN_ENV: API_TOKEN, RECEIPT_ENV: RECEIPT_KEY, ADMIN_ENV: ADMIN_TOKEN}
    )
    env.update(extra)
    env.pop("PYTHONDEVMODE", None)
    env.pop("PYTHONTRACEMALLOC", None)
    return env


def write_config(directory: Path, relay_url: str, db_path: Path) -> Path:
    """Write a gate config into ``directory``: ports 0, one pipeline ``bench`` with the
    quorum-1 step ``q1`` (8 approvers, 4 h timeout) and its twin ``q1s`` that requires
    approver signatures, an admin token, no practical rate limit."""
    operators = [
        {"id": op_id, "identity": ident}
        for op_id, ident in zip(OPERATOR_IDS, IDENTITIES, strict=True)
    ]
    config = {
        "relay": {
            "url": relay_url,
            "secret_env": SECRET_ENV,
            "callback_addr": "127.0.0.1:0",
            "dispatch_timeout": "5s",
            "operators": operators,
            "security": {
                "allowed_users": OPERATOR_IDS,
                "max_input_length": 500,
                "rate_limit": 1_000_000_000,
                "max_skew": "300s",
            },
        },
        "api": {"listen": "127.0.0.1:0", "token_env": TOKEN_ENV, "admin_token_env": ADMIN_ENV},
        "storage": {"path": str(db_path)},
        "receipts": {"key_env": RECEIPT_ENV},
        "pipelines": [
            {
                "name": PIPELINE,
                "steps": [
                    {
                        "name": STEP,
                        "quorum": 1,
                        "approvers": OPERATOR_IDS,
                        "timeout": STEP_TIMEOUT,
                        "risk": RISK,
                    },
                    {
                        "name": SIGNED_STEP,
                        "quorum": 1,
                        "approvers": OPERATOR_IDS,
                        "timeout": STEP_TIMEOUT,
                        "risk": RISK,
                        "approver_signature": "required",
                    },
                ],
            }
        ],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


# ---- hitl/v0 wire format (SPEC §2), written here so the load side never imports the gate ----


def sign(secret: str, t: int, body: bytes) -> str:
    """``X-Draftcat-Signature`` value: ``t=<t>,v1=<hex HMAC-SHA256(secret, "t." + body)>``."""
    mac = hmac.new(secret.encode("utf-8"), str(t).encode("ascii") + b"." + body, hashlib.sha256)
    return f"t={t},v1={mac.hexdigest()}"


def rfc3339_now() -> str:
    """Current UTC time as RFC 3339 with ``Z`` (second precision)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def decision_bytes(
    approval_id: str, nonce: str, payload_hash: str, identity: str, verb: str = "approve"
) -> bytes:
    """A compact decision envelope (SPEC §2 "Decision") as the bytes a relay would send."""
    body = {
        "protocol": "hitl/v0",
        "approval_id": approval_id,
        "nonce": nonce,
        "decision": verb,
        "payload_hash": payload_hash,
        "approver": {"id": identity, "display": None, "channel": "bench"},
        "adjust_text": None,
        "decided_at": rfc3339_now(),
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def write_decisions(path: Path, dispatches: list[dict[str, Any]]) -> None:
    """One decision line per captured dispatch (``approval_id``, ``nonce``, ``payload_hash``),
    approvers taken in turn from ``IDENTITIES``: the load generator's input file."""
    lines = (
        decision_bytes(
            e["approval_id"], e["nonce"], e["payload_hash"], IDENTITIES[i % len(IDENTITIES)]
        )
        for i, e in enumerate(dispatches)
    )
    path.write_bytes(b"\n".join(lines) + b"\n")


# ---- /proc sampling ----------------------------------------------------------------------


def proc_status_path(path: str) -> dict[str, str]:
    """A ``status`` file of /proc as a dict (values stripped)."""
    out = {}
    with open(path, encoding="ascii", errors="replace") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def proc_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as a dict."""
    return proc_status_path(f"/proc/{pid}/status")


def family(pid: int) -> list[int]:
    """``pid`` and its child processes: the daemon and its writer process
    (``gate.store.writer_process``), whose costs are the daemon's."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    except OSError:
        return [pid]
    return [pid] + [int(word) for word in text.split()]


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` and its children in MiB (VmRSS summed: pages the
    forked writer still shares with the daemon count twice, so this errs high)."""
    return sum(int(proc_status(p)["VmRSS"].split()[0]) for p in family(pid)) / 1024


def hwm_mb(pid: int) -> float:
    """Peak resident set size of ``pid`` and its children in MiB (VmHWM summed)."""
    return sum(int(proc_status(p)["VmHWM"].split()[0]) for p in family(pid)) / 1024


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its children (all threads) in seconds, from
    ``/proc/<pid>/stat``."""
    total = 0
    for member in family(pid):
        with open(f"/proc/{member}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
        fields = text[text.rindex(")") + 2 :].split()
        # fields[0] is field 3 (state); utime is field 14, stime field 15
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches summed over every thread of ``pid`` and of
    its children."""
    total = 0
    for member in family(pid):
        for task in os.listdir(f"/proc/{member}/task"):
            try:
                status = proc_status_path(f"/proc/{member}/task/{task}/status")
            except OSError:
                continue
            total += int(status.get("voluntary_ctxt_switches", 0))
            total += int(status.get("nonvoluntary_ctxt_switches", 0))
    return total


def threads(pid: int) -> int:
    """Number of threads of ``pid`` and its children."""
    return sum(int(proc_status(p)["Threads"]) for p in family(pid))


# ---- statistics --------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of an already sorted list (nan when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def latency_stats_ms(latencies_s: list[float]) -> dict[str, float]:
    """p50/p90/p99/mean/min/max of latencies given in seconds, reported in milliseconds."""
    values = sorted(latencies_s)
    if not values:
        return {k: float("nan") for k in ("p50", "p90", "p99", "mean", "min", "max")}
    return {
        "p50": percentile(values, 50) * 1000,
        "p90": percentile(values, 90) * 1000,
        "p99": percentile(values, 99) * 1000,
        "mean": sum(values) / len(values) * 1000,
        "min": values[0] * 1000,
        "max": values[-1] * 1000,
    }


def median(values: list[float]) -> float:
    """Median (nan when empty)."""
    s = sorted(values)
    if not s:
        return float("nan")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


# ---- processes ---------------------------------------------------------------------------


class Daemon:
    """``python -m gate serve -c CONFIG`` with stderr going to ``log_path``.

    ``start()`` returns the seconds from spawn until the ``event=listening`` line appeared
    (the log file is polled every 2 ms).
    """

    def __init__(
        self,
        config: Path,
        log_path: Path,
        env: dict[str, str] | None = None,
        wrapper: list[str] | None = None,
    ) -> None:
        self.config = config
        self.log_path = log_path
        self.env = env or bench_env()
        self.wrapper = wrapper or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.callback_url = ""
        self.api_url = ""
        self.start_s = float("nan")

    @property
    def pid(self) -> int:
        """The daemon's process id."""
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 300.0) -> float:
        """Spawn and wait for ``event=listening``; returns the start time in seconds."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                [*self.wrapper, PYTHON, "-m", "gate", "serve", "-c", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=self.env,
                cwd=ROOT,
            )
        finally:
            log.close()
        deadline = t0 + timeout
        offset = 0
        buf = b""
        while True:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            offset += len(chunk)
            buf += chunk
            match = LISTENING.search(buf.decode("utf-8", "replace"))
            if match:
                self.start_s = time.perf_counter() - t0
                self.callback_url = match.group(1).rstrip("/") + "/hitl/v0/decisions"
                self.api_url = match.group(2).rstrip("/")
                return self.start_s
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gate exited {self.proc.returncode} before listening:\n" + self.log_tail()
                )
            if time.perf_counter() > deadline:
                self.kill()
                raise RuntimeError(f"gate did not listen within {timeout} s:\n" + self.log_tail())
            time.sleep(0.002)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines the daemon wrote on stderr."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code (SIGKILL after ``timeout``)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


class Helper:
    """A helper process (``bench.relay``, ``bench.baseline``) that prints ``listening URL``
    as its first stdout line and nothing else; its stderr goes to ``log_path``."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> Helper:
        """Spawn and read the URL it listens on; returns self."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.proc = subprocess.Popen(
                [PYTHON, *self.args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=bench_env(),
                cwd=ROOT,
            )
        finally:
            log.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline().decode("utf-8", "replace").strip()
        if not line.startswith("listening ") or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(
                f"{self.args} did not start ({line!r}):\n"
                + self.log_path.read_text(errors="replace")[-3000:]
            )
        self.url = line.split(" ", 1)[1]
        return self

    @property
    def pid(self) -> int:
        """The helper's process id."""
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class HttpClient:
    """A keep-alive http.client connection for the harness's own (unmeasured or single)
    requests; ``request`` returns ``(status, parsed JSON or None, seconds)``."""

    def __init__(self, base: str, token: str | None = None, timeout: float = 120.0) -> None:
        parts = urllib.parse.urlsplit(base)
        self.host, self.port = parts.hostname, parts.port
        self.timeout = timeout
        self.token = token
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any, float]:
        """One request on the kept connection (reconnects once if it was closed)."""
        headers = {}
        data = None
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                t0 = time.perf_counter()
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                elapsed = time.perf_counter() - t0
                return resp.status, (json.loads(raw) if raw else None), elapsed
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connection."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def run_json(args: list[str], timeout: float, log_path: Path | None = None) -> dict[str, Any]:
    """Run ``python ARGS`` to completion and return the JSON object it printed on stdout."""
    proc = subprocess.run(
        [PYTHON, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=bench_env(),
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
    if log_path is not None and proc.stderr:
        with open(log_path, "ab") as fh:
            fh.write(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{args[:3]} exited {proc.returncode}: "
            + proc.stderr.decode("utf-8", "replace")[-3000:]
        )
    return json.loads(proc.stdout)
