"""The POSIX sh relay template (conformance/relays/shell/relay.sh) against the real gate.

It passes ``python -m gate verify`` end to end behind socat, and its per-connection handler
refuses what SPEC §2 says a relay must refuse. In ``ask`` mode, with a real pseudo-terminal
as its /dev/tty, it shows the draft as it is and takes only an answer typed after it.
Needs the Debian packages socat, jq, curl and openssl; skipped (with the reason)
where one is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gate.protocol import signing
from tests.support import SECRET as GATE_SECRET
from tests.support import GateProcess, free_port, write_config

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
RELAY_SH = ROOT / "conformance" / "relays" / "shell" / "relay.sh"
SECRET = "shell-relay-test-secret"
APPROVER = "alice@example.com"
DEADLINE_S = 30.0


def _needs(*tools: str) -> pytest.MarkDecorator:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    return pytest.mark.skipif(
        bool(missing),
        reason=f"shell relay needs {', '.join(missing)} (apt-get install socat jq curl openssl)",
    )


needs_handler = _needs("sh", "jq", "curl", "openssl")
needs_listener = _needs("sh", "socat", "jq", "curl", "openssl")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "HITL_"))}
    env.update(
        HITL_RELAY_SECRET=SECRET,
        RELAY_APPROVER=APPROVER,
        RELAY_STATE=str(tmp_path / "state"),
        TMPDIR=str(tmp_path),
    )
    env.update(extra)
    return env


class ShellRelay:
    """``relay.sh serve`` (socat) on a free loopback port, in its own process group."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = tmp_path / "relay.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                ["sh", str(RELAY_SH), "serve", f"127.0.0.1:{self.port}"],
                env=_env(tmp_path, **env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"relay exited: {self.log()}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)  # polling interval, not synchronisation
        raise AssertionError(f"relay not listening within {DEADLINE_S} s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # socat and the handlers it forked
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def shell_relay(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ShellRelay]:
    relay = ShellRelay(tmp_path, RELAY_AUTO=getattr(request, "param", "approve"))
    try:
        relay.wait_ready()
        yield relay
    finally:
        relay.stop()


@needs_listener
@pytest.mark.parametrize(
    "shell_relay", ["approve", "adjust:Grüße — edited by sh ✅"], indirect=True
)
def test_shell_relay_passes_verify(shell_relay: ShellRelay) -> None:
    env = {**os.environ, "HITL_RELAY_SECRET": SECRET}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gate",
            "verify",
            shell_relay.url,
            "--secret-env",
            "HITL_RELAY_SECRET",
            "--approver",
            APPROVER,
            "--timeout",
            "30",
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    context = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\nrelay log:\n{shell_relay.log()}"
    assert proc.returncode == 0, context
    report = json.loads(proc.stdout)
    assert report["ok"] is True, context
    failed = [c for c in report["checks"] if not c["ok"]]
    assert failed == [], context
    names = {c["name"] for c in report["checks"]}
    assert {
        "relay.ack",
        "relay.decision_signed",
        "relay.payload_hash_echo",
        "relay.refuses_bad_signature",
        "relay.refuses_stale_timestamp",
        "gate.replay_refused",
    } <= names


# --- the per-connection handler alone (stdin -> stdout), no socat --------------------------


class CallbackServer(ThreadingHTTPServer):
    """Stands in for the gate's decision endpoint: records each POST, answers 200."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Capture)
        self.seen: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Event()


class _Capture(BaseHTTPRequestHandler):
    server: CallbackServer

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append(({k.lower(): v for k, v in self.headers.items()}, raw))
        answer = b'{"status":"recorded","resolved":true,"outcome":"approved"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        self.server.arrived.set()  # after the answer: a test ending then cannot cut it off

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass


@pytest.fixture
def callback() -> Iterator[CallbackServer]:
    server = CallbackServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _dispatch(callback_url: str, body: str = "Hi Anna — ✅\r\n") -> bytes:
    return json.dumps(
        {
            "protocol": "hitl/v0",
            "approval_id": "01TESTSHELLRELAY0000000000",
            "run_id": "r",
            "pipeline": "p",
            "step": "s",
            "risk": "low",
            "approvers": [APPROVER],
            "quorum": {"required": 1, "collected": 0},
            "payload_hash": "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest(),
            "draft": {"content_type": "text/plain", "body": body},
            "callback": {"url": callback_url, "nonce": secrets.token_hex(16)},
            "revision": 1,
        },
        ensure_ascii=False,
    ).encode("utf-8")


def _handle(tmp_path: Path, body: bytes, signature: str | None) -> tuple[int, dict[str, Any]]:
    head = f"POST / HTTP/1.1\r\nHost: relay\r\nContent-Length: {len(body)}\r\n"
    if signature is not None:
        head += f"X-Draftcat-Signature: {signature}\r\n"
    with (tmp_path / "handler.log").open("ab") as log:  # not a pipe: the background job keeps it
        proc = subprocess.run(
            ["sh", str(RELAY_SH)],
            input=head.encode() + b"\r\n" + body,
            stdout=subprocess.PIPE,
            stderr=log,
            env=_env(tmp_path),
            timeout=DEADLINE_S,
            check=False,
        )
    status_line, _, rest = proc.stdout.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


@needs_handler
def test_handler_refuses_unsigned_stale_forged_and_oversized(tmp_path: Path) -> None:
    body = _dispatch("http://127.0.0.1:9/never")
    now = int(time.time())
    assert _handle(tmp_path, body, None) == (
        401,
        {"status": "unauthorized", "reason": "signature_missing"},
    )
    assert _handle(tmp_path, body, f"t={now}") == (
        401,
        {"status": "unauthorized", "reason": "signature_malformed"},
    )
    assert _handle(tmp_path, body, signing.sign(SECRET, now - 301, body)) == (
        401,
        {"status": "unauthorized", "reason": "timestamp_out_of_window"},
    )
    assert _handle(tmp_path, body, signing.sign(SECRET, now * 1000, body)) == (
        401,
        {"status": "unauthorized", "reason": "timestamp_out_of_window"},
    )
    assert _handle(tmp_path, body, signing.sign("another-secret", now, body)) == (
        401,
        {"status": "unauthorized", "reason": "signature_mismatch"},
    )
    big = b" " * (64 * 1024 + 1)
    assert _handle(tmp_path, big, signing.sign(SECRET, now, big))[0] == 413
    lying = json.loads(body)
    lying["payload_hash"] = "sha256:" + "0" * 64
    raw = json.dumps(lying).encode()
    assert _handle(tmp_path, raw, signing.sign(SECRET, now, raw))[0] == 400
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())


@needs_handler
def test_handler_accepts_rotated_secret_and_posts_a_signed_decision(
    tmp_path: Path, callback: CallbackServer
) -> None:
    url = f"http://127.0.0.1:{callback.server_address[1]}/hitl/v0/decisions"
    body = _dispatch(url)
    now = int(time.time())
    old = signing.compute("retired-secret", now, body)
    new = signing.compute(SECRET, now, body).upper()
    header = f" t = {now} , v1 = {old} ,v1={new}"  # lenient parse, any v1 may match
    assert _handle(tmp_path, body, header) == (202, {"status": "accepted"})
    assert _handle(tmp_path, body, header) == (202, {"status": "accepted", "duplicate": True})
    assert callback.arrived.wait(DEADLINE_S), (tmp_path / "handler.log").read_text()
    [(headers, raw)] = callback.seen
    parsed = signing.parse(headers["x-draftcat-signature"])
    signing.check_hmac(parsed, raw, [SECRET])
    assert abs(parsed.t - time.time()) < 60
    assert headers["x-hitl-protocol"] == "hitl/v0"
    dispatch, decision = json.loads(body), json.loads(raw)
    assert decision["protocol"] == "hitl/v0"
    assert decision["approval_id"] == dispatch["approval_id"]
    assert decision["nonce"] == dispatch["callback"]["nonce"]
    assert decision["payload_hash"] == dispatch["payload_hash"]
    assert decision["decision"] == "approve" and decision["adjust_text"] is None
    assert decision["approver"]["id"] == APPROVER


@needs_handler
def test_handler_skips_a_malformed_v1_like_the_gate(
    tmp_path: Path, callback: CallbackServer
) -> None:
    """(conformance/vectors/signature_header.json, the *_v1_* cases): a v1
    that is not 64 hex digits is skipped when another is well formed; with none well formed
    the header is signature_malformed (the template answered signature_mismatch)."""
    url = f"http://127.0.0.1:{callback.server_address[1]}/hitl/v0/decisions"
    body = _dispatch(url)
    now = int(time.time())
    good = signing.compute(SECRET, now, body)
    wrong = signing.compute("another-secret", now, body)
    assert _handle(tmp_path, body, f"t={now},v1={good[:-1]},v1={wrong}") == (
        401,
        {"status": "unauthorized", "reason": "signature_mismatch"},
    )
    for junk in (good[:-1], "z" * 64, good + "0", ""):
        assert _handle(tmp_path, body, f"t={now},v1={junk},v1={junk}") == (
            401,
            {"status": "unauthorized", "reason": "signature_malformed"},
        ), junk
    assert _handle(tmp_path, body, f"t={now},v1=zz,v1={good}") == (202, {"status": "accepted"})
    assert callback.arrived.wait(DEADLINE_S), (tmp_path / "handler.log").read_text()


def _ask_on_a_terminal(tmp_path: Path, callback: CallbackServer, draft: str) -> str:
    """Run the handler in ``ask`` mode with a pseudo-terminal as its controlling terminal
    (its /dev/tty) on a dispatch of ``draft``; answer ``a`` once it asks; return what the
    terminal showed (CR LF undone) after the decision reached ``callback``."""
    import fcntl
    import pty
    import select
    import termios

    url = f"http://127.0.0.1:{callback.server_address[1]}/hitl/v0/decisions"
    body = _dispatch(url, draft)
    head = (
        f"POST / HTTP/1.1\r\nHost: relay\r\nContent-Length: {len(body)}\r\n"
        f"X-Draftcat-Signature: {signing.sign(SECRET, int(time.time()), body)}\r\n\r\n"
    )
    master, slave = pty.openpty()

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    shown = b""
    proc: subprocess.Popen[bytes] | None = None
    # the session must outlive the handler (which answers, then asks from a background job):
    # when a session leader exits, its terminal is hung up. So a shell leads the session,
    # runs the handler, then waits to be killed.
    wrapper = 'sh "$1"; exec sleep 120 >/dev/null'
    try:
        with (tmp_path / "handler.log").open("ab") as log:
            proc = subprocess.Popen(
                ["sh", "-c", wrapper, "wrapper", str(RELAY_SH)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=_env(tmp_path, RELAY_AUTO="ask"),
                pass_fds=(slave,),
                preexec_fn=controlling_terminal,
            )  # noqa: PLW1509
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(head.encode() + body)
        proc.stdin.close()
        status_line = proc.stdout.readline()
        assert status_line.startswith(b"HTTP/1.1 202"), status_line
        deadline = time.monotonic() + DEADLINE_S
        while b"decide as" not in shown:
            assert time.monotonic() < deadline, (shown, (tmp_path / "handler.log").read_text())
            if select.select([master], [], [], 0.5)[0]:
                shown += os.read(master, 65536)
        os.write(master, b"a\n")
        assert callback.arrived.wait(DEADLINE_S), (tmp_path / "handler.log").read_text()
    finally:
        os.close(master)
        os.close(slave)
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait(DEADLINE_S)
            assert proc.stdout is not None
            proc.stdout.close()
    return shown.decode("utf-8").replace("\r\n", "\n")  # the terminal's output translation


@needs_handler
def test_ask_mode_shows_control_and_invisible_characters_of_a_draft(
    tmp_path: Path, callback: CallbackServer
) -> None:
    """Security review: ``ask`` printed the draft raw on the terminal, so ``"...ATTACKER\\r
    \\x1b[2K..."`` showed only its harmless second half. It now shows every control, format
    (bidi, zero-width) and line-separator character as ``<U+XXXX>``, with a warning. The
    handler runs with a pseudo-terminal as its controlling terminal (its /dev/tty)."""
    draft = (
        "Transfer 12000 EUR to ATTACKER\r\x1b[2KTransfer 12 EUR to ACME\n"
        "tab\tkept \u202eevil\u202c zero\u200bwidth \u2028 end\n"
    )
    text = _ask_on_a_terminal(tmp_path, callback, draft)
    assert (
        "Transfer 12000 EUR to ATTACKER<U+000D><U+001B>[2KTransfer 12 EUR to ACME\n"
        "tab\tkept <U+202E>evil<U+202C> zero<U+200B>width <U+2028> end\n"
    ) in text, text
    assert "warning: the draft holds 6 control or invisible characters" in text, text
    for raw in ("\x1b", "\u202e", "\u200b", "\u2028"):
        assert raw not in text, repr(raw)
    [(_, raw)] = callback.seen
    assert json.loads(raw)["decision"] == "approve"


@needs_handler
@pytest.mark.parametrize(
    ("draft", "said"),
    [
        ("", "(the draft is empty)"),
        (" \n\t\n  ", "(the draft is only whitespace, 6 characters)"),
    ],
    ids=["empty", "whitespace"],
)
def test_relay_shell_ask_says_when_the_draft_is_empty_or_whitespace(
    tmp_path: Path, callback: CallbackServer, draft: str, said: str
) -> None:
    """``ask`` showed an empty or whitespace-only draft as nothing between
    its two ``==`` lines; it says so in words where the draft would be."""
    text = _ask_on_a_terminal(tmp_path, callback, draft)
    assert f"\n{said}\n==\n" in text, text
    [(_, raw)] = callback.seen
    assert json.loads(raw)["decision"] == "approve"


# --- answers typed before the draft, stray words, high risk ---------------------------------
# ``relay.sh serve`` in ask mode behind socat, in a session whose controlling terminal (the
# handlers' /dev/tty) is a real pseudo-terminal; a real gate dispatches to it.

ONE_KEY_PROMPT = "decide as alice@example.com: [a]pprove, [s]kip or [e]dit (adjust)? "
ONE_KEY_HINT = "Not taken: type a, s or e (or approve, skip, edit).\n"


OPTIONAL_REASON_PROMPT = "Why skip? What should change (optional, one line; empty for none): "
REQUIRED_REASON_PROMPT = "Why skip? What should change (required, one line): "


def _whole_word_prompt(risk: str) -> str:
    return f"decide as alice@example.com. Risk {risk}: type the whole word approve, skip or edit: "


def _whole_word_hint(risk: str) -> str:
    return f"Not taken: at risk {risk} type the whole word approve, skip or edit.\n"


def _notice(approval_id: str = "01TESTSHELLRELAY0000000000", **extra: Any) -> bytes:
    """A resolution notice as the gate sends it (docs/protocol.md "Notices")."""
    notice = {
        "protocol": "hitl/v0",
        "type": "notice",
        "approval_id": approval_id,
        "run_id": "r",
        "pipeline": "p",
        "step": "s",
        "outcome": "skipped",
        "resolved_at": "2026-01-01T00:31:05Z",
        "revision": 1,
        "payload_hash": "sha256:" + "0" * 64,
        "decided_by": [{"identity": "bob@example.com", "decision": "skip", "on_behalf_of": None}],
        "reason": "Betrag falsch",
    }
    return json.dumps(notice | extra, ensure_ascii=False).encode("utf-8")


@needs_handler
def test_handler_acks_a_signed_notice_and_refuses_an_unsigned_one(tmp_path: Path) -> None:
    """A notice is checked like a dispatch (401 unsigned, forged or stale), acked
    200 when signed, remembered as resolved (``.done/ID``: a queued prompt about it is never
    shown) and never taken for a request (no nonce remembered, no decision); 400 without an
    outcome. Nothing is remembered for a refused one."""
    now = int(time.time())
    notice = _notice()
    state = tmp_path / "state"
    assert _handle(tmp_path, notice, None) == (
        401,
        {"status": "unauthorized", "reason": "signature_missing"},
    )
    assert _handle(tmp_path, notice, signing.sign("another-secret", now, notice)) == (
        401,
        {"status": "unauthorized", "reason": "signature_mismatch"},
    )
    assert _handle(tmp_path, notice, signing.sign(SECRET, now - 301, notice))[0] == 401
    bad = _notice(outcome=None)
    assert _handle(tmp_path, bad, signing.sign(SECRET, now, bad)) == (
        400,
        {"status": "invalid", "reason": "envelope"},
    )
    assert not state.exists() or not any(state.iterdir())

    for _ in range(2):  # the gate retries a notice whose ack it missed: the same notice
        assert _handle(tmp_path, notice, signing.sign(SECRET, now, notice)) == (
            200,
            {"status": "accepted"},
        )
    assert sorted(p.name for p in state.iterdir()) == [".done"]  # no nonce: not a request
    assert [p.name for p in (state / ".done").iterdir()] == ["01TESTSHELLRELAY0000000000"]
    log = (tmp_path / "handler.log").read_text(encoding="utf-8")
    assert "notice: approval 01TESTSHELLRELAY0000000000 skipped; not asking any more" in log
    assert "Betrag falsch" not in log  # a reason is a human's words: never logged


class PtyShellRelay(ShellRelay):
    """``relay.sh serve`` with ``RELAY_AUTO=ask`` and a pseudo-terminal as its session's
    controlling terminal: every handler socat forks asks there. The test is the human at the
    master side: ``screen`` is what the terminal showed (CR LF undone), ``type`` types."""

    def __init__(self, tmp_path: Path) -> None:
        import fcntl
        import termios

        self.master, slave = os.openpty()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = tmp_path / "relay.log"
        self._raw = b""
        self._cond = threading.Condition()

        def controlling_terminal() -> None:
            os.setsid()  # socat leads the session and keeps the terminal while handlers come
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

        try:
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    ["sh", str(RELAY_SH), "serve", f"127.0.0.1:{self.port}"],
                    env=_env(tmp_path, RELAY_AUTO="ask", HITL_RELAY_SECRET=GATE_SECRET),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(slave,),
                    preexec_fn=controlling_terminal,
                )  # noqa: PLW1509
        finally:
            os.close(slave)
        self._reader = threading.Thread(target=self._read_screen, daemon=True)
        self._reader.start()

    def _read_screen(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the session's last holder of the terminal is gone
                data = b""
            with self._cond:
                self._raw += data
                self._cond.notify_all()
            if not data:
                return

    @property
    def screen(self) -> str:
        with self._cond:
            return self._raw.decode("utf-8", "replace").replace("\r\n", "\n")

    def type(self, text: str) -> None:
        """Type ``text`` on the terminal's keyboard (``\\n`` is Enter)."""
        os.write(self.master, text.encode("utf-8"))

    def wait_screen(
        self, text: str, start: int = 0, undecided: Callable[[], None] | None = None
    ) -> int:
        """Wait until ``text`` shows at or after offset ``start``; return where it ends.
        ``undecided`` is called on every look and raises when a decision came too early."""
        deadline = time.monotonic() + DEADLINE_S
        with self._cond:
            while True:
                found = self.screen.find(text, start)
                if found >= 0:
                    return found + len(text)
                if undecided is not None:
                    undecided()
                assert time.monotonic() < deadline and self.proc.poll() is None, (
                    f"no {text!r} on the terminal; screen:\n{self.screen}\nlog:\n{self.log()}"
                )
                self._cond.wait(0.2)

    def stop(self) -> None:
        super().stop()
        self._reader.join(DEADLINE_S)
        os.close(self.master)


@pytest.fixture
def asking(tmp_path: Path) -> Iterator[tuple[PtyShellRelay, Callable[..., GateProcess]]]:
    """A ``PtyShellRelay`` (listening) and a function starting a real gate dispatching to it
    (``steps`` as ``write_config``'s); both stopped after the test."""
    relay = PtyShellRelay(tmp_path)
    started: list[GateProcess] = []

    def gate(
        steps: list[dict[str, Any]] | None = None, relay_cfg: dict[str, Any] | None = None
    ) -> GateProcess:
        config = write_config(tmp_path, relay.url, steps=steps, relay=relay_cfg)
        proc = GateProcess(config).start()
        started.append(proc)
        return proc

    try:
        relay.wait_ready()
        yield relay, gate
    finally:
        for proc in started:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.stop()
        relay.stop()


def _undecided(gate: GateProcess, approval_id: str) -> Callable[[], None]:
    def check() -> None:
        approval = gate.api().get(approval_id)
        assert approval["decisions"] == [], f"decided before the answer was typed: {approval}"

    return check


def _decisions(approval: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(d["identity"], d["decision"], d["revision"]) for d in approval["decisions"]]


@needs_listener
def test_shell_keys_typed_before_the_prompt_are_discarded(asking) -> None:
    """Shell relay: ``a`` Enter typed while no prompt was on screen approved
    the next request at once, unseen (ask read /dev/tty as it was). What is typed before the
    draft and its prompt are on screen, whole lines and half a line, is discarded; only the
    answer typed after the prompt counts, for the first request and for the next one."""
    relay, start_gate = asking
    gate = start_gate()
    api = gate.api()

    relay.type("a\nstray")  # nothing on screen asks for it
    mark = relay.wait_screen("a\nstray")  # its echo: the terminal holds it as input now
    first = api.create("q1", "Erste Mail: bitte lesen\n")["approval_id"]
    end = relay.wait_screen(ONE_KEY_PROMPT, mark, _undecided(gate, first))
    shown = relay.screen[mark:end]
    assert shown.index("Erste Mail: bitte lesen") < shown.index(ONE_KEY_PROMPT), shown
    relay.type("s\n")  # the answer, typed after the prompt: "s", not "strays"
    end = relay.wait_screen(OPTIONAL_REASON_PROMPT, end)
    relay.type("\n")  # no reason
    approval = api.wait_resolved(first)
    assert (approval["outcome"], _decisions(approval)) == (
        "skipped",
        [("alice@example.com", "skip", 1)],
    )

    relay.type("s\nstray")  # between two prompts: a stray key, then half a line
    mark = relay.wait_screen("s\nstray", end)
    second = api.create("q1", "Zweite Mail\n")["approval_id"]
    end = relay.wait_screen(ONE_KEY_PROMPT, mark, _undecided(gate, second))
    relay.type("a\n")
    approval = api.wait_resolved(second)
    assert (approval["outcome"], _decisions(approval)) == (
        "approved",
        [("alice@example.com", "approve", 1)],
    )
    assert "Not taken" not in relay.screen, relay.screen


@needs_listener
@pytest.mark.parametrize(
    ("answer", "outcome", "verb"),
    [
        ("  APPROVE \t", "approved", "approve"),
        ("S", "skipped", "skip"),
    ],
    ids=["approve-word", "skip-key"],
)
def test_shell_only_a_choice_is_taken_and_abort_does_not_approve(
    asking, answer: str, outcome: str, verb: str
) -> None:
    """Shell relay: ask matched ``a*``, so ``abort`` (or anything starting
    with ``a``) approved. Only ``a``/``approve``, ``s``/``skip``, ``e``/``edit``/``adjust``
    are taken (any case, trimmed); anything else gets a ``Not taken`` line and the prompt
    again, and decides nothing."""
    relay, start_gate = asking
    gate = start_gate()
    approval_id = gate.api().create("q1", "Hallo Anna\n")["approval_id"]
    undecided = _undecided(gate, approval_id)
    mark = relay.wait_screen(ONE_KEY_PROMPT, 0, undecided)
    for wrong in ("abort", "apple", "sa", "", "approved", "a b"):
        relay.type(wrong + "\n")
        mark = relay.wait_screen(ONE_KEY_HINT + ONE_KEY_PROMPT, mark, undecided)
    relay.type(answer + "\n")
    if verb == "skip":
        relay.wait_screen(OPTIONAL_REASON_PROMPT, mark, undecided)
        relay.type("\n")
    approval = gate.api().wait_resolved(approval_id)
    assert (approval["outcome"], _decisions(approval)) == (
        outcome,
        [("alice@example.com", verb, 1)],
    )


@needs_listener
@pytest.mark.parametrize(("risk", "word"), [("high", "approve"), ("critical", "Edit")])
def test_shell_high_risk_takes_the_whole_word_only(asking, risk: str, word: str) -> None:
    """Shell relay: at a risk other than low/normal one key must not decide;
    the prompt says to type the whole word, and ``a``, ``s``, ``e`` are refused with that
    hint. The whole word (any case) is taken; ``edit`` then asks for the new text."""
    relay, start_gate = asking
    steps = [{"name": "pay", "quorum": 1, "approvers": [101, 102], "timeout": "1h", "risk": risk}]
    gate = start_gate(steps)
    approval_id = gate.api().create("pay", "Pay 12,000.00 EUR to ACME\n")["approval_id"]
    undecided = _undecided(gate, approval_id)
    mark = relay.wait_screen(_whole_word_prompt(risk), 0, undecided)
    for key in ("a", "s", "e", "appr"):
        relay.type(key + "\n")
        mark = relay.wait_screen(_whole_word_hint(risk) + _whole_word_prompt(risk), mark, undecided)
    relay.type(word + "\n")
    if word == "Edit":
        relay.wait_screen("Type the new text (one line): ", mark, undecided)
        relay.type("Pay 1,200.00 EUR to ACME\n")
    approval = gate.api().wait_resolved(approval_id)
    expected = (
        ("approved", "approve", "Pay 12,000.00 EUR to ACME\n")
        if word == "approve"
        else ("adjusted", "adjust", "Pay 1,200.00 EUR to ACME\n")
    )
    assert (approval["outcome"], _decisions(approval), approval["final_body"]) == (
        expected[0],
        [("alice@example.com", expected[1], 1)],
        expected[2],
    )


@needs_listener
def test_shell_relay_asks_a_required_skip_reason_and_sends_it(asking) -> None:
    """Shell relay: on a ``skip_reason: required`` step a skip asks for its
    reason until a line that is not only whitespace is typed, and sends it as ``reason``."""
    relay, start_gate = asking
    steps = [
        {"name": "need", "quorum": 1, "approvers": [101, 102], "timeout": "1h"}
        | {"skip_reason": "required"}
    ]
    gate = start_gate(steps)
    approval_id = gate.api().create("need", "Rechnung 2026-114\n")["approval_id"]
    undecided = _undecided(gate, approval_id)
    mark = relay.wait_screen(ONE_KEY_PROMPT, 0, undecided)
    relay.type("s\n")
    mark = relay.wait_screen(REQUIRED_REASON_PROMPT, mark, undecided)
    relay.type("   \n")
    mark = relay.wait_screen(
        "This step needs a reason for a skip.\n" + REQUIRED_REASON_PROMPT, mark, undecided
    )
    relay.type("Betrag falsch: 1.200,00 €\n")
    approval = gate.api().wait_resolved(approval_id)
    assert (approval["outcome"], [(d["decision"], d["reason"]) for d in approval["decisions"]]) == (
        "skipped",
        [("skip", "Betrag falsch: 1.200,00 €")],
    )


@needs_listener
def test_shell_relay_drops_the_prompt_of_an_approval_resolved_elsewhere(asking) -> None:
    """Shell relay: with ``relay.notices: true`` the gate's notice drops the
    prompt on the terminal about that approval with a line saying how it ended; an approval
    queued behind it and resolved meanwhile is never shown; the terminal then asks the next
    one as usual."""
    relay, start_gate = asking
    gate = start_gate(relay_cfg={"notices": True})
    api = gate.api()
    cancelled = api.create("q1", "Die Pipeline zieht das zurück\n")["approval_id"]
    mark = relay.wait_screen(ONE_KEY_PROMPT, 0, _undecided(gate, cancelled))
    queued = api.create("q1", "Wartet in der Schlange\n")["approval_id"]
    gate.wait_for_line(rf"event=dispatched approval_id={queued} revision=1 .*status=202")
    assert api.call("POST", f"/v1/approvals/{queued}/cancel")[0] == 200
    gate.wait_for_line(rf"event=followup_sent approval_id={queued} kind=notice ")
    assert api.call("POST", f"/v1/approvals/{cancelled}/cancel")[0] == 200
    mark = relay.wait_screen(
        f"Approval {cancelled} resolved elsewhere: cancelled; not asking any more.\n", mark
    )

    answered = api.create("q1", "Alice beantwortet diese\n")["approval_id"]
    end = relay.wait_screen(ONE_KEY_PROMPT, mark, _undecided(gate, answered))
    assert "Alice beantwortet diese" in relay.screen[mark:end]
    relay.type("a\n")
    assert api.wait_resolved(answered)["outcome"] == "approved"
    assert "Wartet in der Schlange" not in relay.screen  # resolved before its turn: not shown
    assert relay.screen.count(ONE_KEY_PROMPT) == 2
