"""Which database an offline command reads or writes: the one a config names
(``storage.path``, or ``storage.url`` with its ``storage.password_env``), or one given on
the command line (``--db``: a SQLite file or a ``postgresql://`` URL, ``--password-env``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import click

from gate.cli import fail, missing_extra, options

if TYPE_CHECKING:
    from gate.store.readonly import Database

F = TypeVar("F", bound=Callable[..., Any])

PASSWORD_HELP = (
    "Env var holding the PostgreSQL user's password, or the name of its file in "
    "$CREDENTIALS_DIRECTORY, as for the gate's secrets (default: libpq's own PGPASSWORD or "
    "~/.pgpass). Never printed or logged."
)


def database_options(verb: str) -> Callable[[F], F]:
    """``--db`` (a SQLite file or a PostgreSQL URL, instead of the config's) and
    ``--password-env``; the help of ``--db`` starts with ``verb``."""
    return options(
        click.option(
            "--db",
            "db",
            default=None,
            metavar="PATH|URL",
            help=f"{verb} this database instead of the config's: a SQLite file or "
            "postgresql://USER@HOST:PORT/DB.",
        ),
        click.option(
            "--password-env", "password_env", default=None, metavar="VAR", help=PASSWORD_HELP
        ),
    )


def password(option: str, var: str | None) -> str | None:
    """The password in the environment variable ``var`` (named by ``option``), or in its
    credential file in ``$CREDENTIALS_DIRECTORY``, as the gate reads its secrets; None when
    no variable is named. Exits 2 naming ``option`` when it is unset or unusable."""
    from gate.config.secrets import CREDENTIALS_DIRECTORY, read_secret

    if var is None:
        return None
    credentials = os.environ.get(CREDENTIALS_DIRECTORY) or None
    value, error = read_secret(option, var, os.environ, credentials)
    if value is None:
        fail(str(error), 2)
    return value


def postgres(option: str, url: str, password_env: str | None, needed_by: str = "") -> Any:
    """The PostgreSQL database ``url`` given with ``option`` (a ``PgTarget``); exits 2 with
    one line naming ``option`` when it is no ``postgresql://`` URL or holds a password
    (never shown: it comes from ``--password-env`` or libpq's own ``PGPASSWORD``/
    ``~/.pgpass``), or naming the extra to install (for ``needed_by``, default ``option``)
    without the driver."""
    from gate.postgres.target import PgTarget
    from gate.store.pg_read import is_url

    try:
        parts = urlsplit(url)
        secret = parts.password is not None or "password=" in parts.query
    except ValueError:
        secret = False
    if not is_url(url):
        fail(f"{option}: not a postgresql://USER@HOST:PORT/DB URL", 2)
    if secret:
        fail(f"{option}: the URL must not hold a password: give it with --password-env", 2)
    _driver(needed_by or f"{option} postgresql://")
    return PgTarget(url, password("--password-env", password_env))


def _driver(needed_by: str) -> None:
    """Exit 2 with one line naming the postgres extra when it is not installed."""
    missing = missing_extra("postgres", needed_by)
    if missing is not None:
        fail(missing, 2)


def given(db: str, password_env: str | None) -> Database:
    """The database of ``--db``: a ``postgresql://`` URL, else a SQLite file."""
    from gate.store.pg_read import is_url

    if is_url(db):
        database: Database = postgres("--db", db, password_env)
        return database
    if password_env is not None:
        fail("--password-env: only with a postgresql:// URL in --db", 2)
    return Path(db)


def configured(config: Any) -> Database:
    """The database ``config`` names: ``storage.url`` (its password in the variable
    ``storage.password_env``) when set, else the SQLite file ``storage.path``."""
    from gate.postgres.target import PgTarget

    storage = config.storage
    if not storage.on_postgres:
        path: Path = storage.path
        return path
    _driver("storage.url (PostgreSQL)")
    return PgTarget(storage.url, password("storage.password_env", storage.password_env))
