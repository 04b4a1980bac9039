"""``hitl-gate storage``: where a gate keeps its state; ``storage migrate`` moves a SQLite
gate into an empty PostgreSQL database and verifies the copy."""

from __future__ import annotations

import click

from gate.cli import fail, main
from gate.cli.databases import PASSWORD_HELP, postgres
from gate.errors import GateError, Unavailable


@main.group()
def storage() -> None:
    """Where the gate keeps its state: move a SQLite gate to PostgreSQL.

    Example: hitl-gate storage migrate --from var/hitl-gate.db --to
    postgresql://hitl@db.example.com:5432/hitl --password-env HITL_DB_PASSWORD
    """


@storage.command("migrate")
@click.option(
    "--from",
    "source",
    required=True,
    type=click.Path(dir_okay=False),
    help="The gate's SQLite database (storage.path). No gate may run on it meanwhile.",
)
@click.option(
    "--to",
    "target",
    required=True,
    metavar="URL",
    help="The PostgreSQL database to move it into, empty: postgresql://USER@HOST:PORT/DB.",
)
@click.option("--password-env", "password_env", default=None, metavar="VAR", help=PASSWORD_HELP)
def storage_migrate(source: str, target: str, password_env: str | None) -> None:
    """Copy a SQLite gate's whole state and audit log into an empty PostgreSQL database.

    In one transaction: the gate's schema, every table row by row (the audit entries byte for
    byte), the identity sequences past the copied ids and the chain's head. The source is
    locked as a running gate locks it (refused while one runs on it); a database with any
    row in a gate table is refused and left unchanged. Then the copy is verified: the audit
    chain and every request's rows against it, and its head equal to the source's, so
    `audit verify --expect-head` with a head logged before the move passes on the new
    database. Prints one line: rows per table and the head. Point storage.url at the new
    database before starting the gate again.

    The target must be UTF8 in the C collation; a URL holding a password is refused (give
    it with --password-env, or libpq's PGPASSWORD or ~/.pgpass).

    Exit 0 moved and verified, 1 the copy failed or does not verify, 2 usage (one line
    naming the option: a missing file, no gate database or one in use for --from; no
    postgresql:// URL, an unreachable server or a database that is not empty for --to).

    Example: hitl-gate storage migrate --from var/hitl-gate.db --to
    'postgresql://hitl@db.example.com:5432/hitl?sslmode=verify-full' --password-env
    HITL_DB_PASSWORD
    """
    from pathlib import Path

    from gate.audit.verify import copy_problem
    from gate.store.pg_move import MoveError, move

    database = postgres("--to", target, password_env, "hitl-gate storage migrate")
    try:
        moved = move(Path(source), database)
    except MoveError as exc:
        fail(f"{exc.option}: {exc.message}" if exc.option else exc.message, 2 if exc.option else 1)
    except Unavailable as exc:  # the server: unreachable, refused us
        fail(f"--to: {exc.message}", 2)
    except GateError as exc:  # the driver, found above, would not import
        fail(exc.message, 2)
    try:
        problem = copy_problem(database, moved.head)
    except GateError as exc:
        fail(f"the copy in {database} could not be read back: {exc.message}")
    if problem is not None:
        fail(
            f"the copy in {database} does not verify: {problem} (it stays there: check the"
            f" source with `hitl-gate audit verify --db {source}`, drop the copy, move again)"
        )
    rows = ", ".join(f"{table} {n}" for table, n in moved.tables)
    where = f"head seq {moved.head[0]} hash {moved.head[1]}" if moved.head else "empty audit log"
    click.echo(f"moved {source} to {database}: {rows}; {where}; the copy verifies")
