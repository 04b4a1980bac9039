"""The reference relay at a terminal (``hitl-gate relay`` without ``--auto``).

The relay runs as ``python -m gate relay`` with its stdin and stdout (and, where a test says
so, its stderr) on the slave side of a real pseudo-terminal; the test is the human at the
master side: it reads the screen and types. Gates are real ``python -m gate serve``
processes; dispatches are real signed envelopes. Waits are conditions with deadlines.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.protocol.canonical import payload_hash, wire_json
from gate.protocol.envelope import build_dispatch
from gate.tools.reference_relay.view import (
    GUTTER,
    WRAP_GUTTER,
    budget_lines,
    draft_lines,
    render,
    verdict,
)
from tests.support import (
    DEADLINE_S,
    ROOT,
    SECRET,
    GateProcess,
    decision_body,
    gate_env,
    http_request,
    post_decision,
    sign_headers,
    wait_until,
    write_config,
)

LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+/)")
ONE_KEY_PROMPT = "[a]pprove, [s]kip or [e]dit (adjust)? "
WHOLE_WORD_PROMPT = "Risk high: type the whole word approve, skip or edit: "
OPTIONAL_REASON_PROMPT = "Why skip? What should change (optional, one line; empty for none): "
REQUIRED_REASON_PROMPT = "Why skip? What should change (required, one line): "


class PtyRelay:
    """``python -m gate relay --listen 127.0.0.1:0 ARGS`` on a pseudo-terminal.

    stdin and stdout are the pty's slave side (so is stderr with ``tty_stderr``; else stderr
    is a pipe whose lines ``wait_log`` reads). ``screen`` is everything the terminal showed,
    with the terminal's CR LF output translation undone; ``type`` is the human typing.
    """

    def __init__(self, *args: str, tty_stderr: bool = False, stdout: Any = None) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gate",
                "relay",
                "--listen",
                "127.0.0.1:0",
                "--secret-env",
                "HITL_RELAY_SECRET",
                *args,
            ],
            stdin=slave,
            stdout=slave if stdout is None else stdout,
            stderr=slave if tty_stderr else subprocess.PIPE,
            env=gate_env(),
            cwd=ROOT,
            start_new_session=True,
        )
        os.close(slave)
        self._raw = b""
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._read_screen, daemon=True)]
        if not tty_stderr:
            self._threads.append(threading.Thread(target=self._read_log, daemon=True))
        for thread in self._threads:
            thread.start()
        self.url = (
            self.wait_screen(LISTENING)
            if tty_stderr
            else self.wait_log(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)")
        ).group(1)

    def _read_screen(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every slave descriptor is closed (the relay exited)
                data = b""
            with self._cond:
                self._raw += data
                self._cond.notify_all()
            if not data:
                return

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._cond.notify_all()

    @property
    def screen(self) -> str:
        with self._cond:
            return self._raw.decode("utf-8", "replace").replace("\r\n", "\n")

    def _wait(
        self, find: Callable[[], re.Match[str] | None], what: str, timeout: float
    ) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = find()
                if found:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.proc.poll() is not None:
                    raise AssertionError(
                        f"no {what}; screen:\n{self.screen}\nlog:\n" + "\n".join(self.lines)
                    )
                self._cond.wait(min(remaining, 0.2))

    def wait_screen(
        self, pattern: str | re.Pattern[str], start: int = 0, timeout: float = DEADLINE_S
    ) -> re.Match[str]:
        """Wait until ``pattern`` shows on the screen at or after offset ``start``."""
        regex = re.compile(pattern if isinstance(pattern, re.Pattern) else re.escape(pattern))
        return self._wait(lambda: regex.search(self.screen, start), f"{regex.pattern!r}", timeout)

    def wait_log(self, pattern: str, timeout: float = DEADLINE_S) -> re.Match[str]:
        """Wait until a stderr line matches the regular expression ``pattern``."""
        regex = re.compile(pattern)
        return self._wait(
            lambda: next(filter(None, map(regex.search, self.lines)), None),
            f"log line {pattern!r}",
            timeout,
        )

    def log(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def type(self, text: str) -> None:
        """Type ``text`` on the terminal's keyboard (``\\n`` is Enter)."""
        os.write(self.master, text.encode("utf-8"))

    def stop(self) -> int:
        """SIGTERM, wait, collect the last output; return the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(DEADLINE_S)
        for thread in self._threads:
            thread.join(DEADLINE_S)
        os.close(self.master)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


@pytest.fixture
def pty_relay() -> Iterator[Callable[..., PtyRelay]]:
    started: list[PtyRelay] = []

    def start(*args: str, tty_stderr: bool = False, stdout: Any = None) -> PtyRelay:
        relay = PtyRelay(*args, tty_stderr=tty_stderr, stdout=stdout)
        started.append(relay)
        return relay

    yield start
    for relay in started:
        if relay.proc.poll() is None or relay.proc.returncode is None:
            relay.stop()


@pytest.fixture
def gates() -> Iterator[Callable[[Path], GateProcess]]:
    started: list[GateProcess] = []

    def start(config: Path) -> GateProcess:
        gate = GateProcess(config).start()
        started.append(gate)
        return gate

    yield start
    for gate in started:
        if gate.proc is not None and gate.proc.poll() is None:
            gate.stop()


class Tap(ThreadingHTTPServer):
    """Between the gate and the relay: forwards every dispatch as it came (bytes and
    signature) and keeps a copy, so a test can answer as another approver."""

    def __init__(self, target: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.target = target
        self.seen: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def dispatch(self, approval_id: str, revision: int) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            with self.cond:
                return next(
                    (
                        d
                        for d in self.seen
                        if d["approval_id"] == approval_id and d.get("revision") == revision
                    ),
                    None,
                )

        return wait_until(find, what=f"dispatch of {approval_id} revision {revision}")


class _Forward(BaseHTTPRequestHandler):
    server: Tap

    def do_POST(self) -> None:  # noqa: N802
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        headers = {
            k: v for k, v in self.headers.items() if k.lower().startswith(("x-", "content-type"))
        }
        status, _, answer = http_request(self.server.target, "POST", raw, headers)
        if 200 <= status < 300:
            with self.server.cond:
                self.server.seen.append(json.loads(raw))
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


def resolved(gate: GateProcess, approval_id: str) -> dict[str, Any]:
    return gate.api().wait_resolved(approval_id)


def decisions(approval: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(d["identity"], d["decision"], d["revision"]) for d in approval["decisions"]]


def prompts(screen: str) -> list[tuple[str, str]]:
    """The (revision, identity) of every draft shown, in order."""
    return re.findall(r"revision (\d+)\n.* you are (\S+)\n", screen)


# ---- item 1: keys typed before the prompt -------------------------------------------------


@pytest.mark.e2e
def test_keys_typed_before_the_prompt_are_discarded(tmp_path, pty_relay, gates):
    """``a`` Enter typed while no prompt was on screen approved the next
    request at once, unseen; a stray ``s`` skipped the one after. What is typed before the
    whole draft and its prompt are on screen is discarded; the answer typed after counts."""
    relay = pty_relay("--as", "alice@example.com")
    gate = gates(write_config(tmp_path, relay.url))
    api = gate.api()

    relay.type("a\n")  # nothing on screen asks for it
    mark = len(relay.screen)
    first = api.create("q1", "Erste Mail: bitte lesen\n")["approval_id"]
    relay.wait_screen(ONE_KEY_PROMPT, mark)
    shown = relay.screen[mark:]
    assert shown.index("Erste Mail: bitte lesen") < shown.index(ONE_KEY_PROMPT), shown
    approval = api.get(first)
    assert (approval["state"], approval["decisions"]) == ("pending", []), approval
    relay.type("s\n")  # the answer, typed after the prompt
    relay.wait_screen(OPTIONAL_REASON_PROMPT, mark)
    relay.type("\n")  # no reason
    approval = resolved(gate, first)
    assert approval["outcome"] == "skipped", approval
    assert decisions(approval) == [("alice@example.com", "skip", 1)]

    relay.wait_screen("Recorded: skipped; the approval is resolved.", mark)
    relay.type("s\nstray")  # a stray key, then half a line, between two prompts
    mark = len(relay.screen)
    second = api.create("q1", "Zweite Mail\n")["approval_id"]
    relay.wait_screen(ONE_KEY_PROMPT, mark)
    assert api.get(second)["decisions"] == []
    relay.type("a\n")  # taken as "a", not as "straya"
    approval = resolved(gate, second)
    assert (approval["outcome"], decisions(approval)) == (
        "approved",
        [("alice@example.com", "approve", 1)],
    )
    assert relay.stop() == 0


@pytest.mark.e2e
def test_high_risk_takes_the_whole_word_only(tmp_path, pty_relay, gates):
    """On a ``risk: high`` step one key must not approve; the prompt says
    exactly what to type, and a single ``a`` is refused with that hint."""
    relay = pty_relay("--as", "alice@example.com")
    steps = [{"name": "pay", "quorum": 1, "approvers": [101, 102], "timeout": "1h", "risk": "high"}]
    gate = gates(write_config(tmp_path, relay.url, steps=steps))
    api = gate.api()
    approval_id = api.create("pay", "Pay 12,000.00 EUR to ACME\n")["approval_id"]
    relay.wait_screen(WHOLE_WORD_PROMPT)
    mark = len(relay.screen)
    relay.type("a\n")
    relay.wait_screen("Not taken: at risk high type the whole word approve, skip or edit.", mark)
    relay.wait_screen(WHOLE_WORD_PROMPT, mark)
    assert api.get(approval_id)["decisions"] == []
    relay.type("approve\n")
    approval = resolved(gate, approval_id)
    assert (approval["outcome"], decisions(approval)) == (
        "approved",
        [("alice@example.com", "approve", 1)],
    )
    assert relay.stop() == 0


@pytest.mark.e2e
def test_piped_stdin_is_a_script_answered_in_order(tmp_path, clis, gates):
    """The choice written down: stdin that is not a terminal is a script.
    Its lines answer the prompts in order, however early they were written (nothing is
    discarded), with the same words as a terminal (a risk high step needs ``approve``)."""
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        "alice@example.com",
        stdin=b"s\na\napprove\n",
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    steps = [
        {"name": "q1", "quorum": 1, "approvers": [101, 102], "timeout": "1h"},
        {"name": "pay", "quorum": 1, "approvers": [101, 102], "timeout": "1h", "risk": "high"},
    ]
    gate = gates(write_config(tmp_path, url, steps=steps))
    api = gate.api()
    first = api.create("q1", "Eins")["approval_id"]
    assert resolved(gate, first)["outcome"] == "skipped"
    second = api.create("pay", "Zwei")["approval_id"]
    approval = resolved(gate, second)
    assert (approval["outcome"], decisions(approval)) == (
        "approved",
        [("alice@example.com", "approve", 1)],
    )
    assert relay.stop() == 0
    assert "Not taken: at risk high type the whole word" in relay.stdout.decode()


# ---- item 2: stale prompts ------------------------------------------------------------------


@pytest.mark.e2e
def test_own_edit_is_not_asked_about_again(tmp_path, pty_relay, gates):
    """After alice's edit made revision 2 of a quorum-2 approval, the relay
    asked bob about revision 1 (409 superseded), then alice about revision 2 although her
    edit counts (409 duplicate). Now bob is asked about revision 2 only, with 1 of 2."""
    relay = pty_relay("--as", "alice@example.com", "--as", "bob@example.com")
    gate = gates(write_config(tmp_path, relay.url))
    approval_id = gate.api().create("q2", "Alter Text\n")["approval_id"]
    relay.wait_screen(ONE_KEY_PROMPT)
    relay.type("e\n")
    relay.wait_screen("end with a line holding only '.'")
    relay.type("Neuer Text\n.\n")
    bobs = relay.wait_screen(re.compile(r"revision 2\n(.*) you are bob@example\.com\n"))
    assert bobs.group(1).startswith("approvals: 1 of 2 collected  expires "), bobs.group(0)
    mark = relay.wait_screen(ONE_KEY_PROMPT, bobs.end()).end()
    relay.type("a\n")
    approval = resolved(gate, approval_id)
    assert (approval["outcome"], decisions(approval)) == (
        "adjusted",
        [("alice@example.com", "adjust", 1), ("bob@example.com", "approve", 2)],
    )
    relay.wait_screen("Recorded: adjusted; the approval is resolved.", mark)
    assert relay.stop() == 0
    screen = relay.screen
    assert prompts(screen) == [("1", "alice@example.com"), ("2", "bob@example.com")], screen
    assert (
        f"Approval {approval_id} revision 2: not asking alice@example.com, whose "
        "decision on it is recorded"
    ) in screen, screen
    assert "answer=409" not in relay.log(), relay.log()


@pytest.mark.e2e
def test_prompt_on_screen_is_withdrawn_when_a_newer_revision_arrives(tmp_path, pty_relay, gates):
    """Bob's prompt about revision 1 stayed on screen after carol's edit
    (elsewhere) made revision 2, waiting for a key the gate would refuse (409 superseded).
    It is withdrawn with a line saying why, and bob is asked about revision 2."""
    relay = pty_relay("--as", "bob@example.com")
    tap = Tap(relay.url)
    gate = gates(write_config(tmp_path, tap.url))
    try:
        approval_id = gate.api().create("q2", "Alter Text\n")["approval_id"]
        relay.wait_screen(ONE_KEY_PROMPT)
        first = tap.dispatch(approval_id, 1)
        status, answer, _ = post_decision(
            gate.callback_url,
            decision_body(first, "carol@example.com", "adjust", adjust_text="Carols Text\n"),
        )
        assert (status, answer) == (200, {"status": "recorded", "resolved": False})
        relay.wait_screen(
            f"Approval {approval_id} revision 1 was superseded by revision 2; not asking again."
        )
        bobs = relay.wait_screen(re.compile(r"revision 2\n(.*) you are bob@example\.com\n"))
        assert bobs.group(1).startswith("approvals: 1 of 2 collected  expires "), bobs.group(0)
        body = relay.wait_screen("Carols Text", bobs.end())
        mark = relay.wait_screen(ONE_KEY_PROMPT, body.end()).end()
        relay.type("a\n")
        approval = resolved(gate, approval_id)
        assert (approval["outcome"], decisions(approval)) == (
            "adjusted",
            [("carol@example.com", "adjust", 1), ("bob@example.com", "approve", 2)],
        )
        relay.wait_screen("Recorded: adjusted; the approval is resolved.", mark)
    finally:
        tap.shutdown()
        tap.server_close()
    assert relay.stop() == 0
    assert prompts(relay.screen) == [("1", "bob@example.com"), ("2", "bob@example.com")]
    assert "answer=409" not in relay.log(), relay.log()


@pytest.mark.e2e
def test_prompt_on_screen_is_withdrawn_at_expiry(tmp_path, pty_relay, gates):
    """A prompt whose approval expired stayed on screen until a key was
    typed (410 expired). It is withdrawn when the dispatch's ``expires_at`` passes, and the
    next prompt follows; a key typed then answers that one."""
    relay = pty_relay("--as", "alice@example.com")
    gate = gates(write_config(tmp_path, relay.url))
    api = gate.api()
    first = api.create("short", "Läuft ab")["approval_id"]  # times out after 3 s
    relay.wait_screen(ONE_KEY_PROMPT)
    second = api.create("q1", "Bleibt")["approval_id"]
    relay.wait_screen(
        re.compile(
            rf"Approval {first} expired at \S+ while waiting for an "
            r"answer; not asking any more\."
        )
    )
    mark = relay.wait_screen(ONE_KEY_PROMPT, relay.wait_screen("Bleibt").end()).end()
    relay.type("a\n")
    assert resolved(gate, second)["outcome"] == "approved"
    relay.wait_screen("Recorded: approved; the approval is resolved.", mark)
    assert resolved(gate, first)["outcome"] == "timeout"
    assert resolved(gate, first)["decisions"] == []
    assert relay.stop() == 0


@pytest.mark.e2e
def test_auto_relay_sends_nothing_the_gate_would_refuse(tmp_path, clis, gates):
    """With ``--auto``: after alice's automatic edit, bob's decision went to
    revision 1 (409 superseded) and alice's to revision 2 (409 duplicate)."""
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        "alice@example.com",
        "--as",
        "bob@example.com",
        "--auto",
        "adjust:Neu\n",
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    gate = gates(write_config(tmp_path, url))
    approval_id = gate.api().create("q2", "Alt\n")["approval_id"]
    approval = resolved(gate, approval_id)
    assert (approval["outcome"], approval["final_body"]) == ("adjusted", "Neu\n")
    assert decisions(approval) == [
        ("alice@example.com", "adjust", 1),
        ("bob@example.com", "adjust", 2),
    ]
    relay.wait_for_line(
        rf"event=decision_sent approval_id={approval_id} "
        r"approver=bob@example.com decision=adjust answer=200"
    )
    assert relay.stop() == 0
    assert "answer=409" not in relay.log(), relay.log()


# ---- item 12: messages at the terminal ----------------------------------------------------


@pytest.mark.e2e
def test_relay_prompt_reads_in_words_and_holds_log_lines(tmp_path, pty_relay, gates):
    """The quorum showed as a dict in an INFO line, the budget as raw
    JSON, and INFO lines interleaved with the draft and the prompt. With stderr on the
    terminal too, the relay logs warnings only, and none inside a draft or prompt: a
    warning raised while the prompt waits (a forged dispatch) shows after the answer."""
    relay = pty_relay("--as", "alice@example.com", tty_stderr=True)
    config = write_config(tmp_path, relay.url)
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["budget"] = {"unit": "EUR", "cap_today": 500}
    data["pipelines"][0]["budget_cap"] = 100
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    gate = gates(config)
    approval_id = gate.api().create("q2", "Rechnung bezahlen\n", spend=120)["approval_id"]
    relay.wait_screen(ONE_KEY_PROMPT)
    raw = b'{"protocol":"hitl/v0"}'
    status, _, _ = http_request(
        relay.url, "POST", raw, sign_headers(raw, secret="not-the-relay-secret")
    )
    assert status == 401  # its WARNING was logged before this answer came
    relay.type("a\n")
    relay.wait_screen("Recorded; the quorum is not complete yet.")
    relay.wait_screen("event=dispatch_refused reason=signature_mismatch")
    assert relay.stop() == 0
    screen = relay.screen
    block = screen[screen.index("=" * 72) : screen.index(ONE_KEY_PROMPT) + len(ONE_KEY_PROMPT)]
    assert re.search(
        r"\napprovals: 0 of 2 collected  expires \S+Z  you are "
        r"alice@example\.com\n",
        block,
    ), block
    assert (
        "\nbudget: spend 120 EUR of 500 EUR left today (all pipelines: cap 500 EUR, "
        "0 EUR spent)\nbudget: spend 120 EUR of 100 EUR left today, 20 EUR over the cap "
        "(pipeline p: cap 100 EUR, 0 EUR spent)\n"
    ) in block, block
    assert "Rechnung bezahlen" in block and "event=" not in block, block
    assert " INFO " not in screen, screen
    after = screen.index(ONE_KEY_PROMPT) + len(ONE_KEY_PROMPT)
    assert screen.index("a\n", after) < screen.index("event=dispatch_refused"), screen
    assert approval_id in screen


@pytest.mark.parametrize(
    ("budget", "lines"),
    [
        (
            {
                "unit": "EUR",
                "spent_today": 4.12,
                "cap_today": 20.0,
                "spent_pipeline": 0.38,
                "cap_pipeline": 2.0,
                "this_request": None,
            },
            [
                "budget: 15.88 EUR of 20 EUR left today, the request names no spend "
                "(all pipelines: cap 20 EUR, 4.12 EUR spent)",
                "budget: 1.62 EUR of 2 EUR left today, the request names no spend "
                "(pipeline inv: cap 2 EUR, 0.38 EUR spent)",
            ],
        ),
        (
            {
                "unit": "EUR",
                "spent_today": 380,
                "cap_today": 500,
                "spent_pipeline": 0,
                "cap_pipeline": None,
                "this_request": 120,
            },
            [
                "budget: spend 120 EUR of 120 EUR left today (all pipelines: cap 500 EUR, "
                "380 EUR spent)"
            ],
        ),
        (
            {
                "unit": "USD",
                "spent_today": 0.1 + 0.2,
                "cap_today": None,
                "spent_pipeline": 0.3,
                "cap_pipeline": 0.25,
                "this_request": 0.5,
            },
            [
                "budget: spend 0.5 USD of 0 USD left today, 0.5 USD over the cap (pipeline inv: "
                "cap 0.25 USD, 0.3 USD spent)"
            ],
        ),
        (
            {
                "unit": "EUR",
                "spent_today": 0,
                "cap_today": None,
                "spent_pipeline": 0,
                "cap_pipeline": None,
                "this_request": 7,
            },
            ["budget: spend 7 EUR (no cap)"],
        ),
        (
            {"unit": "EUR\x1b[2K", "cap_today": "lots", "this_request": True},
            ['budget: {"unit": "EUR\\u001b[2K", "cap_today": "lots", "this_request": true}'],
        ),
        (
            {"unit": "EUR", "cap_today": 10**400, "this_request": 1},
            [f'budget: {{"unit": "EUR", "cap_today": {10**400}, "this_request": 1}}'],
        ),
    ],
    ids=["no-spend", "spend-fits", "over-already", "no-cap", "odd-types", "beyond-2**53"],
)
def test_relay_budget_in_words(budget, lines):
    """The dispatch's ``budget`` object (docs/protocol.md) in words."""
    assert budget_lines(budget, "inv") == lines


@pytest.mark.parametrize(
    ("verb", "status", "answer", "said"),
    [
        ("approve", 200, {"resolved": True, "outcome": "approved"},
         "Recorded: approved; the approval is resolved."),
        ("adjust", 200, {"resolved": True, "outcome": "adjusted"},
         "Recorded: adjusted; the approval is resolved."),
        ("skip", 200, {"resolved": True, "outcome": "skipped"},
         "Recorded: skipped; the approval is resolved."),
        ("approve", 200, {"resolved": False}, "Recorded; the quorum is not complete yet."),
        (
            "approve", 409, {"reason": "already_resolved", "outcome": "skipped"},
            "The gate did not record your approve: already_resolved (HTTP 409); the approval "
            "was already resolved: skipped.",
        ),
        (
            "skip", 410, {"reason": "expired"},
            "The gate did not record your skip: expired (HTTP 410); the approval timed out "
            "without it.",
        ),
        (
            "approve", 409, {"reason": "superseded"},
            "The gate did not record your approve: superseded (HTTP 409).",
        ),
    ],
    ids=["approved", "adjusted", "skipped", "quorum-open", "resolved-before", "expired", "other"],
)  # fmt: skip
def test_relay_verdict_reads_as_a_sentence(verb, status, answer, said):
    assert verdict(verb, status, {"status": "x", **answer}) == said


def test_relay_screen_names_who_asked():
    envelope = {
        **json.loads(signed_dispatch("x")[0]),
        "requested_by": "carol@example.com\x1b[2K",
        "expires_at": "2026-12-07T10:20:16.4Z",
    }

    lines = render(envelope, "alice@example.com").split("\n")
    anonymous = render({**envelope, "requested_by": None}, "alice@example.com")

    assert lines[4] == "requested by carol@example.com<U+001B>[2K"
    assert lines[3] == (  # the expiry fixed width, as every time a person reads
        "approvals: 0 of 1 collected  expires 2026-12-07T10:20:16.400Z  you are alice@example.com"
    )
    assert "requested by" not in anonymous


# ---- item 5 (relay part): blank drafts ----------------------------------------------------


def signed_dispatch(body: str) -> tuple[bytes, dict[str, str]]:
    """A dispatch of ``body`` signed with the test secret, as the gate sends it."""
    now = int(time.time() * 1000)
    envelope = build_dispatch(
        approval_id="01KDWZ8B00J3Q9V5X7Z2M4N6PR",
        run_id="run-1",
        pipeline="p",
        step="q1",
        issued_at_ms=now,
        expires_at_ms=now + 3_600_000,
        risk="normal",
        quorum_required=1,
        quorum_collected=0,
        approvers=["alice@example.com"],
        payload_hash=payload_hash(body),
        content_type="text/plain",
        body=body,
        callback_url="http://127.0.0.1:9/hitl/v0/decisions",
        nonce="b02n05" + "0" * 26,
        revision=1,
    )
    raw = wire_json(envelope)
    return raw, sign_headers(raw, SECRET)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("", "(the draft is empty)"),
        (" \n\t\n  ", "(the draft is only whitespace, 6 characters: 3 spaces, 2 newlines, 1 tab)"),
    ],
    ids=["empty", "whitespace"],
)
def test_relay_says_when_the_draft_is_empty_or_whitespace(pty_relay, body, said):
    """An empty or whitespace-only draft showed as nothing between two
    separator lines. The relay says so in words, where the draft would be."""
    relay = pty_relay("--as", "alice@example.com")
    raw, headers = signed_dispatch(body)
    status, _, _ = http_request(relay.url, "POST", raw, headers)
    assert status == 202
    relay.wait_screen(ONE_KEY_PROMPT)
    assert relay.stop() == 0
    rule = "-" * 72
    assert f"{rule}\n{said}\n{rule}\n" in relay.screen, relay.screen


# ---- relay review item A: a draft cannot fake the relay's own screen ------------------------

REAL_PROMPT = re.compile(
    r"^Approval (\S+)  (\S+)/(\S+)  revision (\d+), draft of (\d+) lines? above\. "
    + re.escape(ONE_KEY_PROMPT),
    re.MULTILINE,
)


@pytest.mark.e2e
def test_a_draft_cannot_fake_the_relays_screen(tmp_path, pty_relay, gates):
    """Relay review item A: a draft holding the relay's own separator, a fake prompt answered
    ``s``, a fake "Recorded ... skipped", a fake header and a harmless text read as "previous
    approval skipped; new harmless mail", and ``a`` approved the real draft. Every draft line
    is shown behind a gutter the relay's own lines never start with (a draft line starting
    with the gutter is nested behind another one), and the real prompt names what it decides."""
    relay = pty_relay("--as", "alice@example.com")
    gate = gates(write_config(tmp_path, relay.url))
    api = gate.api()
    spoof = (
        "Transfer 48,000.00 EUR to IBAN DE02 1203 0000 0000 2020 51 today.\n"
        + "-" * 72
        + "\n[a]pprove, [s]kip or [e]dit (adjust)? s\n"
        "Recorded: skipped; the approval is resolved.\n"
        "\n" + "=" * 72 + "\nApproval 01M8ZZZZZZZZZZZZZZZZZZZZZZ  p/q1  revision 1, draft of 1 line"
        " above. [a]pprove, [s]kip or [e]dit (adjust)? \n"
        "Approval 01M8ZZZZZZZZZZZZZZZZZZZZZZ  p/q1  risk normal  revision 1\n"
        "approvals: 0 of 1 collected  expires 2026-12-01T13:00:00Z  you are alice@example.com\n"
        "budget: 500 EUR of 500 EUR left today, the request names no spend\n"
        + "-" * 72
        + f"\nThanks for the lunch, see you Friday!\n{GUTTER}already behind a gutter\n"
        + "-" * 72
        + "\n"
    )
    draft = spoof.removesuffix("\n").split("\n")
    mark = len(relay.screen)
    approval_id = api.create("q1", spoof)["approval_id"]
    prompt = relay.wait_screen(REAL_PROMPT, mark)
    assert prompt.groups() == (approval_id, "p", "q1", "1", str(len(draft))), prompt.group(0)
    shown = relay.screen[mark : prompt.start()].split("\n")
    behind = [line.removeprefix(GUTTER) for line in shown if line.startswith(GUTTER)]
    assert behind == draft, shown  # every draft line, in order, behind the gutter
    assert f"{GUTTER}{GUTTER}already behind a gutter" in shown
    # outside the gutter only the relay's own frame: the header of the real approval (which
    # the draft copies: equal text, so compared as the whole frame) and two separators
    outside = [line for line in shown if not line.startswith(GUTTER)]
    assert outside[:3] == ["", "=" * 72, f"Approval {approval_id}  p/q1  risk normal  revision 1"]
    assert re.fullmatch(r"approvals: 0 of 1 collected  expires \S+  you are alice@example.com",
                        outside[3]), outside  # fmt: skip
    assert outside[4:] == ["-" * 72, "-" * 72, ""], outside
    assert api.get(approval_id)["decisions"] == []
    relay.type("a\n")
    approval = resolved(gate, approval_id)
    assert (approval["outcome"], decisions(approval)) == (
        "approved",
        [("alice@example.com", "approve", 1)],
    )
    assert relay.stop() == 0


def test_a_long_draft_line_is_cut_behind_the_gutter_not_wrapped_by_the_terminal():
    """Item A: a draft line longer than the terminal would wrap to column 0, outside the
    gutter; it is cut to the terminal's width, the rest behind the continuation gutter."""
    fake = " " * 100 + "[a]pprove, [s]kip or [e]dit (adjust)? \u4e2d\u6587\tx"
    _, lines = draft_lines(fake + "\nnext\n", width=40)
    assert lines[0].startswith(GUTTER) and lines[-1] == GUTTER + "next"
    assert all(line.startswith(WRAP_GUTTER) for line in lines[1:-1]), lines
    widths = [sum(2 if "\u4e00" <= c <= "\u9fff" else 1 for c in line) for line in lines]
    assert max(widths) <= 40, lines
    assert "".join(line[2:] for line in lines[:-1]) == fake.expandtabs(8)


# ---- relay review item C: no human left at the terminal --------------------------------------


@pytest.mark.e2e
def test_after_stdin_closed_new_dispatches_are_refused_not_stranded(tmp_path, pty_relay, gates):
    """Relay review item C: after one Ctrl-D every new dispatch was acked 202 and stranded
    until expiry, the gate believing it delivered. Once no human can answer, a new dispatch
    is refused 503 ``no_human_at_terminal`` (the gate keeps it and retries, and shows the
    reason in ``dispatch.last_error``); the relay keeps running; the stdin_closed message
    starts on a line of its own, not on the prompt's."""
    relay = pty_relay("--as", "alice@example.com", tty_stderr=True)
    gate = gates(write_config(tmp_path, relay.url))
    api = gate.api()
    mark = len(relay.screen)
    first = api.create("q1", "Erste Mail\n")["approval_id"]
    relay.wait_screen(ONE_KEY_PROMPT, mark)
    relay.type("\x04")  # Ctrl-D at the start of a line: end of input
    closed = relay.wait_screen(re.compile(r"^.*event=stdin_closed.*$", re.MULTILINE), mark)
    assert ONE_KEY_PROMPT not in closed.group(0), relay.screen
    relay.wait_screen("\nInput ended: nobody can answer here any more;", mark)
    second = api.create("q1", "Zweite Mail\n")["approval_id"]

    def refused() -> str | None:
        error = api.get(second)["dispatch"]["last_error"]
        return error if error and "no_human_at_terminal" in error else None

    assert wait_until(refused, what="the refusal in dispatch.last_error") == (
        "relay answered HTTP 503: no_human_at_terminal"
    )
    assert api.get(second)["dispatch"]["delivered_at"] is None
    assert relay.proc.poll() is None  # still running: it can be stopped cleanly
    assert [api.get(a)["state"] for a in (first, second)] == ["pending", "pending"]
    assert relay.stop() == 0


# ---- relay review item B: stdout redirected, the terminal still shows what is decided --------


@pytest.mark.e2e
def test_stdout_redirected_the_draft_and_prompt_are_on_the_terminal(tmp_path, pty_relay, gates):
    """Relay review item B: ``hitl-gate relay --as alice > out.txt`` at a terminal wrote the
    banner, draft and prompt to the file, and ``a`` Enter typed blind approved. Asking on a
    terminal, the relay writes to the terminal its stdin is, whatever stdout is: the draft
    and the prompt are on the pty, and nothing is decided before the prompt was there."""
    with (tmp_path / "out.txt").open("wb") as out:
        relay = pty_relay("--as", "alice@example.com", stdout=out)
    gate = gates(write_config(tmp_path, relay.url))
    api = gate.api()
    relay.wait_screen("hitl-gate relay listening on")
    relay.type("a\n")  # typed blind, before anything asks: discarded
    mark = len(relay.screen)
    approval_id = api.create("q1", "Pay 12,000.00 EUR to ACME\n")["approval_id"]
    prompt = relay.wait_screen(REAL_PROMPT, mark)
    assert prompt.group(1) == approval_id
    assert f"{GUTTER}Pay 12,000.00 EUR to ACME\n" in relay.screen[mark : prompt.start()]
    assert api.get(approval_id)["decisions"] == []
    relay.type("a\n")
    approval = resolved(gate, approval_id)
    assert (approval["outcome"], decisions(approval)) == (
        "approved",
        [("alice@example.com", "approve", 1)],
    )
    assert relay.stop() == 0
    assert "Pay 12,000.00" not in (tmp_path / "out.txt").read_text(encoding="utf-8")


# ---- a skip's reason ---------------------------------------------------------------------

REASON_STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102], "timeout": "1h"},
    {
        "name": "need",
        "quorum": 1,
        "approvers": [101, 102],
        "timeout": "1h",
        "skip_reason": "required",
    },
]


def reasons(approval: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(d["identity"], d["decision"], d["reason"]) for d in approval["decisions"]]


@pytest.mark.e2e
def test_relay_asks_a_skip_reason_and_sends_what_was_typed(tmp_path, pty_relay, gates):
    """On a ``skip_reason: required`` step the relay asks until a reason is
    typed (an empty line is not one) and sends it; elsewhere it asks too, and an empty line
    sends none."""
    relay = pty_relay("--as", "alice@example.com")
    gate = gates(write_config(tmp_path, relay.url, steps=REASON_STEPS))
    api = gate.api()

    mark = len(relay.screen)
    need = api.create("need", "Rechnung 2026-114: 1.240,00 €\n")["approval_id"]
    relay.wait_screen(ONE_KEY_PROMPT, mark)
    relay.type("s\n")
    relay.wait_screen(REQUIRED_REASON_PROMPT, mark)
    relay.type("  \n")  # only whitespace: no reason, asked again
    again = relay.wait_screen("This step needs a reason for a skip.", mark).end()
    relay.wait_screen(REQUIRED_REASON_PROMPT, again)
    assert api.get(need)["decisions"] == []
    relay.type("Betrag falsch: laut Rechnung 1.200,00 €\n")
    approval = resolved(gate, need)
    assert (approval["outcome"], reasons(approval)) == (
        "skipped",
        [("alice@example.com", "skip", "Betrag falsch: laut Rechnung 1.200,00 €")],
    )

    mark = len(relay.screen)
    plain = api.create("q1", "Zweite Mail\n")["approval_id"]
    relay.wait_screen(ONE_KEY_PROMPT, mark)
    relay.type("s\n")
    relay.wait_screen(OPTIONAL_REASON_PROMPT, mark)
    relay.type("\n")
    approval = resolved(gate, plain)
    assert reasons(approval) == [("alice@example.com", "skip", None)]


@pytest.mark.e2e
def test_relay_auto_skip_sends_its_reason(tmp_path, clis, gates):
    """``--auto skip:REASON`` skips with that reason, also on a step that
    requires one."""
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        "alice@example.com",
        "--auto",
        "skip:Bitte Betrag prüfen",
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    gate = gates(write_config(tmp_path, url, steps=REASON_STEPS))
    approval_id = gate.api().create("need", "Eins\n")["approval_id"]
    approval = resolved(gate, approval_id)
    assert (approval["outcome"], reasons(approval)) == (
        "skipped",
        [("alice@example.com", "skip", "Bitte Betrag prüfen")],
    )
    assert relay.stop() == 0
    assert "Bitte Betrag" not in relay.log()  # a reason is not logged, like a draft


@pytest.mark.e2e
def test_a_script_gives_a_reason_only_where_the_step_requires_one(tmp_path, clis, gates):
    """Piped stdin: scripts written before reasons existed answer as before (a
    skip on an optional step takes no reason line); on a ``skip_reason: required`` step the
    line after the skip is its reason."""
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--as",
        "alice@example.com",
        stdin="s\ns\nBetrag prüfen\na\n".encode(),
    )
    url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
    gate = gates(write_config(tmp_path, url, steps=REASON_STEPS))
    api = gate.api()
    answered = []
    for step in ("q1", "need", "q1"):
        approval = resolved(gate, api.create(step, f"{step}\n")["approval_id"])
        answered.append((approval["outcome"], reasons(approval)))
    assert answered == [
        ("skipped", [("alice@example.com", "skip", None)]),
        ("skipped", [("alice@example.com", "skip", "Betrag prüfen")]),
        ("approved", [("alice@example.com", "approve", None)]),
    ]
    assert relay.stop() == 0


@pytest.mark.parametrize("spec", ["skip:", "skip:  ", "adjust:"])
def test_relay_auto_refuses_an_empty_reason_or_text(spec: str) -> None:
    from gate.tools.reference_relay.relay import AutoDecision

    with pytest.raises(ValueError, match=r"use approve, skip, skip:REASON or adjust:TEXT"):
        AutoDecision.parse(spec)


CI_STOP_23_CHILD = """
import asyncio, sys
from gate.tools.reference_relay.terminal import Terminal

async def main() -> None:
    terminal = Terminal.open(asyncio.get_running_loop())
    never = asyncio.get_running_loop().create_future()
    print(await terminal.lines.next(never), flush=True)  # the reader is back in its read

asyncio.run(main())
sys.exit(0)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("attempt", range(3))
def test_ci_stop_23_a_relay_reading_a_script_exits_cleanly(attempt):
    """CI of stop 23: ``relay`` with an open stdin pipe stopped with exit -6. Its reader
    thread sat in ``sys.stdin.buffer.readline()`` holding the buffered reader's lock, and
    the interpreter's shutdown aborted (``Fatal Python error: _enter_buffered_busy``). The
    reader must hold no Python-level lock while it waits: exit 0, no fatal error."""
    with subprocess.Popen(
        [sys.executable, "-c", CI_STOP_23_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    ) as child:
        _stop_while_reading(child)


def _stop_while_reading(child: subprocess.Popen[bytes]) -> None:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(b"first line\n")
    child.stdin.flush()  # and the pipe stays open: the reader waits for more
    assert child.stdout.readline() == b"first line\n"
    returncode = child.wait(DEADLINE_S)  # stdin still open: nothing ends the reader
    child.stdin.close()
    assert child.stderr is not None
    assert (returncode, child.stderr.read().decode()) == (0, "")


@pytest.mark.parametrize("given", [b"", b"approve\n", b"approve\nskip"])
def test_a_script_stdin_already_at_its_end_is_known_when_it_is_opened(given: bytes) -> None:
    """A piped stdin whose writer is gone before the relay starts: its lines and its end are
    read when the terminal is opened, before the event loop runs once, so the first
    dispatch is refused at once (503) instead of racing the reader thread."""
    import asyncio

    from gate.tools.reference_relay.terminal import ScriptLines

    read_end, write_end = os.pipe()
    os.write(write_end, given)
    os.close(write_end)
    loop = asyncio.new_event_loop()
    try:
        lines = ScriptLines(loop, read_end)
        lines.arm()
        expected = [line.decode() for line in given.split(b"\n") if line] + [None]
        assert list(lines.buffer) == expected  # no loop iteration ran: read synchronously
        assert lines.thread is None  # nothing left for a thread to read
        assert lines.ended() is (given == b"")
    finally:
        loop.close()
        os.close(read_end)


def test_a_script_stdin_still_open_is_read_by_the_thread_after_what_was_ready() -> None:
    """Lines already written are read at once; what comes later is read by the thread, in
    order, up to the end."""
    import asyncio

    from gate.tools.reference_relay.terminal import ScriptLines

    read_end, write_end = os.pipe()
    os.write(write_end, b"first\nsec")
    loop = asyncio.new_event_loop()
    try:
        lines = ScriptLines(loop, read_end)
        lines.arm()
        assert list(lines.buffer) == ["first"]
        assert lines.thread is not None
        os.write(write_end, b"ond\nthird\n")
        os.close(write_end)

        async def drain() -> list[str]:
            never: asyncio.Future[str] = loop.create_future()
            got: list[str] = []
            with contextlib.suppress(EOFError):
                while True:
                    got.append(await lines.next(never))
            return got

        assert loop.run_until_complete(asyncio.wait_for(drain(), 30)) == [
            "first",
            "second",
            "third",
        ]
    finally:
        loop.close()
        os.close(read_end)
