"""Signing in at the inbox in a real browser, as an approver sees it: a passkey that was not
used (cancelled, user verification failed, no passkey on this device) is said in words with
what to do, never the browser's own error text, and the button works again without a
reload; a passkey revoked at the gate ends an open tab's session with the reason, at once
and on every later page.

Real processes (gate, inbox) and Debian's headless Chromium with CDP virtual authenticators;
see tests/inbox_e2e.py.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

from tests.inbox_e2e import (
    AUTHENTICATOR,
    LIVE_S,
    Approver,
    Browser,
    Stack,
    announced,
    browser_fixtures,
    enrolled,
    in_view,
    no_horizontal_scroll,
    screenshot,
    signin_ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
NOT_USED = "No passkey was used"
RAW = ("NotAllowedError", "https://", "w3.org", "See:", "timed out or was not allowed")

stack, browser, shots = browser_fixtures()


def press_sign_in(who: Approver) -> Any:
    """Press the sign-in page's button; the notice it answers in."""
    who.page.click("form[data-sign=signin] button[type=submit]")
    return who.page.locator("#sign-status")


def lands_signed_in(who: Approver) -> None:
    """Press the sign-in button; the page goes on, signed in as alice."""
    press_sign_in(who)
    who.page.wait_for_url(lambda url: "/signin" not in url)
    assert "alice@example.com" in who.page.inner_text("header")


def said_in_words(who: Approver, notice: Any) -> str:
    """Wait for the notice to say the passkey was not used; check a person sees it (in the
    window, focused) in words only, and the button can be pressed again."""
    notice.filter(has_text=NOT_USED).wait_for()
    text = str(notice.inner_text())
    assert not [raw for raw in RAW if raw in text], text
    assert "Use the device you enrolled on, or ask for a new invite." in text, text
    assert in_view(who, notice) and announced(who, notice), text
    assert who.page.locator("form[data-sign=signin] button[type=submit]").is_enabled()
    return text


def test_inbox_e2e_signin_a_passkey_not_used_is_said_in_words_and_can_be_tried_again(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    page = alice.page
    credential = alice.credential()
    page.context.clear_cookies()
    page.goto(stack.inbox.origin + "/")
    page.wait_for_url("**/signin**")

    # user verification fails (the fingerprint was not accepted)
    alice.cdp.send(
        "WebAuthn.setUserVerified",
        {"authenticatorId": alice.authenticator_id, "isUserVerified": False},
    )
    said_in_words(alice, press_sign_in(alice))
    screenshot(page, shots, "signin-not-verified", full_page=False)

    # this device holds no passkey for the inbox (another authenticator, empty)
    alice.cdp.send(
        "WebAuthn.removeVirtualAuthenticator", {"authenticatorId": alice.authenticator_id}
    )
    empty = alice.cdp.send("WebAuthn.addVirtualAuthenticator", {"options": AUTHENTICATOR})
    said_in_words(alice, press_sign_in(alice))
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        assert in_view(alice, page.locator("#sign-status")), width
    screenshot(page, shots, "signin-no-passkey", full_page=False)

    # the passkey comes back: the same page signs in, no reload
    alice.cdp.send(
        "WebAuthn.addCredential",
        {"authenticatorId": empty["authenticatorId"], "credential": credential},
    )
    lands_signed_in(alice)
    alice.assert_clean("sign-in after a passkey that was not used")


def test_inbox_e2e_signin_a_revoked_passkey_ends_the_open_tab_with_its_reason(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    page = alice.page
    assert "Waiting for you" in page.inner_text("h1")
    credential_id = base64.urlsafe_b64encode(base64.b64decode(alice.credential()["credentialId"]))
    stack.world.revoke(credential_id.decode().rstrip("="))

    live = page.locator("#live")
    live.filter(has_text="Your passkey is no longer enrolled at the gate").wait_for(timeout=LIVE_S)
    assert in_view(alice, live) and announced(alice, live)
    screenshot(page, shots, "signin-revoked-open-tab", full_page=False)

    page.reload()
    page.wait_for_url("**/signin**why=revoked")
    assert "Your passkey is no longer enrolled at the gate" in page.inner_text("main")
    screenshot(page, shots, "signin-revoked-page", full_page=False)
    alice.assert_clean("a revoked passkey's session")


def test_inbox_e2e_signin_the_invite_says_its_expiry_in_utc_and_leads_to_the_inbox(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    """The gate's invite page, the step before the first sign-in: its expiry in UTC (the
    zone said, as the CLI prints it), and once the passkey is made, a link to the inbox (the
    relying party's origin other than the gate's own) that signs in."""
    signin_ready(stack)
    alice = browser.approver("alice", 390)
    page = alice.page
    page.goto(stack.invite(101, "alice chromium"))
    expires = page.locator("#expires")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", expires.inner_text()), (
        expires.inner_text()
    )
    page.click("#create")
    page.wait_for_selector("#status.ok", timeout=30_000)
    link = page.get_by_role("link", name=stack.inbox.origin)
    assert link.is_visible() and in_view(alice, link)
    assert no_horizontal_scroll(page)  # the credential id, one long word, wraps
    screenshot(page, shots, "enrolled-sign-in-at", full_page=False)

    link.click()
    page.wait_for_url("**/signin**")
    lands_signed_in(alice)
    alice.assert_clean("invite to first sign-in")
