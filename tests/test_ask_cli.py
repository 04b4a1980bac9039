"""``hitl-gate ask`` and ``hitl-gate questions``: what is refused before the gate is asked.
Each usage error is one ``Error:`` line naming the option (and the file), exit 2,
and nothing is sent: the config named does not even exist, so reaching it would say so."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gate.cli import main

BASE = ["ask", "-c", "/nonexistent/config.yaml", "--pipeline", "p", "--step", "s"]


def invoke(args: list[str], stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, args, input=stdin, catch_exceptions=False)


def one_error(result: Result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--text", "Which?", "--multi"],
            "Error: --multi needs --choice (the options to choose from)",
            id="multi-without-choice",
        ),
        pytest.param(
            ["--text", "Which?", "--choice", "a", "--schema", "form.json"],
            "Error: --choice and --schema exclude each other (choices ask for one of them, "
            "a schema for a form)",
            id="choice-with-schema",
        ),
        pytest.param(
            ["--text", "Which?", "--choice", "a", "--choice", "a"],
            "Error: --choice: 'a' is given twice",
            id="choice-twice",
        ),
        pytest.param(
            ["--text", "Which?", "--choice", " "],
            "Error: --choice: an option must not be empty or only white space",
            id="blank-choice",
        ),
        pytest.param([], "Error: give exactly one of --text or --text-file", id="no-text"),
        pytest.param(
            ["--text", "a", "--text-file", "-"],
            "Error: give exactly one of --text or --text-file",
            id="both-texts",
        ),
        pytest.param(
            ["--text", " \t"], "Error: --text: the question is only white space", id="blank"
        ),
        pytest.param(["--text", ""], "Error: --text: the question is empty", id="empty"),
        pytest.param(
            ["--text", "a", "--idempotency-key", " "],
            "Error: --idempotency-key: must be 1-200 UTF-8 characters, not blank, without "
            "control characters",
            id="blank-key",
        ),
    ],
)
def test_ask_usage_errors_are_one_line_exit_2(args, message):
    result = invoke([*BASE, *args])

    assert result.exit_code == 2
    assert one_error(result) == message


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        pytest.param(b'{"type": "object",\n', "is not JSON: Expecting", id="truncated"),
        pytest.param(b"[1, 2]", "holds a JSON array, not an object", id="array"),
        pytest.param(b'"form"', "holds a JSON string, not an object", id="string"),
        pytest.param(b'{"a": 1, "a": 2}', "is not JSON: the key 'a' is given twice", id="dup"),
        pytest.param(b'{"a": NaN}', "is not JSON: NaN is not JSON", id="nan"),
        pytest.param(b'{"a": "\xff"}', "is not valid UTF-8 (byte offset 7)", id="not-utf8"),
    ],
)
def test_ask_bad_schema_file_names_the_file_and_the_problem(tmp_path, data, problem):
    path = write(tmp_path, "form.json", data)

    result = invoke([*BASE, "--text", "PO details?", "--schema", path])

    assert result.exit_code == 2
    assert one_error(result).startswith(f"Error: --schema: {path} {problem}")


def test_ask_missing_schema_file_names_it(tmp_path):
    path = str(tmp_path / "missing.json")

    result = invoke([*BASE, "--text", "PO details?", "--schema", path])

    assert result.exit_code == 2
    assert one_error(result) == (f"Error: --schema: cannot read {path}: No such file or directory")


def test_ask_text_file_not_utf8_is_refused(tmp_path):
    path = write(tmp_path, "q.txt", b"Which \xff?")

    result = invoke([*BASE, "--text-file", path])

    assert result.exit_code == 2
    assert one_error(result) == f"Error: --text-file: {path} is not valid UTF-8 (byte offset 6)"


def test_ask_valid_schema_file_goes_on_to_the_config(tmp_path):
    """A well-formed call passes every local check: the next thing read is the config."""
    path = write(tmp_path, "form.json", b'{"type":"object","properties":{}}')

    result = invoke([*BASE, "--text", "PO details?", "--schema", path])

    assert result.exit_code == 2
    assert "/nonexistent/config.yaml" in result.stderr


def test_questions_help_lists_its_commands():
    result = invoke(["questions", "--help"])

    assert result.exit_code == 0
    assert all(name in result.stdout for name in ("list", "show", "cancel"))
