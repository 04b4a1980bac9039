"""The ``hitl-gate`` command line: exit codes, one-line errors, help of every command.

Config checks and help run in-process with click's CliRunner (fast, same code path); the
commands that talk to a gate run as real ``python -m gate`` subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import socket

import pytest
from click.testing import CliRunner, Result

from gate.cli import main
from tests.support import API_TOKEN, ROOT, gate_env, run_cli, shown_time

EXAMPLE = ROOT / "config.example.yaml"
ENV = {
    "HITL_RELAY_SECRET": "relay-secret-cli-4d0b9e7a2c5f1836",
    "HITL_API_TOKEN": "api-token-cli-8e3a6c1f0b9d2754a1",
    "HITL_RECEIPT_KEY": "receipt-key-cli-2f7c5a0e8d1b4963",
}
UNKNOWN_ID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"

# Structurally valid YAML with many errors at once (each must be named by its YAML path).
MANY_ERRORS = """\
relay:
  url: http://127.0.0.1:9/
  secret_env: HITL_RELAY_SECRET
  callback_addr: "127.0.0.1:8089"
  bogus_key: 1
  operators:
    - id: 111
      identity: alice@example.com
  security:
    allowed_users: [111, 555]
api:
  token_env: HITL_API_TOKEN
storage:
  path: x.db
receipts:
  key_env: HITL_RECEIPT_KEY
pipelines:
  - name: p
    steps:
      - name: s
        quorum: 3
        approvers: [111, 777]
"""


def invoke(args: list[str], env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---- check-config ---------------------------------------------------------------------------


def test_check_config_example_is_valid():
    result = invoke(["check-config", "-c", str(EXAMPLE)], env=dict(ENV))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{EXAMPLE}: ok (1 pipelines, 2 steps, 3 operators)\n"
    assert result.stderr == ""


def test_check_config_lists_every_error_with_its_yaml_path(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(MANY_ERRORS, encoding="utf-8")
    result = invoke(["check-config", "-c", str(config)], env={**ENV, "HITL_RELAY_SECRET": None})
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    prefix = f"{config}: "
    assert all(line.startswith(prefix) for line in lines), lines
    found = [line[len(prefix) :] for line in lines]
    expected_paths = [
        "relay.bogus_key: ",
        "relay.security.allowed_users[1]: ",
        "pipelines[0].steps[0].approvers[1]: ",
        "pipelines[0].steps[0].quorum: ",
        "relay.secret_env: ",
    ]
    assert len(found) == len(expected_paths), found
    for path in expected_paths:
        assert sum(line.startswith(path) for line in found) == 1, (path, found)
    assert any("555" in line for line in found)
    assert any("777" in line for line in found)
    assert any("HITL_RELAY_SECRET" in line for line in found)


def test_check_config_bad_required_value_does_not_hide_other_errors(tmp_path):
    """SPEC §5: every error listed, even when a required value (relay.url) is itself bad."""
    config = tmp_path / "bad.yaml"
    config.write_text(MANY_ERRORS.replace("http://127.0.0.1:9/", "ftp://nowhere"), encoding="utf-8")
    result = invoke(["check-config", "-c", str(config)], env={**ENV, "HITL_RELAY_SECRET": None})
    assert result.exit_code == 2
    found = [line.removeprefix(f"{config}: ") for line in result.stderr.splitlines()]
    for path in (
        "relay.url: ",
        "relay.bogus_key: ",
        "relay.security.allowed_users[1]: ",
        "pipelines[0].steps[0].approvers[1]: ",
        "pipelines[0].steps[0].quorum: ",
        "relay.secret_env: ",
    ):
        assert sum(line.startswith(path) for line in found) == 1, (path, found)
    assert len(found) == 6, found


@pytest.mark.parametrize("var", sorted(ENV))
def test_check_config_missing_env_var_is_named(var):
    result = invoke(["check-config", "-c", str(EXAMPLE)], env={**ENV, var: None})
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert var in lines[0]
    assert re.match(
        rf"{re.escape(str(EXAMPLE))}: \S+_env: environment variable {var} is not set$", lines[0]
    ), lines[0]


def test_check_config_missing_file():
    result = invoke(["check-config", "-c", "/nonexistent/gate.yaml"], env=dict(ENV))
    assert result.exit_code == 2
    assert "config file not found" in result.stderr


# ---- request: usage and unreachable gate ----------------------------------------------------


@pytest.mark.parametrize(
    "draft_args",
    [
        ["--draft", "x", "--draft-file", "-"],
        [],
    ],
)
def test_request_needs_exactly_one_draft_source(draft_args):
    result = invoke(
        ["request", "-c", str(EXAMPLE), "--pipeline", "p", "--step", "s", *draft_args],
        env=dict(ENV),
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert one_error_line(result.stderr) == "Error: give exactly one of --draft or --draft-file"


def test_request_unreadable_draft_file_is_usage_error(tmp_path):
    result = invoke(
        [
            "request",
            "-c",
            str(EXAMPLE),
            "--pipeline",
            "p",
            "--step",
            "s",
            "--draft-file",
            str(tmp_path / "missing.txt"),
        ],
        env=dict(ENV),
    )
    assert result.exit_code == 2
    assert one_error_line(result.stderr).startswith("Error: --draft-file: cannot read ")


@pytest.mark.parametrize(
    ("spend", "problem"),
    [("-1", "must be a number >= 0"), ("1.7e308", "is too large (at most 1e+15)"),
     ("1e16", "is too large (at most 1e+15)")],
)  # fmt: skip
def test_request_spend_out_of_range_is_usage_error(spend, problem):
    """A spend above 1e15 is refused by the API (its sums must stay finite); the CLI says so
    before sending anything."""
    result = invoke(
        [
            "request",
            "-c",
            str(EXAMPLE),
            "--pipeline",
            "p",
            "--step",
            "s",
            "--draft",
            "x",
            "--spend",
            spend,
        ],
        env=dict(ENV),
    )
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == f"Error: --spend: {problem}"


@pytest.mark.parametrize("key", ["", " ", "a\nb", "tab\there", "x" * 201, "ab\udcffcd"], ids=repr)
def test_request_idempotency_key_the_api_would_refuse_is_a_usage_error(key):
    """Regression (new-user review): an empty key was dropped silently (two approvals for
    two runs), a newline gave aiohttp's traceback. Later: a key that is not UTF-8
    (``$'ab\\xffcd'``: Python's argv holds the byte as a lone surrogate) was sent as ``abcd``
    (aiohttp drops the byte), so two different keys became one on the gate."""
    result = invoke(
        [
            "request",
            "-c",
            str(EXAMPLE),
            "--pipeline",
            "p",
            "--step",
            "s",
            "--draft",
            "x",
            "--idempotency-key",
            key,
        ],
        env=dict(ENV),
    )
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == (
        "Error: --idempotency-key: must be 1-200 UTF-8 characters, not blank, without control"
        " characters"
    )


@pytest.mark.e2e
@pytest.mark.parametrize("identity", ["", " ", " alice@example.com"])
def test_relay_as_an_identity_no_dispatch_can_name_is_a_usage_error(identity):
    """Regression (new-user review): ``relay --as ''`` started, then logged not_in_scope for
    every dispatch and never decided."""
    proc = run_cli(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        identity,
        "--auto",
        "approve",
    )
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr.decode()) == (
        f"Error: --as: {identity!r} is not an identity (empty, or spaces around it)"
    )


def test_request_permit_out_in_a_missing_directory_is_refused_before_the_create(tmp_path):
    """Regression (new-user review): the approval was created (a human asked) and only the
    save failed at the end."""
    target = tmp_path / "missing" / "permit.jws"
    result = invoke(
        [
            "request",
            "-c",
            str(EXAMPLE),
            "--pipeline",
            "p",
            "--step",
            "s",
            "--draft",
            "x",
            "--wait",
            "--permit-out",
            str(target),
        ],
        env=dict(ENV),
    )
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == (
        f"Error: --permit-out: {target.parent} is not a directory this user can write to"
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.e2e
@pytest.mark.parametrize("api_url", ["http://127.0.0.1:{port}", "unix:{tmp}/no-gate.sock"])
def test_request_gate_unreachable_is_one_error_line(tmp_path, api_url):
    """Without --wait: one error line, exit 1. With --wait the create is retried (the gate
    may be restarting) until --timeout: exit 4, saying how to find the request later."""
    url = api_url.format(port=_closed_port(), tmp=tmp_path)
    args = (
        "request",
        "-c",
        str(EXAMPLE),
        "--api-url",
        url,
        "--pipeline",
        "p",
        "--step",
        "s",
        "--draft",
        "hello",
    )
    proc = run_cli(*args)
    assert proc.returncode == 1
    assert proc.stdout == b""
    line = one_error_line(proc.stderr.decode("utf-8"))
    assert line.startswith(f"Error: cannot reach the gate at {url}"), line
    proc = run_cli(*args, "--wait", "--timeout", "1")
    assert proc.returncode == 4
    assert proc.stdout == b""
    err = proc.stderr.decode("utf-8").splitlines()
    assert err[0].startswith(
        f"the gate cannot take the request now (cannot reach the gate at {url}"
    ), err
    assert re.fullmatch(
        r"Error: the gate did not take the request within 1 s: nothing may "
        r"fire; run the same command again with --idempotency-key "
        r"hitl-request-\S+ to find it if it lands later",
        err[-1],
    ), err


@pytest.mark.e2e
@pytest.mark.parametrize(
    "url", ["notaurl", "127.0.0.1:8090", "ftp://host:21", "unix:", "http://host:99999", "http://"]
)
def test_malformed_api_url_is_a_usage_error_naming_the_option(url):
    """Regression (new-user review): ``--api-url notaurl`` said "cannot reach the gate"."""
    proc = run_cli("list", "-c", str(EXAMPLE), "--api-url", url)
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr.decode()) == (
        f"Error: --api-url: {url!r} is not http://host:port, https://host:port or unix:/path"
    )


@pytest.mark.e2e
def test_api_commands_read_the_token_from_the_credentials_directory(gate, tmp_path):
    """Regression (operator review): check-config and serve read $CREDENTIALS_DIRECTORY, but
    ``request``/``list`` said the token variable was not set."""
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    (creds / "HITL_API_TOKEN").write_text(API_TOKEN + "\n", encoding="utf-8")
    env = {k: v for k, v in gate_env().items() if k != "HITL_API_TOKEN"}
    env["CREDENTIALS_DIRECTORY"] = str(creds)
    proc = run_cli(
        "list", "-c", str(gate.config), "--api-url", gate.api_url, "--state", "all", env=env
    )
    assert proc.returncode == 0, proc.stderr
    (creds / "HITL_API_TOKEN").unlink()
    proc = run_cli("list", "-c", str(gate.config), "--api-url", gate.api_url, env=env)
    assert proc.returncode == 2
    assert one_error_line(proc.stderr.decode()) == (
        "Error: api.token_env: environment variable HITL_API_TOKEN is not set (nor is there a "
        f"credential file {creds / 'HITL_API_TOKEN'})"
    )


@pytest.mark.e2e
def test_request_without_token_is_usage_error():
    proc = run_cli(
        "request",
        "-c",
        str(EXAMPLE),
        "--api-url",
        "http://127.0.0.1:1",
        "--pipeline",
        "p",
        "--step",
        "s",
        "--draft",
        "x",
        env={k: v for k, v in os.environ.items() if k != "HITL_API_TOKEN"},
    )
    assert proc.returncode == 2
    assert one_error_line(proc.stderr.decode()) == (
        "Error: api.token_env: environment variable HITL_API_TOKEN is not set"
    )


# ---- show / cancel / list against a running gate --------------------------------------------


@pytest.mark.e2e
def test_show_and_cancel(gate):
    args = ["-c", str(gate.config), "--api-url", gate.api_url]
    for command in ("show", "cancel"):
        proc = run_cli(command, *args, UNKNOWN_ID)
        assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
        assert proc.stdout == b""
        line = one_error_line(proc.stderr.decode())
        assert "404" in line and "unknown_approval" in line, line

    proc = run_cli("request", *args, "--pipeline", "p", "--step", "nope", "--draft", "x")
    assert (proc.returncode, proc.stdout) == (1, b"")
    line = one_error_line(proc.stderr.decode())
    assert "404" in line and "unknown_step" in line, line

    proc = run_cli("request", *args, "--pipeline", "p", "--step", "q1", "--draft", "Grüße")
    assert proc.returncode == 0, proc.stderr
    approval_id = proc.stdout.decode().strip()
    assert re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", approval_id)

    proc = run_cli("show", *args, approval_id)
    assert proc.returncode == 0, proc.stderr
    assert '"state": "pending"' in proc.stdout.decode()

    expires_at = json.loads(proc.stdout)["expires_at"]
    proc = run_cli("list", *args, "--state", "pending")
    assert proc.returncode == 0, proc.stderr
    # the expiry as a person reads it: fixed width, three millisecond digits
    assert proc.stdout.decode() == (
        f"{approval_id}  pending   -          p/q1  0/1  expires {shown_time(expires_at)}\n"
    )

    proc = run_cli("cancel", *args, approval_id)
    assert (proc.returncode, proc.stdout.decode()) == (0, f"{approval_id} cancelled\n")
    proc = run_cli("cancel", *args, approval_id)
    assert proc.returncode == 1
    line = one_error_line(proc.stderr.decode())
    assert "409" in line and "already_resolved" in line, line
    proc = run_cli("list", *args, "--state", "pending")
    assert (proc.returncode, proc.stdout) == (0, b"")
    assert proc.stderr.decode() == "no pending approvals\n"  # not silence (new-user review)


# ---- help ---------------------------------------------------------------------------------

COMMANDS = [
    [],
    ["serve"],
    ["check-config"],
    ["request"],
    ["list"],
    ["show"],
    ["cancel"],
    ["audit"],
    ["audit", "verify"],
    ["audit", "export"],
    ["relay"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "main")
def test_help_of_every_command(command):
    result = invoke([*command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ")
    assert result.stderr == ""


def test_help_of_spec_verify_command():
    """SPEC §4 lists ``hitl-gate verify RELAY_URL --secret-env VAR --approver ID ...``."""
    result = invoke(["verify", "--help"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ")
    for option in ("--secret-env", "--approver", "--listen", "--public-url", "--timeout", "--json"):
        assert option in result.stdout, option


def test_version_and_unknown_command():
    result = invoke(["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("hitl-gate, version ")
    result = invoke(["no-such-command"])
    assert result.exit_code == 2


@pytest.mark.e2e
def test_console_entry_point_runs_as_module():
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert proc.stdout.decode().startswith("Usage: python -m gate ")


def test_no_command_help_shows_reStructuredText_markup():
    """New-user review: ``hitl-gate --help`` showed "(resolves ``cancelled``)" with the
    docstring's literal double backticks."""
    import click

    from gate.cli import main

    found = []

    def walk(command: click.Command, path: str) -> None:
        texts = [command.help or "", command.short_help or ""]
        texts += [getattr(p, "help", None) or "" for p in command.params]
        if any("``" in text for text in texts):
            found.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(main, "hitl-gate")
    assert found == []


def test_every_command_module_is_named_in_the_lazy_group():
    """``hitl-gate`` imports a command's module only when it runs (gate.cli.COMMANDS): every
    command the modules register must be in that map, or it would be missing from the CLI."""
    import importlib
    import pkgutil

    import gate.cli as cli

    for module in pkgutil.iter_modules(cli.__path__):
        importlib.import_module(f"gate.cli.{module.name}")
    assert sorted(cli.main.commands) == sorted(cli.COMMANDS)
    for name, modules in cli.COMMANDS.items():
        assert cli.main.commands[name].callback is not None
        assert any(
            cli.main.commands[name].callback.__module__ == f"gate.cli.{m}" for m in modules
        ), name


# ---- the inbox and the MCP server are extras ------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "command"),
    [("inbox", ["inbox", "serve"]), ("inbox", ["inbox", "check-config"]), ("mcp", ["mcp"])],
    ids=["inbox serve", "inbox check-config", "mcp"],
)
def test_command_without_its_extra_names_the_extra_in_one_line(monkeypatch, extra, command):
    """A base install (``pip install hitl-gate``) lacks the extra's packages: one line, exit 2,
    no traceback; the command's help still works (tests/test_packaging.py runs this in a
    real install without extras)."""
    import gate.cli as cli

    monkeypatch.setitem(cli.EXTRAS, extra, (*cli.EXTRAS[extra], "gate_not_installed_here"))

    result = invoke([*command, "-c", "config.yaml"])
    helped = invoke([*command, "--help"])

    assert result.exit_code == 2
    assert one_error_line(result.stderr) == (
        f"Error: hitl-gate {extra} needs the {extra} extra: pip install 'hitl-gate[{extra}]'"
    )
    assert result.stdout == ""
    assert helped.exit_code == 0 and helped.stdout.startswith("Usage: ")


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("extra", "shadow", "command"),
    [
        ("mcp", "mcp", ["mcp"]),  # an mcp 1.x: no mcp.server.mcpserver
        ("inbox", "markdown_it", ["inbox", "serve"]),  # a markdown-it-py 2.x: no EnvType
        ("inbox", "markdown_it", ["inbox", "check-config"]),
    ],
    ids=["old mcp", "old markdown-it, serve", "old markdown-it, check-config"],
)
def test_command_with_an_unusable_extra_names_the_extra_in_one_line(
    tmp_path, extra, shadow, command
):
    """The extra's packages are installed but unusable (an older major version another tool
    pinned, a dependency removed): the same one line naming the extra, exit 2, no
    traceback, never a config check that passes before the program cannot start."""
    package = tmp_path / "shadow" / shadow
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("# an older release of the package, without its API\n")
    (package / "utils.py").write_text("")

    config = EXAMPLE if extra == "mcp" else ROOT / "examples" / "inbox" / "inbox.yaml"

    done = run_cli(
        *command,
        "-c",
        str(config),
        env={**gate_env(), "PYTHONPATH": f"{tmp_path / 'shadow'}{os.pathsep}{ROOT}"},
    )

    stderr = done.stderr.decode()
    lines = stderr.strip().splitlines()
    assert done.returncode == 2, stderr
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(
        f"Error: hitl-gate {extra} needs the {extra} extra: pip install 'hitl-gate[{extra}]'"
    )


# ---- what a person reads: times fixed width ------------------------------------------------


def test_list_lines_show_times_fixed_width_with_milliseconds():
    from gate.cli.approvers import credential_line
    from gate.cli.requests import approval_line, question_line

    approval = {
        "approval_id": UNKNOWN_ID,
        "state": "pending",
        "outcome": None,
        "pipeline": "p",
        "step": "q1",
        "quorum": {"required": 2, "collected": 1},
        "expires_at": "2026-12-07T10:20:16.4Z",
        "decisions": [],
    }
    question = {
        "question_id": UNKNOWN_ID,
        "state": "resolved",
        "outcome": "answered",
        "pipeline": "p",
        "step": "ask",
        "question": {"response_type": "free_text"},
        "version": 1,
        "expires_at": "2026-12-07T10:20:16Z",
    }
    credential = {
        "credential_id": "If4x36FUomFia_hUBG_SJw",
        "operator_id": 101,
        "identity": "alice@example.com",
        "type": "ed25519",
        "revoked_at": "2026-12-07T10:20:16.45Z",
        "label": None,
    }
    assert approval_line(approval) == (
        f"{UNKNOWN_ID}  pending   -          p/q1  1/2  expires 2026-12-07T10:20:16.400Z"
    )
    assert question_line(question) == (
        f"{UNKNOWN_ID}  resolved  answered   p/ask  free_text  version 1  "
        "expires 2026-12-07T10:20:16.000Z"
    )
    assert credential_line(credential) == (
        "If4x36FUomFia_hUBG_SJw  101  alice@example.com  ed25519  "
        "revoked 2026-12-07T10:20:16.450Z  -"
    )
