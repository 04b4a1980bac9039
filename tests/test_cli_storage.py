"""``hitl-gate storage migrate`` (gate/cli/storage.py) and the ``--db`` option of ``audit
verify``/``export`` on bad input: one ``Error:`` line naming the option, exit 2, nothing
written, never a password. The move itself, on a real server: tests/test_store_pg_move.py."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gate.cli import main
from gate.store.connection import prepare
from tests.pg_server import free_port

PASSWORD = "s3cret-never-shown-4f1e"


def invoke(args: list[str], env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def one_error_line(result: Result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.fixture
def gate_db(tmp_path: Path) -> Path:
    """An empty gate database, as the gate prepares it."""
    path = tmp_path / "gate.db"
    prepare(path).close()
    return path


def nowhere() -> str:
    """A PostgreSQL URL nothing listens at."""
    return f"postgresql://gate@127.0.0.1:{free_port()}/gate"


def migrate(source: Path | str, target: str, *extra: str, **env: str | None) -> Result:
    return invoke(["storage", "migrate", "--from", str(source), "--to", target, *extra], env)


def test_storage_migrate_missing_source_names_from(tmp_path: Path) -> None:
    result = migrate(tmp_path / "none.db", nowhere())
    assert result.exit_code == 2
    assert one_error_line(result) == f"Error: --from: no database file at {tmp_path / 'none.db'}"


@pytest.mark.parametrize("kind", ["text", "other-sqlite"])
def test_storage_migrate_source_that_is_no_gate_database(tmp_path: Path, kind: str) -> None:
    source = tmp_path / "other.db"
    if kind == "text":
        source.write_text("not a database at all, just text\n" * 100, encoding="utf-8")
    else:
        with sqlite3.connect(source) as conn:
            conn.execute("CREATE TABLE notes (body TEXT)")
    result = migrate(source, nowhere())
    assert result.exit_code == 2
    line = one_error_line(result)
    if kind == "text":
        assert line.startswith(f"Error: --from: cannot read {source}: "), line
    else:
        assert line == f"Error: --from: {source} is not a hitl-gate database"


@pytest.mark.parametrize(
    ("target", "line"),
    [
        ("mysql://gate@127.0.0.1/gate", "--to: not a postgresql://USER@HOST:PORT/DB URL"),
        ("/var/lib/hitl-gate/gate.db", "--to: not a postgresql://USER@HOST:PORT/DB URL"),
        (
            f"postgresql://gate:{PASSWORD}@127.0.0.1/gate",
            "--to: the URL must not hold a password: give it with --password-env",
        ),
        (
            f"postgresql://gate@127.0.0.1/gate?password={PASSWORD}",
            "--to: the URL must not hold a password: give it with --password-env",
        ),
    ],
    ids=["mysql", "a-path", "password-in-url", "password-parameter"],
)
def test_storage_migrate_target_that_is_no_postgres_url(
    gate_db: Path, target: str, line: str
) -> None:
    result = migrate(gate_db, target)
    assert result.exit_code == 2
    assert one_error_line(result) == f"Error: {line}"
    assert PASSWORD not in result.output


def test_storage_migrate_unreachable_server_names_to_and_never_the_password(
    gate_db: Path,
) -> None:
    url = nowhere()
    result = migrate(gate_db, url, "--password-env", "PGMOVE_PW", PGMOVE_PW=PASSWORD)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert line.startswith(f"Error: --to: cannot connect to {url}: "), line
    assert "Connection refused" in line or "connection refused" in line, line
    assert PASSWORD not in result.output


def test_storage_migrate_password_env_not_set(gate_db: Path) -> None:
    result = migrate(gate_db, nowhere(), "--password-env", "PGMOVE_NOT_SET", PGMOVE_NOT_SET=None)
    assert result.exit_code == 2
    assert one_error_line(result) == (
        "Error: --password-env: environment variable PGMOVE_NOT_SET is not set"
    )


def test_storage_migrate_without_psycopg_names_the_extra(
    gate_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as in a base install: no driver
    result = migrate(gate_db, nowhere())
    assert result.exit_code == 2
    assert one_error_line(result) == (
        "Error: hitl-gate storage migrate needs the postgres extra: "
        "pip install 'hitl-gate[postgres]'"
    )


def test_storage_migrate_help_has_an_example() -> None:
    result = invoke(["storage", "migrate", "--help"])
    assert result.exit_code == 0
    assert "Example: hitl-gate storage migrate --from var/hitl-gate.db --to" in result.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["verify"], "Error: give exactly one of -c/--config, --db or --file"),
        (
            ["verify", "--db", "x.db", "--file", "y"],
            "Error: give exactly one of -c/--config, --db or --file",
        ),
        (["export"], "Error: give exactly one of -c/--config or --db"),
        (
            ["export", "-c", "c.yaml", "--password-env", "X"],
            "Error: --password-env: only with --db (a config names its storage.password_env)",
        ),
        (
            ["verify", "--db", "x.db", "--password-env", "X"],
            "Error: --password-env: only with a postgresql:// URL in --db",
        ),
    ],
    ids=["verify-none", "verify-two", "export-none", "export-config-password", "sqlite-pw"],
)
def test_audit_db_option_bad_use_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], line: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(["audit", *args], env={"HITL_GATE_CONFIG": None, "X": "x"})
    assert result.exit_code in (1, 2)
    assert one_error_line(result) == line


def test_audit_db_missing_sqlite_file_is_named(tmp_path: Path) -> None:
    result = invoke(["audit", "verify", "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 2
    assert one_error_line(result) == f"Error: no database at {tmp_path / 'none.db'}"


def test_audit_db_reads_a_sqlite_file_too(gate_db: Path) -> None:
    result = invoke(["audit", "export", "--db", str(gate_db)])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")


def test_storage_migrate_password_from_a_credential_file(gate_db: Path, tmp_path: Path) -> None:
    """As the gate reads its secrets: the variable unset, its file in $CREDENTIALS_DIRECTORY
    (systemd's LoadCredential=) is read, so the error is the server's, not the password's."""
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "PGMOVE_PW").write_text(PASSWORD + "\n", encoding="utf-8")
    url = nowhere()
    env: dict[str, str | None] = {
        "PGMOVE_PW": None,
        "CREDENTIALS_DIRECTORY": str(tmp_path / "creds"),
    }
    result = migrate(gate_db, url, "--password-env", "PGMOVE_PW", **env)
    assert result.exit_code == 2
    assert one_error_line(result).startswith(f"Error: --to: cannot connect to {url}: ")
    assert PASSWORD not in result.output
