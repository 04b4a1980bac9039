"""The ``storage`` section (gate/config/storage.py): a SQLite ``path`` (the default) or a
PostgreSQL ``url`` whose password comes from ``password_env``; exactly one of the two, and
every mistake one line naming its key (the URL itself never echoed: it may hold a password)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gate.config import load, load_config
from gate.config.storage import LIBPQ_PARAMS
from gate.errors import ConfigError
from tests.pg_server import psycopg_or_skip
from tests.test_config import (
    ENV,
    _commented_example,
    config_errors,
    example_data,
    load_errors,
    write,
)

URL = "postgresql://gate@db.example.com:5432/hitl?sslmode=verify-full&connect_timeout=5"
PASSWORD = "db-password-value-4f1e9c2a7b3d8e60"


def with_storage(tmp_path: Path, storage: Any) -> Path:
    data = example_data()
    data["storage"] = storage
    return write(tmp_path, data)


def test_storage_url_selects_postgres_and_passes_libpq_parameters(tmp_path: Path) -> None:
    config = load_config(with_storage(tmp_path, {"url": URL, "password_env": "HITL_DB_PASSWORD"}))

    assert config.storage.on_postgres
    assert (config.storage.url, config.storage.path) == (URL, None)
    assert config.storage.password_env == "HITL_DB_PASSWORD"
    assert config.storage.describe() == URL


def test_storage_path_stays_sqlite(tmp_path: Path) -> None:
    config = load_config(with_storage(tmp_path, {"path": "var/gate.db"}))

    assert not config.storage.on_postgres
    assert config.storage.sqlite_file() == tmp_path / "var" / "gate.db"


def test_storage_on_postgres_has_no_sqlite_file(tmp_path: Path) -> None:
    config = load_config(with_storage(tmp_path, {"url": URL}))

    with pytest.raises(ConfigError, match=r"^storage: this command reads a SQLite database"):
        config.storage.sqlite_file()


@pytest.mark.parametrize(
    ("storage", "error"),
    [
        pytest.param(
            {"path": "gate.db", "url": URL},
            "storage: give either path (SQLite) or url (PostgreSQL), not both",
            id="both",
        ),
        pytest.param(
            {}, "storage: give path (a SQLite file) or url (a postgresql:// URL)", id="neither"
        ),
        pytest.param(
            {"url": None, "password_env": "HITL_DB_PASSWORD"},
            "storage: give path (a SQLite file) or url (a postgresql:// URL)",
            id="null-url",
        ),
        pytest.param(
            {"url": URL, "password_env": "hitl-db-pw-s3cr3t-xyz0123456789"},
            "storage.password_env: looks like a secret value, not the name of an environment"
            " variable (not shown; put the secret in a variable, e.g. HITL_DB_PASSWORD, and"
            " its name here)",
            id="secret-for-variable-name",
        ),
        pytest.param(
            {"path": "gate.db", "password_env": "HITL_DB_PASSWORD"},
            "storage: password_env goes with url (PostgreSQL); SQLite has no password",
            id="password-for-sqlite",
        ),
        pytest.param(
            {"url": "postgresql://gate:hunter2-secret@db/hitl"},
            "storage.url: must not hold a password; name the environment variable that holds"
            " it in storage.password_env",
            id="password-in-url",
        ),
        pytest.param(
            {"url": "postgresql://gate@db/hitl?sslmode=require&password=hunter2-secret"},
            "storage.url: must not hold a password; name the environment variable that holds"
            " it in storage.password_env",
            id="password-parameter",
        ),
        pytest.param(
            {"url": "postgresql://gate@db/hitl?PASSWORD=hunter2-secret"},
            "storage.url: must not hold a password; name the environment variable that holds"
            " it in storage.password_env",
            id="password-parameter-upper-case",
        ),
        pytest.param(
            {"url": "postgresql://gate@db/hitl?scram_client_key=hunter2-secret"},
            "storage.url: must not hold a password; name the environment variable that holds"
            " it in storage.password_env",
            id="secret-parameter",
        ),
        *(
            pytest.param(
                {"url": f"postgresql://gate@db/hitl?sslmode=require&{key}=1"},
                f'storage.url: invalid URI query parameter "{key}" (libpq\'s, such as'
                " sslmode, connect_timeout, application_name)",
                id=f"unknown-parameter-{key}",
            )
            for key in ("sslmod", "x", "SSLMODE")
        ),
        *(
            pytest.param(
                {"url": f"postgresql://gate@db/hitl?application_name={escape}"},
                "storage.url: not a valid postgresql:// URL: % must start %XX (two hex digits,"
                " not %00)",
                id=f"bad-escape-{escape}",
            )
            for escape in ("%zz", "%00", "a%")
        ),
        pytest.param(
            {"url": "mysql://gate@db/hitl"},
            "storage.url: must be a postgresql:// URL (a SQLite file is storage.path)",
            id="other-scheme",
        ),
        pytest.param(
            {"url": "postgresql://gate@db:99999/hitl"},
            "storage.url: not a valid postgresql:// URL",
            id="bad-port",
        ),
        pytest.param(
            {"url": "postgresql://gate@db/hitl?sslmode"},
            "storage.url: not a valid postgresql:// URL",
            id="bad-query",
        ),
        pytest.param(
            {"url": "postgresql://gate@db/ hitl"},
            "storage.url: URL must not contain whitespace",
            id="whitespace",
        ),
        pytest.param(
            {"url": URL, "password_env": "1-bad"},
            "storage.password_env: '1-bad' is not an environment variable name"
            " (letters, digits and _)",
            id="bad-variable-name",
        ),
    ],
)
def test_storage_mistakes_are_one_line_naming_the_key(
    tmp_path: Path, storage: dict[str, Any], error: str
) -> None:
    errors = config_errors(with_storage(tmp_path, storage))

    assert errors == [error]
    assert not any("hunter2" in line for line in errors)


def test_storage_url_parameters_are_every_one_the_installed_libpq_knows() -> None:
    pq = psycopg_or_skip().pq
    known = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
    assert known - LIBPQ_PARAMS - {"password", "sslpassword", "oauth_client_secret",
                                   "scram_client_key", "scram_server_key"} == set()  # fmt: skip


def test_storage_error_does_not_hide_the_others(tmp_path: Path) -> None:
    data = example_data()
    data["storage"] = {"url": "postgresql://gate:hunter2-secret@db/hitl"}
    data["api"]["max_draft_bytes"] = 0

    errors = config_errors(write(tmp_path, data))

    assert errors[0].startswith("api.max_draft_bytes: ")
    assert errors[1].startswith("storage.url: must not hold a password")
    assert len(errors) == 2


def test_storage_password_is_a_secret_from_its_variable(tmp_path: Path) -> None:
    path = with_storage(tmp_path, {"url": URL, "password_env": "HITL_DB_PASSWORD"})

    _, secrets = load(path, ENV | {"HITL_DB_PASSWORD": PASSWORD})
    assert secrets.storage_password == PASSWORD
    assert PASSWORD not in repr(secrets)
    _, without = load(with_storage(tmp_path / "b", {"url": URL}), ENV)
    assert without.storage_password is None

    assert load_errors(path, ENV) == [
        "storage.password_env: environment variable HITL_DB_PASSWORD is not set"
    ]
    reused = ENV | {"HITL_DB_PASSWORD": ENV["HITL_API_TOKEN"]}
    assert load_errors(path, reused) == [
        "storage.password_env: HITL_DB_PASSWORD has the same value as HITL_API_TOKEN"
        " (api.token_env); each secret must be distinct"
    ]


def test_storage_example_commented_out_loads(tmp_path: Path) -> None:
    config = load_config(with_storage(tmp_path, _commented_example()["storage"]))

    assert config.storage.on_postgres and config.storage.password_env == "HITL_DB_PASSWORD"
