"""``hitl-gate inbox check-config``: every error one line with its YAML path;
secrets only from the environment."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gate.cli import main
from gate.inbox.config import load_inbox, relying_party
from tests.support import SECRET

GOOD: dict[str, Any] = {
    "listen": "127.0.0.1:8095",
    "database": "var/inbox.db",
    "gate": {"secret_env": "HITL_RELAY_SECRET", "callback_url": "http://127.0.0.1:8089"},
}


def check(tmp_path: Path, data: Any, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    path = tmp_path / "inbox.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data, "utf-8")
    runner = CliRunner()
    result = runner.invoke(
        main,
        ["inbox", "check-config", "-c", str(path)],
        env={"HITL_RELAY_SECRET": SECRET, **(env or {})},
        catch_exceptions=False,
    )
    return result.exit_code, result.stdout, result.stderr


def test_inbox_check_config_ok_and_defaults(tmp_path: Path) -> None:
    code, out, err = check(tmp_path, GOOD)

    assert (code, err) == (0, "")
    assert out.endswith(f"ok (listen 127.0.0.1:8095, database {tmp_path}/var/inbox.db)\n")
    config, secrets, errors = load_inbox(tmp_path / "inbox.yaml", {"HITL_RELAY_SECRET": SECRET})
    assert errors == [] and config is not None and secrets is not None
    assert secrets.relay_secrets == (SECRET,)
    assert SECRET not in repr(secrets)
    assert config.base_url == "http://localhost:8095"
    assert config.gate.max_skew == 300.0 and config.session_ttl == 12 * 3600.0
    party = relying_party(config)
    assert party is not None and (party.rp_id, party.origins) == (
        "localhost",
        ("http://localhost:8095",),
    )


def test_inbox_check_config_names_every_yaml_path(tmp_path: Path) -> None:
    data = {
        "listen": "unix:/tmp/x.sock",
        "public_url": "ftp://x",
        "colour": "blue",
        "gate": {
            "secret_env": "HITL_RELAY_SECRET",
            "callback_url": "http://127.0.0.1:8089",
            "max_skew": "soon",
        },
        "session_ttl": "-1h",
    }

    code, out, err = check(tmp_path, data)

    path = tmp_path / "inbox.yaml"
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines)
    said = "\n".join(line.removeprefix(f"{path}: ") for line in lines)
    for where in ("listen: ", "public_url: ", "colour: ", "gate.max_skew: ", "session_ttl: "):
        assert any(line.startswith(where) for line in said.splitlines()), (where, said)
    assert "invalid duration 'soon'" in said


def test_inbox_check_config_secrets_only_from_the_environment(tmp_path: Path) -> None:
    data = dict(GOOD, gate=dict(GOOD["gate"], previous_secret_env="HITL_INBOX_OLD"))

    code, _, err = check(tmp_path, data, {"HITL_INBOX_OLD": "short"})
    missing = check(tmp_path, GOOD, {"HITL_RELAY_SECRET": ""})

    assert code == 2
    assert "gate.previous_secret_env: HITL_INBOX_OLD is shorter than 16 bytes" in err
    assert "short" not in err.replace("shorter", "")
    assert missing[0] == 2
    assert "gate.secret_env: environment variable HITL_RELAY_SECRET is empty" in missing[2]
    pasted = dict(GOOD, gate=dict(GOOD["gate"], secret_env=SECRET))
    code, _, err = check(tmp_path, pasted)
    assert code == 2 and "gate.secret_env: " in err and SECRET not in err


def test_inbox_check_config_reads_the_metrics_token_as_a_secret(tmp_path: Path) -> None:
    data = dict(GOOD, metrics_token_env="HITL_INBOX_METRICS_TOKEN")

    short = check(tmp_path, data, {"HITL_INBOX_METRICS_TOKEN": "tiny"})
    unset = check(tmp_path, data)
    token = "metrics-token-0123456789abcdef"
    config, secrets, errors = load_inbox(
        tmp_path / "inbox.yaml", {"HITL_RELAY_SECRET": SECRET, "HITL_INBOX_METRICS_TOKEN": token}
    )

    assert short[0] == 2
    assert "metrics_token_env: HITL_INBOX_METRICS_TOKEN is shorter than 16 bytes" in short[2]
    assert "tiny" not in short[2]
    assert unset[0] == 2 and "metrics_token_env: " in unset[2]
    assert errors == [] and secrets is not None and config is not None
    assert (secrets.relay_secrets, secrets.metrics_token) == ((SECRET,), token)
    assert token not in repr(secrets)


@pytest.mark.parametrize(
    ("webauthn", "public_url", "said"),
    [
        ({"rp_id": "10.0.0.1"}, None, "webauthn.rp_id: '10.0.0.1' is an IP address"),
        (None, "http://10.0.0.5:8095", "webauthn.rp_id: public_url's host is an IP address"),
        (
            {"origins": ["http://inbox.example.com"]},
            "https://inbox.example.com",
            "webauthn.origins[0]: 'http://inbox.example.com' uses http on a host other",
        ),
        (
            {"origins": ["https://evil.example.net"]},
            "https://inbox.example.com",
            "webauthn.origins[0]: host 'evil.example.net' is neither 'inbox.example.com'",
        ),
    ],
)
def test_inbox_check_config_webauthn(
    tmp_path: Path, webauthn: dict[str, Any] | None, public_url: str | None, said: str
) -> None:
    data = dict(GOOD)
    if webauthn is not None:
        data["webauthn"] = webauthn
    if public_url is not None:
        data["public_url"] = public_url

    code, _, err = check(tmp_path, data)

    assert code == 2 and said in err, err


def test_inbox_check_config_file_and_yaml_errors(tmp_path: Path) -> None:
    assert check(tmp_path, "gate: [\n")[0] == 2
    code, _, err = check(tmp_path, "- a\n")
    assert code == 2 and "top level: expected a mapping" in err
    code, _, err = check(tmp_path, {"listen": "127.0.0.1:8095"})
    assert code == 2 and "gate: " in err


def test_inbox_check_config_storage_url_puts_it_on_postgresql(tmp_path: Path) -> None:
    url = "postgresql://inbox@db.example:5432/inbox"
    on_pg = {k: v for k, v in GOOD.items() if k != "database"}
    on_pg["storage"] = {"url": url, "password_env": "HITL_INBOX_DB_PASSWORD"}
    env = {"HITL_RELAY_SECRET": SECRET, "HITL_INBOX_DB_PASSWORD": "db-secret-value"}

    code, out, err = check(tmp_path, on_pg, env)
    config, secrets, errors = load_inbox(tmp_path / "inbox.yaml", env)

    assert (code, err) == (0, "") and out.endswith(f"database {url})\n"), (out, err)
    assert errors == [] and config is not None and secrets is not None
    assert secrets.database_password == "db-secret-value"
    assert "db-secret-value" not in repr(secrets) and secrets.relay_secrets == (SECRET,)


@pytest.mark.parametrize(
    ("storage", "with_database", "line"),
    [
        (
            {"path": "/var/lib/inbox.db"},
            False,
            "storage.path: the inbox's SQLite file is database; storage takes url",
        ),
        (
            {"url": "postgresql://inbox@db.example/inbox"},
            True,
            "storage.url: give database (a SQLite file) or storage.url, not both",
        ),
        ({"url": "postgresql://inbox:hunter2@db.example/inbox"}, False, "storage.url: "),
        (
            {"url": "postgresql://inbox@db.example/inbox", "password_env": "HITL_NOT_SET"},
            False,
            "storage.password_env: ",
        ),
    ],
)
def test_inbox_check_config_storage_errors(
    tmp_path: Path, storage: dict[str, str], with_database: bool, line: str
) -> None:
    data = {k: v for k, v in GOOD.items() if with_database or k != "database"}
    data["storage"] = storage

    code, out, err = check(tmp_path, data)

    assert (code, out) == (2, ""), out
    assert f": {line}" in err, err
    assert "hunter2" not in err and len(err.splitlines()) == 1, err


def test_inbox_on_postgresql_without_psycopg_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as in an install without the extra
    on_pg = {k: v for k, v in GOOD.items() if k != "database"}
    on_pg["storage"] = {"url": "postgresql://inbox@db.example/inbox"}

    code, out, err = check(tmp_path, on_pg)

    assert (code, out) == (2, "")
    assert err == (
        "Error: storage.url (PostgreSQL) needs the postgres extra:"
        " pip install 'hitl-gate[postgres]'\n"
    )
