"""Tests for gate.config: loading, errors with their YAML paths, durations, addresses, secrets."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from gate.config import (
    BudgetConfig,
    Config,
    Secrets,
    TcpListen,
    UnixListen,
    load,
    load_config,
    load_secrets,
    parse_duration,
    parse_listen,
)
from gate.errors import ConfigError
from tests.support import run_cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.yaml"
ENV = {
    "HITL_RELAY_SECRET": "test-secret-new-6a1f0c9e2d7b4853",
    "HITL_API_TOKEN": "api-token-value-0c7e2b9f4a1d6853",
    "HITL_RECEIPT_KEY": "receipt-key-value-5e8a1c3f7b0d2946",
}


def example_data() -> dict[str, Any]:
    """A fresh, mutable copy of the example config."""
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def write(directory: Path, content: dict[str, Any] | str, name: str = "gate.yaml") -> Path:
    """Write ``content`` (a mapping is dumped as YAML) to ``directory/name``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    text = content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def config_errors(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.errors


def load_errors(path: Path, environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(path, environ)
    return info.value.errors


def step(data: dict[str, Any], s: int) -> dict[str, Any]:
    result: dict[str, Any] = data["pipelines"][0]["steps"][s]
    return result


# --------------------------------------------------------------------------- the example


def test_example_loads_without_errors() -> None:
    config = load_config(EXAMPLE)

    assert config.source == EXAMPLE
    assert config.relay.url == "http://127.0.0.1:8091/"
    assert config.relay.callback_addr == "127.0.0.1:8089"
    assert config.relay.public_url == "http://localhost:8089"
    assert config.relay.dispatch_timeout == 10.0
    assert config.relay.previous_secret_env is None
    assert [(op.id, op.identity) for op in config.relay.operators] == [
        (111, "alice@example.com"),
        (222, "bob@example.com"),
        (333, "carol@example.com"),
    ]
    assert config.relay.security.allowed_users == (111, 222, 333)
    assert config.relay.security.max_skew == 300.0
    assert config.api.listen == "127.0.0.1:8090"
    assert config.storage.path == ROOT / "var" / "hitl-gate.db"
    assert config.receipts.signing_key_file is None
    assert config.budget == BudgetConfig(unit="EUR", cap_today=20.0)
    found = config.find_step("invoice-due-diligence", "send-followup")
    assert found is not None
    pipeline, followup = found
    assert pipeline.budget_cap == 2.0
    assert (followup.quorum, followup.approvers, followup.timeout, followup.risk) == (
        1,
        (111, 222),
        4 * 3600.0,
        "normal",
    )
    found = config.find_step("invoice-due-diligence", "pay-invoice")
    assert found is not None
    pay = found[1]
    assert (pay.quorum, pay.approvers, pay.timeout) == (2, (111, 222, 333), 1800.0)
    assert pay.risk == "high"


def test_example_loads_with_secrets() -> None:
    config, secrets = load(EXAMPLE, ENV)

    assert config == load_config(EXAMPLE)
    assert secrets == Secrets(
        relay_secrets=("test-secret-new-6a1f0c9e2d7b4853",),
        api_token="api-token-value-0c7e2b9f4a1d6853",
        receipt_key=b"receipt-key-value-5e8a1c3f7b0d2946",
    )
    for value in ENV.values():
        assert value not in repr(secrets)


def _model_keys(model: type[pydantic.BaseModel], prefix: str) -> set[str]:
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        if model is Config and name == "source":
            continue
        key = info.alias or name
        keys.add(prefix + key)
        inner = info.annotation
        args = getattr(inner, "__args__", ())
        for candidate in (inner, *args):
            if isinstance(candidate, type) and issubclass(candidate, pydantic.BaseModel):
                keys |= _model_keys(candidate, prefix + key + ".")
    return keys


def _yaml_keys(value: Any, prefix: str) -> set[str]:
    keys: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            keys.add(prefix + key)
            if (prefix + key).endswith(".when.arguments"):
                continue  # its keys are a JSON draft's paths, not config keys
            keys |= _yaml_keys(inner, prefix + key + ".")
    elif isinstance(value, list):
        for item in value:
            keys |= _yaml_keys(item, prefix)
    return keys


def _commented_example() -> dict[str, Any]:
    """The example's commented-out sections: its lines that start with ``#|``, as YAML."""
    lines = [
        line[3:] if line.startswith("#| ") else line[2:]
        for line in EXAMPLE.read_text(encoding="utf-8").splitlines()
        if line.startswith("#|")
    ]
    data = yaml.safe_load("\n".join(lines)) or {}
    assert isinstance(data, dict)
    return data


def test_example_documents_every_key() -> None:
    documented = _yaml_keys(example_data(), "") | _yaml_keys(_commented_example(), "")
    assert _model_keys(Config, "") == documented


def test_example_commented_sections_are_valid(tmp_path: Path) -> None:
    """What the example shows commented out loads when uncommented: the
    delegations as they are, the question pipeline added to the pipelines, with a relay that
    declared question support."""
    commented = _commented_example()
    data = example_data() | {"delegations": commented["delegations"]}
    for item in data["delegations"]:
        item["until"] = "2999-01-01T00:00:00Z"  # the example's date passes; the shape stays
    data["pipelines"] += commented["pipelines"]
    data["relay"]["questions"] = True

    config = load_config(write(tmp_path, data))

    assert config.delegations[0].to == 333
    found = config.find_step("supplier-choice", "pick-supplier")
    assert found is not None and found[1].is_question
    assert config.relay.question_target == config.relay.url


# --------------------------------------------------------------------------- every error at once


def test_config_many_errors_listed_together(tmp_path: Path) -> None:
    data = example_data()
    data["relay"]["security"]["allowed_users"] = [111, 222]
    data["relay"]["security"]["colour"] = "blue"  # unknown key
    step(data, 0)["approvers"] = [111, 999]  # unknown operator
    step(data, 1)["timeout"] = "30 minutes"  # bad duration
    step(data, 1)["quorum"] = 4  # 333 is outside allowed_users: 2 in scope
    path = write(tmp_path, data)
    environ = {k: v for k, v in ENV.items() if k != "HITL_RELAY_SECRET"}

    assert load_errors(path, environ) == [
        "relay.security.colour: unknown key",
        "pipelines[0].steps[1].timeout: invalid duration '30 minutes' (use e.g. 90s, 30m, 4h)",
        "pipelines[0].steps[0].approvers[1]: operator 999 is not defined in relay.operators",
        # the example escalates send-followup to 333
        "pipelines[0].steps[0].escalate[0].to[0]: operator 333 is not in"
        " relay.security.allowed_users",
        "pipelines[0].steps[1].approvers[2]: operator 333 is not in relay.security.allowed_users",
        "pipelines[0].steps[1].quorum: quorum 4 is larger than the 2 operators in scope",
        "relay.secret_env: environment variable HITL_RELAY_SECRET is not set",
    ]


def test_config_schema_errors_listed_together(tmp_path: Path) -> None:
    data = example_data()
    del data["relay"]["url"]
    data["relay"]["operators"][0]["id"] = "111"
    data["relay"]["security"]["max_input_length"] = 0
    data["api"]["listen"] = "localhost"
    data["api"]["token_env"] = "HITL API TOKEN"
    data["budget"]["cap_today"] = -1
    data["pipelines"][0]["name"] = " invoice-due-diligence"
    step(data, 0)["risk"] = "medium"
    step(data, 0)["type"] = "manual"
    step(data, 1)["approvers"] = [111, "bob"]
    data["extra"] = {"a": 1}
    path = write(tmp_path, data)

    assert config_errors(path) == [
        "relay.url: required",
        "relay.operators[0].id: expected an integer, got string '111'",
        "relay.security.max_input_length: must be >= 1, got 0",
        "api.listen: invalid address 'localhost' (use host:port, e.g. 127.0.0.1:8090)",
        "api.token_env: 'HITL API TOKEN' is not an environment variable name"
        " (letters, digits and _)",
        "budget.cap_today: must be >= 0, got -1",
        "pipelines[0].name: has leading or trailing whitespace",
        "pipelines[0].steps[0].type: must be one of 'approval' or 'question', got string 'manual'",
        "pipelines[0].steps[0].risk: must be one of 'low', 'normal', 'high' or 'critical',"
        " got string 'medium'",
        "pipelines[0].steps[1].approvers[1]: expected an integer, got string 'bob'",
        "extra: unknown key",
    ]
    # The schema failed beyond repair, so no secret errors are mixed in.
    assert load_errors(path, {}) == config_errors(path)


def test_config_cross_field_errors(tmp_path: Path) -> None:
    data = example_data()
    data["relay"]["operators"] += [
        {"id": 222, "identity": "dave@example.com"},
        {"id": 444, "identity": "Alice@Example.COM"},
    ]
    data["relay"]["security"]["allowed_users"] = [111, 222, 333, 999, 111]
    data["receipts"]["key_env"] = "HITL_RELAY_SECRET"
    data["pipelines"].append(dict(data["pipelines"][0]))
    step(data, 1)["name"] = "send-followup"
    path = write(tmp_path, data)

    assert config_errors(path) == [
        "relay.operators[3].id: duplicate operator id 222 (also relay.operators[1])",
        "relay.operators[4].identity: duplicate identity 'Alice@Example.COM'"
        " (same as relay.operators[0] after trim and casefold)",
        "relay.security.allowed_users[3]: operator 999 is not defined in relay.operators",
        "relay.security.allowed_users[4]: operator 111 is listed twice",
        "receipts.key_env: must differ from relay.secret_env (HITL_RELAY_SECRET is used for both)",
        "pipelines[0].steps[1].name: duplicate step name 'send-followup'"
        " (also pipelines[0].steps[0])",
        "pipelines[1].name: duplicate pipeline name 'invoice-due-diligence' (also pipelines[0])",
        "pipelines[1].steps[1].name: duplicate step name 'send-followup'"
        " (also pipelines[1].steps[0])",
    ]


def test_config_values_the_gate_could_never_use_are_refused(tmp_path: Path) -> None:
    """Regression (new-user review): an operator id of 2**63 passed check-config, then every
    decision of that operator answered 500 (SQLite INTEGER overflow); a 300-character step
    name passed, then every create for it answered 400 invalid_step; an identity longer
    than a decision may carry could never decide; an enormous max_skew silently switched
    the timestamp check (SPEC §2 check 3) off."""
    data = example_data()
    too_big = 2**63
    data["relay"]["operators"][0]["id"] = too_big
    data["relay"]["operators"][1]["identity"] = "b" * 309 + "@example.com"  # 321 characters
    data["relay"]["security"]["allowed_users"] = [too_big, 222, 333]
    data["relay"]["security"]["max_skew"] = "2h"
    step(data, 0)["approvers"] = [too_big, 222]
    step(data, 1)["name"] = "s" * 201
    data["pipelines"][0]["name"] = "p" * 201
    path = write(tmp_path, data)

    assert config_errors(path) == [
        f"relay.operators[0].id: must be <= {2**63 - 1}, got {too_big}",
        "relay.operators[1].identity: must be at most 320 characters, got 321",
        f"relay.security.allowed_users[0]: must be <= {2**63 - 1}, got {too_big}",
        "relay.security.max_skew: must be at most 3600 seconds (1h), got 7200 seconds",
        "pipelines[0].name: must be at most 200 characters, got 201",
        f"pipelines[0].steps[0].approvers[0]: must be <= {2**63 - 1}, got {too_big}",
        "pipelines[0].steps[1].name: must be at most 200 characters, got 201",
    ]
    # the limits themselves are fine
    data = example_data()
    biggest = 2**63 - 1
    data["relay"]["operators"][0]["id"] = biggest
    data["relay"]["security"]["allowed_users"] = [biggest, 222, 333]
    data["relay"]["security"]["max_skew"] = "1h"
    for s in range(len(data["pipelines"][0]["steps"])):
        step(data, s)["approvers"] = [
            biggest if a == 111 else a for a in step(data, s).get("approvers", [])
        ] or [biggest]
    step(data, 1)["name"] = "s" * 200
    config = load_config(write(tmp_path, data, "limits.yaml"))
    assert config.relay.operators[0].id == biggest


def test_config_storage_path_that_can_never_be_a_database(tmp_path: Path) -> None:
    """Regression (new-user review): ``path: /tmp`` passed check-config, then serve failed
    with "unable to open database file"."""
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    for path, message in [
        (str(tmp_path), f"{tmp_path} is a directory"),
        (str(tmp_path / "afile" / "gate.db"), f"{tmp_path / 'afile'} is not a directory"),
    ]:
        data = example_data()
        data["storage"]["path"] = path
        errors = config_errors(write(tmp_path, data))
        assert errors == [
            f"storage.path: {message}"
            + (
                "; name the database file in it (e.g. gate.db)"
                if "is a directory" in message
                else ""
            )
        ], errors
    data = example_data()
    data["storage"]["path"] = str(tmp_path / "new" / "dirs" / "gate.db")  # created by serve
    load_config(write(tmp_path, data))


def test_config_identity_with_whitespace_refused(tmp_path: Path) -> None:
    data = example_data()
    data["relay"]["operators"][0]["identity"] = "alice@example.com "
    data["relay"]["operators"][1]["identity"] = "\tbob@example.com"

    assert config_errors(write(tmp_path, data)) == [
        "relay.operators[0].identity: has leading or trailing whitespace",
        "relay.operators[1].identity: has leading or trailing whitespace",
    ]


def test_config_approvers_default_to_allowed_users(tmp_path: Path) -> None:
    data = example_data()
    del step(data, 1)["approvers"]
    step(data, 1)["quorum"] = 3
    config = load_config(write(tmp_path, data))

    pay = config.pipelines[0].steps[1]
    assert pay.approvers == (111, 222, 333)
    assert [op.id for op in config.scope(pay)] == [111, 222, 333]

    step(data, 1)["quorum"] = 4
    assert config_errors(write(tmp_path, data)) == [
        "pipelines[0].steps[1].quorum: quorum 4 is larger than the 3 operators in scope",
    ]


def test_config_defaults_when_optional_keys_are_absent(tmp_path: Path) -> None:
    data = example_data()
    for key in ("previous_secret_env", "public_url", "dispatch_timeout"):
        del data["relay"][key]
    data["relay"]["security"] = {"allowed_users": [111]}
    data["api"] = {"token_env": "HITL_API_TOKEN"}
    del data["receipts"]["signing_key_file"]
    del data["budget"]
    data["pipelines"] = [{"name": "p", "steps": [{"name": "s"}]}]
    config = load_config(write(tmp_path, data))

    assert config.relay.public_url is None
    assert config.relay.dispatch_timeout == 10.0
    security = config.relay.security
    assert (security.max_input_length, security.rate_limit, security.max_skew) == (500, 10, 300.0)
    assert (config.api.listen, config.api.max_draft_bytes) == ("127.0.0.1:8090", 262144)
    assert config.budget == BudgetConfig(unit="EUR", cap_today=None)
    only = config.pipelines[0].steps[0]
    assert (only.type, only.channel, only.quorum) == ("approval", "relay", 1)
    assert only.approvers == (111,)
    assert (only.timeout, only.risk) == (14400.0, "normal")
    assert config.pipelines[0].budget_cap is None


def test_config_empty_budget_section_means_defaults(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "budget:\n  # Currency label shown with spend. Default EUR.\n  unit: EUR\n", "budget:\n"
    )
    text = text.replace("  cap_today: 20.0\n", "")
    assert load_config(write(tmp_path, text)).budget == BudgetConfig()


def test_config_relative_storage_path_resolves_against_config_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = example_data()
    data["receipts"]["signing_key_file"] = "keys/../keys/receipt.ed25519"
    path = write(tmp_path / "etc", data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    config = load_config(os.path.relpath(path, elsewhere))

    assert config.storage.path == tmp_path / "etc" / "var" / "hitl-gate.db"
    assert config.receipts.signing_key_file == tmp_path / "etc" / "keys" / "receipt.ed25519"
    assert config.source == path

    data["storage"]["path"] = str(tmp_path / "abs.db")
    assert load_config(write(tmp_path / "etc", data)).storage.path == tmp_path / "abs.db"


def test_config_public_url_trailing_slash_removed(tmp_path: Path) -> None:
    data = example_data()
    data["relay"]["public_url"] = "https://gate.example.com/"
    assert load_config(write(tmp_path, data)).relay.public_url == "https://gate.example.com"


def test_config_url_is_never_echoed(tmp_path: Path) -> None:
    # Power Automate style URLs carry a signature in the query string: keep it out of messages.
    data = example_data()
    data["relay"]["url"] = "ftp://prod.example.com/workflows?sig=SECRETSIG"
    data["relay"]["public_url"] = "gate.example.com"
    errors = config_errors(write(tmp_path, data))

    assert errors == [
        "relay.url: must be an http:// or https:// URL with a host",
        "relay.public_url: must be an http:// or https:// URL with a host",
    ]


def test_config_callback_addr_must_be_tcp(tmp_path: Path) -> None:
    data = example_data()
    data["relay"]["callback_addr"] = "unix:/run/gate.sock"
    assert config_errors(write(tmp_path, data)) == [
        "relay.callback_addr: must be host:port (a unix socket is not allowed here)",
    ]


def test_config_all_secret_variables_must_differ(tmp_path: Path) -> None:
    data = example_data()
    data["relay"]["previous_secret_env"] = "HITL_RELAY_SECRET"
    data["api"]["token_env"] = "HITL_RELAY_SECRET"
    data["receipts"]["key_env"] = "HITL_API_TOKEN"
    assert config_errors(write(tmp_path, data)) == [
        "relay.previous_secret_env: must differ from relay.secret_env"
        " (HITL_RELAY_SECRET is used for both)",
        "api.token_env: must differ from relay.secret_env (HITL_RELAY_SECRET is used for both)",
    ]


def test_config_is_frozen_and_uses_tuples() -> None:
    config = load_config(EXAMPLE)

    with pytest.raises(pydantic.ValidationError):
        config.relay.url = "http://elsewhere/"  # type: ignore[misc]
    assert isinstance(config.pipelines, tuple)
    assert isinstance(config.relay.security.allowed_users, tuple)
    assert hash(config) == hash(load_config(EXAMPLE))


def test_config_lookups() -> None:
    config = load_config(EXAMPLE)

    assert config.find_step("invoice-due-diligence", "nope") is None
    assert config.find_step("nope", "send-followup") is None
    followup = config.pipelines[0].steps[0]
    assert [op.id for op in config.scope(followup)] == [111, 222]


def test_config_scope_without_load_defaults_to_allowed_users() -> None:
    data = example_data()
    del step(data, 0)["approvers"]
    config = Config.model_validate(data)

    assert config.pipelines[0].steps[0].approvers == ()
    assert [op.id for op in config.scope(config.pipelines[0].steps[0])] == [111, 222, 333]


def test_case_h10_operator_by_identity_trims_and_casefolds() -> None:
    config = load_config(EXAMPLE)

    alice = config.operator_by_identity("Alice@Example.COM")
    assert alice is not None and alice.id == 111
    assert config.operator_by_identity("Alice@Example.COM ") == alice
    assert alice.key == "alice@example.com"
    assert config.operator_by_identity("\u0430lice@example.com") is None  # Cyrillic а
    assert config.operator_by_identity("relay-bot@example.com") is None


# --------------------------------------------------------------------------- file and YAML problems


def test_config_yaml_syntax_error_is_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "relay:\n  url: http://x\n   bad: [1, 2\n")
    errors = config_errors(path)

    assert len(errors) == 1
    assert errors[0].startswith("line 3, column 7: ")


def test_config_duplicate_yaml_key_refused(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8") + "api:\n  token_env: OTHER\n"
    errors = config_errors(write(tmp_path, text))
    line = text.count("\n") - 1

    assert errors == [f"line {line}, column 1: duplicate key 'api'"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "",
            "top level: expected a mapping with sections relay, api, storage, receipts and"
            " pipelines, got an empty file",
        ),
        (
            "- relay\n",
            "top level: expected a mapping with sections relay, api, storage, receipts"
            " and pipelines, got a list",
        ),
    ],
    ids=["empty", "list"],
)
def test_config_top_level_not_a_mapping(tmp_path: Path, content: str, expected: str) -> None:
    assert config_errors(write(tmp_path, content)) == [expected]


def test_config_file_not_found_or_directory(tmp_path: Path) -> None:
    assert config_errors(tmp_path / "missing.yaml") == [
        f"config file not found: {tmp_path / 'missing.yaml'}"
    ]
    assert config_errors(tmp_path) == [f"config file is a directory: {tmp_path}"]


def test_config_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "gate.yaml"
    path.write_bytes(b"relay: \xff\n")
    assert config_errors(path) == [f"config file {path} is not valid UTF-8 (byte offset 7)"]


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("4h", 14400.0),
        ("30m", 1800.0),
        ("90s", 90.0),
        ("1h30m", 5400.0),
        ("1h30m15s", 5415.0),
        ("500ms", 0.5),
        ("1s500ms", 1.5),
        ("90", 90.0),
        ("2.5", 2.5),
        (90, 90.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration_good(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4 hours", "invalid duration '4 hours' (use e.g. 90s, 30m, 4h)"),
        ("1.5h", "invalid duration '1.5h' (use e.g. 90s, 30m, 4h)"),
        ("4d", "invalid duration '4d' (use e.g. 90s, 30m, 4h)"),
        ("h", "invalid duration 'h' (use e.g. 90s, 30m, 4h)"),
        ("", "invalid duration '' (use e.g. 90s, 30m, 4h)"),
        ("-5s", "invalid duration '-5s' (use e.g. 90s, 30m, 4h)"),
        (True, "invalid duration True (use e.g. 90s, 30m, 4h)"),
        ("0s", "duration must be > 0, got '0s'"),
        (0, "duration must be > 0, got 0"),
        (-3, "duration must be > 0, got -3"),
        (float("inf"), "duration must be a finite number, got inf"),
        (10**400, "duration " + repr(10**400) + " is too large"),
    ],
    ids=[
        "words",
        "fraction",
        "days",
        "no-number",
        "empty",
        "negative",
        "bool",
        "zero-s",
        "zero",
        "negative-number",
        "inf",
        "huge",
    ],
)
def test_parse_duration_bad(text: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(info.value) == message


def test_config_bad_duration_names_its_path(tmp_path: Path) -> None:
    data = example_data()
    step(data, 0)["timeout"] = "4 hours"
    data["relay"]["security"]["max_skew"] = 0
    assert config_errors(write(tmp_path, data)) == [
        "relay.security.max_skew: duration must be > 0, got 0",
        "pipelines[0].steps[0].timeout: invalid duration '4 hours' (use e.g. 90s, 30m, 4h)",
    ]


def test_config_base60_duration_is_not_a_number(tmp_path: Path) -> None:
    # Plain YAML 1.1 would read 1:30 as 90 (seconds); refuse it instead of guessing.
    text = EXAMPLE.read_text(encoding="utf-8").replace("timeout: 30m", "timeout: 1:30")
    assert config_errors(write(tmp_path, text)) == [
        "pipelines[0].steps[1].timeout: invalid duration '1:30' (use e.g. 90s, 30m, 4h)",
    ]


# --------------------------------------------------------------------------- listen addresses


@pytest.mark.parametrize(
    ("addr", "parsed"),
    [
        ("127.0.0.1:8090", TcpListen("127.0.0.1", 8090)),
        ("localhost:0", TcpListen("localhost", 0)),
        ("0.0.0.0:65535", TcpListen("0.0.0.0", 65535)),
        ("[::1]:8090", TcpListen("::1", 8090)),
        ("unix:/run/hitl-gate.sock", UnixListen("/run/hitl-gate.sock")),
        ("unix:var/api.sock", UnixListen("var/api.sock")),
    ],
)
def test_parse_listen_good(addr: str, parsed: tuple[str, ...]) -> None:
    assert parse_listen(addr) == parsed


@pytest.mark.parametrize(
    "addr",
    [
        "",
        "8090",
        ":8090",
        "localhost",
        "host:port",
        "host:65536",
        "host:-1",
        "::1:8090",
        "[::1",
        "[]:80",
        "unix:",
        "my host:80",
    ],
)
def test_parse_listen_bad(addr: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_listen(addr)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- secrets


def test_case_h04_secret_with_trailing_newline_refused() -> None:
    config = load_config(EXAMPLE)
    environ = dict(
        ENV,
        HITL_RELAY_SECRET=ENV["HITL_RELAY_SECRET"] + "\n",
        HITL_API_TOKEN=" " + ENV["HITL_API_TOKEN"],
    )

    with pytest.raises(ConfigError) as info:
        load_secrets(config, environ)

    assert info.value.errors == [
        "relay.secret_env: HITL_RELAY_SECRET has leading or trailing whitespace"
        " (often a trailing newline); remove it",
        "api.token_env: HITL_API_TOKEN has leading or trailing whitespace"
        " (often a trailing newline); remove it",
    ]
    assert ENV["HITL_RELAY_SECRET"] not in str(info.value)
    assert ENV["HITL_API_TOKEN"] not in str(info.value)


def test_secrets_missing_and_empty_all_listed(tmp_path: Path) -> None:
    data = example_data()
    data["relay"]["previous_secret_env"] = "HITL_RELAY_SECRET_OLD"
    path = write(tmp_path, data)

    assert load_errors(path, {"HITL_API_TOKEN": ""}) == [
        "relay.secret_env: environment variable HITL_RELAY_SECRET is not set",
        "relay.previous_secret_env: environment variable HITL_RELAY_SECRET_OLD is not set",
        "api.token_env: environment variable HITL_API_TOKEN is empty",
        "receipts.key_env: environment variable HITL_RECEIPT_KEY is not set",
    ]


def test_secrets_rotation_current_first(tmp_path: Path) -> None:
    data = example_data()
    data["relay"]["previous_secret_env"] = "HITL_RELAY_SECRET_OLD"
    environ = dict(ENV, HITL_RELAY_SECRET_OLD="test-secret-old-0e4b7d2c9a1f6385")

    _, secrets = load(write(tmp_path, data), environ)

    assert secrets.relay_secrets == (ENV["HITL_RELAY_SECRET"], "test-secret-old-0e4b7d2c9a1f6385")


def test_secrets_reused_value_refused() -> None:
    config = load_config(EXAMPLE)
    same = "the-same-value-in-three-variables"
    environ = dict(ENV, HITL_API_TOKEN=same, HITL_RECEIPT_KEY=same, HITL_RELAY_SECRET=same)

    with pytest.raises(ConfigError) as info:
        load_secrets(config, environ)

    assert info.value.errors == [
        "api.token_env: HITL_API_TOKEN has the same value as HITL_RELAY_SECRET"
        " (relay.secret_env); each secret must be distinct",
        "receipts.key_env: HITL_RECEIPT_KEY has the same value as HITL_RELAY_SECRET"
        " (relay.secret_env); each secret must be distinct",
        "receipts.key_env: HITL_RECEIPT_KEY has the same value as HITL_API_TOKEN"
        " (api.token_env); each secret must be distinct",
    ]
    assert same not in str(info.value)


def test_secrets_same_variable_reported_once(tmp_path: Path) -> None:
    data = example_data()
    data["receipts"]["key_env"] = "HITL_RELAY_SECRET"

    assert load_errors(write(tmp_path, data), ENV) == [
        "receipts.key_env: must differ from relay.secret_env (HITL_RELAY_SECRET is used for both)",
    ]


def test_secrets_undecodable_value_refused() -> None:
    config = load_config(EXAMPLE)
    environ = dict(ENV, HITL_RECEIPT_KEY="receipt-key-value-5e8a1c3f7b0d\udcff")

    with pytest.raises(ConfigError) as info:
        load_secrets(config, environ)
    assert info.value.errors == ["receipts.key_env: HITL_RECEIPT_KEY is not valid UTF-8"]


def test_secrets_receipt_key_is_utf8_bytes() -> None:
    config = load_config(EXAMPLE)
    key = "clé-de-reçus-5e8a1c3f7b0d2946-éàü"
    secrets = load_secrets(config, dict(ENV, HITL_RECEIPT_KEY=key))
    assert secrets.receipt_key == key.encode()
    assert secrets.warnings == ()


def test_config_listeners_and_public_url_checked(tmp_path: Path) -> None:
    """Fresh-user findings: same port for both listeners, a public_url with the decisions path
    or a query, and an unbounded max_input_length are config errors, all listed at once."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "relay:\n"
        "  url: http://127.0.0.1:8091/\n"
        "  secret_env: HITL_RELAY_SECRET\n"
        '  callback_addr: "127.0.0.1:8090"\n'
        "  public_url: http://gate.example.com/hitl/v0/decisions?x=1\n"
        "  operators: [{id: 1, identity: a@example.com}]\n"
        "  security: {allowed_users: [1], max_input_length: 1000000}\n"
        'api: {listen: "127.0.0.1:8090", token_env: HITL_API_TOKEN}\n'
        "storage: {path: x.db}\n"
        "receipts: {key_env: HITL_RECEIPT_KEY}\n"
        "pipelines: [{name: p, steps: [{name: s}]}]\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == [
        "api.listen: 127.0.0.1:8090 is the same address as relay.callback_addr "
        "(127.0.0.1:8090); use two ports",
        "relay.public_url: must not have a query or fragment (it is a base URL; "
        "/hitl/v0/decisions is appended)",
        "relay.public_url: give the base URL without /hitl/v0/decisions (the gate appends it)",
        "relay.security.max_input_length: at most 60000 (a decision body is limited to 64 KiB)",
    ]


@pytest.mark.e2e
@pytest.mark.parametrize("pasted", ["a9f8c0ffee1234567890abcdef", "s3cr3t-v4lue/with+b64=="])
def test_a_secret_pasted_into_an_env_key_is_refused_without_being_shown(tmp_path, pasted):
    """Security review: a secret pasted where the config wants the NAME of a variable
    (``api.token_env``) was printed back by check-config, doctor and serve ("environment
    variable a9f8... is not set" or "'s3cr...' is not an environment variable name")."""
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    data["api"]["token_env"] = pasted
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    for command in (
        ["check-config", "-c", str(config)],
        ["serve", "-c", str(config)],
        ["doctor", "-c", str(config)],
    ):
        proc = run_cli(*command)
        text = proc.stdout.decode() + proc.stderr.decode()
        assert proc.returncode != 0, (command, text)
        assert pasted not in text and pasted[:8] not in text, (command, text)
        assert "api.token_env" in text, (command, text)


@pytest.mark.parametrize(
    "token",
    ["tok\x01en-value-0c7e2b9f4a1d6853", "two words, long enough", "tökén-value-0c7e2b9f4a1d6853"],
)
def test_api_token_must_be_printable_ascii(token):
    """Security review: check-config passed an API token holding ``\x01``; serve took it, and
    every client then failed to send it as a bearer token."""
    config = load_config(EXAMPLE)
    with pytest.raises(ConfigError) as info:
        load_secrets(config, {**ENV, "HITL_API_TOKEN": token})
    assert info.value.errors == [
        "api.token_env: HITL_API_TOKEN holds a space, a control or a non-ASCII character; an "
        "HTTP bearer token is printable ASCII"
    ]


RANGE = "must be a number between -2**53 and 2**53 (±9007199254740992)"


def test_config_numbers_beyond_2_53_are_refused_with_their_path(tmp_path: Path) -> None:
    """Every bound, limit and amount is a finite number within ±2**53 (docs/design.md
    "Numbers"): a cap, a max_spend or an argument's min/max beyond it is refused with its
    YAML path, not taken as an ever-true condition nor a number no float holds."""
    data = example_data()
    data["budget"]["cap_today"] = 10**400
    data["pipelines"][0]["budget_cap"] = 2**53 + 1
    step(data, 0)["policy"] = [
        {
            "id": "big",
            "decide": "deny",
            "when": {
                "max_spend": 10**400,
                "arguments": {"/a": {"min": -(10**400)}, "/b": {"max": 1e300}},
            },
        }
    ]
    path = write(tmp_path, data)
    at = "pipelines[0].steps[0].policy[0].when"
    assert config_errors(path) == [
        f"budget.cap_today: {RANGE}, got a 401-digit number",
        f"pipelines[0].budget_cap: {RANGE}, got 9007199254740993",
        f"{at}.max_spend: {RANGE}, got a 401-digit number",
        f"{at}.arguments./a.min: {RANGE}, got a 401-digit number",
        f"{at}.arguments./b.max: {RANGE}, got 1e+300",
    ]
    # the limits themselves are fine
    data["budget"]["cap_today"] = 2**53
    data["pipelines"][0]["budget_cap"] = float(2**53)
    step(data, 0)["policy"][0]["when"] = {
        "max_spend": 2**53,
        "arguments": {"/a": {"min": -(2**53)}, "/b": {"max": 2**53}},
    }
    config = load_config(write(tmp_path, data, "limits.yaml"))
    assert config.budget.cap_today == 2**53
