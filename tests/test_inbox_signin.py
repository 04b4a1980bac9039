"""Sign-in and sessions at the inbox: a real gate, the real ``hitl-gate inbox
serve``, passkeys enrolled through the gate's real invite page by a software authenticator,
real assertions over HTTP, the inbox's SQLite file read as it is on disk."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inbox_harness import InboxWorld, start_world
from tests.support import free_port, logged
from tests.webauthn_soft import SoftAuthenticator

pytestmark = pytest.mark.e2e


@pytest.fixture
def world(tmp_path: Path) -> Iterator[InboxWorld]:
    started = start_world(tmp_path)
    yield started
    started.stop()


def sessions(world: InboxWorld) -> list[dict[str, object]]:
    assert world.inbox is not None
    return [dict(r) for r in world.inbox.rows("SELECT * FROM sessions")]


def test_signin_sets_a_strict_cookie_and_keeps_only_its_hash(world: InboxWorld) -> None:
    client = world.client()
    page = client.get("/signin?next=/recent")
    assert page.status == 200 and "Sign in with your passkey" in page.text
    pre = [c for c in page.headers["set-cookie"] if c.startswith("hitl_inbox_pre=")]
    assert pre and "HttpOnly" in pre[0] and "SameSite=Strict" in pre[0], pre
    assert "Max-Age=300" in pre[0], pre  # as long as its challenge

    answer = client.signin(world.passkeys[101], next_path="/recent")

    assert (answer.status, answer.json()) == (200, {"location": "/recent"}), answer.text
    cookie = next(c for c in answer.headers["set-cookie"] if c.startswith("hitl_inbox="))
    flags = [part.strip() for part in cookie.split(";")]
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(flags), cookie
    assert not any(f.lower() == "secure" for f in flags), cookie  # http on localhost
    token = client.cookies["hitl_inbox"]
    assert len(token) == 43  # 32 random bytes, base64url
    rows = sessions(world)
    assert len(rows) == 1
    assert rows[0]["id_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert rows[0]["identity"] == "alice@example.com"
    assert rows[0]["credential_id"] == world.passkeys[101].credential_id
    assert token not in repr(rows)
    home = client.get("/")
    assert home.status == 200 and "alice@example.com" in home.text
    assert world.inbox is not None
    log = world.inbox.log()
    assert "event=inbox_signin identity=alice@example.com" in log
    assert token not in log and rows[0]["csrf"] not in log  # type: ignore[operator]


def test_refused_signins_say_why_and_store_nothing(world: InboxWorld) -> None:
    client = world.client()
    cases = {
        "unknown_credential": lambda: client.signin(SoftAuthenticator()),
        "origin_mismatch": lambda: client.signin(world.passkeys[101], origin="http://evil.example"),
        "rp_mismatch": lambda: client.signin(world.passkeys[101], rp_id="example.com"),
    }
    for reason, attempt in cases.items():
        answer = attempt()
        assert answer.status == 401, (reason, answer.text)
        assert answer.json()["reason"] == reason, answer.text
        assert answer.json()["message"], answer.text
        assert "hitl_inbox" not in client.cookies
    # a challenge is single use: the same page's challenge again, even with its cookie
    page = client.get("/signin")
    challenge = re.search(r'data-challenge="([^"]+)"', page.text)
    assert challenge
    csrf = client.cookies["hitl_inbox_pre"]
    signed = world.passkeys[102].assert_(challenge.group(1), "localhost", client.origin)
    assert client.post_json("/signin", {"csrf": csrf, "assertion": signed}).status == 200
    client.cookies = {"hitl_inbox_pre": csrf}
    again = world.passkeys[102].assert_(challenge.group(1), "localhost", client.origin)
    reused = client.post_json("/signin", {"csrf": csrf, "assertion": again})
    assert (reused.status, reused.json()["reason"]) == (401, "challenge_unknown"), reused.text
    assert [r["identity"] for r in sessions(world)] == ["bob@example.com"]
    assert world.inbox is not None
    assert logged(world.inbox, "event=inbox_signin_refused", 4) == 4


def test_the_eleventh_signin_attempt_is_rate_limited(world: InboxWorld) -> None:
    client = world.client()
    for _ in range(10):
        assert client.signin(SoftAuthenticator()).status == 401
    answer = client.signin(world.passkeys[101])
    assert (answer.status, answer.json()["reason"]) == (429, "rate_limited"), answer.text
    retry = answer.header("Retry-After")
    assert retry is not None and 0 < int(retry) <= 300, retry
    assert sessions(world) == []


def test_a_revoked_passkey_ends_its_session_at_the_next_request(world: InboxWorld) -> None:
    alice = world.client()
    assert alice.signin(world.passkeys[101]).status == 200
    assert alice.get("/").status == 200
    world.revoke(world.passkeys[101].credential_id)

    home = alice.get("/")

    where = "/signin?next=/&why=revoked"  # the page says why
    assert (home.status, home.header("Location")) == (303, where), home.text
    assert [r["ended"] for r in sessions(world)] == ["revoked"]  # kept to say why, never valid
    page = alice.get(where)
    assert page.status == 200
    assert "Your passkey is no longer enrolled at the gate" in page.text
    assert alice.signin(world.passkeys[101]).json()["reason"] == "unknown_credential"
    assert world.inbox is not None
    logged(world.inbox, "event=inbox_session_ended why=credential_revoked")


def test_a_revoked_session_says_why_to_live_and_to_every_later_page(world: InboxWorld) -> None:
    """An open tab's /live poll is the first request after the revocation: it answers the
    reason, and the next page loads still say it (the reason is not used up)."""
    alice = world.client()
    assert alice.signin(world.passkeys[101]).status == 200
    world.revoke(world.passkeys[101].credential_id)

    polled = alice.get("/live?since=0")

    assert polled.status == 401, polled.text
    assert polled.json()["reason"] == "passkey_revoked", polled.text
    assert "Your passkey is no longer enrolled at the gate" in polled.json()["message"]
    assert alice.get("/live?since=0").json()["reason"] == "passkey_revoked"
    for _ in range(2):
        home = alice.get("/recent")
        assert home.header("Location") == "/signin?next=/recent&why=revoked", home.text
    assert alice.signin(world.passkeys[102]).status == 200  # another passkey: a new session
    assert alice.get("/recent").status == 200


def test_signed_out_pages_redirect_and_posts_answer_401(world: InboxWorld) -> None:
    client = world.client()
    for path in ("/", "/recent", "/items/01ABC", "/decisions/1"):
        answer = client.get(path)
        assert answer.status == 303, (path, answer.status)
        assert answer.header("Location") == f"/signin?next={path}"
    live = client.get("/live?since=0")
    assert (live.status, live.json()["reason"]) == (401, "signed_out")
    for path in ("/items/01ABC/challenge", "/items/01ABC/decide"):
        answer = client.post_json(path, {"csrf": "x", "decision": "approve", "revision": "1"})
        assert (answer.status, answer.json()["reason"]) == (401, "signed_out"), path
    # a link opened from a mail (cross-site: the Strict cookie is withheld) reloads once
    hop = client.get("/items/01ABC", headers={"Sec-Fetch-Site": "cross-site"})
    assert hop.status == 200
    assert '<meta http-equiv="refresh" content="0;url=/items/01ABC?r=1">' in hop.text
    assert "<script" not in hop.text
    again = client.get("/items/01ABC?r=1", headers={"Sec-Fetch-Site": "cross-site"})
    assert again.status == 303 and again.header("Location") == "/signin?next=/items/01ABC"
    # opened at 127.0.0.1, the page says where passkeys sign in
    assert world.inbox is not None
    origin = world.inbox.origin  # http://localhost:<port>
    at_ip = client.get("/signin")
    assert at_ip.status == 200
    assert f"open {origin}/signin" in at_ip.text, at_ip.text
    at_name = client.get("/signin", headers={"Host": origin.removeprefix("http://")})
    assert at_name.status == 200 and "passkeys sign in only at" not in at_name.text


def test_signout_ends_the_session(world: InboxWorld) -> None:
    client = world.client()
    assert client.signin(world.passkeys[101]).status == 200
    token = client.cookies["hitl_inbox"]
    page = client.get("/")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf

    answer = client.post_form("/signout", {"csrf": csrf.group(1)})

    assert (answer.status, answer.header("Location")) == (303, "/signin")
    assert "hitl_inbox" not in client.cookies
    assert sessions(world) == []
    client.cookies["hitl_inbox"] = token  # the old cookie is worth nothing now
    assert client.get("/").status == 303


def test_rp_mismatch_is_said_on_the_signin_page(tmp_path: Path) -> None:
    gate_port = free_port()
    world = InboxWorld(tmp_path, gate_port, free_port(), origins=[f"http://localhost:{gate_port}"])
    try:
        world.start_gate()
        world.enrol(101)
        world.start_inbox()
        client = world.client()
        page = client.get("/signin")
        assert "do not list the inbox&#39;s origin" in page.text, page.text
        assert client.signin(world.passkeys[101]).json()["reason"] == "rp_mismatch"
        assert world.inbox is not None
        logged(world.inbox, "event=inbox_rp_mismatch")
        assert sessions(world) == []
    finally:
        world.stop()


def test_a_passkey_enrolled_just_after_another_signin_signs_in_at_once(tmp_path: Path) -> None:
    # A's unknown id made the inbox ask the gate; B enrolled a moment later
    # must not wait 5 s (only B's own id looked up within 5 s is answered from the cache)
    world = start_world(tmp_path, enrol=())
    try:
        world.enrol(101)
        assert world.client().signin(world.passkeys[101]).status == 200
        world.enrol(102)

        answer = world.client().signin(world.passkeys[102])

        assert answer.status == 200, answer.text
        assert [r["identity"] for r in sessions(world)] == [
            "alice@example.com",
            "bob@example.com",
        ]
    finally:
        world.stop()


def test_an_unknown_passkey_is_said_in_words_for_a_new_enrolment(world: InboxWorld) -> None:
    answer = world.client().signin(SoftAuthenticator())
    assert answer.json()["message"] == (
        "The gate does not know this passkey: it was never enrolled, or it was revoked."
        " If you enrolled it just now, try again."
    ), answer.text
