"""Mail to approvers when a new item arrives, an escalation adds them or a reminder awaits
them (optional, off without ``mail``; ``mail.on`` says which of the three).

On the FIRST dispatch of an approval or question (not a re-send or a new revision:
``InboxDb.receive`` said ``new``) one mail per approver is queued: subject "Waiting for you:
<pipeline> · <step>"; on an escalation one per approver it ADDED ("Escalated to you: …");
on a reminder one per approver it awaits ("Reminder 2: …"). The body is the item's link and
the time left — never the draft, a question's text or a reason (mail leaves the host; the
link only opens the item, after sign-in). A worker sends the queue with aiosmtplib; a
failure is logged ``event=mail_failed`` (no body, no password) and retried 3 times. Mail is
best effort: a full queue or a restart may lose an unsent mail, never an item.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

import aiosmtplib

from gate.inbox.config import MAIL_ADDRESS, MailSection
from gate.inbox.followups import ESCALATION, NEW, REMINDER, News, first_seen
from gate.inbox.words import time_left

log = logging.getLogger(__name__)

RETRIES = 3
SAID = {  # news kind -> (subject's start, the body's first sentence)
    NEW: ("Waiting for you", "Something is waiting for your decision."),
    ESCALATION: ("Escalated to you", "An escalation added you to the approvers of this item."),
    REMINDER: ("Reminder {n}", "A reminder: this is still waiting for your decision."),
}
RETRY_DELAYS_S = (2.0, 10.0, 30.0)
QUEUE_SIZE = 1000
SEND_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Mail:
    """One mail to send: ``to`` (an address), ``identity`` (whom it is for, for the log),
    ``approval_id`` (for the log), ``subject`` and plain-text ``body``."""

    to: str
    identity: str
    approval_id: str
    subject: str
    body: str


def _header_text(value: Any) -> str:
    """A dispatch's name as header text: control characters (line breaks) dropped."""
    return "".join(ch for ch in str(value) if ch.isprintable())[:200]


def address_of(section: MailSection, identity: str) -> str | None:
    """The address ``identity`` gets mail at: ``mail.addresses[identity]``, else the
    identity itself when it is a plain e-mail address, else None (no mail)."""
    listed = section.addresses.get(identity)
    if listed is not None:
        return listed
    return identity if MAIL_ADDRESS.fullmatch(identity) else None


def mails_for(
    section: MailSection,
    base_url: str,
    approval_id: str,
    dispatch: Mapping[str, Any],
    expires_at_ms: int,
    now_ms: int,
    news: News | None = None,
) -> list[Mail]:
    """The mails telling ``news`` (default: a new item, to every approver ``dispatch``
    names) of item ``approval_id`` (a question's ``question_id``) whose ``dispatch`` names
    its ``pipeline`` and ``step``: one per identity of the news with an address (each address
    once), linking ``<base_url>/items/<approval_id>``. Reads nothing else of the dispatch: no
    draft, question text or reason goes into a mail."""
    if news is None:  # what the first dispatch of an item tells
        news = first_seen(dispatch)[1][0]
    start, sentence = SAID[news.kind]
    subject = (
        f"{start.format(n=news.n)}: {_header_text(dispatch.get('pipeline', ''))}"
        f" \u00b7 {_header_text(dispatch.get('step', ''))}"
    )
    link = f"{base_url.rstrip('/')}/items/{approval_id}"
    body = (
        f"{sentence}\n\n"
        f"Open it (you sign in with your passkey): {link}\n"
        f"Time left: {time_left(expires_at_ms, now_ms)}\n"
    )
    mails: list[Mail] = []
    seen: set[str] = set()
    for identity in news.identities:
        to = address_of(section, identity)
        if to is None:
            log.info("event=mail_no_address approval_id=%s identity=%s", approval_id, identity)
        elif to.casefold() not in seen:
            seen.add(to.casefold())
            mails.append(Mail(to, identity, approval_id, subject, body))
    return mails


@dataclass(eq=False)
class Mailer:
    """The mail queue and its worker: ``tell`` queues (never blocks, never raises),
    ``run(stop)`` sends until ``stop`` is set. ``login`` is ``(username, password)`` or
    None (never shown by repr); ``on_result`` is told of each mail sent (True) or given up
    (False)."""

    section: MailSection
    base_url: str
    login: tuple[str, str] | None = field(default=None, repr=False)
    on_result: Callable[[bool], None] = lambda sent: None
    queue: asyncio.Queue[Mail] = field(
        init=False, default_factory=lambda: asyncio.Queue(QUEUE_SIZE)
    )

    def tell(
        self, approval_id: str, dispatch: Mapping[str, Any], expires_at: int, news: News
    ) -> None:
        """Queue the mails of ``news`` when ``mail.on`` lists its kind (see ``mails_for``);
        a full queue drops the mail with ``event=mail_dropped`` (the item itself is kept:
        mail is best effort)."""
        if news.kind not in self.section.on:
            return
        now = int(time.time() * 1000)
        for mail in mails_for(
            self.section, self.base_url, approval_id, dispatch, expires_at, now, news
        ):
            try:
                self.queue.put_nowait(mail)
            except asyncio.QueueFull:
                log.warning(
                    "event=mail_dropped approval_id=%s identity=%s why=queue_full",
                    approval_id,
                    mail.identity,
                )

    async def send(self, mail: Mail) -> None:
        """Send one mail as an RFC 5322 message from ``mail.from`` (raises
        ``aiosmtplib.SMTPException`` or OSError when it cannot)."""
        section = self.section
        message = EmailMessage()
        message["From"] = section.sender
        message["To"] = mail.to
        message["Subject"] = mail.subject
        message["Auto-Submitted"] = "auto-generated"
        message.set_content(mail.body)
        await aiosmtplib.send(
            message,
            hostname=section.host,
            port=section.port,
            use_tls=section.security == "tls",
            start_tls=section.security == "starttls",
            username=self.login[0] if self.login else None,
            password=self.login[1] if self.login else None,
            timeout=SEND_TIMEOUT_S,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Send queued mails until ``stop``; each is tried once and retried ``RETRIES``
        times, waiting ``RETRY_DELAYS_S`` between (``event=mail_failed`` each time,
        ``event=mail_given_up`` at the end)."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                getting = asyncio.ensure_future(self.queue.get())
                await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    break
                await self._deliver(getting.result(), stop)
        finally:
            stopping.cancel()

    async def _deliver(self, mail: Mail, stop: asyncio.Event) -> None:
        for attempt in range(RETRIES + 1):
            try:
                await self.send(mail)
            except (aiosmtplib.SMTPException, OSError) as exc:
                log.warning(
                    "event=mail_failed approval_id=%s identity=%s attempt=%d error=%s",
                    mail.approval_id,
                    mail.identity,
                    attempt + 1,
                    type(exc).__name__,
                )
            else:
                log.info(
                    "event=mail_sent approval_id=%s identity=%s", mail.approval_id, mail.identity
                )
                self.on_result(True)
                return
            if attempt == RETRIES or stop.is_set():
                break
            delay = RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        log.warning(
            "event=mail_given_up approval_id=%s identity=%s", mail.approval_id, mail.identity
        )
        self.on_result(False)
