"""Identity trimming (item 9): identities are compared after trimming
exactly the Unicode White_Space characters, then casefolding (SPEC §2 check 11). Python's
``str.strip()`` also dropped U+001C..U+001F, so ``alice@example.com\\x1f`` counted as alice.

Through one real daemon (decisions and creates over HTTP, a capturing relay on loopback), the
config loader, the reference relay's scope check, ``verify``'s judge, and the pure helper.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gate.config import load_config
from gate.errors import ConfigError
from gate.protocol.envelope import parse_decision
from gate.protocol.errors import ProtocolError
from gate.protocol.whitespace import WHITE_SPACE, identity_key, trim
from gate.tools.reference_relay.relay import Relay
from gate.tools.reference_relay.terminal import Terminal
from tests.support import (
    ROOT,
    CaptureRelay,
    GateProcess,
    decision_body,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)
from tests.test_verify import APPROVER, _decision, _failed

ALICE = "alice@example.com"
SEPARATORS = ["\x1c", "\x1d", "\x1e", "\x1f"]  # str.isspace(), but not White_Space
NOT_ALLOWED = (403, {"status": "forbidden", "reason": "approver_not_allowed"})
VECTORS = ROOT / "conformance" / "vectors"


@pytest.fixture(scope="module")
def relay() -> Iterator[CaptureRelay]:
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory, relay: CaptureRelay) -> Iterator[GateProcess]:
    proc = GateProcess(write_config(tmp_path_factory.mktemp("gate"), relay.url)).start()
    yield proc
    if proc.proc and proc.proc.poll() is None:
        proc.stop()


def _open(gate: GateProcess, relay: CaptureRelay, **extra: Any) -> tuple[str, dict[str, Any]]:
    """Create an approval and return it with its dispatch once the gate has recorded the ack
    (before that, a snapshot of the approval races the ack's ``delivered_at``/``attempts``)."""
    approval = gate.api().create("q1", "pay 12 EUR to ACME\n", **extra)
    approval_id = approval["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    wait_until(
        lambda: gate.api().get(approval_id)["dispatch"]["delivered_at"] is not None,
        what="the gate to record the relay's ack",
    )
    return approval_id, dispatch


# ---- the gate: decisions and requested_by ----------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    "identity",
    [ALICE + s for s in SEPARATORS] + [f"\x1f{ALICE}"],
    ids=["trailing_1c", "trailing_1d", "trailing_1e", "trailing_1f", "leading_1f"],
)
def test_identity_with_an_information_separator_is_not_the_operator(
    gate: GateProcess, relay: CaptureRelay, identity: str
) -> None:
    approval_id, dispatch = _open(gate, relay)
    before = gate.api().get(approval_id)

    got = post_decision(gate.callback_url, decision_body(dispatch, identity))[:2]

    assert got == NOT_ALLOWED
    assert gate.api().get(approval_id) == before


@pytest.mark.e2e
@pytest.mark.parametrize(
    "identity", ["\u3000Alice@Example.COM\u2029", f"\xa0{ALICE}\x85", f"\u2002{ALICE}\u202f\t"]
)
def test_identity_padded_with_white_space_is_the_operator(
    gate: GateProcess, relay: CaptureRelay, identity: str
) -> None:
    approval_id, dispatch = _open(gate, relay)

    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, identity))

    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    assert gate.api().get(approval_id)["decisions"][0]["identity"] == identity  # as sent


@pytest.mark.e2e
@pytest.mark.parametrize("separator", SEPARATORS)
def test_requested_by_with_an_information_separator_is_no_operator(
    gate: GateProcess, separator: str
) -> None:
    answer = gate.api().call(
        "POST",
        "/v1/approvals",
        {"pipeline": "p", "step": "q1", "draft": {"body": "x"}, "requested_by": ALICE + separator},
    )

    assert answer == (
        400,
        {
            "status": "invalid",
            "reason": "invalid_requested_by",
            "field": "requested_by",
            "message": f'requested_by "{ALICE}<U+{ord(separator):04X}>" is not the identity'
            f" of an operator in relay.operators; did you mean {ALICE}?",
        },
    )


@pytest.mark.e2e
def test_requested_by_padded_with_white_space_is_the_operator(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    approval_id, dispatch = _open(gate, relay, requested_by=f"\u3000{ALICE}\u00a0")

    assert dispatch["approvers"] == ["bob@example.com", "carol@example.com"]
    assert post_decision(gate.callback_url, decision_body(dispatch, ALICE))[:2] == (
        403,
        {"status": "forbidden", "reason": "self_approval"},
    )


# ---- the config ------------------------------------------------------------------------------


def _identity_errors(tmp_path: Path, identity: str) -> list[str]:
    path = write_config(tmp_path, "http://127.0.0.1:9/")
    text = path.read_text(encoding="utf-8")
    # the first operator (alice, id 101) gets ``identity``, written as a YAML escape
    path.write_text(
        text.replace("identity: alice@example.com", f"identity: {json.dumps(identity)}", 1),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return [e for e in info.value.errors if e.startswith("relay.operators[0].")]


@pytest.mark.parametrize("separator", SEPARATORS)
def test_config_identity_with_a_control_character_is_named(tmp_path: Path, separator: str) -> None:
    assert _identity_errors(tmp_path, ALICE + separator) == [
        f"relay.operators[0].identity: has a control character (U+{ord(separator):04X}); an "
        "identity is what the relay sends as approver.id"
    ]


@pytest.mark.parametrize("identity", [f"{ALICE}\u3000", f"\u2028{ALICE}", f" {ALICE}"])
def test_config_identity_with_white_space_around_it_is_named(tmp_path: Path, identity: str) -> None:
    assert _identity_errors(tmp_path, identity) == [
        "relay.operators[0].identity: has leading or trailing whitespace"
    ]


@pytest.mark.e2e
def test_relay_as_with_a_control_character_is_a_usage_error() -> None:
    proc = run_cli(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        ALICE + "\x1f",
        "--auto",
        "approve",
    )

    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.decode() == (
        f"Error: --as: {ALICE + chr(0x1F)!r} has a control character (U+001F); no dispatch "
        "names such an identity\n"
    )


# ---- the reference relay and verify ----------------------------------------------------------


async def test_reference_relay_decides_only_for_identities_in_scope() -> None:
    async with aiohttp.ClientSession() as session:
        terminal = Terminal.open(asyncio.get_running_loop())  # deciders() reads nothing
        relay = Relay("s" * 32, [ALICE, "Bob@Example.com"], None, 300.0, session, terminal)
        envelope = {
            "approval_id": "01KDWZ8B00J3Q9V5X7Z2M4N6PR",
            "approvers": [ALICE + "\x1f", "\u3000bob@example.com"],
        }

        assert relay.deciders(envelope) == ["Bob@Example.com"]


def test_verify_judges_an_identity_with_a_separator_out_of_scope() -> None:
    assert _failed(_decision(approver={"id": APPROVER + "\x1f"})) == {"relay.approver_in_scope"}
    assert _failed(_decision(approver={"id": f"\u3000{APPROVER.upper()}\u2029"})) == set()


# ---- the helper and the vectors --------------------------------------------------------------


def test_trim_removes_exactly_white_space() -> None:
    everything = "".join(chr(c) for c in range(0x3001) if 0xD800 > c or c > 0xDFFF)
    kept = [c for c in everything if c.isspace() and trim(f"x{c}") != "x"]

    assert len(WHITE_SPACE) == 25
    assert kept == SEPARATORS  # what str.strip() took that is not White_Space
    assert trim(WHITE_SPACE + "a\u200b\ufeff" + WHITE_SPACE) == "a\u200b\ufeff"
    assert identity_key("\x85\u3000ALICE@Example.com\u2028") == ALICE
    assert identity_key(f"{ALICE}\x1f") != ALICE


def _vector(case_id: str) -> dict[str, Any]:
    cases = json.loads((VECTORS / "decision_parse.json").read_text(encoding="utf-8"))["cases"]
    (case,) = [c for c in cases if c["id"] == case_id]
    return case


@pytest.mark.parametrize(
    "case_id", ["approver_id_only_unicode_white_space", "approver_id_only_information_separator"]
)
def test_decision_parse_vectors_use_white_space(case_id: str) -> None:
    case = _vector(case_id)
    raw = case["body_utf8"].encode("utf-8")
    if case["accepted"]:
        decision = parse_decision(raw)
        assert decision.approver_id == case["expect"]["approver_id"]
    else:
        with pytest.raises(ProtocolError) as info:
            parse_decision(raw)
        assert info.value.code == case["reason"]


# ---- invisible characters in an identity ------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("char", "kind"),
    [
        ("\u200b", "format"),  # zero-width space: "alice" twice, one invisible difference
        ("\u202e", "format"),  # right-to-left override
        ("\u2060", "format"),  # word joiner
        ("\ue000", "private-use"),
        ("\U000e0001", "format"),  # language tag
        ("\u0378", "unassigned"),
    ],
)
def test_check_config_refuses_an_invisible_character_in_an_identity(
    tmp_path: Path, char: str, kind: str
) -> None:
    """Item D: bob given ``alice@example.com\\u200b`` is a second operator that looks exactly
    like alice. check-config exits 2 naming the YAML path and the code point."""
    path = write_config(tmp_path, "http://127.0.0.1:9/")
    text = path.read_text(encoding="utf-8")
    written = f'identity: "{ALICE}\\U{ord(char):08X}"'  # a YAML escape
    path.write_text(text.replace("identity: bob@example.com", written, 1), encoding="utf-8")
    assert written in path.read_text(encoding="utf-8")
    proc = run_cli("check-config", "-c", str(path))
    assert proc.returncode == 2, proc.stderr
    assert (
        f"relay.operators[1].identity: has an invisible {kind} character (U+{ord(char):04X}); "
        "an identity is what the relay sends as approver.id"
    ) in proc.stderr.decode(), proc.stderr
    assert b"Traceback" not in proc.stderr


@pytest.mark.e2e
def test_relay_as_with_a_zero_width_character_is_a_usage_error() -> None:
    proc = run_cli(
        "relay", "--listen", "127.0.0.1:0", "--secret-env", "HITL_RELAY_SECRET",
        "--as", ALICE + "\u200b", "--auto", "approve",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.decode() == (
        f"Error: --as: {ALICE + chr(0x200B)!r} has an invisible format character (U+200B); "
        "no dispatch names such an identity\n"
    )
