"""Mail to approvers when a new item reaches the inbox: a real gate dispatching to a
real ``hitl-gate inbox serve`` that sends through a real SMTP server (aiosmtpd) on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from email import message_from_bytes, policy
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiosmtpd.smtp import SMTP, Envelope, Session

from gate.inbox.config import load_inbox
from gate.inbox.mail import address_of, mails_for
from gate.protocol.canonical import wire_json
from tests.support import (
    SECRET,
    GateProcess,
    decision_body,
    free_port,
    http_request,
    post_decision,
    sign_headers,
    wait_until,
    write_config,
)
from tests.test_inbox_followups import reminded_after_escalation
from tests.test_inbox_relay import STEPS, Inbox, dispatch_of


class SmtpServer:
    """aiosmtpd on 127.0.0.1 (port 0) in a thread of its own; ``messages`` in arrival order."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], Message]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _start(self) -> asyncio.base_events.Server:
        return await self._loop.create_server(lambda: SMTP(self), "127.0.0.1", 0)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802 - aiosmtpd's hook name
        content = envelope.original_content or b""
        with self._lock:
            self.messages.append(
                (list(envelope.rcpt_tos), message_from_bytes(content, policy=policy.default))
            )
        return "250 OK"

    def received(self) -> list[tuple[list[str], Message]]:
        with self._lock:
            return list(self.messages)

    def stop(self) -> None:
        self._server.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def mail_config(inbox: Inbox, port: int, on: list[str] | None = None) -> None:
    data = yaml.safe_load(inbox.config.read_text("utf-8"))
    data["mail"] = {
        "host": "127.0.0.1",
        "port": port,
        "security": "none",
        "from": "inbox@example.com",
        "addresses": {"bob@example.com": "bob.private@example.org"},
        **({} if on is None else {"on": on}),
    }
    inbox.config.write_text(yaml.safe_dump(data), "utf-8")


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    server = SmtpServer()
    yield server
    server.stop()


def start(
    tmp_path: Path,
    smtp_port: int,
    steps: list[dict[str, Any]] | None = None,
    on: list[str] | None = None,
) -> tuple[Inbox, GateProcess]:
    inbox = Inbox(tmp_path, free_port())
    mail_config(inbox, smtp_port, on)
    inbox.start()
    folder = tmp_path / "gate"
    folder.mkdir()
    config = write_config(
        folder,
        inbox.relay_url,
        steps=[*STEPS, *(steps or [])],
        relay={"notices": True, "questions": True},
    )
    return inbox, GateProcess(config).start()


def body_of(message: Message) -> str:
    payload = message.get_payload(decode=True)
    assert isinstance(payload, bytes)
    return payload.decode("utf-8")


@pytest.mark.e2e
def test_inbox_mails_each_approver_of_a_new_item_a_link_and_no_draft(
    tmp_path: Path, smtp: SmtpServer
) -> None:
    inbox, gate = start(tmp_path, smtp.port)
    try:
        approval = gate.api().create("q2", body="SECRET DRAFT: pay 12 EUR to ACME")
        approval_id = approval["approval_id"]
        got = wait_until(lambda: smtp.received() if len(smtp.received()) >= 3 else None, timeout=60)

        assert sorted(to for rcpts, _ in got for to in rcpts) == [
            "alice@example.com",
            "bob.private@example.org",  # mail.addresses wins over the identity itself
            "carol@example.com",
        ]
        for _, message in got:
            assert message["From"] == "inbox@example.com"
            assert message["Subject"] == "Waiting for you: p \u00b7 q2"
            text = body_of(message)
            assert (
                f"{inbox.relay_url.split('/hitl')[0]}/items/{approval_id}".replace(
                    "127.0.0.1", "localhost"
                )
                in text
            )
            assert "Time left: " in text
            assert "SECRET DRAFT" not in text and "ACME" not in message.as_string()
        sent = inbox.proc.log  # type: ignore[union-attr]
        wait_until(
            lambda: sent().count("event=mail_sent") == 3, what="3 mail_sent lines", timeout=60
        )
        assert "SECRET DRAFT" not in sent()

        # a re-send, a reminder-like update (same revision and nonce, other bytes) and a new
        # revision (an adjust) are no NEW item: no mail
        row = inbox.wait_item(approval_id, lambda r: True)
        raw = row["dispatch"].encode("utf-8")
        assert http_request(inbox.relay_url, "POST", raw, sign_headers(raw))[0] == 200
        updated = dispatch_of(row) | {"reminder": {"count": 1}}
        raw2 = wire_json(updated)
        assert http_request(inbox.relay_url, "POST", raw2, sign_headers(raw2))[0] == 200
        inbox.wait_item(approval_id, lambda r: dispatch_of(r).get("reminder") == {"count": 1})
        adjust = decision_body(dispatch_of(row), "alice@example.com", "adjust", adjust_text="v2")
        assert post_decision(gate.callback_url, adjust)[0] == 200
        inbox.wait_item(approval_id, lambda r: r["revision"] == 2)
        # a barrier: the next new item's mails come after any the above would have queued
        barrier = gate.api().create("q1", body="next")["approval_id"]
        wait_until(lambda: len(smtp.received()) >= 6 or None, timeout=60)

        later = smtp.received()[3:]
        assert len(later) == 3
        assert all(barrier in body_of(m) for _, m in later)
        wait_until(
            lambda: sent().count("event=mail_sent") == 6, what="6 mail_sent lines", timeout=60
        )
    finally:
        gate.stop()
        inbox.stop()


@pytest.mark.e2e
def test_inbox_a_question_is_mailed_without_its_text(tmp_path: Path, smtp: SmtpServer) -> None:
    inbox, gate = start(tmp_path, smtp.port)
    try:
        ask = {"pipeline": "p", "step": "ask", "text": "Which supplier, secretly?"}
        status, question = gate.api().call(
            "POST", "/v1/questions", ask | {"response_type": "free_text"}
        )
        assert status == 201, question
        got = wait_until(lambda: smtp.received() if len(smtp.received()) >= 2 else None, timeout=60)
        assert sorted(to for rcpts, _ in got for to in rcpts) == [
            "alice@example.com",
            "bob.private@example.org",
        ]
        assert all(m["Subject"] == "Waiting for you: p \u00b7 ask" for _, m in got)
        assert all("secretly" not in m.as_string() for _, m in got)
        assert all(question["question_id"] in body_of(m) for _, m in got)
    finally:
        gate.stop()
        inbox.stop()


@pytest.mark.e2e
def test_inbox_with_its_smtp_server_down_logs_mail_failed_and_still_acks(tmp_path: Path) -> None:
    inbox, gate = start(tmp_path, free_port())  # nothing listens there
    try:
        approval = gate.api().create("q1", body="still kept")
        approval_id = approval["approval_id"]

        inbox.wait_item(approval_id, lambda r: r["state"] == "pending")
        wait_until(lambda: gate.api().get(approval_id)["dispatch"]["delivered_at"])
        line = inbox.proc.wait_for_line(
            r"event=mail_failed approval_id=(\S+) .*attempt=1", timeout=60
        )  # type: ignore[union-attr]
        assert line.group(1) == approval_id
        assert "still kept" not in inbox.proc.log()  # type: ignore[union-attr]
    finally:
        gate.stop()
        inbox.stop()


def test_inbox_mail_config_errors_name_their_yaml_paths(tmp_path: Path) -> None:
    path = tmp_path / "inbox.yaml"
    base: dict[str, Any] = {
        "gate": {"secret_env": "HITL_RELAY_SECRET", "callback_url": "http://127.0.0.1:8089"}
    }
    bad = {
        "host": "smtp.example.com",
        "port": 0,
        "security": "ssl",
        "from": "Inbox <inbox@example.com>",
        "addresses": {"alice": "alice at example.com"},
        "username_env": "SMTP_USER",
    }
    path.write_text(yaml.safe_dump(base | {"mail": bad}), "utf-8")
    env = {"HITL_RELAY_SECRET": SECRET}

    config, _, errors = load_inbox(path, env)

    assert config is None
    assert errors == [
        "mail.port: must be >= 1, got 0",
        "mail.security: must be one of 'starttls', 'tls' or 'none', got string 'ssl'",
        "mail.from: 'Inbox <inbox@example.com>' is not a plain e-mail address (local@domain)",
        "mail.addresses.alice: 'alice at example.com' is not a plain e-mail address (local@domain)",
    ]
    good = {"host": "smtp.example.com", "from": "inbox@example.com"}
    path.write_text(yaml.safe_dump(base | {"mail": good | {"username_env": "SMTP_USER"}}), "utf-8")
    assert load_inbox(path, env)[2] == [
        "mail.password_env: set both mail.username_env and mail.password_env, or neither"
    ]
    login = {"username_env": "SMTP_USER", "password_env": "SMTP_PASSWORD"}
    path.write_text(yaml.safe_dump(base | {"mail": good | login}), "utf-8")
    assert load_inbox(path, env)[2] == [
        "mail.username_env: environment variable SMTP_USER is not set",
        "mail.password_env: environment variable SMTP_PASSWORD is not set",
    ]
    config, secrets, errors = load_inbox(
        path, env | {"SMTP_USER": "inbox", "SMTP_PASSWORD": "pw-not-shown"}
    )
    assert errors == [] and config is not None and config.mail is not None
    assert (config.mail.port, config.mail.security, config.mail.sender) == (
        587,
        "starttls",
        "inbox@example.com",
    )
    assert secrets is not None and secrets.mail_login == ("inbox", "pw-not-shown")
    assert "pw-not-shown" not in repr(secrets)


def test_mails_for_reads_names_and_approvers_only(tmp_path: Path) -> None:
    path = tmp_path / "inbox.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "gate": {"secret_env": "S", "callback_url": "http://127.0.0.1:1"},
                "mail": {"host": "h", "from": "a@b.example", "addresses": {"ops": "o@x.example"}},
            }
        ),
        "utf-8",
    )
    config, _, errors = load_inbox(path, {"S": SECRET})
    assert errors == [] and config is not None and config.mail is not None
    dispatch = {
        "pipeline": "pay\r\nBcc: evil@x.example",
        "step": "send",
        "approvers": ["ops", "no-address", "Eve@X.example", "eve@x.example", 7],
        "draft": {"body": "the draft"},
    }

    mails = mails_for(config.mail, "https://inbox.example/", "01A", dispatch, 3_600_000, 0)

    assert [m.to for m in mails] == ["o@x.example", "Eve@X.example"]  # each address once
    assert mails[0].subject == "Waiting for you: payBcc: evil@x.example \u00b7 send"
    assert "https://inbox.example/items/01A" in mails[0].body
    assert "Time left: 1 h" in mails[0].body and "the draft" not in mails[0].body
    assert address_of(config.mail, "no-address") is None


# alice and bob have it; carol joins at level 1 after 1 s; a reminder every second
ESCALATING = {"name": "esc", "quorum": 1, "approvers": [101, 102], "timeout": "1h",
              "remind_every": "1s", "escalate": [{"after": "1s", "to": [103]}]}  # fmt: skip


def mails_of(smtp: SmtpServer, approval_id: str) -> list[tuple[list[str], Message]]:
    return [(to, m) for to, m in smtp.received() if f"/items/{approval_id}" in body_of(m)]


@pytest.mark.e2e
def test_inbox_mails_whom_an_escalation_adds_and_no_reminder_by_default(
    tmp_path: Path, smtp: SmtpServer
) -> None:
    inbox, gate = start(tmp_path, smtp.port, steps=[ESCALATING])
    try:
        approval_id = gate.api().create("esc", body="SECRET DRAFT: pay 40 EUR")["approval_id"]
        gate_db = gate.config.parent / "gate.db"
        wait_until(
            lambda: reminded_after_escalation(gate_db, inbox.db, approval_id),
            what="a reminder after the escalation at the inbox",
        )
        # a barrier: the next new item's mails come after any the above would have queued
        barrier = gate.api().create("q1", body="next")["approval_id"]
        wait_until(lambda: len(mails_of(smtp, barrier)) == 3 or None, timeout=60)

        got = mails_of(smtp, approval_id)
        assert [(to, m["Subject"]) for to, m in got] == [
            (["alice@example.com"], "Waiting for you: p \u00b7 esc"),
            (["bob.private@example.org"], "Waiting for you: p \u00b7 esc"),
            (["carol@example.com"], "Escalated to you: p \u00b7 esc"),
        ]  # the reminders mailed nobody: mail.on is [new, escalation] by default
        text = body_of(got[2][1])
        assert "Time left: " in text and "SECRET" not in got[2][1].as_string()
    finally:
        gate.stop()
        inbox.stop()


@pytest.mark.e2e
def test_inbox_mails_a_reminder_to_whom_it_awaits_when_mail_on_says_reminder(
    tmp_path: Path, smtp: SmtpServer
) -> None:
    reminded = {"name": "rem", "quorum": 2, "approvers": [101, 102], "timeout": "1h",
                "remind_every": "1s"}  # fmt: skip
    inbox, gate = start(tmp_path, smtp.port, steps=[reminded], on=["new", "reminder"])
    try:
        approval_id = gate.api().create("rem", body="SECRET DRAFT: pay 5 EUR")["approval_id"]

        def reminded_twice() -> list[tuple[list[str], Message]] | None:
            got = [m for m in mails_of(smtp, approval_id) if "Reminder 2" in m[1]["Subject"]]
            return got if len(got) == 2 else None

        second = wait_until(reminded_twice, what="reminder 2 mailed to alice and bob", timeout=60)
        assert sorted(to for rcpts, _ in second for to in rcpts) == [
            "alice@example.com",
            "bob.private@example.org",
        ]
        for _, message in second:
            assert message["Subject"] == "Reminder 2: p \u00b7 rem"
            assert "Time left: " in body_of(message) and "SECRET" not in message.as_string()
        news = [m for _, m in mails_of(smtp, approval_id) if m["Subject"].startswith("Waiting")]
        assert len(news) == 2
    finally:
        gate.stop()
        inbox.stop()


def test_inbox_mail_on_errors_name_their_yaml_path(tmp_path: Path) -> None:
    path = tmp_path / "inbox.yaml"
    head = (
        "gate: {secret_env: HITL_RELAY_SECRET, callback_url: 'http://127.0.0.1:8089'}\n"
        "mail:\n  host: smtp.example.com\n  from: inbox@example.com\n"
    )
    env = {"HITL_RELAY_SECRET": SECRET}

    path.write_text(head + "  on: [new, escalated]\n", "utf-8")  # YAML 1.1 reads `on` as true
    assert load_inbox(path, env)[2] == [
        "mail.on[1]: must be one of 'new', 'escalation' or 'reminder', got string 'escalated'"
    ]
    path.write_text(head + "  on: []\n", "utf-8")
    assert load_inbox(path, env)[2] == [
        "mail.on: an empty list mails nobody (leave out the mail section to send no mail)"
    ]
    path.write_text(head + "  on: new\n", "utf-8")
    assert load_inbox(path, env)[2] == ["mail.on: expected a list, got string 'new'"]
    path.write_text(head + "  on: [reminder, new]\n", "utf-8")
    config, _, errors = load_inbox(path, env)
    assert errors == [] and config is not None and config.mail is not None
    assert config.mail.on == ("reminder", "new")
    path.write_text(head, "utf-8")
    config, _, errors = load_inbox(path, env)
    assert config is not None and config.mail is not None
    assert config.mail.on == ("new", "escalation")
