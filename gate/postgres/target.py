"""Where a PostgreSQL database is (``PgTarget``: a libpq URL, the password apart) and a
connection to it (``connect``) with the session settings every program of the project uses:
timeouts, TCP keepalives, ``application_name`` ``<program>/<role>/<instance>``.

psycopg is imported lazily, inside ``connect``: the base install (without the ``postgres``
extra) imports this module, and a program on SQLite never loads the driver.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from gate.errors import Unavailable
from gate.postgres.connection import PgConnection, as_sqlite_error

# Session settings of every connection (ms): a writer frozen or cut off while it holds the
# head lock loses it after IDLE_IN_TRANSACTION_MS (the other gates go on); a gate waiting
# for the lock longer than LOCK_TIMEOUT_MS answers 503 instead of hanging: twice as long, so
# a gate waiting on a frozen one gets the lock when the server ends the frozen session,
# rather than timing out with it (a storage fault: its /healthz 503, drained by a balancer);
# no statement runs longer than STATEMENT_TIMEOUT_MS.
IDLE_IN_TRANSACTION_MS = 5_000
LOCK_TIMEOUT_MS = 10_000
STATEMENT_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 5
# PostgreSQL >= 14: how often (ms) a session running a statement checks that its client is
# still there (a gate gone mid-statement does not hold locks until the statement ends)
CLIENT_CHECK_MS = 2_000
# TCP keepalives (s): a peer gone without a FIN is noticed within about 10 + 3 * 5 s
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
NEEDS_EXTRA = "storage.url (PostgreSQL) needs the postgres extra: pip install 'hitl-gate[postgres]'"


def _instance() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class PgTarget:
    """A PostgreSQL database: ``url`` (libpq's URL, without a password: config
    ``storage.url``), ``password`` (from ``storage.password_env``; never shown) and
    ``instance``, this program's name in ``application_name``
    (``<program>/<role>/<instance>``: ``pg_stat_activity`` tells the gates and inboxes
    apart); by default ``host:pid``."""

    url: str
    password: str | None = field(default=None, repr=False)
    instance: str = field(default_factory=_instance)

    def __str__(self) -> str:
        return self.url  # refused with a password in it (gate.config.storage)


def connect(
    target: PgTarget, role: str, *, read_only: bool = False, program: str = "hitl-gate"
) -> PgConnection:
    """A new autocommit connection to ``target`` as ``PgConnection``, with
    ``application_name`` ``<program>/<role>/<instance>``, the session timeouts above, TCP
    keepalives and, with ``read_only``, ``default_transaction_read_only``. Options given in
    the URL's ``options`` come first. Raises ``PgOperationalError`` (a storage fault) when
    the server cannot be reached, Unavailable naming the extra when psycopg is missing or
    the parameter libpq refuses in the URL."""
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise Unavailable("storage_unavailable", NEEDS_EXTRA) from None

    try:
        params: dict[str, Any] = conninfo_to_dict(target.url)
    except psycopg.Error as exc:  # the config refuses these; libpq has the last word
        reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise Unavailable("storage_unavailable", f"storage.url: {reason}") from None
    settings: dict[str, object] = {
        "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION_MS,
        "lock_timeout": LOCK_TIMEOUT_MS,
        "statement_timeout": STATEMENT_TIMEOUT_MS,
    }
    if read_only:
        settings["default_transaction_read_only"] = "on"
    options = " ".join(f"-c {name}={value}" for name, value in settings.items())
    given = params.get("options")
    params["options"] = f"{given} {options}" if given else options
    params["application_name"] = f"{program}/{role}/{target.instance}"[:63]
    params.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    params.update(KEEPALIVES)
    if target.password is not None:
        params["password"] = target.password
    try:
        driver = psycopg.connect(autocommit=True, **params)
    except psycopg.Error as exc:
        raise as_sqlite_error(exc) from None  # its cause would repeat the parameters
    conn = PgConnection(driver)
    if driver.info.server_version >= 140000:
        try:
            conn.execute(f"SET client_connection_check_interval = {CLIENT_CHECK_MS}")
        except sqlite3.Error:
            conn.close()
            raise
    return conn
