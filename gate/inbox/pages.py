"""The inbox's pages: Jinja2 templates (autoescape on) and static assets from the
package, one function per page taking ``gate.inbox.model`` values and returning the rendered
``web.Response``, so request handlers stay thin. Every response gets ``headers.install``'s
security headers.

Forms post to the URLs below; a form the approver signs carries ``data-sign`` (its verb) and
``data-challenge`` (the base64url WebAuthn challenge) or ``data-challenge-url`` (where
``inbox.js`` POSTs the form's fields to get ``{"challenge": …}`` first: a skip's reason and
an adjust's text are part of the decision digest).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp_jinja2
import jinja2
from aiohttp import web
from markupsafe import Markup

from gate.inbox import headers
from gate.inbox.decided import final_text, my_part, on_behalf_of, sent_words, standing
from gate.inbox.followups import followup_words
from gate.inbox.listing import decided_facts, requested_at, requested_by, row_facts, run_words
from gate.inbox.model import DecisionRecord, Item, Session
from gate.inbox.progress import collected, shown
from gate.inbox.render import MARK_OPEN, diff_html, draft_view, hidden_count, marked_text
from gate.inbox.words import (
    answer_words,
    budget,
    form_fields,
    outcome_title,
    quorum,
    time_left,
)
from gate.protocol.errors import ProtocolError

STATIC = Path(__file__).resolve().parent / "static"
VERBS = (("approve", "Approve"), ("skip", "Skip"), ("adjust", "Send adjusted draft"))
HIGH_RISKS = frozenset({"high", "critical"})


def item_url(approval_id: str, action: str = "") -> str:
    """``/items/<id>``: an item's page (the id percent-encoded); with an ``action``,
    ``/items/<id>/<action>``: ``decide`` (where its decision forms post), ``challenge``
    (where ``inbox.js`` gets a decision's challenge), ``answer`` (where a question's form
    posts)."""
    return f"/items/{quote(approval_id, safe='')}" + (f"/{action}" if action else "")


def _marked_line(value: object) -> Markup:
    return marked_text(str(value), keep="")


def setup_templates(app: web.Application) -> jinja2.Environment:
    """Set ``app`` up to render the inbox's templates (from the package, autoescape on,
    undefined names an error), serve ``/static/`` from the package and add the security
    headers to every response. Returns the Jinja2 environment."""
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("gate.inbox", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        filters={"marked": _marked_line, "shown": shown},
        default_helpers=False,
    )
    app.router.add_static("/static/", STATIC, name="static", append_version=False)
    headers.install(app)
    return env


def render(
    request: web.Request, name: str, context: Mapping[str, Any], status: int = 200
) -> web.Response:
    """Template ``name`` with ``context`` over the base every page has (no session, no nav
    link, live updates from 0), answering ``status``."""
    base = {"session": None, "nav": "", "seq": 0}
    return aiohttp_jinja2.render_template(name, request, {**base, **context}, status=status)


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the waiting list."""

    item: Item
    url: str
    quorum: str
    left: str
    budget: list[str]
    risk_class: str
    approved_by: list[str]
    first_line: str = ""
    requested: str = ""
    run_id: str | None = None
    requested_by: str | None = None
    review: str | None = None
    bulkable: bool = False
    whole: Markup = Markup("")
    standing: str | None = None  # the approver's own decision counts: "You approved; …"
    followups: tuple[str, ...] = ()  # "Reminder 3", "Escalated to you" (followup_words)


def _facts(item: Item, now_ms: int, viewer: str, approved_by: Sequence[str] = ()) -> dict[str, Any]:
    pending = item.state == "pending"
    return {
        "followups": followup_words(item.followups, viewer) if pending else (),
        "item": item,
        "quorum": quorum(collected(item, approved_by), item.quorum_required),
        "approved_by": list(approved_by),
        "left": time_left(item.expires_at, now_ms) if pending else item.state,
        "budget": budget(item.budget),
        "risk_class": "high" if item.risk.lower() in HIGH_RISKS else "normal",
        "requested_by": requested_by(item),
    }


def _asked(item: Item, session: Session, seq: int) -> dict[str, Any]:
    """An item page's "Requested" (when, UTC) and "Run" (``listing.run_words``) facts, the
    ``session`` and the live updates' ``seq``."""
    return {"requested": requested_at(item), "run": run_words(item), "session": session, "seq": seq}


def signin_page(
    request: web.Request,
    *,
    challenge: str,
    csrf: str,
    error: str | None = None,
    notice: str | None = None,
) -> web.Response:
    """The sign-in page: one "Sign in with your passkey" button whose form carries the
    WebAuthn ``challenge`` (base64url) and a pre-session ``csrf`` token; ``error`` in words
    (status 401); ``notice`` why the approver was signed out (status 200)."""
    context = {"challenge": challenge, "csrf": csrf, "action": "/signin", "error": error}
    context["notice"] = notice
    return render(request, "signin.html", context, status=401 if error else 200)


def waiting_page(
    request: web.Request,
    *,
    items: Sequence[Item],
    session: Session,
    now_ms: int,
    seq: int,
    approved_by: Mapping[str, Sequence[str]] | None = None,
    mine: Mapping[str, str | None] | None = None,
) -> web.Response:
    """What waits for the signed-in approver: pending ``items`` sorted by expiry (soonest
    first), each with pipeline, step, risk, quorum progress (``approved_by``: approval id →
    identities recorded through the inbox), time left and budget; an empty state in words.
    ``seq`` is the inbox's change counter the live updates poll from. Each row also shows
    who asked (``_facts``), ``listing.row_facts`` (request time, run id) and either the whole
    draft and a bulk checkbox (``bulkable``) or its first line and why it must be opened
    (``review``). An item where the approver's own decision already counts (``mine``:
    approval id → ``decided.my_part``) is listed apart, "Waiting for others", saying so ("You
    approved; 1 more needed"), without a checkbox."""
    pending = sorted((i for i in items if i.state == "pending"), key=lambda i: i.expires_at)
    seen, parts = approved_by or {}, mine or {}
    rows, others = [], []
    for i in pending:
        facts = _facts(i, now_ms, session.identity, seen.get(i.approval_id, ()))
        part = parts.get(i.approval_id)
        if part is None:
            rows.append(Row(url=item_url(i.approval_id), **facts, **row_facts(i)))
            continue
        said = standing(part, i, collected(i, seen.get(i.approval_id, ())))[0]
        listed = {**row_facts(i), "bulkable": False, "review": None}
        others.append(Row(url=item_url(i.approval_id), **facts, **listed, standing=said))
    context = {"rows": rows, "others": others, "session": session, "nav": "waiting", "seq": seq}
    return render(request, "waiting.html", context)


def item_page(
    request: web.Request,
    *,
    item: Item,
    session: Session,
    now_ms: int,
    seq: int,
    challenges: Mapping[str, str] | None = None,
    approved_by: Sequence[str] = (),
    recorded: Sequence[DecisionRecord] = (),
) -> web.Response:
    """An approval: facts (quorum progress counts ``approved_by``, the identities whose approval
    of this revision the inbox saw recorded, and names them), the warning banner when the draft
    has marked characters, the diff from the revision before after an adjust, the draft
    (``render.draft_view``), and while pending the approve / skip (reason, required when the
    step says so) / adjust (textarea holding the current body) forms. ``challenges`` maps a verb
    to its base64url challenge; a verb without one gets ``data-challenge-url``
    (``item_url``'s ``challenge``) instead. ``recorded`` (``db.recorded_on``) says whether the
    approver's own decision already counts (then no forms, the page says so:
    ``decided.standing``) and, once an adjust resolved it, the final text and its diff from
    the draft asked (``decided.final_text``)."""
    challenges = challenges or {}
    decide, ask = item_url(item.approval_id, "decide"), item_url(item.approval_id, "challenge")
    forms = [
        {
            "verb": verb,
            "label": label,
            "action": decide,
            "challenge": challenges.get(verb, ""),
            "challenge_url": None if verb in challenges else ask,
        }
        for verb, label in VERBS
    ]
    diff = None if item.previous_body is None else diff_html(item.previous_body, item.body)
    part = my_part(session.identity, item, recorded) if item.state == "pending" else None
    count = collected(item, approved_by)
    final = final_text(item, recorded)
    context = {
        **_facts(item, now_ms, session.identity, approved_by),
        **_asked(item, session, seq),
        "mine": None if part is None else standing(part, item, count)[1],
        "final": None if final is None else draft_view(final, item.content_type),
        "final_diff": None if final is None else diff_html(item.body, final),
        "draft": draft_view(item.body, item.content_type),
        "hidden": hidden_count(item.body),  # said under the adjust box (finding 11)
        "diff": diff,
        "forms": forms,
    }
    return render(request, "item.html", context)


def _sent(submitted: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """The posted fields as lists of strings (empty when nothing was posted)."""
    listed = {k: v if isinstance(v, list) else [v] for k, v in (submitted or {}).items()}
    return {str(key): [str(value) for value in values] for key, values in listed.items()}


def question_page(
    request: web.Request,
    *,
    item: Item,
    session: Session,
    now_ms: int,
    seq: int,
    error: str | None = None,
    status: int = 200,
    submitted: Mapping[str, Any] | None = None,
    recorded: Sequence[DecisionRecord] = (),
    approved_by: Sequence[str] = (),
) -> web.Response:
    """A question from ``item.dispatch["question"]``: its text and reason
    (marked), then free text / choices / the form's fields with the schema's limits
    (``words.form_fields``); a schema the gate would not send is said, not shown. ``error``
    (an answer refused, in words) is shown above the form, answering ``status`` (422), with
    the values ``submitted`` (the posted fields, a string or a list of strings each) filled
    in again: typed texts, ticked boxes, the chosen option. The answers recorded through the
    inbox (``recorded``) are shown in words, the approver's own as "Your answer".
    ``approved_by`` is taken as ``item_page`` takes it (a question shows no quorum)."""
    question: dict[str, Any] = item.dispatch.get("question") or {}
    text = marked_text(str(question.get("text", "")))
    reason = marked_text(str(question["reason"])) if question.get("reason") else None
    options = [str(o) for o in question.get("options") or ()]
    fields, schema_error = [], None
    if question.get("response_type") == "form":
        try:
            fields = form_fields(question.get("schema"))
        except ProtocolError as exc:
            schema_error = str(exc)
    marked = sum(str(part).count(MARK_OPEN) for part in (text, reason or ""))
    marked += sum(_marked_line(o).count(MARK_OPEN) for o in options)
    context = {
        **_facts(item, now_ms, session.identity, approved_by),
        **_asked(item, session, seq),
        "text": text,
        "reason": reason,
        "response_type": question.get("response_type"),
        "options": options,
        "fields": fields,
        "schema_error": schema_error,
        "sent": _sent(submitted),
        "marked": marked,
        "action": item_url(item.approval_id, "answer"),
        "error": error,
        "answers": [
            (r.identity, _said(sent_words(r, item))) for r in recorded if r.decision == "answer"
        ],
    }
    return render(request, "question.html", context, status=status)


def _said(words: str | None) -> Markup | None:
    """What a decision sent or the reason given, for a page: escaped, hidden characters
    marked, lines kept."""
    return None if words is None else marked_text(words)


def _named(record: DecisionRecord, item: Item | None) -> dict[str, Any] | None:
    """What ``_named.html`` names a decided item by (None when the inbox lost the item)."""
    return None if item is None else {"item": item, **decided_facts(record, item)}


def recent_page(
    request: web.Request,
    *,
    decisions: Sequence[DecisionRecord],
    session: Session,
    items: Mapping[str, Item | None] | None = None,
) -> web.Response:
    """The signed-in approver's ``decisions``, newest first, each naming its item as the
    waiting list does (pipeline · step, first line, when it was requested: ``items`` maps an
    approval id to the item the inbox keeps, None when gone), with what it sent (an adjust's
    text, an answer in words: ``decided.sent_words``), the gate's answer in words and the
    reason they gave (escaped and marked, its lines kept), if any."""
    kept = items or {}
    rows = [
        {
            "record": d,
            "named": _named(d, kept.get(d.approval_id)),
            "url": item_url(d.approval_id),
            "when": datetime.fromtimestamp(d.decided_at / 1000, UTC).strftime("%Y-%m-%d %H:%M"),
            "words": answer_words(d.status, d.answer, d.decision)[1],
            "reason": _said(d.reason),
            "sent": _said(sent_words(d, kept.get(d.approval_id))),
        }
        for d in sorted(decisions, key=lambda d: d.decided_at, reverse=True)
    ]
    return render(request, "recent.html", {"rows": rows, "session": session, "nav": "recent"})


TITLES = {
    "recorded": "Decision recorded",
    "resolved": "Approval resolved",
    "superseded": "A newer revision is waiting",
    "expired": "Expired",
    "already_decided": "Already decided",
    "already_resolved": "Already resolved",
    "cancelled": "Cancelled",
    "refused": "Not recorded",
    "sent": "Sent; no answer received",
    "unreachable": "The gate could not be reached",
    "unknown": "Unknown to the gate",
    "not_sent": "Not sent",
    "rate_limited": "Not recorded: too many decisions a minute",
}


RECORDED = ("recorded", "resolved")  # the gate recorded the decision: whom it counts for is said


def message_page(
    request: web.Request,
    *,
    record: DecisionRecord,
    session: Session | None = None,
    progress: tuple[int, int] | None = None,
    item: Item | None = None,
) -> web.Response:
    """The gate's answer to the approver's decision in words (``words.answer_words``):
    recorded, resolved, superseded, expired, already decided; a link back to the item. The
    title names the outcome (``words.outcome_title``; ``progress`` is the quorum's
    (collected, required) now, None when unknown; an answer says its value), the page names
    the item decided (``item``, None when the inbox no longer has it: pipeline · step, first
    line, when it was requested) and shows the reason the approver gave (``record.reason``:
    escaped and marked, its lines kept), if any."""
    kind, sentence = answer_words(record.status, record.answer, record.decision)
    sent = sent_words(record, item)
    title = outcome_title(kind, record.decision, record.revision, progress, sent)
    context = {
        "title": title or TITLES[kind],
        "kind": kind,
        "sentence": sentence,
        "item_url": item_url(record.approval_id),
        "session": session,
        "reason": _said(record.reason),
        "named": _named(record, item),
        "behalf": on_behalf_of(record.identity, item) if item and kind in RECORDED else (),
    }
    return render(request, "message.html", context)


def plain_page(
    request: web.Request,
    *,
    title: str,
    sentence: str,
    status: int = 200,
    session: Session | None = None,
) -> web.Response:
    """A page of one ``sentence`` under ``title`` (e.g. the 404 page), answering ``status``."""
    context = {"title": title, "kind": "refused", "sentence": sentence, "item_url": None}
    context["reason"] = context["named"] = context["behalf"] = None
    return render(request, "message.html", {**context, "session": session}, status=status)
