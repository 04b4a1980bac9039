"""The inbox's defences end to end in a real browser: a
hostile draft renders inert and complete in the REAL inbox; a forged POST without the CSRF
token, a POST from another origin (a page on 127.0.0.1 posting a form cross-site) and a GET
of every decision URL change nothing (the gate's database has no decision); the inbox
restarted with items pending keeps them; the pages at 390 px need no horizontal scroll.

Real processes (gate, inbox, pipeline) and Debian's headless Chromium; see tests/inbox_e2e.py.
"""

from __future__ import annotations

import html
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.inbox_e2e import (
    Browser,
    Stack,
    browser_fixtures,
    decide,
    enrol,
    enrolled,
    no_horizontal_scroll,
    open_item,
    pending,
    screenshot,
    sign_in,
    signin_ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
END = "-- the very end of the draft --"
HOSTILE = (
    "<script>window.__pwned = 'script'</script>\n"
    '<img src="x" onerror="window.__pwned = \'onerror\'">\n'
    "total: \u202e00.01\u202c EUR\n"
    + "".join(f"line {n:05d}: <b>bold?</b> &amp; nothing else\n" for n in range(5600))
    + END
)
SHOWN = HOSTILE.replace("\u202e", "U+202E").replace("\u202c", "U+202C")


stack, browser, shots = browser_fixtures()


class Elsewhere:
    """A page on another origin (``http://127.0.0.1:<port>``, another site than
    ``localhost``) whose one form posts to ``action`` with ``fields``: no script at all."""

    def __init__(self, action: str, fields: dict[str, str]) -> None:
        inputs = "".join(
            f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
            for k, v in fields.items()
        )
        body = (
            f'<!doctype html><title>win a prize</title><form method="post" '
            f'action="{html.escape(action)}">{inputs}<button id="go">Claim</button></form>'
        ).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def no_decision(stack: Stack, approval_id: str) -> None:
    """The gate recorded nothing and the item still waits."""
    assert stack.gate_rows("SELECT 1 FROM decisions WHERE approval_id = ?", approval_id) == []
    [(state,)] = stack.gate_rows("SELECT state FROM approvals WHERE approval_id = ?", approval_id)
    assert state == "pending"


def refused(answer: Any, status: int, reason: str) -> None:
    assert answer.status == status, (answer.status, answer.text()[:300])
    assert answer.json()["reason"] == reason, answer.text()[:300]


def test_inbox_e2e_hostile_draft_renders_inert_and_complete(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    assert len(HOSTILE.encode()) > 200 * 1024
    pipeline, approval_id = pending(stack, "one", HOSTILE)
    open_item(alice, stack, approval_id)
    page = alice.page
    page.wait_for_load_state("load")
    assert page.text_content(".draft pre") == SHOWN
    assert page.locator(".draft pre").evaluate("(el, end) => el.textContent.endsWith(end)", END)
    assert page.locator(".draft mark.cc").count() == 2
    assert page.locator(".draft img, .draft script, .draft b").count() == 0
    alice.assert_clean("hostile draft")
    screenshot(page, shots, "item-hostile", full_page=False)
    decide(alice, "approve")
    code, out, err = pipeline.finish()
    assert (code, out.decode()) == (0, HOSTILE), err  # approved exactly as sent
    alice.assert_clean("after approving the hostile draft")


def test_inbox_e2e_forged_posts_and_gets_change_nothing(stack: Stack, browser: Browser) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    pipeline, approval_id = pending(stack, "one", "Transfer 5,000 EUR")
    open_item(alice, stack, approval_id)
    page = alice.page
    csrf = str(page.get_attribute("form.verb-approve input[name=csrf]", "value"))
    base = f"{stack.inbox.origin}/items/{approval_id}"
    fields = {"decision": "approve", "revision": "1"}

    # same origin, the session's cookie, no CSRF token (a form, then JSON with the body's
    # token but not the header): refused 403, nothing sent to the gate
    same = {"Origin": stack.inbox.origin}
    for path in ("/challenge", "/decide"):
        refused(page.request.post(base + path, form=fields, headers=same), 403, "csrf_mismatch")
        json_body = {**fields, "csrf": csrf}
        answer = page.request.post(base + path, data=json_body, headers=same)
        refused(answer, 403, "csrf_mismatch")

    # the right token from another origin: refused 403 origin_not_allowed
    other = {"Origin": "http://127.0.0.1:9"}
    answer = page.request.post(base + "/decide", form={**fields, "csrf": csrf}, headers=other)
    refused(answer, 403, "origin_not_allowed")

    # a page on another site posts a form to the inbox: SameSite=Strict withholds the cookie
    # and the Origin is not the inbox's; whatever the inbox answers, nothing changes
    evil = Elsewhere(base + "/decide", {**fields, "csrf": csrf})
    try:
        tab = page.context.new_page()
        tab.goto(evil.url)
        with tab.expect_navigation() as went:
            tab.click("#go")
        answer = went.value
        assert answer is not None and answer.status in (401, 403), answer.status
        tab.close()
    finally:
        evil.close()

    # a GET of every decision URL (mail scanners open links): nothing happens
    for path in (
        f"/items/{approval_id}/challenge",
        f"/items/{approval_id}/decide",
        f"/items/{approval_id}/answer",
        "/bulk/challenge",
        "/bulk/decide",
        "/signout",
        "/signin?next=/items/" + approval_id,
        f"/items/{approval_id}",
    ):
        got = page.goto(stack.inbox.origin + path)
        assert got is not None and got.status in (200, 404, 405), (path, got.status)
    no_decision(stack, approval_id)
    assert stack.inbox.rows("SELECT * FROM decisions") == []

    # still signed in (GET /signout did nothing) and the real button still works: the
    # refusals above were the defences, not a broken harness
    open_item(alice, stack, approval_id)
    decide(alice, "approve")
    code, _, err = pipeline.finish()
    assert code == 0, err
    assert len(stack.gate_rows("SELECT 1 FROM decisions WHERE approval_id = ?", approval_id)) == 1


def test_inbox_e2e_restarted_inbox_keeps_pending_items_and_sessions(
    stack: Stack, browser: Browser
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    first, first_id = pending(stack, "one", "first draft")
    second, second_id = pending(stack, "one", "second draft")
    alice.page.goto(stack.inbox.origin + "/")
    for approval_id in (first_id, second_id):
        alice.page.wait_for_selector(f'li[data-approval-id="{approval_id}"]')

    assert stack.inbox.stop() == 0, stack.inbox.log()
    stack.inbox.start()

    alice.page.goto(stack.inbox.origin + "/")  # the session survived the restart too
    for approval_id in (first_id, second_id):
        alice.page.wait_for_selector(f'li[data-approval-id="{approval_id}"]')
    open_item(alice, stack, second_id)
    decide(alice, "approve")
    code, out, err = second.finish()
    assert (code, out) == (0, b"second draft"), err
    no_decision(stack, first_id)
    first.stop()


def test_inbox_e2e_pages_at_390px_need_no_horizontal_scroll(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    phone = browser.approver("alice", width=390)
    page = phone.page
    page.goto(stack.inbox.origin + "/signin")
    assert no_horizontal_scroll(page), "sign-in"
    screenshot(page, shots, "signin")
    enrol(phone, stack.invite(101, "alice phone"))
    sign_in(phone, stack.inbox)
    token = "https://example.com/" + "x" * 300  # one unbroken 320-character word
    _, approval_id = pending(stack, "one", f"See {token} and approve.\n" + "a long line " * 60)
    page.goto(stack.inbox.origin + "/")
    page.wait_for_selector(f'li[data-approval-id="{approval_id}"]')
    assert no_horizontal_scroll(page), "waiting"
    open_item(phone, stack, approval_id)
    assert no_horizontal_scroll(page), "item"
    screenshot(page, shots, "item-long-lines")
    page.goto(stack.inbox.origin + "/recent")
    assert no_horizontal_scroll(page), "recent"
    phone.assert_clean("390 px")
