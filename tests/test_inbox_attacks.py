"""An outside attacker against the inbox (review rev17a): a forged re-send that
would show the approver another draft than the one signed, bodies larger than one read, a
sign-in ``next`` that leaves the inbox. Real gate, real inbox, real signed envelopes on
loopback; the SQLite files are read as they are on disk."""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.inbox.db import InboxDb
from gate.inbox.items import item_from
from gate.inbox.shortlived import CHALLENGE_TTL_MS, ShortLived
from gate.inbox.signin import safe_next
from gate.protocol.canonical import payload_hash
from tests.inbox_harness import ENV, InboxClient, InboxWorld, field_value, start_world
from tests.support import CliProcess, http_request, logged, sign_headers

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InboxWorld]:
    started = start_world(tmp_path_factory.mktemp("attacks"), enrol=(101,))
    yield started
    started.stop()


def signed_in(world: InboxWorld) -> InboxClient:
    client = world.client()
    answer = client.signin(world.passkeys[101])
    assert answer.status == 200, answer.text
    return client


def relay_url(world: InboxWorld) -> str:
    return f"http://127.0.0.1:{world.inbox_port}/hitl/v0/relay"


def kept(world: InboxWorld, body: str) -> tuple[str, dict[str, Any]]:
    """A new approval on q1 with ``body``, once the inbox keeps it: (id, stored dispatch)."""
    assert world.gate is not None and world.inbox is not None
    approval_id = world.gate.api().create("q1", body=body)["approval_id"]
    row = world.inbox.wait_item(approval_id, lambda r: True)
    return approval_id, json.loads(row["dispatch"])


def item(world: InboxWorld, approval_id: str) -> Any:
    assert world.inbox is not None
    found = world.inbox.rows("SELECT * FROM items WHERE approval_id = ?", approval_id)
    return found[0] if found else None


def post_signed(world: InboxWorld, envelope: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    raw = json.dumps(envelope).encode("utf-8")
    status, _, answer = http_request(relay_url(world), "POST", raw, sign_headers(raw))
    return status, json.loads(answer or b"{}")


def test_inbox_a_resend_with_another_draft_is_refused_and_the_signed_one_stays(
    world: InboxWorld,
) -> None:
    assert world.inbox is not None and world.gate is not None
    real = "Transfer 90000 EUR to account ATTACKER-666\n"
    approval_id, dispatch = kept(world, real)
    before = item(world, approval_id)
    forged = json.loads(json.dumps(dispatch))
    forged["draft"]["body"] = "Transfer 90 EUR to the usual supplier account\n"
    forged["payload_hash"] = payload_hash(forged["draft"]["body"])
    other_type = json.loads(json.dumps(dispatch))
    other_type["draft"]["content_type"] = "text/markdown"

    status, answer = post_signed(world, forged)
    typed, typed_answer = post_signed(world, other_type)

    assert (status, answer["reason"]) == (409, "dispatch_conflict")
    assert (typed, typed_answer["reason"]) == (409, "dispatch_conflict")
    after = item(world, approval_id)
    assert before is not None and after is not None and dict(after) == dict(before)
    logged(world.inbox, "event=dispatch_conflict")
    client = signed_in(world)
    page = client.get(f"/items/{approval_id}").text
    assert "ATTACKER-666" in page and "usual supplier" not in page
    decided = client.decide(approval_id, world.passkeys[101], "approve")
    assert decided.status == 200, decided.text
    approved = world.gate.api().wait_resolved(approval_id)
    assert approved["outcome"] == "approved"
    assert approved["payload_hash"] == payload_hash(real)


def test_inbox_a_resend_that_only_moves_the_expiry_is_kept(world: InboxWorld) -> None:
    assert world.inbox is not None
    approval_id, dispatch = kept(world, "A reminder keeps the same draft\n")
    resent = json.loads(json.dumps(dispatch))
    resent["reminder"] = 1
    resent["awaiting"] = ["101"]

    status, answer = post_signed(world, resent)

    assert (status, answer) == (200, {"status": "ok"})
    row = item(world, approval_id)
    assert row is not None and json.loads(row["dispatch"])["reminder"] == 1


def test_inbox_a_1_mb_dispatch_is_taken_whole_every_time(world: InboxWorld) -> None:
    assert world.inbox is not None
    _, dispatch = kept(world, "base\n")
    big = "x" * (1024 * 1024 - 1) + "\n"
    for n in range(5):
        envelope = json.loads(json.dumps(dispatch))
        envelope["approval_id"] = f"BIG-{n}"
        envelope["draft"]["body"] = big
        envelope["payload_hash"] = payload_hash(big)

        status, answer = post_signed(world, envelope)

        assert (status, answer) == (200, {"status": "ok"}), n
        row = item(world, f"BIG-{n}")
        assert row is not None and row["payload_hash"] == payload_hash(big)


def test_inbox_an_adjust_of_400_kb_gets_its_challenge(world: InboxWorld) -> None:
    approval_id, _ = kept(world, "Adjust me\n")
    client = signed_in(world)
    csrf, revision = client.item_form(approval_id)
    fields = {
        "csrf": csrf,
        "decision": "adjust",
        "revision": revision,
        "adjust_text": "y" * (400 * 1024),
    }

    got = client.post_json(f"/items/{urllib.parse.quote(approval_id)}/challenge", fields)

    assert got.status == 200, got.text
    assert got.json()["challenge"]


def test_reference_relay_takes_a_1_mb_dispatch_whole_every_time(world: InboxWorld) -> None:
    _, dispatch = kept(world, "base for the reference relay\n")
    relay = CliProcess(
        "relay", "--listen", "127.0.0.1:0", "--secret-env", "HITL_RELAY_SECRET",
        "--auto", "skip:not this one", "--as", "101", env=ENV,
    )  # fmt: skip
    try:
        url = relay.wait_for_line(r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)").group(1)
        big = "z" * (1024 * 1024 - 1) + "\n"
        for n in range(3):
            envelope = json.loads(json.dumps(dispatch))
            envelope["approval_id"] = f"REF-BIG-{n}"
            envelope["draft"]["body"] = big
            envelope["payload_hash"] = payload_hash(big)
            raw = json.dumps(envelope).encode("utf-8")

            status, _, answer = http_request(url, "POST", raw, sign_headers(raw))

            assert status == 202, (n, answer)
    finally:
        relay.stop()


def test_inbox_a_stored_draft_that_is_not_the_signed_one_is_withheld() -> None:
    signed = "Pay 12 EUR\n"
    dispatch = {
        "kind": "approval",
        "revision": 1,
        "payload_hash": payload_hash("Pay 12000 EUR\n"),
        "draft": {"body": signed, "content_type": "text/plain"},
        "callback": {"url": "http://127.0.0.1:9/", "nonce": "n1"},
        "approvers": ["101"],
    }
    row = {
        "approval_id": "A1", "kind": "approval", "revision": 1, "nonce": "n1",
        "payload_hash": payload_hash(signed), "state": "pending", "expires_at": 10**13,
        "received_at": 0, "updated_seq": 1, "previous_body": None, "outcome": None,
    }  # fmt: skip

    lying = item_from(row, dispatch, 0)  # the dispatch's own hash is not its body's
    other_row = item_from({**row, "payload_hash": "0" * 64}, {**dispatch,
        "payload_hash": payload_hash(signed)}, 0)  # fmt: skip
    fine = item_from(row, {**dispatch, "payload_hash": payload_hash(signed)}, 0)

    assert (lying.state, other_row.state, fine.state) == ("withheld", "withheld", "pending")
    assert other_row.payload_hash == payload_hash(signed)  # from the dispatch shown


@pytest.mark.parametrize(
    "value",
    ["/\t/evil.example/", "/\n/evil.example/", "/\r/evil.example/", "//evil.example/",
     "/\\evil.example/", "\\/evil.example/", "https://evil.example/", "/ /evil.example/",
     "/\x00/evil.example/", "/\u2028/evil.example/", "", "evil.example", "/\x7f/x"],
)  # fmt: skip
def test_inbox_signin_next_that_could_leave_the_inbox_goes_home(value: str) -> None:
    assert safe_next(value) == "/"


@pytest.mark.parametrize("value", ["/", "/items/01ABC", "/recent?r=1", "/items/a%2Fb"])
def test_inbox_signin_next_local_path_is_kept(value: str) -> None:
    assert safe_next(value) == value


def test_inbox_junk_signin_posts_do_not_lock_out_a_real_signin(tmp_path: Path) -> None:
    fresh = start_world(tmp_path, enrol=(101,))
    try:
        attacker = fresh.client()
        for n in range(12):  # no pre-session cookie, no CSRF token, no Origin
            junk = attacker.request(
                "POST", "/signin", b'{"csrf": "x"}', {"Content-Type": "application/json"}
            )
            assert junk.status == 403, (n, junk.text)

        answer = fresh.client().signin(fresh.passkeys[101])

        assert answer.status == 200, answer.text
        victim = fresh.client()
        for n in range(10):  # real tries that fail still count
            failed = victim.signin(fresh.passkeys[101], rp_id="evil.example")
            assert failed.status in (401, 429), (n, failed.text)
        limited = victim.signin(fresh.passkeys[101])
        assert (limited.status, limited.json()["reason"]) == (429, "rate_limited")
        assert limited.header("Retry-After")
    finally:
        fresh.stop()


def test_inbox_1000_signin_pages_from_elsewhere_do_not_flush_a_victims_challenge(
    world: InboxWorld,
) -> None:
    victim = world.client()
    page = victim.get("/signin")
    challenge = re.search(r'data-challenge="([^"]+)"', page.text)
    assert challenge, page.text
    csrf = field_value(page.text, "csrf")
    statuses: set[int] = set()
    conn = http.client.HTTPConnection(
        "127.0.0.1", world.inbox_port, timeout=30, source_address=("127.0.0.2", 0)
    )
    try:
        for _ in range(1000):  # another address, no cookie: a fresh challenge each time
            conn.request("GET", "/signin")
            got = conn.getresponse()
            got.read()
            statuses.add(got.status)
    finally:
        conn.close()

    signed = world.passkeys[101].assert_(challenge.group(1), victim.rp_id, victim.origin)
    answer = victim.post_json("/signin", {"csrf": csrf, "assertion": signed})

    assert answer.status == 200, answer.text
    assert statuses <= {200, 429}


async def test_inbox_a_full_challenge_pool_refuses_new_pages_and_keeps_live_challenges(
    tmp_path: Path,
) -> None:
    db = await InboxDb.open(tmp_path / "inbox.db")
    pool = ShortLived(db)
    try:
        first = await pool.issue_challenge("pre-0", "/", 0, "10.0.0.0")
        for n in range(1, 1000):
            assert await pool.issue_challenge(f"pre-{n}", "/", 1, f"10.0.0.{n % 10}") is not None

        refused = await pool.issue_challenge("pre-late", "/", 2, "10.0.0.99")
        replaced = await pool.issue_challenge("pre-0b", "/", 2, "10.0.0.0", replaces="pre-0")

        assert refused is None
        assert first is not None and replaced is not None
        assert await pool.take_challenge(first, 3) is None  # its own page replaced it
        later = await pool.issue_challenge("pre-after", "/", 2 + CHALLENGE_TTL_MS, "10.0.0.99")
        assert later is not None  # expired ones make room
    finally:
        await db.close()


def test_inbox_a_wrong_method_is_answered_in_words(world: InboxWorld) -> None:
    client = world.client()

    page = client.get("/signout")
    fetch = client.request("PUT", "/items/x/decide", b"{}", {"Content-Type": "application/json"})

    assert page.status == 405 and "text/html" in (page.header("Content-Type") or "")
    assert page.header("Content-Security-Policy") and fetch.header("Content-Security-Policy")
    assert page.header("Allow") == "POST"
    assert (fetch.status, fetch.json()["reason"]) == (405, "method_not_allowed")
