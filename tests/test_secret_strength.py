"""Weak secrets (item 6): a relay secret, API token or receipt key shorter
than 16 bytes is refused by ``check-config`` and ``serve`` (exit 2, one line per secret naming
its YAML path and variable); one shorter than 32 bytes is a warning (``check-config`` exit 0,
``doctor`` WARN, ``serve`` logs it). The demo's and the tests' own secrets are long enough.

``check-config`` runs in-process with click's CliRunner; ``serve`` and ``doctor`` as real
``python -m gate`` processes, the daemon with a capturing relay on loopback.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from gate.cli import main
from tests.support import ENV, ROOT, CaptureRelay, GateProcess, gate_env, run_cli, write_config

# (YAML path, variable) of every secret the test config names (tests.support.write_config)
SECRETS = [
    ("relay.secret_env", "HITL_RELAY_SECRET"),
    ("relay.previous_secret_env", "HITL_RELAY_SECRET_OLD"),
    ("api.token_env", "HITL_API_TOKEN"),
    ("receipts.key_env", "HITL_RECEIPT_KEY"),
]
FIX = "openssl rand -hex 32"


def check_config(config: Path, **env: str) -> Result:
    return CliRunner().invoke(
        main, ["check-config", "-c", str(config)], env={**gate_env(), **env}, catch_exceptions=False
    )


def too_short(where: str, var: str, size: int) -> str:
    unit = "byte" if size == 1 else "bytes"
    return f"{where}: {var} is {size} {unit}; use at least 16 (32 recommended): {FIX}"


def weak(where: str, var: str, size: int) -> str:
    return f"{where}: {var} is {size} bytes; 32 or more are recommended: {FIX}"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("secrets"), "http://127.0.0.1:9/")


# ---- check-config ---------------------------------------------------------------------------


@pytest.mark.parametrize(("where", "var"), SECRETS, ids=[w for w, _ in SECRETS])
@pytest.mark.parametrize("value", ["x", "0123456789abcde"], ids=["1_byte", "15_bytes"])
def test_check_config_refuses_a_secret_shorter_than_16_bytes(
    config: Path, where: str, var: str, value: str
) -> None:
    result = check_config(config, **{var: value})

    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"{config}: {too_short(where, var, len(value))}\n"


def test_secret_length_is_counted_in_utf8_bytes(config: Path) -> None:
    result = check_config(config, HITL_RECEIPT_KEY="ééééééé")  # 7 characters, 14 bytes

    assert result.exit_code == 2
    assert result.stderr == f"{config}: {too_short('receipts.key_env', 'HITL_RECEIPT_KEY', 14)}\n"


def test_check_config_names_every_short_secret_at_once(config: Path) -> None:
    short = {var: f"s{i}" for i, (_, var) in enumerate(SECRETS)}

    result = check_config(config, **short)

    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"{config}: {too_short(w, v, 2)}" for w, v in SECRETS]


@pytest.mark.parametrize(("where", "var"), SECRETS, ids=[w for w, _ in SECRETS])
@pytest.mark.parametrize("size", [16, 31])
def test_check_config_warns_about_a_secret_shorter_than_32_bytes(
    config: Path, where: str, var: str, size: int
) -> None:
    value = "k" * size

    result = check_config(config, **{var: value})

    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"{config}: ok (")
    assert result.stderr == f"{config}: warning: {weak(where, var, size)}\n"
    assert value not in result.output


def test_check_config_is_quiet_about_32_bytes(config: Path) -> None:
    result = check_config(config, HITL_API_TOKEN="k" * 32)

    assert (result.exit_code, result.stderr) == (0, "")


def test_secret_from_a_credential_file_is_measured_too(config: Path, tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    (creds / "HITL_RECEIPT_KEY").write_text("short\n", encoding="utf-8")  # 5 bytes + newline
    env = {k: v for k, v in gate_env().items() if k != "HITL_RECEIPT_KEY"}
    env["CREDENTIALS_DIRECTORY"] = str(creds)

    result = CliRunner().invoke(
        main, ["check-config", "-c", str(config)], env=env, catch_exceptions=False
    )

    assert result.exit_code == 2
    assert result.stderr == f"{config}: {too_short('receipts.key_env', 'HITL_RECEIPT_KEY', 5)}\n"


def test_previous_receipt_key_is_measured_too(config: Path, tmp_path: Path) -> None:
    """receipts.previous_key_env is in the same table of secrets."""
    rotating = tmp_path / "rotating.yaml"
    rotating.write_text(
        config.read_text(encoding="utf-8").replace(
            "key_env: HITL_RECEIPT_KEY",
            "key_env: HITL_RECEIPT_KEY\n  previous_key_env: HITL_OLD_KEY",
        ),
        encoding="utf-8",
    )

    result = check_config(rotating, HITL_OLD_KEY="old")
    assert result.exit_code == 2
    assert result.stderr == (
        f"{rotating}: {too_short('receipts.previous_key_env', 'HITL_OLD_KEY', 3)}\n"
    )
    result = check_config(rotating, HITL_OLD_KEY="o" * 20)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == (
        f"{rotating}: warning: {weak('receipts.previous_key_env', 'HITL_OLD_KEY', 20)}\n"
    )


@pytest.mark.parametrize("password", ["pw", "p" * 21], ids=["2_bytes", "21_bytes"])
def test_the_database_password_is_not_held_to_the_secrets_length(
    config: Path, tmp_path: Path, password: str
) -> None:
    """New-user report: every start, reload and doctor warned ``weak_secret`` about the
    PostgreSQL password (``storage.password_env``). A database password is not an HMAC key:
    its strength is the database's business, so no length is asked of it (as the inbox
    asks none); it must still be set and clean."""
    on_pg = tmp_path / "pg.yaml"
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    raw["storage"] = {"url": "postgresql://gate@127.0.0.1:9/hitl", "password_env": "HITL_DB_PW"}
    on_pg.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")

    result = check_config(on_pg, HITL_DB_PW=password)
    assert (result.exit_code, result.stderr) == (0, "")
    padded = check_config(on_pg, HITL_DB_PW=password + " ")
    assert padded.exit_code == 2
    assert padded.stderr.startswith(f"{on_pg}: storage.password_env: ")


# ---- serve and doctor -----------------------------------------------------------------------


@pytest.mark.e2e
def test_serve_refuses_a_short_secret(config: Path) -> None:
    proc = run_cli("serve", "-c", str(config), env=gate_env(HITL_API_TOKEN="t"))

    assert proc.returncode == 2
    assert proc.stderr.decode() == f"{config}: {too_short('api.token_env', 'HITL_API_TOKEN', 1)}\n"


@pytest.fixture
def relay() -> Iterator[CaptureRelay]:
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.mark.e2e
def test_serve_starts_with_a_weak_secret_and_logs_a_warning(
    tmp_path: Path, relay: CaptureRelay
) -> None:
    gate = GateProcess(
        write_config(tmp_path, relay.url), gate_env(HITL_RECEIPT_KEY="r" * 20)
    ).start()
    try:
        line = gate.wait_for_line("event=weak_secret").string
    finally:
        assert gate.stop() == 0
    assert "receipts.key_env" in line and "HITL_RECEIPT_KEY is 20 bytes" in line, line
    assert "r" * 20 not in gate.log()


@pytest.mark.e2e
def test_doctor_fails_a_short_secret_and_warns_about_a_weak_one(
    tmp_path: Path, relay: CaptureRelay
) -> None:
    config = write_config(tmp_path, relay.url)

    def secrets_line(**env: str) -> tuple[int, str]:
        proc = run_cli("doctor", "-c", str(config), env=gate_env(**env), timeout=60)
        lines = proc.stdout.decode().splitlines()
        found = [line for line in lines if re.match(r"[A-Z]+ secrets: ", line)]
        assert len(found) == 1, lines
        return proc.returncode, found[0]

    code, line = secrets_line(HITL_RELAY_SECRET_OLD="old")
    assert (code, line) == (
        1,
        "FAIL secrets: " + too_short("relay.previous_secret_env", "HITL_RELAY_SECRET_OLD", 3),
    )
    code, line = secrets_line(HITL_RELAY_SECRET="s" * 24)
    assert code == 0, line
    assert line == (
        "WARN secrets: HITL_RELAY_SECRET, HITL_RELAY_SECRET_OLD, HITL_API_TOKEN, "
        "HITL_RECEIPT_KEY set and distinct; but "
        + weak("relay.secret_env", "HITL_RELAY_SECRET", 24)
    )


# ---- the secrets we ship ---------------------------------------------------------------------


def _demo_secrets() -> dict[str, str]:
    text = (ROOT / "scripts" / "demo.py").read_text(encoding="utf-8")
    return dict(re.findall(r'"(HITL_[A-Z_]+)": "([^"]+)"', text))


def test_demo_readme_and_test_secrets_are_at_least_32_bytes() -> None:
    demo = _demo_secrets()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    by_hand = readme.split("\n## The same thing by hand", 1)[1].split("\n## ", 1)[0]
    exported = dict(re.findall(r"(HITL_[A-Z_]+)=([^\s\\]+)", by_hand))

    assert set(demo) == {"HITL_RELAY_SECRET", "HITL_API_TOKEN", "HITL_RECEIPT_KEY"}
    assert exported == demo  # the README's by-hand section uses the demo's database
    for name, value in [*demo.items(), *ENV.items()]:
        assert len(value.encode()) >= 32, (name, value)
