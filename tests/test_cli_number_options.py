"""Every number a CLI option or argument takes (``gate.cli.common.NumberType``): ASCII digits
only, as the API's query parameters (docs/design.md "Numbers"). Click's own FLOAT and INT also
took ``١٢``, ``1_0`` and `` 5 ``; a refusal is one ``Error: --option: ...`` line, exit 2,
before anything is sent or started."""

from __future__ import annotations

import pytest

from tests.test_cli import ENV, EXAMPLE, invoke, one_error_line

CONFIG = ["-c", str(EXAMPLE)]
REQUEST = ["request", *CONFIG, "--pipeline", "p", "--step", "s", "--draft", "x"]
ASK = ["ask", *CONFIG, "--pipeline", "p", "--step", "s", "--text", "x"]
POLICY = ["policy", "test", *CONFIG, "--pipeline", "p", "--step", "s", "--draft-file", "-"]
VERIFY = ["verify", "http://127.0.0.1:9/", "--secret-env", "S", "--approver", "a"]
RELAY = ["relay", "--secret-env", "S"]

FLOAT_OPTIONS = [
    (REQUEST, "--spend"),
    (POLICY, "--spend"),
    ([*REQUEST, "--wait"], "--timeout"),
    ([*ASK, "--wait"], "--timeout"),
    (VERIFY, "--timeout"),
    (["mcp", *CONFIG, "--http", "127.0.0.1:0"], "--read-timeout"),
    (RELAY, "--max-skew"),
]
INT_OPTIONS = [
    (["list", *CONFIG], "--limit"),
    (["questions", "list", *CONFIG], "--limit"),
    (["mcp", *CONFIG, "--http", "127.0.0.1:0"], "--max-connections"),
]
NOT_ASCII = ["١٢", "1_0", " 5 ", "²", "nan", "inf", "0x10", ""]


@pytest.mark.parametrize("text", NOT_ASCII, ids=repr)
@pytest.mark.parametrize(("args", "option"), FLOAT_OPTIONS, ids=lambda x: str(x))
def test_a_number_option_takes_ascii_digits_only(args: list[str], option: str, text: str) -> None:
    result = invoke([*args, option, text], env=dict(ENV))
    assert result.exit_code == 2, result.output
    assert one_error_line(result.stderr) == (
        f"Error: {option}: must be a number in ASCII digits, such as 12 or 0.5 (got {text!r})"
    )


@pytest.mark.parametrize("text", [*NOT_ASCII, "1.5", "1e3"], ids=repr)
@pytest.mark.parametrize(("args", "option"), INT_OPTIONS, ids=lambda x: str(x))
def test_a_whole_number_option_takes_ascii_digits_only(
    args: list[str], option: str, text: str
) -> None:
    result = invoke([*args, option, text], env=dict(ENV))
    assert result.exit_code == 2, result.output
    assert one_error_line(result.stderr) == (
        f"Error: {option}: must be a whole number in ASCII digits, such as 12 (got {text!r})"
    )


def test_an_operator_id_argument_takes_ascii_digits_only() -> None:
    result = invoke(["approvers", "add-key", *CONFIG, "١٢", "--public-key", "-"], env=dict(ENV))
    assert result.exit_code == 2, result.output
    assert one_error_line(result.stderr) == (
        "Error: OPERATOR_ID: must be a whole number in ASCII digits, such as 12 (got '١٢')"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [(["list", *CONFIG, "--limit", "0"], "--limit: must be a whole number from 1 to 500"),
     (["list", *CONFIG, "--limit", "501"], "--limit: must be a whole number from 1 to 500"),
     ([*VERIFY, "--timeout", "0.5"], "--timeout: must be a number >= 1 and at most 2**53 "
      "(9007199254740992)"),
     ([*ASK, "--wait", "--timeout", "-1"], "--timeout: must be a number >= 0 and at most 2**53 "
      "(9007199254740992)"),
     ([*ASK, "--wait", "--timeout", "1e400"], "--timeout: must be a number >= 0 and at most "
      "2**53 (9007199254740992)"),
     ([*REQUEST, "--spend", "-1"], "--spend: must be a number >= 0"),
     ([*REQUEST, "--spend", "1e400"], "--spend: is too large (at most 1e+15)"),
     ([*POLICY, "--spend", "1e16"], "--spend: is too large (at most 1e+15)")],
)  # fmt: skip
def test_a_number_out_of_its_range_is_one_line(args: list[str], message: str) -> None:
    result = invoke(args, env=dict(ENV))
    assert result.exit_code == 2, result.output
    assert one_error_line(result.stderr) == f"Error: {message}"
