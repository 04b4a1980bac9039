"""A throwaway load balancer for the tests and the bench: Debian's ``haproxy`` with a config
written into a temporary folder, listening on 127.0.0.1 at a free port, in front of gates.

Round-robin over the upstreams, an active health check ``GET /healthz`` on each of them every
200 ms (down after 2 failures, up again after 1 success), and ``retries`` with ``option
redispatch``: a request whose connection to a dead gate fails is sent to another one at once,
without waiting for the health check to notice. Client and server timeouts of 310 s, above
the API's longest ``?wait=``. docs/operating.md's haproxy example carries the same lines
(tests/test_balancer.py checks it). Only a failed *connection* is retried (the
request never reached a gate); a request a gate took and died on is answered 502, never
sent twice (exactly-once is the gate's promise, not the balancer's; the client retries). So
is a request whose connection the kernel accepted in the instant the gate was dying (its
listening socket not closed yet): measured, a request sent right after SIGKILL, before the
gate was reaped, was answered 502; one sent once it was gone went to the other gate.

Every answer names the gate that served it in ``X-Served-By`` (``g0``, ``g1``, ... in the
order of ``upstreams``).

It runs in the foreground as a child of this process (as the current user: no privileged
port, no ``user`` directive, so root is fine) and ``stop()`` leaves no process behind.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.pg_server import free_port

SERVED_BY = "X-Served-By"
CHECK_INTERVAL_MS = 200

# (host, port) of a gate listener; a third item is the port its health check goes to when
# that listener has no /healthz (a gate's decision callback: /healthz is on its API listener)
Upstream = tuple[str, int] | tuple[str, int, int]


def haproxy() -> str | None:
    """The ``haproxy`` executable (PATH, then /usr/sbin), or None when it is not installed."""
    found = shutil.which("haproxy")
    if found:
        return found
    return "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None


def config_text(port: int, upstreams: Sequence[Upstream], stats_socket: Path) -> str:
    """The haproxy config: a frontend on 127.0.0.1:``port``, one backend over ``upstreams``
    (servers ``g0``, ``g1``, ...), the admin socket at ``stats_socket``."""
    servers = []
    for index, upstream in enumerate(upstreams):
        host, listen = upstream[0], upstream[1]
        check = f" port {upstream[2]}" if len(upstream) == 3 else ""
        servers.append(f"    server g{index} {host}:{listen} check{check}\n")
    return (
        "global\n"
        "    maxconn 4096\n"
        f"    stats socket {stats_socket} mode 600 level admin\n"
        "defaults\n"
        "    mode http\n"
        "    timeout connect 1s\n"
        # above the API's longest ?wait= (300 s): a long-poll is never cut by haproxy's 504
        "    timeout client 310s\n"
        "    timeout server 310s\n"
        "    timeout check 1s\n"
        # a connection refused or timed out is tried again, each time on another server
        "    retries 3\n"
        "    retry-on conn-failure\n"
        "    option redispatch 1\n"
        "frontend gates_in\n"
        f"    bind 127.0.0.1:{port}\n"
        "    default_backend gates\n"
        "backend gates\n"
        "    balance roundrobin\n"
        "    option httpchk GET /healthz\n"
        "    http-check expect status 200\n"
        f"    http-response set-header {SERVED_BY} %s\n"
        f"    default-server inter {CHECK_INTERVAL_MS}ms fastinter {CHECK_INTERVAL_MS}ms"
        f" downinter {CHECK_INTERVAL_MS}ms fall 2 rise 1\n" + "".join(servers)
    )


class Balancer:
    """One haproxy in its own temporary folder; ``start()`` it, ``stop()`` it, ``remove()`` it.

    ``url()`` is its base URL; ``servers()`` the health of each upstream as haproxy sees it
    (``{"g0": "UP", "g1": "DOWN", ...}``, read from its admin socket)."""

    def __init__(self, upstreams: Sequence[Upstream], executable: str | None = None) -> None:
        if not upstreams:
            raise ValueError("a balancer needs at least one upstream")
        found = executable or haproxy()
        if found is None:
            raise RuntimeError("haproxy is not installed (apt-get install haproxy)")
        self.executable = found
        self.upstreams = list(upstreams)
        self.root = Path(tempfile.mkdtemp(prefix="hitl-lb-"))
        self.config = self.root / "haproxy.cfg"
        self.stats_socket = self.root / "admin.sock"
        self.log_path = self.root / "haproxy.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """haproxy's process id (it runs in the foreground: one process)."""
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> Balancer:
        """Write the config, check it (``haproxy -c``), start haproxy; returns when it accepts
        connections on its port (picking another port up to twice when the free one was taken
        meanwhile). A haproxy that does not get there is stopped."""
        self.config.write_text(
            config_text(self.port, self.upstreams, self.stats_socket), encoding="utf-8"
        )
        check = subprocess.run(
            [self.executable, "-c", "-q", "-f", str(self.config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c refused the config: {check.stderr.strip()}")
        for _ in range(3):  # another process may take the free port first: pick again
            self._spawn()
            if self._wait_ready(timeout):
                return self
            self.port = free_port()
        raise RuntimeError(f"haproxy did not start three times:\n{self.log()}")

    def _spawn(self) -> None:
        self.config.write_text(
            config_text(self.port, self.upstreams, self.stats_socket), encoding="utf-8"
        )
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.executable, "-db", "-f", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.root,
            )

    def _wait_ready(self, timeout: float) -> bool:
        """True once haproxy answers on its admin socket (its listener is bound by then);
        False when it exited (a port taken); raises when it hangs past ``timeout``."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                if "cannot bind" in self.log() or "Address already in use" in self.log():
                    return False
                raise RuntimeError(f"haproxy exited {self.proc.returncode}:\n{self.log()}")
            try:
                self.servers()
                return True
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"haproxy did not start within {timeout} s:\n{self.log()}")
            time.sleep(0.02)

    def url(self) -> str:
        """The balancer's base URL (``http://127.0.0.1:PORT``)."""
        return f"http://127.0.0.1:{self.port}"

    def admin(self, command: str) -> str:
        """Send one command to haproxy's admin socket (``show stat``, ...); its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(self.stats_socket))
            sock.sendall(command.encode("ascii") + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")

    def stats(self) -> list[dict[str, str]]:
        """haproxy's ``show stat`` as one dict per row: the frontend, each server (``type``
        ``2``; ``svname`` ``g0``, ...) and the backend (``svname`` ``BACKEND``), with its
        counters (``stot`` requests, ``wretr`` retries, ``wredis`` redispatches, ...)."""
        lines = self.admin("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]

    def servers(self) -> dict[str, str]:
        """Each upstream's state as haproxy's health checks see it: ``UP``, ``DOWN``, or a
        transition (``UP 1/2``: one failed check of the two that take it down)."""
        return {row["svname"]: row["status"] for row in self.stats() if row["type"] == "2"}

    def redispatches(self) -> int:
        """How many requests the backend sent to another gate after a failed connection."""
        return sum(int(row["wredis"] or 0) for row in self.stats() if row["svname"] == "BACKEND")

    def wait_all_up(self, timeout: float = 60.0) -> None:
        """Return once every upstream has passed a health check (haproxy starts them as
        ``UP 1/2``: up, but one failed check from down); raises after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while set((states := self.servers()).values()) != {"UP"}:
            if time.monotonic() > deadline:
                raise RuntimeError(f"upstreams not all up after {timeout} s: {states}")
            time.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop haproxy (SIGTERM, SIGKILL after ``timeout``) and reap it; nothing is done
        when it is not running."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)

    def remove(self) -> None:
        """Stop haproxy and delete its folder."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        """What haproxy wrote so far (for a failing test's message)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
