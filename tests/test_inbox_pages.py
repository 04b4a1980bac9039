"""The inbox's pages (gate/inbox/pages.py, templates, static, headers), served by
the real templates through a tiny in-process aiohttp app with hostile item data
(tests/inbox_pages_app.py): escaped, marked, complete, labelled, with the security headers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from html.parser import HTMLParser

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gate.inbox import words
from gate.inbox.headers import CSP
from gate.inbox.progress import collected
from gate.protocol.errors import ProtocolError
from tests.inbox_pages_app import (
    BIG_BODY,
    END,
    GATE_RUN,
    HIDDEN_IN_BIG,
    ITEMS,
    build_app,
    make_item,
)


@pytest.fixture
async def client() -> AsyncIterator[TestClient[object, object]]:
    async with TestClient(TestServer(build_app(), host="127.0.0.1", port=0)) as c:
        yield c


class Page(HTMLParser):
    """Tags with attributes, label targets, the text, and the scripts of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.labelled: set[str] = set()
        self.stack: list[str] = []
        self.textarea: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "label" and a.get("for"):
            self.labelled.add(str(a["for"]))
        self.stack.append(str(a.get("id") or "") if tag == "textarea" else "")

    def handle_endtag(self, tag: str) -> None:
        if self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.stack and self.stack[-1]:
            self.textarea[self.stack[-1]] = self.textarea.get(self.stack[-1], "") + data


async def fetch(client: TestClient[object, object], path: str) -> tuple[str, Page, dict[str, str]]:
    answer = await client.get(path)
    assert answer.status == 200, path
    html = await answer.text()
    page = Page()
    page.feed(html)
    page.close()
    return html, page, dict(answer.headers)


PAGES = ["/", "/?empty=1", "/items/hostile", "/items/diff", "/items/question", "/recent"]
PAGES += ["/message", "/message?n=1", "/signin"]


@pytest.mark.parametrize("path", PAGES)
async def test_inbox_pages_send_the_security_headers_and_no_inline_script_or_style(
    client: TestClient[object, object], path: str
) -> None:
    html, page, headers = await fetch(client, path)
    assert headers["Content-Security-Policy"] == CSP
    assert headers["Referrer-Policy"] == "same-origin"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cache-Control"] == "no-store"
    scripts = [a for tag, a in page.tags if tag == "script"]
    assert scripts == [{"src": "/static/inbox.js", "defer": None}]
    assert not [
        tag for tag, _ in page.tags if tag in ("style", "img", "iframe", "a") and tag != "a"
    ]
    assert not [a for _, a in page.tags if "style" in a or any(k.startswith("on") for k in a)]
    assert '<html lang="en">' in html and 'name="viewport"' in html


@pytest.mark.parametrize("path", PAGES)
async def test_inbox_pages_label_every_control(
    client: TestClient[object, object], path: str
) -> None:
    _, page, _ = await fetch(client, path)
    for tag, a in page.tags:
        if tag in ("textarea", "select") or (tag == "input" and a.get("type") != "hidden"):
            assert a.get("id") in page.labelled, (path, tag, a)


@pytest.mark.parametrize("asset", ["inbox.css", "inbox.js", "favicon.svg"])
async def test_inbox_static_assets_come_from_the_package(
    client: TestClient[object, object], asset: str
) -> None:
    answer = await client.get(f"/static/{asset}")
    assert answer.status == 200
    assert answer.headers["Cache-Control"] == "no-cache"
    assert answer.headers["Content-Security-Policy"] == CSP


async def test_inbox_item_page_shows_the_whole_hostile_draft_marked_with_a_banner(
    client: TestClient[object, object],
) -> None:
    html, page, _ = await fetch(client, "/items/hostile")
    text = "".join(page.text)
    assert END in text and "<script>window.__pwned=1</script>" in text
    shown = BIG_BODY
    for char in "\u202e\u202c\u200b\r\x1b":
        shown = shown.replace(char, f"U+{ord(char):04X}")
    assert shown in text  # the draft, complete, in one piece
    assert html.count('<mark class="cc" title=') >= HIDDEN_IN_BIG
    assert f"{HIDDEN_IN_BIG} characters in this draft" in " ".join(text.split())
    assert 'title="U+202E RIGHT-TO-LEFT OVERRIDE">U+202E</mark>' in html
    assert "pay&lt;b&gt;outs&lt;/b&gt;<mark" in html  # the pipeline's name, escaped and marked
    assert "<title>pay&lt;b&gt;outs&lt;/b&gt;U+202E · refund" in html


async def test_inbox_item_page_forms_carry_csrf_challenge_and_the_required_reason(
    client: TestClient[object, object],
) -> None:
    html, page, _ = await fetch(client, "/items/hostile")
    forms = [a for tag, a in page.tags if tag == "form" and a.get("data-sign")]
    assert [f["data-sign"] for f in forms] == ["approve", "skip", "adjust"]
    assert forms[0]["data-challenge"] == "Y2hhbGxlbmdlLWFwcHJvdmU"
    assert forms[1]["data-challenge-url"] == "/items/hostile/challenge"
    assert all(f["action"] == "/items/hostile/decide" for f in forms)
    csrf = [a for tag, a in page.tags if tag == "input" and a.get("name") == "csrf"]
    assert len(csrf) == 4 and {a["value"] for a in csrf} == {"csrf-token-0123456789abcdef"}
    reason = next(a for tag, a in page.tags if tag == "textarea" and a.get("name") == "reason")
    assert "required" in reason
    assert page.textarea["adjust-text"] == "\n" + BIG_BODY  # the newline HTML drops, then all


async def test_inbox_item_page_without_a_required_reason_and_with_a_diff(
    client: TestClient[object, object],
) -> None:
    html, page, _ = await fetch(client, "/items/diff")
    reason = next(a for tag, a in page.tags if tag == "textarea" and a.get("name") == "reason")
    assert "required" not in reason
    assert "What changed since revision 1" in html
    assert "<del>- Amount: 1200 EUR</del>" in html
    assert re.search(r"<ins>\+ Amount: 12<mark class=\"cc\"[^>]*>U\+200B</mark> EUR</ins>", html)
    assert not [a for tag, a in page.tags if tag in ("a", "img") and "evil" in str(a)]


async def test_inbox_item_page_lists_the_link_reference_definitions_it_does_not_show(
    client: TestClient[object, object],
) -> None:
    html, page, _ = await fetch(client, "/items/refs")

    notice = html.split('<div class="warning references" role="alert">', 1)[1].split("</div>")[0]
    assert "2 link reference definitions" in notice, notice
    assert (
        '<li>[sign in] <span class="md-url">https://evil.example/?q=&lt;script&gt;'
        "window.__pwned=1&lt;/script&gt;</span> (title &#34;Bank&#34;)</li>"
    ) in notice
    assert (
        '<li>[unused] <span class="md-url">https://second.example/<mark class="cc" '
        'title="U+202E RIGHT-TO-LEFT OVERRIDE">U+202E</mark>exe.txt</span></li>'
    ) in notice
    assert not [a for tag, a in page.tags if tag == "a" and "example" in str(a)]
    assert "1 character in this draft" in " ".join("".join(page.text).split())


async def test_inbox_item_page_without_reference_definitions_has_no_such_notice(
    client: TestClient[object, object],
) -> None:
    html, _, _ = await fetch(client, "/items/diff")

    assert "reference definition" not in html


async def test_inbox_waiting_page_lists_pending_items_by_expiry_with_their_facts(
    client: TestClient[object, object],
) -> None:
    html, page, _ = await fetch(client, "/")
    ids = [a["data-approval-id"] for tag, a in page.tags if tag == "li"]
    assert ids == sorted(ITEMS, key=lambda k: ITEMS[k].expires_at)
    text = " ".join("".join(page.text).split())
    assert "Approvals: 1 of 2" in text and "Time left: 10 min" in text
    assert "Budget today: 4.12 EUR of 20 EUR" in text and "Risk: high" in text
    empty = " ".join("".join((await fetch(client, "/?empty=1"))[1].text).split())
    assert "Nothing is waiting for you." in empty


async def test_inbox_waiting_rows_tell_items_apart_and_hidden_drafts_get_no_checkbox(
    client: TestClient[object, object],
) -> None:
    """A short draft is shown WHOLE by its checkbox, with when, run id and requester; one with
    hidden characters, too long or too wide has no checkbox and says why it must be opened."""
    html, page, _ = await fetch(client, "/?bulk=1")
    boxes = {
        a.get("name") for tag, a in page.tags if tag == "input" and a.get("type") == "checkbox"
    }
    assert boxes == {"item:plain-a", "item:plain-b"}
    row_text = {
        m.group(1): " ".join(re.sub(r"<[^>]+>", " ", m.group(0)).split())
        for m in re.finditer(
            r'<li class="item[^"]*" data-approval-id="([^"]+)".*?</li>', html, re.S
        )
    }
    assert len(row_text) == 6
    for hidden in ("hostile", "diff"):
        assert "Open to review: " in row_text[hidden] and " hidden character" in row_text[hidden]
    assert "Open to review" not in row_text["plain-a"]
    a = row_text["plain-a"]
    assert "Refund 12 EUR to ACME Ltd for order 4411. Second line." in a
    assert "Requested 2026-08-02 09:14 UTC" in a
    assert "run run-7" in a and "requested by carol" in a
    b = row_text["plain-b"]
    assert "Refund 99 EUR to Globex for order 9999." in b and "run " not in b
    wide = row_text["plain-wide"]
    assert "Open to review: 1 line, 124 bytes, a line of 124 characters" in wide
    assert "Refund 99 EUR to Globex for order " + "9" * 45 + "\u2026" in wide
    question = row_text["question"]
    assert "Open to review" not in question


async def test_inbox_waiting_row_names_its_item_once(client: TestClient[object, object]) -> None:
    """A row with a checkbox says "pipeline · step" once: the checkbox's label points at the
    row's own words (aria-labelledby), it does not repeat them."""
    html, page, _ = await fetch(client, "/?bulk=1")
    for approval_id in ("plain-a", "plain-b"):
        row = re.search(
            rf'<li class="item[^"]*" data-approval-id="{approval_id}".*?</li>', html, re.S
        )
        assert row is not None
        text = " ".join(re.sub(r"<[^>]+>", " ", row.group(0)).split())
        assert text.count("billing · refund") == 1, text
        box = re.search(r'<input type="checkbox"[^>]*aria-labelledby="([^"]+)"', row.group(0))
        assert box is not None, row.group(0)
        for target in box.group(1).split():
            assert f'id="{target}"' in row.group(0), target


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/items/plain-a", ["Requested 2026-08-02 09:14 UTC", "Run run-7"]),
        (
            "/items/delegated",
            [
                "Requested 2026-08-02 09:14 UTC",
                f"Run {GATE_RUN}, in the gate's own id format: the gate makes one when the"
                " pipeline names no run",
            ],
        ),
        ("/items/plain-b", ["Requested 2027-01-15 07:59 UTC"]),
    ],
    ids=["run-given", "run-in-the-gate-format", "no-run"],
)
async def test_inbox_item_page_says_when_and_in_which_run_it_was_requested(
    client: TestClient[object, object], path: str, said: list[str]
) -> None:
    _, page, _ = await fetch(client, path)
    text = " ".join(" ".join(page.text).split())

    for words_ in said:
        assert words_ in text, text
    if path == "/items/plain-b":
        assert "Run " not in text


async def test_inbox_adjust_box_says_how_many_hidden_characters_it_keeps(
    client: TestClient[object, object],
) -> None:
    """The textarea shows the raw text (overrides applied): say so."""
    _, page, _ = await fetch(client, "/items/hostile")
    text = " ".join("".join(page.text).split())
    assert (
        "This text contains 5 hidden characters (see the warning above); they are kept unless"
        " you delete them." in text
    )
    _, diff, _ = await fetch(client, "/items/diff")
    assert "This text contains 1 hidden character (see the warning above); it is kept" in " ".join(
        "".join(diff.text).split()
    )
    _, plain, _ = await fetch(client, "/items/plain-a")
    assert "hidden character" not in " ".join("".join(plain.text).split())


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/items/plain-a", "Requested by carol"),
        ("/items/question", "Requested by dave@example.com"),
        ("/items/plain-b", None),
    ],
    ids=["approval", "question", "nobody-named"],
)
async def test_inbox_item_page_says_who_asked(
    client: TestClient[object, object], path: str, said: str | None
) -> None:
    _, page, _ = await fetch(client, path)
    text = " ".join(" ".join(page.text).split())

    if said is None:
        assert "Requested by" not in text
    else:
        assert said in text


async def test_inbox_question_page_shows_the_form_with_the_schema_limits(
    client: TestClient[object, object],
) -> None:
    html, page, _ = await fetch(client, "/items/question")
    inputs = {a.get("name"): a for tag, a in page.tags if tag in ("input", "select")}
    assert inputs["amount"]["type"] == "number"
    assert (inputs["amount"]["min"], inputs["amount"]["max"], inputs["amount"]["step"]) == (
        "0",
        "100",
        "any",
    )
    assert inputs["count"]["step"] == "1"
    assert inputs["email"]["type"] == "email" and "required" in inputs["email"]
    assert (inputs["note"]["minlength"], inputs["note"]["maxlength"]) == ("2", "500")
    assert "required" not in inputs["note"]
    assert inputs["urgent"]["type"] == "checkbox" and "checked" in inputs["urgent"]
    assert "required" in inputs["channel"]
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    assert "2 characters of this question are marked" in " ".join("".join(page.text).split())


async def test_inbox_question_form_refused_keeps_what_was_typed(
    client: TestClient[object, object],
) -> None:
    """An invalid answer shows the form again with the values sent."""
    sent = [
        ("csrf", "x"),
        ("version", "1"),
        ("amount", "150"),
        ("count", "3"),
        ("email", "a@example.com"),
        ("note", "keep <this> text"),
        ("channel", "sms"),
        ("tags", "vip"),
        ("tags", "repeat"),
    ]  # fmt: skip  ("urgent" unticked: its default is ticked)
    answer = await client.post("/items/question/answer", data=sent)
    assert answer.status == 422
    page = Page()
    page.feed(await answer.text())
    inputs = {a.get("id"): a for tag, a in page.tags if tag == "input"}
    assert inputs["f-amount"]["value"] == "150" and inputs["f-count"]["value"] == "3"
    assert inputs["f-email"]["value"] == "a@example.com"
    assert inputs["f-note"]["value"] == "keep <this> text"
    assert "checked" not in inputs["f-urgent"]
    assert "checked" in inputs["f-tags-1"] and "checked" in inputs["f-tags-2"]
    selected = [a.get("value") for tag, a in page.tags if tag == "option" and "selected" in a]
    assert selected == ["sms"]
    assert "Amount (EUR) must be at most 100." in "".join(page.text)


async def test_inbox_message_page_says_the_gate_answer_in_words(
    client: TestClient[object, object],
) -> None:
    _, page, _ = await fetch(client, "/message?n=1")
    text = " ".join("".join(page.text).split())
    assert "A newer revision is waiting" in text and words.ANSWERS["superseded"] in text


@pytest.mark.parametrize(
    ("status", "answer", "kind"),
    [
        (200, {"status": "recorded", "resolved": False}, "recorded"),
        (200, {"status": "recorded", "resolved": True, "outcome": "approved"}, "resolved"),
        (409, {"status": "conflict", "reason": "superseded"}, "superseded"),
        (410, {"status": "gone", "reason": "expired"}, "expired"),
        (409, {"status": "conflict", "reason": "duplicate"}, "already_decided"),
        (409, {"status": "conflict", "reason": "already_decided"}, "already_decided"),
        (409, {"reason": "already_resolved", "outcome": "cancelled"}, "cancelled"),
        (409, {"reason": "already_resolved", "outcome": "approved"}, "already_resolved"),
        (401, {"status": "unauthorized", "reason": "signature_mismatch"}, "refused"),
    ],
)
def test_words_answer_words_names_the_gate_answer(
    status: int, answer: dict[str, object], kind: str
) -> None:
    assert words.answer_words(status, answer)[0] == kind


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"reason": "already_resolved", "outcome": "approved"}, "The question was already"),
        ({"reason": "already_resolved", "outcome": "cancelled"}, "The question was cancelled"),
        ({"status": "gone", "reason": "expired"}, "The question expired before your answer"),
    ],
)
def test_words_an_answer_to_a_closed_question_says_question(
    answer: dict[str, object], said: str
) -> None:
    """An answer posted to a question the gate closed meanwhile: the words name a question
    and an answer, never "the approval"."""
    sentence = words.answer_words(409, answer, "answer")[1]
    assert sentence.startswith(said) and "approval" not in sentence, sentence
    assert sentence.endswith("nothing was recorded."), sentence


def test_words_a_revoked_passkey_says_what_to_do() -> None:
    """A bare "(403 approver_signature_invalid)" says nothing to an approver."""
    answer = {"status": "forbidden", "error": "approver_signature_invalid", "detail": "revoked"}
    kind, sentence = words.answer_words(403, answer)
    assert kind == "refused" and "ask for a new invite" in sentence, sentence
    assert "approver_signature_invalid" not in sentence and ".." not in sentence


@pytest.mark.parametrize(
    ("left_ms", "text"),
    [
        (0, "expired"),
        (59_999, "less than a minute"),
        (42 * 60_000, "42 min"),
        (185 * 60_000, "3 h 5 min"),
        (52 * 3_600_000, "2 d 4 h"),
    ],
)
def test_words_time_left(left_ms: int, text: str) -> None:
    assert words.time_left(1_000 + left_ms, 1_000) == text


def test_words_budget_skips_what_is_absent_or_not_a_finite_number() -> None:
    got = words.budget(
        {
            "unit": "EUR",
            "spent_today": 0.1 + 0.2,
            "cap_today": None,
            "spent_pipeline": True,
            "this_request": float("inf"),
        }
    )
    assert got == ["today: 0.3 EUR"]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (
            {"reason": "approver_signature_invalid", "detail": "counter_regressed"},
            "The gate refused your passkey's signature: its signature counter did not go up,"
            " as a copied passkey's would not. Nothing was recorded.",
        ),
        (
            {"reason": "approver_signature_invalid", "detail": "not_in_batch"},
            "The gate refused your passkey's signature: this item was not among those your"
            " passkey signed. Nothing was recorded.",
        ),
        (
            {"reason": "approver_signature_invalid", "detail": "origin_mismatch"},
            "The gate refused your passkey's signature: the gate does not accept passkeys used"
            " at this inbox's address (its webauthn.origins must list it). Nothing was"
            " recorded.",
        ),
        (
            {"reason": "approver_signature_invalid", "detail": "something_new"},
            "The gate refused your passkey's signature. Nothing was recorded.",
        ),
        (
            {"reason": "approver_signature_required"},
            "The gate requires your passkey's signature on this step. Nothing was recorded.",
        ),
        (
            {"reason": "approver_not_allowed"},
            "The gate does not count you among this step's approvers. Nothing was recorded.",
        ),
        (
            {"reason": "signature_mismatch"},
            "The gate refused the decision (it said \u201csignature_mismatch\u201d). Nothing was"
            " recorded.",
        ),
        ({}, "The gate refused the decision. Nothing was recorded."),
    ],
    ids=[
        "counter",
        "not_in_batch",
        "origin",
        "unknown_detail",
        "required",
        "approver",
        "other",
        "none",
    ],
)
def test_words_answer_words_says_a_refusal_in_words(answer: dict[str, object], said: str) -> None:
    kind, sentence = words.answer_words(403, answer)
    assert (kind, sentence) == ("refused", said)
    assert "403" not in sentence and "approver_signature" not in sentence


@pytest.mark.parametrize("state", ["expired", "cancelled"])
async def test_inbox_closed_item_page_says_its_state_first_and_offers_no_form(
    client: TestClient[object, object], state: str
) -> None:
    # the state was at the bottom, after the draft (off-screen on a phone)
    html, page, _ = await fetch(client, f"/items/diff?closed={state}")
    said = re.search(r'<p class="closed" id="item-state" role="status">([^<]*)</p>', html)
    assert said and f"This approval is {state}" in said.group(1), html
    assert html.index('id="item-state"') < html.index('class="draft"')
    assert not [a for tag, a in page.tags if tag == "form" and a.get("data-sign")]
    assert f'<div class="left"><dt>Time left</dt><dd>{state}</dd>' in html, html


@pytest.mark.parametrize(
    ("dispatch", "collected_before", "recorded", "shown"),
    [
        ({}, 0, ["alice@example.com"], 1),
        ({}, 1, ["alice@example.com"], 2),  # an adjust's revision: its author, then alice
        ({"reminder": 1, "awaiting": ["bob@example.com"]}, 1, ["alice@example.com"], 1),
        ({"reminder": 2, "awaiting": ["alice@example.com"]}, 0, ["alice@example.com"], 1),
        ({"escalation": 1}, 1, ["alice@example.com"], 1),
        ({"escalation": 1}, 0, ["alice@example.com", "bob@example.com"], 2),
        ({}, 1, ["alice@example.com", "bob@example.com", "carol@example.com"], 3),
    ],
    ids=[
        "dispatch-then-inbox",
        "adjusted-then-inbox",
        "reminder-after-the-inbox-approval",
        "reminder-before-the-inbox-approval",
        "escalation-counted-it",
        "escalation-before-both",
        "capped-at-the-quorum",
    ],
)
def test_progress_collected_counts_each_approval_once(
    dispatch: dict[str, object], collected_before: int, recorded: list[str], shown: int
) -> None:
    item = make_item("q", quorum_required=3, quorum_collected=collected_before, dispatch=dispatch)

    assert collected(item, recorded) == shown


def test_words_form_fields_with_bounds_at_2_53_render_as_html_limits() -> None:
    """A bound as large as the gate allows (±2**53) is shown; one beyond it (a hostile
    dispatch: 10**400 made the question page answer 500) is a schema the gate would not
    send, which the page says instead of the form."""
    props = {
        "amount": {"type": "number", "minimum": -(2**53), "maximum": 2**53},
        "count": {"type": "integer", "minimum": 0, "maximum": float(2**53)},
    }
    fields = words.form_fields({"type": "object", "properties": props})
    limits = {field.name: dict(field.attrs) for field in fields}
    assert (limits["amount"]["min"], limits["amount"]["max"]) == (
        "-9007199254740992",
        "9007199254740992",
    )
    assert limits["count"]["max"] == "9007199254740992.0"
    hostile = {"type": "object", "properties": {"n": {"type": "number", "maximum": 10**400}}}
    with pytest.raises(ProtocolError) as info:
        words.form_fields(hostile)
    assert info.value.extra["field"] == "schema.properties.n.maximum"


def test_words_budget_shows_a_number_beyond_2_53_as_its_exact_text() -> None:
    """A relay shows any dispatch: an amount no float holds is shown as sent, never a 500."""
    got = words.budget(
        {"unit": "EUR", "spent_today": 10**400, "cap_today": 2**53, "this_request": -(2**60)}
    )
    assert got == [
        f"today: {10**400} EUR of 9007199254740992 EUR",
        f"this request: {-(2**60)} EUR",
    ]
