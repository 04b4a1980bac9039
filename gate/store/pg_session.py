"""The dedicated PostgreSQL sessions of a gate's cluster work (heartbeat and lease; the change
feed's listener): psycopg 3 async connections in autocommit mode, named
``hitl-gate/<role>/<instance id>`` in ``pg_stat_activity``, with TCP keepalives and
timeouts; driver errors raised as Unavailable 503 ``storage_unavailable``.

psycopg is an optional dependency (the ``postgres`` extra): it is imported when ``connect``
is called, never when this module is, so a SQLite gate runs without it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from gate.errors import Unavailable

# the database's clock in unix ms, the one clock of every gate on the database
DB_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 5000
EXTRA = "postgres"  # pip install 'hitl-gate[postgres]'


class MissingDriver(Unavailable):
    """psycopg is not installed: the message names the extra that brings it."""


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise MissingDriver(
            "storage_unavailable",
            f"PostgreSQL storage needs psycopg: pip install 'hitl-gate[{EXTRA}]'",
        ) from None
    return psycopg


class unavailable:
    """Raise a driver error (``psycopg.Error``, told by its module) as Unavailable 503
    ``storage_unavailable`` naming ``what`` failed; anything else as it is. The message is
    the server's or the driver's, which never holds the password."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and type(exc).__module__.startswith("psycopg"):
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise Unavailable("storage_unavailable", f"{self.what}: {detail}") from exc


async def connect(url: str, role: str, instance_id: str, password: str | None = None) -> Any:
    """A new ``psycopg.AsyncConnection`` to ``url`` (a libpq URL without a password) with
    ``password`` (or none: libpq's own ways, e.g. a ``.pgpass`` file), in autocommit mode,
    named ``hitl-gate/<role>/<instance_id>``; raises MissingDriver without psycopg,
    Unavailable when the server cannot be reached within CONNECT_TIMEOUT_S."""
    psycopg = _psycopg()
    secret = {} if password is None else {"password": password}
    with unavailable(f"connecting the {role} session"):
        conn = await psycopg.AsyncConnection.connect(
            url,
            **secret,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=f"hitl-gate/{role}/{instance_id}"[:63],
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
        )
    return conn


async def close_quietly(conn: Any) -> None:
    """Close ``conn`` (a connection from ``connect``, or None); a broken one closes too."""
    if conn is None:
        return
    try:
        await conn.close()
    except Exception:  # noqa: BLE001 - the connection is being dropped: nothing to report
        return
