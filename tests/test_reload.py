"""SIGHUP reload in-process (``gate.daemon.reload.Reloader`` over ``build_gate``): what a
reload hands to each wired object, and what it refuses. The daemon-level behaviour (signals,
systemd status, the running gate answering with the new settings) is in test_systemd.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.config import load
from gate.daemon.app import Gate, build_gate
from gate.daemon.reload import Reloader
from gate.daemon.sdnotify import Notifier
from gate.protocol import DECISIONS_PATH
from tests.support import ENV, OLD_SECRET, SECRET, write_config

BOUND = "127.0.0.1:8099"


def _gate(tmp_path: Path) -> tuple[Gate, Reloader]:
    config, secrets = load(write_config(tmp_path, "http://127.0.0.1:9/relay"), ENV)
    gate = build_gate(config, secrets, writer_process=False)
    return gate, Reloader(gate, ENV, BOUND, Notifier({}), "serving: test")


async def test_reload_applies_to_service_settings_and_dispatcher(tmp_path: Path) -> None:
    gate, reloader = _gate(tmp_path)
    reloader.environ = {**ENV, "HITL_API_TOKEN": "a-new-api-token-4c1e9b7d0a2f6358"}
    write_config(
        tmp_path,
        "http://127.0.0.1:9/other-relay",
        security={"rate_limit": 7, "max_skew": "60s"},
        relay={"public_url": "https://gate.example.com/base/", "dispatch_timeout": "5s"},
    )

    applied = await reloader.reload()

    assert applied is True
    assert gate.service.config.relay.security.rate_limit == 7
    assert gate.service.rate.per_minute == 7
    assert gate.api_settings.token == "a-new-api-token-4c1e9b7d0a2f6358"
    assert gate.callback_settings.max_skew_s == 60.0
    assert tuple(gate.callback_settings.relay_secrets) == (SECRET, OLD_SECRET)
    assert gate.dispatcher.relay_url == "http://127.0.0.1:9/other-relay"
    assert gate.dispatcher.secret == SECRET
    assert gate.dispatcher.timeout_s == 5.0
    assert gate.dispatcher.callback_url == "https://gate.example.com/base" + DECISIONS_PATH


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"api": {"listen": "127.0.0.1:1"}}, "api.listen: cannot change while running"),
        ({"db": "other.db"}, "storage.path: cannot change while running"),
    ],
    ids=["api.listen", "storage.path"],
)
async def test_reload_refuses_restart_only_changes_and_keeps_everything(
    tmp_path: Path, change: dict[str, object], error: str
) -> None:
    gate, reloader = _gate(tmp_path)
    write_config(tmp_path, "http://127.0.0.1:9/other-relay", security={"rate_limit": 7}, **change)

    errors = reloader.check()
    applied = await reloader.reload()

    assert isinstance(errors, list) and any(e.startswith(error) for e in errors), errors
    assert applied is False
    assert gate.service.config.relay.security.rate_limit == 1000
    assert gate.dispatcher.relay_url == "http://127.0.0.1:9/relay"
    assert gate.dispatcher.callback_url == ""  # not started, and not touched by a refusal
