"""A throwaway PostgreSQL server for the tests: Debian's own binaries (``initdb``, ``pg_ctl``
from ``/usr/lib/postgresql/<version>/bin``, or ``PG_BINDIR``) on a fresh data folder in a
temporary directory, listening on 127.0.0.1 at a free port and on a Unix socket in that
folder. When the tests run as root the server runs as the unprivileged ``postgres`` user
(``runuser``), as PostgreSQL refuses to run as root.

Nothing here is mocked: ``restart("immediate")`` is a real crash-restart of the server, and
``stop()`` leaves no process behind (the module's tests fail if one stays).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PG_ROOT = Path("/usr/lib/postgresql")
USER = "gate"  # the superuser initdb creates; trust auth on loopback and the socket only


def pg_bindir() -> Path | None:
    """The folder of ``initdb``/``pg_ctl``: ``PG_BINDIR`` when set, else the newest
    ``/usr/lib/postgresql/<version>/bin`` that has both; None when there is none."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    found = sorted(
        (int(p.name), p / "bin")
        for p in PG_ROOT.glob("*")
        if p.name.isdigit() and (p / "bin" / "initdb").exists() and (p / "bin" / "pg_ctl").exists()
    )
    return found[-1][1] if found else None


def psycopg_or_skip() -> Any:
    """The psycopg module, for a test module (or test) on PostgreSQL: under HITL_CI=1 a
    missing driver is an ImportError (a failure: ``.ci/run`` installs it), elsewhere a skip
    (``pytest.importorskip``). A module starts with ``psycopg = psycopg_or_skip()``."""
    if os.environ.get("HITL_CI"):
        import psycopg

        return psycopg
    return pytest.importorskip("psycopg")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PgServer:
    """One PostgreSQL server in its own temporary folder; ``start()`` it, ``stop()`` it.

    ``url(db)`` is a libpq URL for the superuser ``gate`` over TCP; ``database(name)``
    makes an empty database (``template0``), or a copy of another."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="hitl-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        self._migrated = False
        self._databases = 0
        if self._as_postgres:  # the folder is root's 0700: hand it to postgres
            shutil.chown(self.root, user="postgres", group="postgres")

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    def _checked(self, *args: str) -> None:
        done = self._run(*args)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip()}")

    def start(self) -> PgServer:
        """initdb (first time) and start the server; returns when it accepts connections."""
        if not self.data.exists():
            self._checked(
                "initdb", "-D", str(self.data), "-U", USER, "-A", "trust", "-E", "UTF8",
                "--no-locale", "--no-sync",
            )  # fmt: skip
            settings = {
                "listen_addresses": "'127.0.0.1'",
                "port": str(self.port),
                "unix_socket_directories": f"'{self.root}'",
                "fsync": "on",
                "max_connections": "100",
            }
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self._checked("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: end sessions and shut down cleanly; ``immediate``: a
        crash, recovered at the next start). Nothing is done when it is not running."""
        if (self.data / "postmaster.pid").exists():
            self._checked("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "immediate") -> None:
        """Stop the server with ``mode`` and start it again on the same port and data."""
        self.stop(mode)
        self.start()

    def remove(self) -> None:
        """Stop the server and delete its folder."""
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, db: str = "postgres") -> str:
        """The libpq URL of database ``db`` for the superuser over TCP on loopback."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{db}"

    def database(self, name: str, template: str = "template0") -> str:
        """Create the database ``name`` as a copy of ``template`` (default: an empty one);
        return its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.url(name)

    def empty_database(self, prefix: str) -> str:
        """A new empty database named ``<prefix>_<n>``; return its URL."""
        self._databases += 1
        return self.database(f"{prefix}_{self._databases}")

    def migrated_database(self) -> str:
        """A new database at the gate's PostgreSQL schema (``pg_schema.migrate``: a copy of
        a template migrated once per server); return its URL."""
        import psycopg

        from gate.store.pg_schema import migrate

        if not self._migrated:
            with psycopg.connect(self.database("gate_template")) as conn:
                with conn.transaction():
                    migrate(conn)
            self._migrated = True
        self._databases += 1
        return self.database(f"gate_{self._databases}", "gate_template")

    def log(self) -> str:
        """The server's log so far (for a failing test's message)."""
        path = self.root / "log"
        return path.read_text(errors="replace") if path.exists() else ""


def running_server() -> Iterator[PgServer]:
    """A started server for a test module's fixture (``yield from running_server()``), removed
    afterwards; skips where there are no binaries, and fails instead under HITL_CI=1
    (``.ci/run`` installs them)."""
    bindir = pg_bindir()
    if bindir is None:
        if os.environ.get("HITL_CI"):
            pytest.fail("no PostgreSQL binaries in /usr/lib/postgresql/<v>/bin (.ci/run installs)")
        pytest.skip("no PostgreSQL binaries here (apt-get install postgresql, or set PG_BINDIR)")
    pg = PgServer(bindir).start()
    try:
        yield pg
    finally:
        pg.remove()


def pg_fixtures() -> tuple[Any, Any]:
    """Two fixtures for a test module on PostgreSQL: ``server`` (module-scoped:
    ``running_server()``) and ``url`` (a new database at the gate's schema for each test:
    ``migrated_database``). A module takes them as ``server, url = pg_fixtures()``."""

    @pytest.fixture(scope="module", name="server")
    def server() -> Iterator[PgServer]:
        yield from running_server()

    @pytest.fixture(name="url")
    def url(server: PgServer) -> str:
        return server.migrated_database()

    return server, url


# the inbox's backends, for a test parametrized over both (``inbox_backend`` below)
INBOX_BACKENDS = [
    pytest.param("sqlite"),
    pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.e2e]),
]


def inbox_fixtures(scope: str = "function") -> tuple[Any, Any]:
    """Two fixtures for an inbox test module over both backends: ``inbox_server``
    (module-scoped ``running_server()``, started only when a PostgreSQL run asks for it) and
    ``inbox_url`` (None on SQLite; on PostgreSQL a new empty database's URL for each test,
    or each module with ``scope="module"``), parametrized by ``INBOX_BACKENDS``. A module
    takes them as ``inbox_server, inbox_url = inbox_fixtures()``."""

    @pytest.fixture(scope="module", name="inbox_server")
    def inbox_server() -> Iterator[PgServer]:
        yield from running_server()

    @pytest.fixture(name="inbox_url", params=INBOX_BACKENDS, scope=scope)  # type: ignore[call-overload]
    def inbox_url(request: pytest.FixtureRequest) -> str | None:
        if request.param == "sqlite":
            return None
        psycopg_or_skip()
        server: PgServer = request.getfixturevalue("inbox_server")
        return server.empty_database("inbox")

    return inbox_server, inbox_url
