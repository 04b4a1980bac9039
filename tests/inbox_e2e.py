"""Support for the inbox's real-browser end-to-end tests:
the real gate and the real ``hitl-gate inbox serve`` on loopback sharing one relying party
(``localhost``), Debian's headless Chromium driven by Playwright with one virtual
authenticator PER approver (a browser context each), enrolment at the gate's invite page,
sign-in at the inbox, a pipeline blocking on ``hitl-gate request --wait`` and screenshots
at 1280 and 390 px under ``$HITL_ARTIFACTS/inbox-e2e/``; ``accessible`` runs axe-core (installed
by ``npm ci --prefix tests/a11y``) in a page at both widths.

Nothing is mocked: every party is a real process or a real browser; waits are conditions
with deadlines (``page.wait_for_selector``/``wait_until``), never fixed sleeps.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.inbox_harness import ENV, InboxProcess, InboxWorld
from tests.support import CliProcess, GateProcess, free_port, http_request, run_cli
from tests.test_passkeys_browser import ARGS, CHROMIUM, _playwright

REQUESTED = r"requested approval (\S+)"
WIDTHS = (1280, 390)
STEP_S = 10_000  # ms: one browser step (a click, a navigation, a selector) on a busy CI
AXE = Path(__file__).parent / "a11y" / "node_modules" / "axe-core" / "axe.min.js"
AXE_RUN = """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
  .filter((v) => v.impact === 'serious' || v.impact === 'critical')
  .map((v) => v.impact + ' ' + v.id + ': ' + v.help + ' at '
    + v.nodes.map((n) => n.target.join(' ')).join(', '))"""
LIVE_S = 20_000  # ms: a change the page learns by polling /live (inbox.js polls every 5 s)
AUTHENTICATOR = {
    "protocol": "ctap2",
    "transport": "internal",
    "hasResidentKey": True,
    "hasUserVerification": True,
    "isUserVerified": True,
}
# operators of tests.support.write_config: 101 alice, 102 bob, 103 carol
SIGNED = {"approver_signature": "required"}  # the gate verifies every passkey assertion
STEPS: list[dict[str, Any]] = [
    {"name": "one", "quorum": 1, "approvers": [101, 102], "timeout": "1h", **SIGNED},
    {"name": "why", "quorum": 1, "approvers": [101, 102], "timeout": "1h", **SIGNED}
    | {"skip_reason": "required"},
    {"name": "two", "quorum": 2, "approvers": [101, 102], "timeout": "1h", **SIGNED},
    {"name": "brief", "quorum": 1, "approvers": [101, 102], "timeout": "8s", **SIGNED},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
    # reminded every second; decisions signed by the relay secret alone (a test's adjust)
    {"name": "nag", "quorum": 2, "approvers": [101, 102], "timeout": "1h", "remind_every": "1s"},
    # reminded every second and escalated to carol after 1 s
    {
        "name": "esc",
        "quorum": 1,
        "approvers": [101, 102],
        "timeout": "1h",
        "remind_every": "1s",
        "escalate": [{"after": "1s", "to": [103]}],
        **SIGNED,
    },
]


class Stack:
    """The real gate and the real inbox of ``tests.inbox_harness.InboxWorld`` (credentials
    channel, notices, questions on; one relying party ``localhost`` whose origins are the
    gate's relay listener AND the inbox) with this module's steps, plus the pipeline's
    commands. No passkey is enrolled up front: approvers enrol in the browser."""

    def __init__(self, folder: Path) -> None:
        self.world = InboxWorld(folder, free_port(), free_port(), steps=list(STEPS))
        self.pipelines: list[CliProcess] = []  # stopped with the stack, even after a failure

    @property
    def gate(self) -> GateProcess:
        """The running gate."""
        assert self.world.gate is not None
        return self.world.gate

    @property
    def inbox(self) -> InboxProcess:
        """The running inbox (``.origin`` is where approvers open it)."""
        assert self.world.inbox is not None
        return self.world.inbox

    def start(self) -> Stack:
        """The gate first (the inbox fetches the credentials from it), then the inbox."""
        try:
            self.world.start_gate()
            self.world.start_inbox()
        except BaseException:
            self.world.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the pipelines still waiting, then both (the inbox first)."""
        for pipeline in self.pipelines:
            pipeline.stop()
        self.world.stop()

    def invite(self, operator_id: int, label: str) -> str:
        """``hitl-gate approvers invite OPERATOR``: the one-time enrolment URL, as opened at
        ``localhost`` (the relying party; the world's gate says 127.0.0.1 in public_url)."""
        proc = run_cli(
            "approvers",
            "invite",
            "-c",
            str(self.gate.config),
            "--api-url",
            self.gate.api_url,
            str(operator_id),
            "--label",
            label,
            env=ENV,
        )
        assert proc.returncode == 0, proc.stderr
        url = str(proc.stdout.decode().strip())
        return url.replace("http://127.0.0.1:", "http://localhost:", 1)

    def ask(self, *args: str) -> CliProcess:
        """A pipeline blocking on ``hitl-gate ask --wait`` (step ``ask``) with ``args``."""
        return self._pipeline(
            "ask",
            "-c",
            str(self.gate.config),
            "--api-url",
            self.gate.api_url,
            "--pipeline",
            "p",
            "--step",
            "ask",
            "--wait",
            *args,
            env=ENV,
        )

    def cancel(self, approval_id: str) -> None:
        """``hitl-gate cancel APPROVAL_ID`` (exit 0)."""
        proc = run_cli(
            "cancel",
            "-c",
            str(self.gate.config),
            "--api-url",
            self.gate.api_url,
            approval_id,
            env=ENV,
        )
        assert proc.returncode == 0, proc.stderr

    def request(self, step: str, draft: str, *extra: str) -> CliProcess:
        """A pipeline blocking on ``hitl-gate request --wait`` (its draft on stdin)."""
        return self._pipeline(
            "request",
            "-c",
            str(self.gate.config),
            "--api-url",
            self.gate.api_url,
            "--pipeline",
            "p",
            "--step",
            step,
            "--draft-file",
            "-",
            "--wait",
            *extra,
            stdin=draft.encode("utf-8"),
            env=ENV,
        )

    def _pipeline(self, *args: str, stdin: bytes | None = None, env: dict[str, str]) -> CliProcess:
        """A background ``hitl-gate`` command that this stack stops when it stops."""
        pipeline = CliProcess(*args, stdin=stdin, env=env)
        self.pipelines.append(pipeline)
        return pipeline

    def gate_rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Read the gate's SQLite file (read-only)."""
        conn = sqlite3.connect(f"file:{self.gate.config.parent / 'gate.db'}?mode=ro", uri=True)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()


@dataclass
class Approver:
    """One approver's browser context, page and virtual authenticator (their own passkey)."""

    name: str
    page: Any
    cdp: Any
    authenticator_id: str
    console: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def watch(self) -> Approver:
        """Record console messages, dialogs (dismissed) and page errors."""
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("dialog", self._dialog)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        return self

    def credential(self) -> dict[str, Any]:
        """The one passkey the virtual authenticator holds (CDP ``WebAuthn.getCredentials``:
        ``credentialId`` in base64, ``privateKey``, …), as ``WebAuthn.addCredential`` takes it."""
        got = self.cdp.send("WebAuthn.getCredentials", {"authenticatorId": self.authenticator_id})
        [only] = got["credentials"]
        return dict(only)

    def sign_counts(self) -> list[int]:
        """The virtual authenticator's credentials' signature counters (CDP): each passkey
        use adds one."""
        got = self.cdp.send("WebAuthn.getCredentials", {"authenticatorId": self.authenticator_id})
        return [int(c["signCount"]) for c in got["credentials"]]

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def assert_clean(self, where: str) -> None:
        """No draft script ran (window probe), no dialog, no page error, no CSP violation."""
        assert self.page.evaluate("typeof window.__pwned") == "undefined", where
        assert self.dialogs == [], (where, self.dialogs)
        assert self.errors == [], (where, self.errors)
        refused = [m for m in self.console if "Content Security Policy" in m or "Refused" in m]
        assert refused == [], (where, refused)


class Browser:
    """One headless Chromium; ``approver()`` opens a fresh context with its own authenticator."""

    def __init__(self, chromium: Any) -> None:
        self.chromium = chromium

    def approver(self, name: str, width: int = 1280) -> Approver:
        """A new browser context (cookies of its own) with a CDP virtual authenticator
        (ctap2, internal, resident key, user verification) on its one page."""
        context = self.chromium.new_context(
            viewport={"width": width, "height": 900}, device_scale_factor=1
        )
        context.set_default_timeout(STEP_S)
        page = context.new_page()
        cdp = context.new_cdp_session(page)
        cdp.send("WebAuthn.enable")
        added = cdp.send("WebAuthn.addVirtualAuthenticator", {"options": AUTHENTICATOR})
        return Approver(name, page, cdp, added["authenticatorId"]).watch()


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium (skipped when absent; a failure under HITL_CI=1)."""
    sync_api = _playwright()
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield Browser(launched)
        finally:
            launched.close()


@contextlib.contextmanager
def running(folder: Path) -> Iterator[Stack]:
    """The real gate and inbox in ``folder``, started; stopped cleanly afterwards."""
    both = Stack(folder).start()
    try:
        yield both
    finally:
        both.stop()


def artifacts(tmp_path: Path) -> Path:
    """Where screenshots go: ``$HITL_ARTIFACTS/inbox-e2e/`` (default: the test's tmp dir)."""
    base = Path(os.environ.get("HITL_ARTIFACTS") or tmp_path / "artifacts")
    directory = base / "inbox-e2e"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def browser_fixtures() -> tuple[Any, Any, Any]:
    """The three fixtures of a browser module, per test: ``stack`` (``running`` in the test's
    tmp_path), ``browser`` (``chromium()``) and ``shots`` (``artifacts``). A module takes them
    as ``stack, browser, shots = browser_fixtures()``."""

    @pytest.fixture(name="stack")
    def stack(tmp_path: Path) -> Iterator[Stack]:
        with running(tmp_path) as both:
            yield both

    @pytest.fixture(name="browser")
    def browser() -> Iterator[Browser]:
        with chromium() as launched:
            yield launched

    @pytest.fixture(name="shots")
    def shots(tmp_path: Path) -> Path:
        return artifacts(tmp_path)

    return stack, browser, shots


def screenshot(page: Any, shots: Path, name: str, full_page: bool = True) -> list[Path]:
    """Write ``<name>-1280.png`` and ``<name>-390.png`` of the page as it is now (the
    viewport resized, then put back); returns the paths."""
    before = page.viewport_size
    written = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        path = shots / f"{name}-{width}.png"
        page.screenshot(path=str(path), full_page=full_page)
        written.append(path)
    page.set_viewport_size(before)
    return written


def accessible(page: Any, shots: Path, name: str) -> list[str]:
    """axe-core's ``serious`` and ``critical`` violations of the page as it is now, at 1280
    and 390 px (``"<name> 390px: serious color-contrast: ... at <selector>"``), after
    ``screenshot(page, shots, name)``. axe-core missing: a skip (a failure under HITL_CI=1)."""
    if not AXE.is_file():
        missing = f"{AXE} is missing (npm ci --prefix tests/a11y)"
        if os.environ.get("HITL_CI"):
            pytest.fail(f"HITL_CI=1: {missing}")
        pytest.skip(missing)
    screenshot(page, shots, name)
    before, found = page.viewport_size, []
    if not page.evaluate("typeof window.axe === 'object'"):
        page.evaluate(AXE.read_text(encoding="utf-8"))  # over CDP: the page's CSP stays on
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        found += [f"{name} {width}px: {v}" for v in page.evaluate(AXE_RUN)]
    page.set_viewport_size(before)
    return found


def no_horizontal_scroll(page: Any) -> bool:
    """True when the document is no wider than the viewport."""
    wide, shown = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    return bool(wide <= shown)


def enrol(who: Approver, url: str) -> None:
    """Create a passkey at the gate's invite page (its ``#create`` button)."""
    who.page.goto(url)
    who.page.click("#create")
    who.page.wait_for_selector("#status.ok", timeout=30_000)
    assert "Passkey enrolled" in who.page.inner_text("main")


def sign_in(who: Approver, inbox: InboxProcess, path: str = "/") -> None:
    """Open ``path`` at the inbox, get sent to the sign-in page, press its button (the
    virtual authenticator answers) and land back on ``path``."""
    page = who.page
    page.goto(inbox.origin + path)
    page.wait_for_url("**/signin**")
    page.click("form[data-sign=signin] button[type=submit]")
    page.wait_for_url(lambda url: "/signin" not in url, timeout=30_000)


def enrolled(
    stack: Stack, browser: Browser, name: str, operator_id: int, width: int = 1280
) -> Approver:
    """A new approver context: enrolled at the gate for ``operator_id``, signed in at the inbox."""
    who = browser.approver(name, width)
    enrol(who, stack.invite(operator_id, f"{name} chromium"))
    sign_in(who, stack.inbox)
    return who


def needs(feature: str, present: bool) -> None:
    """Skip with the missing feature named (parts of the inbox built in parallel)."""
    if not present:
        pytest.skip(f"needs {feature}")


def signin_ready(stack: Stack) -> None:
    """Skip unless the inbox answers its sign-in page."""
    status, _, _ = http_request(stack.inbox.origin + "/signin")
    needs("the inbox's sign-in page (GET /signin)", status == 200)


def has_post_route(stack: Stack, path: str) -> bool:
    """True when the inbox routes a POST of ``path`` (signed out: refused 401/403, not the
    404/405 of a route that does not exist)."""
    status, _, _ = http_request(stack.inbox.base + path, "POST", b"{}")
    return status not in (404, 405)


def open_item(who: Approver, stack: Stack, approval_id: str) -> None:
    """From the waiting page, follow the item's link (as a person would)."""
    page = who.page
    page.goto(stack.inbox.origin + "/")
    page.click(f'li[data-approval-id="{approval_id}"] a')
    page.wait_for_selector(f'article[data-approval-id="{approval_id}"]')


def decide(who: Approver, verb: str) -> str:
    """Press the item page's ``verb`` button (its form signed with the passkey); wait for
    the decision's page and return its text."""
    page = who.page
    page.click(f"form.verb-{verb} button[type=submit]")
    page.wait_for_url(re.compile(r"/decisions/\d+$"), timeout=30_000)
    return str(page.inner_text("main"))


def pending(stack: Stack, step: str, draft: str, *extra: str) -> tuple[CliProcess, str]:
    """A pipeline waiting on ``step`` (``extra`` arguments to ``hitl-gate request``) and its
    approval id, once the inbox keeps the item."""
    pipeline = stack.request(step, draft, *extra)
    approval_id = pipeline.wait_for_line(REQUESTED).group(1)
    stack.inbox.wait_item(approval_id)
    return pipeline, approval_id


def in_view(who: Approver, locator: Any) -> bool:
    """True when ``locator``'s box lies inside the viewport as the page is scrolled now:
    what a person looking at the screen sees, not somewhere below."""
    box = locator.bounding_box()
    size = who.page.viewport_size
    if box is None or size is None or box["width"] == 0 or box["height"] == 0:
        return False
    return bool(
        box["x"] >= 0
        and box["y"] >= 0
        and box["x"] + box["width"] <= size["width"]
        and box["y"] + box["height"] <= size["height"]
    )


def announced(who: Approver, locator: Any) -> bool:
    """True when ``locator`` has the focus or sits in a live region (role status or alert,
    or aria-live): a screen reader says it."""
    return bool(
        locator.evaluate(
            """(el) => el === document.activeElement || el.contains(document.activeElement)
              || !!el.closest('[role=status], [role=alert], [aria-live]')"""
        )
    )


# what HAProxy answers when the replica behind it died mid-request: HTML, not the inbox's JSON
HAPROXY_502 = (
    "<html><body><h1>502 Bad Gateway</h1>\n"
    "The server returned an invalid or incomplete response.\n</body></html>\n"
)


def answer_lost(who: Approver, path_glob: str) -> None:
    """The balancer in front of the inbox answers POSTs to ``path_glob`` with its own 502
    page (the replica died after it may have recorded them): the inbox itself stays real."""
    who.page.route(
        path_glob,
        lambda route: route.fulfill(status=502, content_type="text/html", body=HAPROXY_502),
    )


def said_lost(who: Approver, url: str) -> Any:
    """After an answer was lost: the page is still ``url``, says the decision may or may
    not be recorded where the approver looks, and links *Recent decisions*; returns the
    sentence's locator."""
    said = who.page.get_by_text("may or may not be recorded")
    said.wait_for(timeout=30_000)
    assert who.page.url == url, who.page.url
    assert in_view(who, said) and announced(who, said), said.inner_text()
    link = said.get_by_role("link", name="Recent decisions")
    assert link.get_attribute("href") == "/recent"
    text = said.inner_text()
    assert "502" in text and "Not sent" not in text, text
    return said
