"""A PostgreSQL schema derived from a SQLite one, and its migration: ``baseline`` turns the
DDL SQLite keeps after a program's migrations (its ``sqlite_master``, added columns
included) into PostgreSQL's words, so a schema is never written twice; ``migrate_steps``
applies the numbered steps a database lacks in the caller's transaction, under a
transaction-scoped advisory lock, so several programs starting together migrate it once.

Nothing here imports a driver: ``migrate_steps`` takes any connection with psycopg's
``execute``.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol


class Connection(Protocol):
    """What ``migrate_steps`` needs of a connection (psycopg's ``Connection`` has it)."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


class SchemaTooNew(Exception):
    """The database was migrated by a newer program: this one refuses to touch it."""


def baseline(migrations: Iterable[Iterable[str]], replace: Mapping[str, str]) -> list[str]:
    """SQLite's schema after ``migrations`` (each a list of statements, run in order on an
    in-memory database) in PostgreSQL's words: each ``replace`` key by its value first (a
    row id as an identity column), then ``INTEGER`` as ``BIGINT``, ``REAL`` as ``DOUBLE
    PRECISION``; tables first, in creation order, then the named indexes."""
    db = sqlite3.connect(":memory:")
    for migration in migrations:
        for statement in migration:
            db.execute(statement)
    rows = db.execute(
        "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
        " ORDER BY type = 'index', rowid"
    ).fetchall()
    db.close()
    out = []
    for (sql,) in rows:
        for old, new in replace.items():
            sql = sql.replace(old, new)
        out.append(re.sub(r"\bREAL\b", "DOUBLE PRECISION", re.sub(r"\bINTEGER\b", "BIGINT", sql)))
    return out


def migrate_steps(
    conn: Connection,
    steps: Mapping[tuple[int, int], Sequence[str]],
    *,
    table: str,
    lock_key: int,
    who: str,
    log: logging.Logger,
) -> tuple[int, int]:
    """Apply every step of ``steps`` past the newest one recorded in ``table`` (created when
    missing: ``version``, ``step``, ``applied_at``), in key order, after taking the advisory
    lock ``lock_key`` (held to the end of the caller's transaction); returns the newest
    ``(version, step)`` the database has. Logs ``event=migrated schema_version=N`` on
    ``log`` (the program's) once for each version applied (its later steps with it;
    ``... step=S``, the last, when only steps past 0 of a version the database had were).
    Raises SchemaTooNew (naming ``who``: "this gate") when the database has a step past
    the newest of ``steps``. The caller commits (psycopg: ``BEGIN``, this, ``COMMIT``)."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key,))
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {table} ("
        " version BIGINT NOT NULL,"
        " step BIGINT NOT NULL DEFAULT 0,"
        " applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),"
        " PRIMARY KEY (version, step))"
    )
    row = conn.execute(
        f"SELECT version, step FROM {table} ORDER BY version DESC, step DESC LIMIT 1"
    ).fetchone()
    current = (int(row[0]), int(row[1])) if row is not None else (0, -1)
    known = max(steps)
    if current[0] > known[0]:
        raise SchemaTooNew(
            f"the database's schema is version {current[0]}; {who} knows up to {known[0]}"
        )
    if current > known:
        raise SchemaTooNew(
            f"the database's schema is version {current[0]} with PostgreSQL's step"
            f" {current[1]}; {who} knows up to step {known[1]}"
        )
    reached: dict[int, tuple[int, int]] = {}  # version: (first, last step applied)
    for key in sorted(k for k in steps if k > current):
        for statement in steps[key]:
            conn.execute(statement)
        conn.execute(f"INSERT INTO {table} (version, step) VALUES (%s, %s)", key)
        version, step = key
        reached[version] = (reached[version][0] if version in reached else step, step)
    for version, (first, last) in reached.items():
        # one line a version: a later step alone (an upgrade of PostgreSQL's own) says which
        log.info("event=migrated schema_version=%d" + (f" step={last}" if first else ""), version)
    return max(current, known)
