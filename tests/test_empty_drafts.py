"""Blank drafts (item 5): a draft that is empty or only Unicode
White_Space is refused at the gate (API 400 ``draft_empty``) and by ``hitl-gate request``
before it contacts the gate, unless the step says ``allow_empty_draft: true``.

Through one real daemon (pipeline API over HTTP, a capturing relay on loopback) and the CLI
as real ``python -m gate`` processes.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gate.cli import main
from tests.support import (
    CaptureRelay,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    run_cli,
    write_config,
)

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102], "timeout": "1h"},
    {
        "name": "blank-ok",
        "quorum": 1,
        "approvers": [101, 102],
        "timeout": "1h",
        "allow_empty_draft": True,
    },
]
EMPTY = {"status": "invalid", "reason": "draft_empty", "field": "draft.body"}
# only characters with the Unicode White_Space property (PropList.txt): all blank
BLANK = [
    "",
    " ",
    "\n",
    "\r\n\t\x0b\x0c",
    "\x85",
    "\xa0",
    "\u1680",
    "\u2000\u200a",
    "\u2028\u2029",
    "\u202f\u205f\u3000",
]
# characters str.isspace() or a display may treat as space, but not White_Space: a draft
NOT_BLANK = ["\x1c", "\x1f", " \x1e ", "\u200b", "\u180e", "\ufeff", "\u2060"]


@pytest.fixture(scope="module")
def relay() -> Iterator[CaptureRelay]:
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory, relay: CaptureRelay) -> Iterator[GateProcess]:
    config = write_config(tmp_path_factory.mktemp("gate"), relay.url, steps=STEPS)
    proc = GateProcess(config).start()
    yield proc
    if proc.proc and proc.proc.poll() is None:
        proc.stop()


def _create(gate: GateProcess, step: str, body: str) -> tuple[int, Any]:
    return gate.api().call(
        "POST",
        "/v1/approvals",
        {"pipeline": "p", "step": step, "draft": {"content_type": "text/plain", "body": body}},
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- the API ---------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("body", BLANK, ids=[repr(b) for b in BLANK])
def test_api_refuses_a_blank_draft_and_creates_nothing(gate: GateProcess, body: str) -> None:
    before = gate.api().call("GET", "/v1/approvals?state=all&limit=500")[1]["items"]

    what = "empty" if body == "" else "only white space"
    said = {**EMPTY, "message": f"draft.body is {what}: nothing to approve"}
    assert _create(gate, "q1", body) == (400, said)
    assert gate.api().call("GET", "/v1/approvals?state=all&limit=500")[1]["items"] == before


@pytest.mark.e2e
@pytest.mark.parametrize("body", NOT_BLANK, ids=[repr(b) for b in NOT_BLANK])
def test_api_takes_a_draft_of_characters_that_are_not_white_space(
    gate: GateProcess, relay: CaptureRelay, body: str
) -> None:
    status, answer = _create(gate, "q1", body)

    assert status == 201, answer
    assert relay.wait_dispatch(answer["approval_id"])["draft"]["body"] == body


@pytest.mark.e2e
@pytest.mark.parametrize("body", ["", " \n"], ids=["empty", "white_space"])
def test_step_with_allow_empty_draft_takes_a_blank_draft(
    gate: GateProcess, relay: CaptureRelay, body: str
) -> None:
    status, answer = _create(gate, "blank-ok", body)

    assert status == 201, answer
    assert relay.wait_dispatch(answer["approval_id"])["draft"]["body"] == body  # as sent


@pytest.mark.e2e
def test_blank_draft_of_an_unknown_step_is_still_404(gate: GateProcess) -> None:
    status, answer = _create(gate, "nope", "")

    assert (status, answer["reason"]) == (404, "unknown_step")


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (" \u3000\u2028\n", (422, {"status": "invalid", "reason": "adjust_text_required"})),
        ("\x1f", (200, {"status": "recorded", "resolved": True, "outcome": "adjusted"})),
    ],
    ids=["white_space", "unit_separator"],
)
def test_adjust_text_is_blank_by_the_same_rule(
    gate: GateProcess, relay: CaptureRelay, text: str, answer: Any
) -> None:
    """SPEC §2 check 12 ("whitespace only is blank") by the drafts' rule: White_Space only."""
    status, created = _create(gate, "q1", "the draft")
    dispatch = relay.wait_dispatch(created["approval_id"])

    got = post_decision(
        gate.callback_url, decision_body(dispatch, verb="adjust", adjust_text=text)
    )[:2]

    assert got == answer


# ---- the CLI ---------------------------------------------------------------------------------


def _request(
    config: Path, api_url: str, step: str, *args: str, stdin: bytes | None = None
) -> tuple[int, bytes, str]:
    proc = run_cli(
        "request",
        "-c",
        str(config),
        "--api-url",
        api_url,
        "--pipeline",
        "p",
        "--step",
        step,
        *args,
        stdin=stdin,
    )
    return proc.returncode, proc.stdout, proc.stderr.decode("utf-8")


HINT = "(allow_empty_draft: true on the step allows it)"


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("source", "stdin", "named"),
    [
        (["--draft", ""], None, "--draft: the draft is empty"),
        (["--draft", " \u3000\n"], None, "--draft: the draft is only white space"),
        (["--draft-file", "{empty}"], None, "--draft-file: {empty} is empty"),
        (["--draft-file", "{blank}"], None, "--draft-file: {blank} is only white space"),
        (["--draft-file", "-"], b"", "--draft-file: standard input is empty"),
        (
            ["--draft-file", "-"],
            "\t\xa0\r\n".encode(),
            "--draft-file: standard input is only white space",
        ),
    ],
    ids=["draft", "draft_white_space", "file", "file_white_space", "stdin", "stdin_white_space"],
)
def test_cli_refuses_a_blank_draft_before_contacting_the_gate(
    gate: GateProcess, tmp_path: Path, source: list[str], stdin: bytes | None, named: str
) -> None:
    empty, blank = tmp_path / "empty.txt", tmp_path / "blank.txt"
    empty.write_bytes(b"")
    blank.write_bytes("  \n\u2028".encode())
    files = {"empty": str(empty), "blank": str(blank)}
    args = [arg.format(**files) for arg in source]
    unreachable = f"http://127.0.0.1:{_closed_port()}"  # contacted, it would say so

    code, out, err = _request(gate.config, unreachable, "q1", *args, stdin=stdin)

    assert (code, out) == (2, b""), err
    assert err == f"Error: {named.format(**files)}: nothing to approve {HINT}\n"


@pytest.mark.e2e
def test_cli_passes_a_blank_draft_when_the_step_allows_it(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    code, out, err = _request(gate.config, gate.api_url, "blank-ok", "--draft-file", "-", stdin=b"")

    assert code == 0, err
    approval_id = out.decode().strip()
    assert relay.wait_dispatch(approval_id)["draft"]["body"] == ""


@pytest.mark.e2e
def test_cli_leaves_a_step_it_does_not_know_to_the_gate(gate: GateProcess) -> None:
    code, out, err = _request(gate.config, gate.api_url, "nope", "--draft", "")

    assert (code, out) == (1, b"")
    assert "404" in err and "unknown_step" in err, err


@pytest.mark.e2e
def test_cli_takes_a_draft_that_is_not_white_space(gate: GateProcess) -> None:
    code, out, err = _request(gate.config, gate.api_url, "q1", "--draft", "\x1f")

    assert code == 0, err


# ---- the config key --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_allow_empty_draft_must_be_true_or_false(tmp_path: Path, value: Any) -> None:
    config = write_config(
        tmp_path,
        "http://127.0.0.1:9/",
        steps=[{"name": "s", "approvers": [101], "allow_empty_draft": value}],
    )
    result = CliRunner().invoke(
        main, ["check-config", "-c", str(config)], env=gate_env(), catch_exceptions=False
    )

    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"{config}: pipelines[0].steps[0].allow_empty_draft: expected true or false, got "
    ), lines


def test_allow_empty_draft_defaults_to_false(tmp_path: Path) -> None:
    from gate.config import load_config

    config = load_config(write_config(tmp_path, "http://127.0.0.1:9/"))
    example = yaml.safe_load(
        (Path(__file__).parent.parent / "config.example.yaml").read_text(encoding="utf-8")
    )

    assert all(not step.allow_empty_draft for p in config.pipelines for step in p.steps)
    assert all(
        not s.get("allow_empty_draft", False) for p in example["pipelines"] for s in p["steps"]
    )
