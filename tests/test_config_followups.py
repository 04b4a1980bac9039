"""The config keys: skip_reason, reminders, escalation, delegations, notices. Every bad
value is an error naming its YAML path, listed with the others; good values load typed."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gate.config import load_config
from gate.config.followups import ended_delegations, format_duration
from tests.test_config import config_errors, example_data, step, write

FUTURE = "2999-01-01T00:00:00Z"


def _data(**step_keys: Any) -> dict[str, Any]:
    data = example_data()
    for key in ("remind_after", "remind_every", "escalate"):
        step(data, 0).pop(key, None)
    step(data, 0).update(step_keys)
    return data


def test_defaults_when_the_keys_are_absent(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, _data()))
    first = config.pipelines[0].steps[0]
    assert (first.skip_reason, first.remind_after, first.remind_every, first.escalate) == (
        "optional",
        None,
        None,
        (),
    )
    assert first.first_reminder_s is None
    assert config.delegations == ()
    assert (config.relay.notices, config.relay.notice_url, config.relay.notice_target) == (
        False,
        None,
        None,
    )


def test_good_values_load_typed(tmp_path: Path) -> None:
    data = _data(
        skip_reason="required",
        remind_every="10m",
        escalate=[{"after": "1h", "to": [333]}],
    )
    data["relay"]["notices"] = True
    data["delegations"] = [
        {"from": 222, "to": 333, "until": FUTURE, "reason": "parental leave"},
        {"from": 111, "to": 333, "until": datetime(2999, 1, 1, tzinfo=UTC)},
    ]
    config = load_config(write(tmp_path, data))
    first = config.pipelines[0].steps[0]
    assert first.skip_reason == "required"
    # remind_every alone: the first reminder after one interval
    assert (first.first_reminder_s, first.reminder_interval_s) == (600.0, 600.0)
    assert [(lvl.after, lvl.to) for lvl in first.escalate] == [(3600.0, (333,))]
    assert config.relay.notice_target == config.relay.url
    assert [(d.from_, d.to, d.reason) for d in config.delegations] == [
        (222, 333, "parental leave"),
        (111, 333, None),
    ]
    assert config.delegations[0].until_ms == 32472144000000


def test_notice_url_turns_notices_on(tmp_path: Path) -> None:
    data = _data()
    assert data["relay"]["notices"] is False  # the example's, left as it is
    data["relay"]["notice_url"] = "http://127.0.0.1:9/notices"
    assert load_config(write(tmp_path, data)).relay.notice_target == "http://127.0.0.1:9/notices"


def test_every_bad_value_is_listed_with_its_path(tmp_path: Path) -> None:
    data = _data(
        remind_after="5h",  # the step's timeout is 4h
        remind_every="500ms",
        escalate=[
            {"after": "1h", "to": [333, 444]},
            {"after": "30m", "to": [111]},
            {"after": "5h", "to": [333]},
        ],
    )
    data["delegations"] = [
        {"from": 111, "to": 222, "until": "2020-01-01T00:00:00Z"},
        {"from": 222, "to": 111, "until": FUTURE},
        {"from": 222, "to": 111, "until": FUTURE},
        {"from": 999, "to": 999, "until": FUTURE},
    ]
    assert config_errors(write(tmp_path, data)) == [
        "pipelines[0].steps[0].remind_every: must be at least 1s",
        "pipelines[0].steps[0].remind_after: 5h is not before the step's timeout (4h):"
        " no reminder would ever be sent",
        "pipelines[0].steps[0].escalate[0].to[1]: operator 444 is not defined in relay.operators",
        "pipelines[0].steps[0].escalate[1].after: must be later than the level before it",
        "pipelines[0].steps[0].escalate[1].to: adds nobody (every operator is already in scope)",
        "pipelines[0].steps[0].escalate[2].after: 5h is not before the step's timeout (4h):"
        " this level would never be reached",
        "pipelines[0].steps[0].escalate[2].to: adds nobody (every operator is already in scope)",
        "delegations[2]: the same delegation as delegations[1]",
        "delegations[3].from: operator 999 is not defined in relay.operators",
        "delegations[3].to: operator 999 is not defined in relay.operators",
        "delegations[3].to: operator 999 cannot delegate to themselves",
        "delegations: cycle 111 -> 222 -> 111 (each would decide on behalf of the other)",
    ]


def test_longer_delegation_cycle_and_delegate_outside_allowed_users(tmp_path: Path) -> None:
    data = _data()
    data["relay"]["operators"].append({"id": 444, "identity": "dora@example.com"})
    data["delegations"] = [
        {"from": 111, "to": 222, "until": FUTURE},
        {"from": 222, "to": 333, "until": FUTURE},
        {"from": 333, "to": 111, "until": FUTURE},
        {"from": 111, "to": 444, "until": FUTURE},
    ]
    assert config_errors(write(tmp_path, data)) == [
        "delegations[3].to: operator 444 is not in relay.security.allowed_users"
        " (a delegate decides only if allowed to decide at all)",
        "delegations: cycle 111 -> 222 -> 333 -> 111 (each would decide on behalf of the other)",
    ]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("skip_reason", "always", "must be one of 'required' or 'optional', got string 'always'"),
        ("remind_after", "soon", "invalid duration 'soon' (use e.g. 90s, 30m, 4h)"),
        ("remind_every", 0, "duration must be > 0, got 0"),
        ("escalate", [{"after": "1h"}], None),
        ("escalate", [{"after": "1h", "to": []}], None),
        ("escalate", [{"after": "1h", "to": [333], "cc": [1]}], None),
    ],
)
def test_schema_errors_name_the_key(
    tmp_path: Path, key: str, value: Any, message: str | None
) -> None:
    errors = config_errors(write(tmp_path, _data(**{key: value})))
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"pipelines[0].steps[0].{key}"), errors
    if message is not None:
        assert errors[0] == f"pipelines[0].steps[0].{key}: {message}"


@pytest.mark.parametrize(
    ("until", "message"),
    [
        ("2999-01-01T00:00:00+02:00", "expected an RFC 3339 UTC time ending in Z"),
        ("2999-01-01", "expected an RFC 3339 UTC time ending in Z"),
        ("someday Z", "expected an RFC 3339 UTC time, got 'someday Z'"),
        (20991231, "expected an RFC 3339 UTC time, got int"),
    ],
)
def test_delegation_until_must_be_utc(tmp_path: Path, until: Any, message: str) -> None:
    data = _data()
    data["delegations"] = [{"from": 222, "to": 333, "until": until}]
    errors = config_errors(write(tmp_path, data))
    assert len(errors) == 1 and errors[0].startswith(f"delegations[0].until: {message}"), errors


def test_delegation_unknown_key_suggests_from(tmp_path: Path) -> None:
    data = _data()
    data["delegations"] = [{"frm": 222, "to": 333, "until": FUTURE}]
    assert config_errors(write(tmp_path, data)) == [
        "delegations[0].from: required",
        'delegations[0].frm: unknown key; did you mean "from"?',
    ]


@pytest.mark.parametrize(
    ("seconds", "text"), [(14400, "4h"), (5400, "1h30m"), (90, "1m30s"), (0.5, "500ms")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_an_ended_delegation_loads_and_is_named_by_ended_delegations(tmp_path: Path) -> None:
    """Time passing must not make a valid file invalid for the daemon (a restart after a crash
    would fail): an ended delegation loads; ``ended_delegations`` names it for check-config
    (an error there), serve, reload and doctor (a warning)."""
    data = _data()
    data["delegations"] = [
        {"from": 222, "to": 333, "until": FUTURE},
        {"from": 111, "to": 333, "until": "2020-01-01T00:00:00Z"},
    ]
    config = load_config(write(tmp_path, data))
    now_ms = int(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000)
    assert ended_delegations(config.delegations, now_ms) == [
        "delegations[1].until: 2020-01-01T00:00:00Z is in the past (the delegation has ended)"
    ]
    assert ended_delegations(config.delegations, config.delegations[0].until_ms - 1) == [
        "delegations[1].until: 2020-01-01T00:00:00Z is in the past (the delegation has ended)"
    ]
    assert len(ended_delegations(config.delegations, config.delegations[0].until_ms)) == 2
