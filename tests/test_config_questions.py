"""Question steps in the config (issue 15): the question relay, the refusals, the limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gate.config import load_config
from gate.config.questions import NEEDS_RELAY
from tests.support import run_cli
from tests.test_config import config_errors, example_data, write


def question_config(**step: Any) -> dict[str, Any]:
    """The example with a question relay and a pipeline ``ask`` with one question step."""
    data = example_data()
    data["relay"]["questions"] = True
    data["pipelines"].append(
        {"name": "ask", "steps": [{"name": "pick", "type": "question", **step}]}
    )
    return data


def test_question_step_loads_with_its_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, question_config(approvers=[111])))

    found = config.find_step("ask", "pick")
    assert found is not None
    question = found[1]
    assert question.is_question and question.quorum == 1
    assert (question.max_options, question.max_answer_chars) == (50, 2000)
    assert config.relay.question_target == config.relay.url


def test_question_target_prefers_question_url(tmp_path: Path) -> None:
    data = question_config()
    data["relay"]["questions"] = False
    data["relay"]["question_url"] = "http://127.0.0.1:9/questions"

    config = load_config(write(tmp_path, data))

    assert config.relay.question_target == "http://127.0.0.1:9/questions"


def test_question_target_is_none_without_support() -> None:
    config = load_config(Path(__file__).resolve().parent.parent / "config.example.yaml")

    assert config.relay.question_target is None


def test_question_step_without_a_question_relay_is_refused_at_its_type(tmp_path: Path) -> None:
    data = question_config()
    data["relay"]["questions"] = False

    errors = config_errors(write(tmp_path, data))

    assert errors == [f"pipelines[1].steps[0].type: {NEEDS_RELAY}"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("quorum", 2, "quorum must be 1, got 2"),
        ("remind_after", "10m", "reminders/escalation are for approval steps"),
        ("remind_every", "10m", "reminders/escalation are for approval steps"),
        ("escalate", [{"after": "10m", "to": [333]}], "reminders/escalation are for approval"),
        ("allow_self_approval", True, "only for approval steps"),
        ("allow_empty_draft", True, "only for approval steps"),
        ("skip_reason", "required", "only for approval steps"),
    ],
)
def test_question_step_refuses_approval_keys(
    tmp_path: Path, key: str, value: Any, message: str
) -> None:
    errors = config_errors(write(tmp_path, question_config(**{key: value})))

    assert len(errors) == 1, errors
    assert errors[0].startswith(f"pipelines[1].steps[0].{key}: "), errors
    assert message in errors[0]


@pytest.mark.parametrize(("key", "value"), [("max_options", 0), ("max_answer_chars", "10")])
def test_question_limits_are_positive_integers(tmp_path: Path, key: str, value: Any) -> None:
    errors = config_errors(write(tmp_path, question_config(**{key: value})))

    assert any(e.startswith(f"pipelines[1].steps[0].{key}") for e in errors), errors


@pytest.mark.e2e
def test_check_config_exits_2_naming_the_question_step_without_relay(tmp_path: Path) -> None:
    data = question_config()
    data["relay"]["questions"] = False

    proc = run_cli("check-config", "-c", str(write(tmp_path, data)))

    assert proc.returncode == 2
    assert f"pipelines[1].steps[0].type: {NEEDS_RELAY}" in proc.stderr.decode()
