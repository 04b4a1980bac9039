"""Messages (item 12): what a person reads when something is refused.

- ``422 quorum_unreachable`` names the requester and how many approvers remain (answer
  fields and the ``request`` error line), through one real daemon;
- ``request --draft-file -`` says "standard input", and invalid UTF-8 gives the byte offset
  of the first invalid byte (stdin and files; ``permit verify --body-file -`` alike), as real
  ``python -m gate`` processes;
- an unknown config key suggests the closest valid one (``check-config``);
- docs/protocol.md uses the configured skew and says once why the signature header is named
  ``X-Draftcat-Signature``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gate.cli import main
from tests.support import ROOT, CaptureRelay, GateProcess, gate_env, run_cli, write_config

ALICE = "alice@example.com"
STEPS = [
    {"name": "pair", "quorum": 2, "approvers": [101, 102], "timeout": "1h"},
    {"name": "q1", "quorum": 1, "approvers": [101, 102], "timeout": "1h"},
]
PROTOCOL_MD = ROOT / "docs" / "protocol.md"


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


# ---- 422 quorum_unreachable -----------------------------------------------------------------


@pytest.mark.e2e
def test_quorum_unreachable_answer_names_the_requester_and_who_is_left(
    gate: GateProcess,
) -> None:
    answer = gate.api().call(
        "POST",
        "/v1/approvals",
        {
            "pipeline": "p",
            "step": "pair",
            "draft": {"body": "x"},
            "requested_by": " Alice@Example.com",
        },
    )

    assert answer == (
        422,
        {
            "status": "invalid",
            "reason": "quorum_unreachable",
            "field": "requested_by",
            "requested_by": ALICE,
            "approvers_left": 1,
            "quorum_required": 2,
        },
    )


@pytest.mark.e2e
def test_request_says_who_asked_and_how_many_approvers_remain(gate: GateProcess) -> None:
    proc = run_cli(
        "request",
        "-c",
        str(gate.config),
        "--api-url",
        gate.api_url,
        "--pipeline",
        "p",
        "--step",
        "pair",
        "--draft",
        "x",
        "--requested-by",
        ALICE,
    )

    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr.decode() == (
        "Error: the gate answered HTTP 422 quorum_unreachable: quorum 2 cannot be met without "
        f"the requester {ALICE}: 1 other approver remains in scope (a requester may not "
        "approve their own request unless the step sets allow_self_approval: true)\n"
    )


# ---- --draft-file: standard input, byte offsets ---------------------------------------------


def _request(gate: GateProcess, *args: str, **run: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gate",
            "request",
            "-c",
            str(gate.config),
            "--api-url",
            gate.api_url,
            "--pipeline",
            "p",
            "--step",
            "q1",
            *args,
        ],
        capture_output=True,
        env=gate_env(),
        cwd=ROOT,
        timeout=20,
        check=False,
        **run,
    )


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("raw", "offset"),
    [(b"\xff", 0), (b"Gr\xc3\xbc\xc3e", 4), (b"ok\n" * 5 + b"\xed\xa0\x80", 15)],
    ids=["first_byte", "truncated_sequence", "surrogate"],
)
def test_draft_on_stdin_that_is_not_utf8_names_standard_input_and_the_offset(
    gate: GateProcess, raw: bytes, offset: int
) -> None:
    proc = _request(gate, "--draft-file", "-", input=raw)

    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == (
        f"Error: --draft-file: standard input is not valid UTF-8 (byte offset {offset})\n"
    )


@pytest.mark.e2e
def test_draft_file_that_is_not_utf8_gives_the_offset(gate: GateProcess, tmp_path: Path) -> None:
    draft = tmp_path / "mail.txt"
    draft.write_bytes("Grüße, ".encode() + b"\x80 rest")

    proc = _request(gate, "--draft-file", str(draft))

    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        f"Error: --draft-file: {draft} is not valid UTF-8 (byte offset 9)\n"
    )


def _write_only_stdin() -> tuple[int, int]:
    """A pipe; its write end given as standard input cannot be read (EBADF)."""
    return os.pipe()


@pytest.mark.e2e
def test_unreadable_standard_input_is_named(gate: GateProcess) -> None:
    read_end, write_end = _write_only_stdin()
    try:
        proc = _request(gate, "--draft-file", "-", stdin=write_end)
    finally:
        os.close(read_end)
        os.close(write_end)

    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        "Error: --draft-file: cannot read standard input: Bad file descriptor\n"
    )


@pytest.mark.e2e
def test_closed_standard_input_is_named(gate: GateProcess) -> None:
    command = [
        sys.executable,
        "-m",
        "gate",
        "request",
        "-c",
        str(gate.config),
        "--api-url",
        gate.api_url,
        "--pipeline",
        "p",
        "--step",
        "q1",
        "--draft-file",
        "-",
    ]
    # `<&-`: the command starts with its standard input closed (Python's sys.stdin is None)
    proc = subprocess.run(
        ["sh", "-c", 'exec "$@" <&-', "sh", *command],
        capture_output=True,
        env=gate_env(),
        cwd=ROOT,
        timeout=20,
        check=False,
    )

    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        "Error: --draft-file: cannot read standard input: it is closed\n"
    )


@pytest.mark.e2e
def test_permit_verify_names_standard_input(tmp_path: Path) -> None:
    from gate.trust.keys import generate

    generate(tmp_path)
    permit = tmp_path / "permit.jws"
    permit.write_text("a.b.c\n", encoding="ascii")
    read_end, write_end = _write_only_stdin()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gate",
                "permit",
                "verify",
                str(permit),
                "--public-key",
                str(tmp_path / "hitl-gate-ed25519.pub"),
                "--body-file",
                "-",
            ],
            stdin=write_end,
            capture_output=True,
            env=gate_env(),
            cwd=ROOT,
            timeout=20,
            check=False,
        )
    finally:
        os.close(read_end)
        os.close(write_end)

    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        "Error: --body-file: cannot read standard input: Bad file descriptor\n"
    )


# ---- unknown config keys --------------------------------------------------------------------


def _check_config(tmp_path: Path, edit: Any) -> list[str]:
    path = write_config(tmp_path, "http://127.0.0.1:9/")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    result = CliRunner().invoke(
        main, ["check-config", "-c", str(path)], env=gate_env(), catch_exceptions=False
    )
    assert result.exit_code == 2
    prefix = f"{path}: "
    assert all(line.startswith(prefix) for line in result.stderr.splitlines()), result.stderr
    return [line[len(prefix) :] for line in result.stderr.splitlines()]


def _rename(data: dict[str, Any], path: tuple[Any, ...], new: str) -> None:
    *parents, old = path
    node = data
    for part in parents:
        node = node[part]
    node[new] = node.pop(old)


@pytest.mark.parametrize(
    ("path", "typo", "expected"),
    [
        (
            ("pipelines", 0, "steps", 0, "quorum"),
            "qorum",
            'pipelines[0].steps[0].qorum: unknown key; did you mean "quorum"?',
        ),
        (
            ("relay", "secret_env"),
            "secret_evn",
            'relay.secret_evn: unknown key; did you mean "secret_env"?',
        ),
        (
            ("relay", "security", "allowed_users"),
            "allowed_user",
            'relay.security.allowed_user: unknown key; did you mean "allowed_users"?',
        ),
        (
            ("relay", "operators", 0, "identity"),
            "identiy",
            'relay.operators[0].identiy: unknown key; did you mean "identity"?',
        ),
        (("pipelines",), "pipeline", 'pipeline: unknown key; did you mean "pipelines"?'),
        (
            ("api", "max_draft_bytes"),
            "max_draft_size",
            'api.max_draft_size: unknown key; did you mean "max_draft_bytes"?',
        ),
    ],
    ids=["step", "relay", "security", "operator", "top_level", "api"],
)
def test_unknown_config_key_suggests_the_closest_one(
    tmp_path: Path, path: tuple[Any, ...], typo: str, expected: str
) -> None:
    errors = _check_config(tmp_path, lambda data: _rename(data, path, typo))

    assert expected in errors, errors


def test_unknown_config_key_without_a_close_one_suggests_nothing(tmp_path: Path) -> None:
    def add(data: dict[str, Any]) -> None:
        data["relay"]["frobnicate"] = 1
        data["storage"]["sqlite"] = "x"  # close to no storage key

    assert _check_config(tmp_path, add) == [
        "relay.frobnicate: unknown key",
        "storage.sqlite: unknown key",
    ]


def test_unknown_key_in_an_optional_section_suggests_too(tmp_path: Path) -> None:
    def add(data: dict[str, Any]) -> None:
        data["http"] = {"header_timout": "5s"}
        data["budget"] = {"cap_todya": 1}

    assert _check_config(tmp_path, add) == [
        'http.header_timout: unknown key; did you mean "header_timeout"?',
        'budget.cap_todya: unknown key; did you mean "cap_today"?',
    ]


# ---- docs/protocol.md -----------------------------------------------------------------------


def test_protocol_doc_uses_the_configured_skew() -> None:
    text = PROTOCOL_MD.read_text(encoding="utf-8")

    assert not re.search(r"±\s*300|300\s*s\s+(away|from)", text), "hard-coded ±300 s"
    assert text.count("max_skew") >= 2


def test_protocol_doc_says_why_the_header_is_named_after_draftcat() -> None:
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    signature = text.split("## Signature", 1)[1].split("\n## ", 1)[0]

    assert "draftcat" in signature.lower().replace("x-draftcat-signature", "")
    assert text.lower().count("wire compatib") == 1
