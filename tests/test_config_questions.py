"""Question steps in the config: the question relay, the refusals, the limits."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.config import load_config
from gate.config.questions import NEEDS_RELAY
from tests.support import CaptureRelay, GateProcess, run_cli, write_config
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


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("allow_self_approval", False, "only for approval steps"),
        ("allow_empty_draft", False, "only for approval steps"),
        ("skip_reason", "optional", "only for approval steps"),
        ("remind_after", None, "reminders/escalation are for approval steps"),
        ("escalate", [], "reminders/escalation are for approval steps"),
    ],
)
def test_question_step_refuses_approval_keys_present_at_their_default(
    tmp_path: Path, key: str, value: Any, message: str
) -> None:
    """A3: config.example.yaml says these keys are refused on a question step: refused
    when present at all, even at their approval default."""
    errors = config_errors(write(tmp_path, question_config(**{key: value})))

    assert len(errors) == 1, errors
    assert errors[0].startswith(f"pipelines[1].steps[0].{key}: "), errors
    assert message in errors[0]


def test_question_step_takes_an_explicit_quorum_of_1(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, question_config(quorum=1, approvers=[111])))

    found = config.find_step("ask", "pick")
    assert found is not None and found[1].quorum == 1


@pytest.mark.parametrize("key", ["max_options", "max_answer_chars"])
def test_approval_step_refuses_question_limits(tmp_path: Path, key: str) -> None:
    data = example_data()
    data["pipelines"][0]["steps"][0][key] = 10

    errors = config_errors(write(tmp_path, data))

    assert errors == [f"pipelines[0].steps[0].{key}: only for type: question"], errors


def test_bad_question_url_is_the_only_error(tmp_path: Path) -> None:
    data = question_config()
    data["relay"]["questions"] = False
    data["relay"]["question_url"] = "ftp://x/"

    errors = config_errors(write(tmp_path, data))

    assert len(errors) == 1 and errors[0].startswith("relay.question_url"), errors


def test_question_step_quorum_2_is_one_error_even_with_one_approver(tmp_path: Path) -> None:
    errors = config_errors(write(tmp_path, question_config(quorum=2, approvers=[111])))

    assert errors == [
        "pipelines[1].steps[0].quorum: a question is answered once (first valid answer wins);"
        " quorum must be 1, got 2"
    ], errors


@pytest.mark.e2e
def test_refused_reload_logs_reload_refused_once(tmp_path: Path) -> None:
    """A3: a SIGHUP with a bad question step logs each error once and one reload_refused."""
    relay = CaptureRelay().start()
    steps = [{"name": "ask", "type": "question", "approvers": [101], "timeout": "1h"}]
    config = write_config(tmp_path, relay.url, steps=steps, relay={"questions": True})
    gate = GateProcess(config).start()
    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
        data["pipelines"][0]["steps"][0]["quorum"] = 2
        config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        assert gate.proc is not None
        gate.proc.send_signal(signal.SIGHUP)
        gate.wait_for_line(r"event=reload_refused errors=1 kept=running_config$")
        assert gate.api().call("GET", "/healthz")[0] == 200  # still serving: log flushed
        log = gate.log()
    finally:
        assert gate.stop() == 0
        relay.stop()
    assert log.count("event=reload_refused") == 1, log
    assert log.count("pipelines[0].steps[0].quorum: ") == 1, log
    assert "event=reload_error error=pipelines[0].steps[0].quorum: a question is answered" in log
