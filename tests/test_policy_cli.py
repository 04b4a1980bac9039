"""``hitl-gate policy test`` and what ``check-config`` shows of policy, run as
real ``python -m gate`` processes on a config file; nothing is created (no database)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import run_cli, write_config

pytestmark = pytest.mark.e2e

STEPS: list[dict[str, Any]] = [
    {
        "name": "send",
        "approvers": [101, 102],
        "remember_approval": "90m",
        "policy": [
            {
                "id": "no-prod",
                "decide": "deny",
                "reason": "not from here",
                "when": {"body_matches": r"\bprod\b"},
            },
            {
                "id": "small",
                "decide": "approve",
                "when": {
                    "max_spend": 100,
                    "content_type": "application/json",
                    "arguments": {"amount": {"max": 100}},
                },
            },
        ],  # fmt: skip
    },
    {
        "name": "pair",
        "quorum": 2,
        "approvers": [101, 102, 103],
        "policy": [
            {
                "id": "tiny",
                "decide": "approve",
                "allow_quorum": True,
                "when": {"max_draft_bytes": 10},
            }
        ],  # fmt: skip
    },
    {"name": "ask", "type": "question", "approvers": [101]},
]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = write_config(tmp_path, "http://127.0.0.1:9/relay", steps=STEPS)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["relay"]["questions"] = True
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def policy_test(config: Path, step: str, draft: str, *extra: str) -> tuple[int, str, str]:
    draft_file = config.parent / "draft"
    draft_file.write_text(draft, encoding="utf-8")
    done = run_cli(
        "policy", "test", "-c", str(config), "--pipeline", "p", "--step", step,
        "--draft-file", str(draft_file), *extra,
    )  # fmt: skip
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def test_policy_test_names_the_deciding_rule(config: Path) -> None:
    code, out, err = policy_test(
        config, "send", '{"amount": 40}', "--content-type", "application/json", "--spend", "40"
    )
    assert (code, err) == (0, "")
    assert out.splitlines()[1] == "policy:small would approve (pipelines[0].steps[0].policy[1])"

    code, out, _ = policy_test(
        config, "send", '{"amount": 40, "env": "prod"}', "--content-type", "application/json",
        "--spend", "40",
    )  # fmt: skip
    assert code == 0
    assert out.splitlines()[1] == (
        "policy:no-prod would deny (pipelines[0].steps[0].policy[0]); reason: not from here"
    )

    code, out, _ = policy_test(config, "send", '{"amount": 400}', "--spend", "40")
    assert code == 0
    assert out.splitlines()[1:] == [
        "no rule: a person decides",
        r"  no-prod: no match: body does not match body_matches '\bprod\b'",
        "  small: no match: content_type text/plain is not application/json",
        "unless a person approved this same draft on this step within 1h30m: then "
        "policy:remembered approves it",
    ]
    assert not (config.parent / "gate.db").exists()  # nothing created


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--step", "nope"], "step 'nope' is not configured in 'p'"),
        (["--pipeline", "nope"], "pipeline 'nope' is not configured"),
        (["--step", "ask"], "--step: 'ask' is a question step"),
        (["--spend", "-1"], "--spend: must be a number >= 0"),
        (["--draft-file", "/nonexistent/x"], "--draft-file: cannot read /nonexistent/x"),
    ],
)
def test_policy_test_bad_input_is_one_line_exit_2(
    config: Path, args: list[str], message: str
) -> None:
    draft_file = config.parent / "draft"
    draft_file.write_text("x", encoding="utf-8")
    base = {"--pipeline": "p", "--step": "send", "--draft-file": str(draft_file)}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    flat = [x for pair in base.items() for x in pair]
    done = run_cli("policy", "test", "-c", str(config), *flat)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert len(err.splitlines()) == 1 and message in err, err


def test_policy_test_draft_not_utf8(config: Path) -> None:
    bad = config.parent / "bad"
    bad.write_bytes(b"\xff\xfe")
    done = run_cli(
        "policy", "test", "-c", str(config), "--pipeline", "p", "--step", "send",
        "--draft-file", str(bad),
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.decode().strip() == f"Error: --draft-file: {bad} is not UTF-8 text"


def test_check_config_shows_an_approve_rule_standing_in_for_a_quorum(config: Path) -> None:
    done = run_cli("check-config", "-c", str(config))
    assert done.returncode == 0, done.stderr
    assert (
        f"{config}: note: pipelines[0].steps[1].policy[0]: rule 'tiny' approves on its own a"
        " step that needs quorum 2 (allow_quorum: true)"
    ) in done.stderr.decode().splitlines()


def test_check_config_lists_policy_errors_with_their_path(config: Path) -> None:
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["pipelines"][0]["steps"][1]["policy"][0].pop("allow_quorum")
    data["pipelines"][0]["steps"][0]["policy"][0]["when"]["body_matches"] = "(["
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    done = run_cli("check-config", "-c", str(config))
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 2
    assert any(
        line.startswith(f"{config}: pipelines[0].steps[0].policy[0].when.body_matches: ")
        for line in lines
    ), lines
    assert any(
        line.startswith(
            f"{config}: pipelines[0].steps[1].policy[0].decide: the step needs quorum 2"
        )
        for line in lines
    ), lines


def test_doctor_names_an_approve_rule_standing_in_for_a_quorum(config: Path) -> None:
    done = run_cli("doctor", "-c", str(config))  # the relay is down: exit 1, lines still shown
    config_line = next(
        line for line in done.stdout.decode().splitlines() if line.split()[1:2] == ["config:"]
    )
    assert config_line.startswith("PASS config: "), config_line
    assert config_line.endswith(
        "; pipelines[0].steps[1].policy[0]: rule 'tiny' approves on its own a step that needs"
        " quorum 2 (allow_quorum: true)"
    ), config_line


def test_policy_test_says_an_approve_over_a_budget_cap_goes_to_a_person(config: Path) -> None:
    """Review L2: policy test knows the config's caps but not the day's spending; it says
    that the gate drops an approve whose spend passes a cap at creation."""
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["pipelines"][0]["budget_cap"] = 5
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    code, out, err = policy_test(
        config, "send", '{"amount": 40}', "--content-type", "application/json", "--spend", "8"
    )
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1] == "policy:small would approve (pipelines[0].steps[0].policy[1])"
    assert lines[4] == (
        "but spend 8 is over the pipeline's budget_cap 5: the gate leaves it to a person"
    )
    code, out, _ = policy_test(
        config, "send", '{"amount": 4}', "--content-type", "application/json", "--spend", "4"
    )
    assert out.splitlines()[4] == (
        "unless the day's spending with spend 4 passes the pipeline's budget_cap 5 at"
        " creation: then a person decides"
    )


@pytest.mark.parametrize(
    ("draft", "extra", "small"),
    [
        (
            '{"amount": 40}',
            ["--content-type", "application/json", "--spend", "400"],
            "small: no match: spend 400 > max_spend 100",
        ),
        (
            '{"amount": 40}',
            ["--spend", "40"],
            "small: no match: content_type text/plain is not application/json",
        ),
        (
            '{"amount": 400}',
            ["--content-type", "application/json", "--spend", "40"],
            "small: no match: argument amount 400 > max 100",
        ),
        (
            '{"amount": 40}',
            ["--content-type", "application/json"],
            "small: no match: no spend given for max_spend 100",
        ),
        (
            '{"total": 40}',
            ["--content-type", "application/json", "--spend", "40"],
            "small: no match: argument amount is absent",
        ),
    ],
    ids=["spend", "content-type", "argument", "no-spend", "absent-argument"],
)
def test_policy_test_says_why_each_rule_did_not_match(
    config: Path, draft: str, extra: list[str], small: str
) -> None:
    code, out, err = policy_test(config, "send", draft, *extra)
    assert (code, err) == (0, "")
    assert out.splitlines()[1:4] == [
        "no rule: a person decides",
        r"  no-prod: no match: body does not match body_matches '\bprod\b'",
        f"  {small}",
    ]


def test_policy_test_lists_every_rule_when_one_decides(config: Path) -> None:
    code, out, _ = policy_test(
        config, "send", '{"amount": 40}', "--content-type", "application/json", "--spend", "40"
    )
    assert code == 0
    assert out.splitlines()[1:4] == [
        "policy:small would approve (pipelines[0].steps[0].policy[1])",
        r"  no-prod: no match: body does not match body_matches '\bprod\b'",
        "  small: matches",
    ]


@pytest.mark.parametrize("path", ["/items/²/qty", "/items/٣/qty", "/items/01/qty", "items.².qty"])
def test_check_config_refuses_a_list_index_that_is_not_ascii_digits(
    config: Path, path: str
) -> None:
    """A list index in a path is ASCII digits, no leading zero (RFC 6901): ``²`` passed
    check-config, then every create with a list there answered 500."""
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["pipelines"][0]["steps"][0]["policy"][1]["when"]["arguments"] = {path: {"max": 5}}
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    done = run_cli("check-config", "-c", str(config))
    assert done.returncode == 2
    segment = path.replace(".", "/").split("/")[-2]
    assert done.stderr.decode().splitlines() == [
        f"{config}: pipelines[0].steps[0].policy[1].when.arguments: {path!r}: segment"
        f" {segment!r} looks like a list index but is none: a list index is ASCII digits"
        " 0-9 without a leading zero (0, 1, 12)",
    ]


def test_policy_test_sets_a_reasons_second_line_in(config: Path) -> None:
    """A deny reason written over two lines in YAML is printed as one reason: its second
    line set in under the first, not as a line of its own."""
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["pipelines"][0]["steps"][0]["policy"][0]["reason"] = "not from here\nuse staging"
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    code, out, err = policy_test(config, "send", "deploy to prod")

    assert (code, err) == (0, "")
    assert out.splitlines()[1:3] == [
        "policy:no-prod would deny (pipelines[0].steps[0].policy[0]); reason: not from here",
        "  use staging",
    ]


@pytest.mark.parametrize(
    ("draft", "problem"),
    [
        ('{"to": "a@example.com", "to": "b@example.com"}', 'duplicate key "to"'),
        ('{"amount": NaN}', "NaN is not JSON"),
    ],
)
def test_policy_test_says_a_deny_matched_a_draft_it_could_not_read(
    config: Path, draft: str, problem: str
) -> None:
    code, out, err = policy_test(config, "send", draft, "--content-type", "application/json")
    assert (code, err) == (0, "")
    assert out.splitlines()[1:] == [
        "policy:no-prod would deny (pipelines[0].steps[0].policy[0]); reason: not from here",
        f"  no-prod: matches: the draft is not strict JSON ({problem}), and a deny rule holds"
        " where it cannot check",
        "  small: no match: no spend given for max_spend 100",
    ]
