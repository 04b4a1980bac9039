"""The ``cluster`` section's PostgreSQL setups: N gates (``storage.url``) on one database of a
throwaway server the bench starts itself (``tests.pg_server.PgServer``: Debian's binaries,
``fsync`` on, as for the tests), reached directly (one gate) or through the balancer.

The server is started at the first setup that needs it and removed when the section ends
(``Postgres.remove``); each started setup gets a new empty database, which its first gate
migrates. Its postmaster is one of the setup's database process trees: every PostgreSQL
process (the gates' backends, the WAL writer, the checkpointer, ...) counts in the CPU per
decision, apart from the gates' own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from bench import cpu
from bench.common import OPERATOR_IDS, Daemon, bench_env, write_config
from tests.balancer import Balancer, haproxy
from tests.pg_server import PgServer, pg_bindir

if TYPE_CHECKING:
    from bench.cluster import Running
    from bench.run import Bench

# a step with a reminder every second (and a long timeout): the fail-over figures watch
# which gate sends the next one after the lease holder was killed
FOLLOWED_STEP = "fu"
FOLLOWED = {
    "name": FOLLOWED_STEP,
    "quorum": 1,
    "approvers": OPERATOR_IDS,
    "timeout": "1h",
    "remind_after": "1s",
    "remind_every": "1s",
}


class Postgres:
    """The section's throwaway PostgreSQL server, started at first use."""

    def __init__(self) -> None:
        self.server: PgServer | None = None
        self._databases = 0

    def unavailable(self) -> str | None:
        """Why no PostgreSQL setup can run here, or None."""
        if pg_bindir() is None:
            return "no PostgreSQL binaries (apt-get install postgresql, or set PG_BINDIR)"
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return "psycopg is not installed (pip install 'hitl-gate[postgres]')"
        return None

    def new_database(self) -> str:
        """A new empty database on the server (started now if needed); its URL."""
        if self.server is None:
            bindir = pg_bindir()
            assert bindir is not None
            self.server = PgServer(bindir).start()
        self._databases += 1
        return self.server.database(f"bench_{self._databases}")

    def postmaster(self) -> int:
        """The running server's postmaster pid (every PostgreSQL process descends from it)."""
        assert self.server is not None
        return int((self.server.data / "postmaster.pid").read_text().split()[0])

    def scalar(self, url: str, sql: str) -> Any:
        """The first column of the first row of ``sql`` on ``url``."""
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
        return None if row is None else row[0]

    def remove(self) -> None:
        """Stop the server and delete its folder (nothing when it never started)."""
        if self.server is not None:
            self.server.remove()
            self.server = None


def pg_config(directory: Path, relay_url: str, url: str) -> Path:
    """The bench's gate config (``bench.common.write_config``) on the database ``url``, with
    the reminding step ``FOLLOWED`` added."""
    path = write_config(directory, relay_url, directory / "unused.db")
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["storage"] = {"url": url}
    config["pipelines"][0]["steps"].append(FOLLOWED)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def kill9(daemon: Daemon) -> None:
    """SIGKILL a gate's whole process tree (the daemon and its writer process) and reap the
    daemon: what a crashed host does to it."""
    for pid in cpu.tree(daemon.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert daemon.proc is not None
    daemon.proc.wait(30)


def hostport(url: str) -> tuple[str, int]:
    """``(host, port)`` of a URL."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return parts.hostname, parts.port


def balancer_for(gates: list[Daemon]) -> Balancer:
    """A started haproxy in front of the gates' decision listeners, its health checks on
    their API listeners (the callback listener has no /healthz); every upstream up."""
    upstreams = [(*hostport(g.callback_url), hostport(g.api_url)[1]) for g in gates]
    balancer = Balancer(upstreams).start()
    try:
        balancer.wait_all_up()
    except BaseException:
        balancer.remove()
        raise
    return balancer


@dataclass
class PgGates:
    """``gates`` gates on one new database of ``postgres``; through the balancer when
    ``balanced``."""

    postgres: Postgres
    gates: int
    balanced: bool
    backend: str = "postgresql"
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"pg-{self.gates}" + ("-lb" if self.balanced else "")

    def unavailable(self) -> str | None:
        if self.balanced and haproxy() is None:
            return "haproxy is not installed (apt-get install haproxy)"
        return self.postgres.unavailable()

    def start(self, bench: Bench, directory: Path, relay_url: str) -> Running:
        from bench.cluster import Running

        url = self.postgres.new_database()
        daemons: list[Daemon] = []
        balancer: Balancer | None = None
        try:
            for n in range(self.gates):  # one after the other: the first one migrates
                where = directory / f"g{n}"
                where.mkdir(parents=True, exist_ok=True)
                daemon = Daemon(pg_config(where, relay_url, url), where / "gate.log", bench_env())
                daemons.append(daemon)
                daemon.start()
            if self.balanced:
                balancer = balancer_for(daemons)
        except BaseException:
            for daemon in daemons:
                daemon.kill()
            raise

        def stop() -> list[int]:
            if balancer is not None:
                balancer.remove()
            return [daemon.stop() for daemon in daemons]

        first = daemons[0]
        return Running(
            decisions_url=(
                balancer.url() + urllib.parse.urlsplit(first.callback_url).path
                if balancer
                else first.callback_url
            ),
            api_urls=[daemon.api_url for daemon in daemons],
            gate_pids=[daemon.pid for daemon in daemons],
            undelivered=lambda: int(
                self.postgres.scalar(url, "SELECT count(*) FROM outbox WHERE delivered_at IS NULL")
            ),
            stop=stop,
            balancer_pid=balancer.pid if balancer else None,
            db_pids=[self.postgres.postmaster()],
            daemons=daemons,
            balancer=balancer,
        )
