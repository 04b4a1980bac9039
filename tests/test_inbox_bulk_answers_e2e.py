"""Bulk approve and question answers through the inbox: the real gate, the real
``hitl-gate inbox serve``, real pipelines (``hitl-gate request --wait``, ``hitl-gate ask
--wait``) blocking on them, a software passkey enrolled at the gate's invite page."""

from __future__ import annotations

import contextlib
import html
import http.client
import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.inbox_harness import ENV, RP_ID, STEPS, InboxClient, InboxWorld, field_value, start_world
from tests.support import CliProcess, run_cli, wait_until
from tests.test_inbox_bulk import LONG

pytestmark = pytest.mark.e2e

SIGNED = {
    "name": "signed",
    "quorum": 1,
    "approvers": [101, 102, 103],
    "timeout": "1h",
    "approver_signature": "required",  # the gate verifies every batch signature
}
FORM = {
    "type": "object",
    "properties": {
        "po": {"type": "string", "title": "PO number", "maxLength": 20},
        "amount": {"type": "integer", "minimum": 1, "maximum": 100},
        "checks": {"type": "array", "items": {"type": "string", "enum": ["credit", "sanctions"]}},
    },
    "required": ["po", "amount"],
}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[InboxWorld]:
    box = start_world(tmp_path, steps=[*STEPS, SIGNED])
    yield box
    box.stop()


def request(world: InboxWorld, draft: str, step: str = "signed", *extra: str) -> CliProcess:
    assert world.gate is not None
    return CliProcess(
        "request", "-c", str(world.gate.config), "--api-url", world.gate.api_url,
        "--pipeline", "p", "--step", step, "--draft", draft, "--wait", *extra, env=ENV,
    )  # fmt: skip


def ask(world: InboxWorld, *args: str) -> CliProcess:
    assert world.gate is not None
    return CliProcess(
        "ask", "-c", str(world.gate.config), "--api-url", world.gate.api_url,
        "--pipeline", "p", "--step", "ask", *args, "--wait", env=ENV,
    )  # fmt: skip


def pending(world: InboxWorld, count: int) -> dict[str, str]:
    """Wait until the inbox keeps ``count`` pending items; body (or question text) -> id."""
    assert world.inbox is not None
    inbox = world.inbox

    def found() -> dict[str, str] | None:
        if not inbox.db.exists():
            return None
        rows = inbox.rows("SELECT approval_id, dispatch FROM items WHERE state = 'pending'")
        if len(rows) < count:
            return None
        out = {}
        for row in rows:
            sent = json.loads(row["dispatch"])
            text = sent.get("draft", {}).get("body") or sent.get("question", {}).get("text")
            out[text] = row["approval_id"]
        return out

    return dict(wait_until(found, timeout=90, what=f"{count} pending inbox items"))


def signed_in(world: InboxWorld, operator: int = 101) -> InboxClient:
    client = world.client()
    answer = client.signin(world.passkeys[operator])
    assert answer.status == 200, answer.text
    return client


def bulk_fields(client: InboxClient, ids: list[str]) -> dict[str, str]:
    """The waiting page's bulk form with ``ids`` ticked (their revisions as shown)."""
    page = client.get("/")
    assert page.status == 200, page.text
    shown = dict(re.findall(r'name="item:([^"]+)" value="(\d+)"', page.text))
    assert set(ids) <= set(shown), page.text
    assert 'data-challenge-url="/bulk/challenge"' in page.text
    return {"csrf": field_value(page.text, "csrf"), **{f"item:{i}": shown[i] for i in ids}}


def batch_assertion(world: InboxWorld, challenge: str, origin: str, counter: bool) -> Any:
    """alice's assertion over a batch challenge. Without ``counter`` it is made as a synced
    passkey makes it (signature counter 0, as Apple's and Google's report); with it, as a
    hardware key makes it (a counter that goes up: one assertion, one counter value for
    every item of the batch, see test_bulk_with_a_counting_authenticator)."""
    passkey = world.passkeys[101]
    if not counter:
        passkey.counter = -1  # assert_ adds 1: 0
    return passkey.assert_(challenge, RP_ID, origin)


def bulk_approve(
    world: InboxWorld, client: InboxClient, fields: dict[str, str], counter: bool = False
) -> Any:
    got = client.post_json("/bulk/challenge", fields)
    assert got.status == 200, got.text
    signed = batch_assertion(world, got.json()["challenge"], client.origin, counter)
    return client.post_json("/bulk/decide", {**fields, "assertion": signed})


def test_bulk_approve_of_five_items_with_one_assertion(world: InboxWorld) -> None:
    pipelines = {f"bulk draft {n}": request(world, f"bulk draft {n}") for n in range(5)}
    ids = pending(world, 5)
    client = signed_in(world)

    done = bulk_approve(world, client, bulk_fields(client, list(ids.values())))

    assert done.status == 200, done.text
    location = done.json()["location"]
    assert world.inbox is not None
    kept = world.inbox.rows("SELECT batch_id, http_status, answer FROM decisions")
    assert {r["http_status"] for r in kept} == {200}, [dict(r) for r in kept]
    assert len(kept) == 5 and len({r["batch_id"] for r in kept}) == 1
    for draft, proc in pipelines.items():
        code, out, err = proc.finish()
        assert (code, out.decode()) == (0, draft), err
    decisions = world.gate_rows("SELECT approval_id, credential_id, decision FROM decisions")
    assert sorted(r["approval_id"] for r in decisions) == sorted(ids.values())
    assert {r["decision"] for r in decisions} == {"approve"}
    assert len({r["credential_id"] for r in decisions}) == 1  # one passkey, one assertion
    assert decisions[0]["credential_id"] is not None
    results = client.get(location)
    assert results.status == 200
    assert results.text.count('class="answer answer-resolved"') == 5, results.text
    assert "<h1>All 5 approved</h1>" in results.text
    other = world.client()  # another approver's session does not see this batch
    assert other.signin(world.passkeys[102]).status == 200
    assert other.get(location).status == 404


def test_a_bulk_approval_cut_short_counts_every_ticked_item(world: InboxWorld) -> None:
    """The inbox killed mid-batch (the gate down, so its first post waits): the batch page
    names every item ticked, the one sent without an answer and those never sent."""
    pipelines = [request(world, f"cut draft {n}") for n in range(3)]
    ids = pending(world, 3)
    client = signed_in(world)
    fields = bulk_fields(client, list(ids.values()))
    got = client.post_json("/bulk/challenge", fields)
    assert got.status == 200, got.text
    signed = batch_assertion(world, got.json()["challenge"], client.origin, False)
    assert world.gate is not None and world.inbox is not None
    assert world.gate.stop() == 0
    inbox = world.inbox

    def decide() -> None:
        with contextlib.suppress(OSError, http.client.HTTPException):  # killed mid-answer
            client.post_json("/bulk/decide", {**fields, "assertion": signed})

    thread = threading.Thread(target=decide)
    thread.start()
    kept = wait_until(
        lambda: (
            (rows := inbox.rows("SELECT batch_id, answer FROM decisions ORDER BY id"))
            and len(rows) == 3
            and rows[0]["answer"] == "{}"
            and rows[2]["answer"] == '{"error": "not_sent"}'
            and rows
        ),
        what="the batch's rows kept, the first sent",
    )
    inbox.kill9()
    thread.join(30)
    world.start_inbox()

    page = client.get(f"/bulk/{kept[0]['batch_id']}")
    assert page.status == 200, page.text
    said = " ".join(page.text.split())
    heading = "None of 3 approved, 1 not answered, 2 not sent: nothing was recorded for them"
    assert f"<h1>{heading}</h1>" in said, said
    assert said.count('class="answer answer-not_sent"') == 2, said
    recent = client.get("/recent").text
    assert f'href="/bulk/{kept[0]["batch_id"]}"' in recent, recent
    for pipeline in pipelines:
        pipeline.stop()


def test_a_bulk_approval_over_the_gate_s_rate_limit_says_select_again(tmp_path: Path) -> None:
    """The gate takes 2 decisions a minute from one approver: of 3 ticked, the third is
    refused, and the results say it is the gate's limit and what to do."""
    world = start_world(tmp_path, steps=[*STEPS, SIGNED], security={"rate_limit": 2})
    try:
        pipelines = [request(world, f"limited draft {n}") for n in range(3)]
        ids = pending(world, 3)
        client = signed_in(world)
        done = bulk_approve(world, client, bulk_fields(client, list(ids.values())))
        assert done.status == 200, done.text
        said = html.unescape(" ".join(client.get(done.json()["location"]).text.split()))
        for pipeline in pipelines:
            pipeline.stop()
    finally:
        world.stop()
    limit = "1 over the gate's limit of decisions a minute: select it again in a minute"
    assert f"<h1>2 of 3 approved, {limit}</h1>" in said, said
    assert said.count('class="answer answer-rate_limited"') == 1, said
    assert "the gate's limit of decisions a minute" in said.split("answer-rate_limited")[1]


def test_bulk_results_tell_items_of_one_step_apart_as_the_waiting_list_does(
    world: InboxWorld,
) -> None:
    drafts = {"a": "Refund <b>7</b> EUR\nto ACME", "b": "Refund <b>8</b> EUR\nto ACME"}
    pipelines = [request(world, d, "signed", "--run-id", f"run-{k}") for k, d in drafts.items()]
    ids = pending(world, 2)
    client = signed_in(world)

    done = bulk_approve(world, client, bulk_fields(client, list(ids.values())))

    assert done.status == 200, done.text
    results = client.get(done.json()["location"]).text
    for key, draft in drafts.items():
        first = draft.split("\n")[0].replace("<", "&lt;").replace(">", "&gt;")
        row = re.search(
            rf'<li class="answer answer-resolved"><a href="/items/{ids[draft]}">'
            r'<span class="what">p · signed</span></a>: '
            rf'<span class="first-line">{re.escape(first)}</span> '
            r'<span class="requested">\(requested \d{4}-\d\d-\d\d \d\d:\d\d UTC, '
            rf"run run-{key}\)</span>: ",
            results,
        )
        assert row, results
    for proc in pipelines:
        assert proc.finish()[0] == 0


def test_bulk_with_a_counting_authenticator(world: InboxWorld) -> None:
    pipelines = {f"counted {n}": request(world, f"counted {n}") for n in range(5)}
    ids = pending(world, 5)
    client = signed_in(world)
    before = world.passkeys[101].counter

    done = bulk_approve(world, client, bulk_fields(client, list(ids.values())), counter=True)

    assert done.status == 200, done.text
    assert world.inbox is not None
    kept = world.inbox.rows("SELECT http_status FROM decisions ORDER BY id")
    assert [r["http_status"] for r in kept] == [200] * 5
    for draft, proc in pipelines.items():
        code, out, err = proc.finish()
        assert (code, out.decode()) == (0, draft), err
    [(count,)] = world.gate_rows("SELECT sign_count FROM approver_credentials WHERE sign_count > 0")
    assert count == before + 1  # one assertion, one counter value, five decisions
    assert world.gate is not None
    config = str(world.gate.config)
    verify = run_cli("audit", "verify", "-c", config, env=ENV)
    assert verify.returncode == 0, verify.stdout.decode() + verify.stderr.decode()
    header, *rows = (
        run_cli("audit", "signatures", "-c", config, env=ENV).stdout.decode().splitlines()
    )
    assert header.split()[0] == "approval", header
    assert len(rows) == 5 and all(row.split()[-2:] == ["webauthn", "yes"] for row in rows), rows


def test_bulk_where_one_item_was_resolved_elsewhere_says_so_and_records_the_others(
    world: InboxWorld,
) -> None:
    pipelines = {f"race {n}": request(world, f"race {n}") for n in range(3)}
    ids = pending(world, 3)
    client = signed_in(world)
    fields = bulk_fields(client, list(ids.values()))
    got = client.post_json("/bulk/challenge", fields)
    assert got.status == 200, got.text
    signed = batch_assertion(world, got.json()["challenge"], client.origin, counter=False)
    # bob approves "race 1" in between: the gate resolves it and tells the inbox
    bob = signed_in(world, 102)
    assert bob.decide(ids["race 1"], world.passkeys[102]).status == 200
    assert world.inbox is not None
    world.inbox.wait_item(ids["race 1"], lambda r: r["state"] == "resolved")

    done = client.post_json("/bulk/decide", {**fields, "assertion": signed})

    assert done.status == 200, done.text
    results = client.get(done.json()["location"]).text
    assert results.count("answer-resolved") == 2, results
    assert "<h1>2 of 3 approved</h1>" in results and "Approved together" not in results
    assert "The approval was already resolved; nothing was recorded." in results
    for proc in pipelines.values():
        assert proc.finish()[0] == 0
    recorded = world.gate_rows("SELECT approval_id, operator_id FROM decisions")
    assert sorted((r["approval_id"], r["operator_id"]) for r in recorded) == sorted(
        [(ids["race 0"], 101), (ids["race 1"], 102), (ids["race 2"], 101)]
    )


def test_a_bulk_challenge_names_an_item_that_changed_and_posts_nothing(world: InboxWorld) -> None:
    pipelines = [request(world, f"x {n}") for n in range(2)]
    ids = pending(world, 2)
    client = signed_in(world)
    fields = bulk_fields(client, list(ids.values()))
    fields[f"item:{ids['x 0']}"] = "2"  # a revision the page never showed

    got = client.post_json("/bulk/challenge", fields)

    assert (got.status, got.json()["reason"]) == (409, "changed"), got.text
    assert "changed since you opened it" in got.json()["message"]
    one = client.post_json("/bulk/challenge", {"csrf": fields["csrf"], f"item:{ids['x 1']}": "1"})
    assert (one.status, one.json()["reason"]) == (422, "batch_size")
    forged = client.post_json("/bulk/challenge", {**fields, "csrf": "forged"}, csrf="forged")
    assert (forged.status, forged.json()["reason"]) == (403, "csrf_mismatch")
    assert world.gate_rows("SELECT COUNT(*) FROM decisions")[0][0] == 0
    for proc in pipelines:
        proc.proc.terminate()
        proc.finish()


def test_a_forged_bulk_challenge_naming_a_long_draft_is_refused_open_to_review(
    world: InboxWorld,
) -> None:
    """The waiting page offers no checkbox for a 200-line draft; a request that ticks it
    anyway is refused by the inbox (the server decides, not the page) and nothing is signed,
    posted or recorded at the gate."""
    pipelines = [request(world, LONG), request(world, "short one")]
    ids = pending(world, 2)
    client = signed_in(world)
    page = client.get("/")
    assert f'name="item:{ids[LONG]}"' not in page.text
    assert "Open to review: 200 lines, 10 KB" in page.text
    fields = {"csrf": field_value(page.text, "csrf"), **{f"item:{i}": "1" for i in ids.values()}}

    got = client.post_json("/bulk/challenge", fields)
    decided = client.post_json("/bulk/decide", {**fields, "assertion": {"id": "x"}})

    for answer in (got, decided):
        assert (answer.status, answer.json()["reason"]) == (409, "open_to_review"), answer.text
        assert f"p \u00b7 signed ({ids[LONG]}) must be opened" in answer.json()["message"]
    assert "200 lines" in got.json()["message"]
    assert world.gate_rows("SELECT COUNT(*) FROM decisions")[0][0] == 0
    for proc in pipelines:
        proc.proc.terminate()
        proc.finish()


def answer_form(client: InboxClient, question_id: str, fields: list[tuple[str, str]]) -> Any:
    path = f"/items/{urllib.parse.quote(question_id, safe='')}"
    page = client.get(path)
    assert page.status == 200, page.text
    sent = [
        ("csrf", field_value(page.text, "csrf")),
        ("version", field_value(page.text, "version")),
    ]
    body = urllib.parse.urlencode(sent + fields).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Origin": client.origin}
    return client.request("POST", path + "/answer", body, headers)


def test_questions_answered_through_their_forms_reach_the_pipeline_typed(
    world: InboxWorld, tmp_path: Path
) -> None:
    schema = tmp_path / "form.json"
    schema.write_text(json.dumps(FORM), encoding="utf-8")
    asks = {
        "PO number?": (ask(world, "--text", "PO number?"), [("value", "2026-114\r\nok")]),
        "Supplier?": (
            ask(world, "--text", "Supplier?", "--choice", "Acme", "--choice", "Globex"),
            [("value", "Globex")],
        ),
        "Checks?": (
            ask(
                world, "--text", "Checks?", "--choice", "credit", "--choice", "sanctions", "--multi"
            ),
            [("value", "sanctions"), ("value", "credit")],
        ),
        "PO details?": (
            ask(world, "--text", "PO details?", "--schema", str(schema)),
            [("po", "A-1"), ("amount", "12"), ("checks", "credit"), ("checks", "sanctions")],
        ),
    }
    ids = pending(world, 4)
    client = signed_in(world)
    printed = {
        "PO number?": "2026-114\nok\n",
        "Supplier?": "Globex\n",
        "Checks?": '["sanctions","credit"]\n',
        "PO details?": '{"amount":12,"checks":["credit","sanctions"],"po":"A-1"}\n',
    }

    for text, (proc, fields) in asks.items():
        answered = answer_form(client, ids[text], fields)
        assert answered.status == 303, answered.text
        location = answered.header("Location")
        assert location is not None and location.startswith("/decisions/")
        code, out, err = proc.finish()
        assert (code, out.decode()) == (0, printed[text]), err
        assert client.get(location).status == 200


def test_an_invalid_answer_is_the_form_again_in_words_and_nothing_is_posted(
    world: InboxWorld, tmp_path: Path
) -> None:
    schema = tmp_path / "form.json"
    schema.write_text(json.dumps(FORM), encoding="utf-8")
    proc = ask(world, "--text", "PO details?", "--schema", str(schema))
    question_id = pending(world, 1)["PO details?"]
    client = signed_in(world)

    bad = answer_form(client, question_id, [("po", "A-1"), ("amount", "500")])
    blank = answer_form(client, question_id, [("po", "  "), ("amount", "5")])

    assert bad.status == 422, bad.text
    assert "Not sent:" in bad.text and "\u201camount\u201d" in bad.text, bad.text
    assert 'value="A-1"' in bad.text and 'value="500"' in bad.text  # kept (finding 10)
    assert blank.status == 422 and "\u201cPO number\u201d must not be blank." in blank.text
    path = f"/items/{urllib.parse.quote(question_id, safe='')}/answer"
    good = urllib.parse.urlencode({"version": "1", "po": "A-1", "amount": "5"})
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    no_csrf = client.request("POST", path, good.encode(), {**form, "Origin": client.origin})
    csrf = field_value(client.get(path[: -len("/answer")]).text, "csrf")
    elsewhere = client.request(
        "POST", path, (good + f"&csrf={csrf}").encode(), {**form, "Origin": "http://evil.example"}
    )
    assert (no_csrf.status, no_csrf.json()["reason"]) == (403, "csrf_mismatch")
    assert (elsewhere.status, elsewhere.json()["reason"]) == (403, "origin_not_allowed")
    assert world.inbox is not None
    assert world.inbox.rows("SELECT COUNT(*) FROM decisions")[0][0] == 0
    assert world.gate_rows("SELECT state FROM questions")[0]["state"] == "pending"
    proc.proc.terminate()
    proc.finish()


def test_an_answer_is_said_as_answered_with_its_value_everywhere(
    world: InboxWorld, tmp_path: Path
) -> None:
    schema = tmp_path / "form.json"
    schema.write_text(json.dumps(FORM), encoding="utf-8")
    choice = ask(world, "--text", "Supplier?", "--choice", "Acme", "--choice", "Globex AG")
    form = ask(world, "--text", "PO details?", "--schema", str(schema))
    ids = pending(world, 2)
    client = signed_in(world)

    answered = answer_form(client, ids["Supplier?"], [("value", "Globex AG")])
    details = answer_form(client, ids["PO details?"], [("po", "A-1"), ("amount", "12")])

    assert choice.finish()[0] == 0 and form.finish()[0] == 0
    page = client.get(str(answered.header("Location"))).text
    assert "<h1>Answered: Globex AG</h1>" in page, page
    assert "Approved" not in page and "approval is resolved" not in page, page
    assert "Supplier?" in page  # the decision page names what it answered
    form_page = client.get(str(details.header("Location"))).text
    assert "<h1>Answered: PO number: A-1; amount: 12</h1>" in form_page, form_page
    assert world.inbox is not None
    world.inbox.wait_item(ids["Supplier?"], lambda r: r["state"] == "resolved")
    question = client.get(f"/items/{ids['Supplier?']}").text
    assert "Your answer: Globex AG" in question, question
    recent = client.get("/recent").text
    assert 'answer<span class="sent">: Globex AG</span>' in recent, recent
    assert 'answer<span class="sent">: PO number: A-1; amount: 12</span>' in recent, recent
    assert "Supplier?" in recent and "p · ask" in recent, recent
