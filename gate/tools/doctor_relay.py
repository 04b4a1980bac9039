"""Doctor checks of the relays: reachable, their clock against ours, the dispatches they
acked (approvals' to the relay with the follow-up sends given up lately, and questions' to
the question relay for a config that asks questions)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from yarl import URL

from gate.daemon.relay_http import redact, relay_session
from gate.errors import GateError
from gate.protocol.relay_answers import refusal_reason
from gate.protocol.times import rfc3339_ms
from gate.store import inspection
from gate.store.audit_records import APPROVAL_TABLES, QUESTION_TABLES, undelivered_dispatches
from gate.tools.doctor_check import Check, counted, warn

if TYPE_CHECKING:
    from gate.store.readonly import Database

# A system clock before this release's date is certainly wrong (e.g. a board without a
# battery-backed clock that booted without NTP). Bump it with each release (CHANGELOG.md).
RELEASE_DATE = "2026-11-30"
CLOCK_WARN_S = 60.0
DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class RelayProbe:
    """What HEAD/OPTIONS on the relay URL gave: the ``method`` that got an HTTP answer with
    its ``status``, the answer's ``Date`` header as unix seconds (None if absent or
    unparsable) and ``now_s`` when it arrived; or ``error`` when neither got an answer."""

    method: str | None
    status: int | None
    date_s: float | None
    now_s: float
    elapsed_s: float
    error: str | None = None


def safe_url(url: str) -> str:
    """The URL without credentials or query (a webhook URL's query often is its secret)."""
    try:
        parsed = URL(url)
    except (TypeError, ValueError):
        return "<unparsable URL>"
    safe = str(parsed.with_user(None).with_query(None).with_fragment(None))
    return safe + ("?<redacted>" if parsed.query_string else "")


async def probe_relay(
    url: str, timeout_s: float, ca_file: Path | None, now: Callable[[], float] = time.time
) -> RelayProbe:
    """Send HEAD, then OPTIONS if HEAD got no HTTP answer, to ``url`` (redirects not
    followed, TLS verified as for dispatches). Any HTTP status counts as an answer."""
    error = "no answer"
    started = time.monotonic()
    async with relay_session(ca_file) as session:
        for method in ("HEAD", "OPTIONS"):
            try:
                async with session.request(
                    method,
                    url,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                ) as resp:
                    return RelayProbe(
                        method,
                        resp.status,
                        _date_s(resp.headers.get("Date")),
                        now(),
                        time.monotonic() - started,
                    )
            except TimeoutError:
                error = f"no answer within {timeout_s:g} s"
            except aiohttp.ClientError as exc:
                error = redact(_client_error(exc), url)
    return RelayProbe(None, None, None, now(), time.monotonic() - started, error)


def _client_error(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError) and not isinstance(
        exc, aiohttp.ClientSSLError
    ):
        return f"cannot connect to {exc.host}:{exc.port}: {exc.os_error}"
    return f"{type(exc).__name__}: {exc}"


def _date_s(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def check_relay(url: str, probe: RelayProbe, name: str = "relay") -> Check:
    """Reachable = any HTTP answer (401, 404, 405 included); 3xx warns (never followed).
    ``name``: the check's (``question relay`` for a separate question relay URL)."""
    where = safe_url(url)
    if probe.status is None:
        return Check(name, False, f"{where} unreachable: {probe.error}")
    detail = (
        f"{where} answered HTTP {probe.status} to {probe.method} in {probe.elapsed_s * 1000:.0f} ms"
    )
    if 300 <= probe.status < 400:
        return warn(
            name,
            detail + "; redirects are not followed, so a dispatch answered "
            "with a redirect is never acked",
        )
    return Check(name, True, detail)


def check_clock(now_s: float, probe: RelayProbe | None, max_skew_s: float) -> Check:
    """The clock is after this release's date and, when the relay sent a ``Date`` header,
    within CLOCK_WARN_S (warning) and ``max_skew_s`` (failure: decisions would be refused
    ``timestamp_out_of_window``) of it."""
    shown = rfc3339_ms(int(now_s * 1000))
    released = datetime.fromisoformat(RELEASE_DATE).replace(tzinfo=UTC).timestamp()
    if now_s < released:
        return Check(
            "clock",
            False,
            f"system clock says {shown}, before this release ({RELEASE_DATE}); set the clock (NTP)",
        )
    if probe is None or probe.date_s is None:
        return Check(
            "clock",
            True,
            f"{shown}, after this release ({RELEASE_DATE}); not "
            "compared with the relay's (no Date header from it)",
        )
    off = probe.now_s - probe.date_s
    direction = "ahead of" if off > 0 else "behind"
    detail = f"{shown}, {abs(off):.0f} s {direction} the relay's Date header"
    if abs(off) > max_skew_s:
        return Check(
            "clock",
            False,
            detail + f", more than relay.security.max_skew "
            f"({max_skew_s:g} s): signed messages would be refused; fix NTP",
        )
    if abs(off) > CLOCK_WARN_S:
        return warn("clock", detail + f" (more than {CLOCK_WARN_S:g} s; check NTP)")
    return Check("clock", True, detail)


# what an un-acked dispatch's status most often means, for the dispatch check's hint
_DISPATCH_HINTS = {
    401: "the relay refused the gate's signature: do the relay and relay.secret_env hold "
    "the same secret?",
    403: "the relay refused the gate: its secret, or its allow-list?",
    404: "is relay.url the relay's dispatch path?",
    405: "is relay.url the relay's dispatch path (it must take POST)?",
}
# what the relay's own reason (hitl/v0 refusal reasons, SPEC §2) says, which beats a guess
# from the status: a relay whose clock is off refuses with 401 too
_REASON_HINTS = {
    "timestamp_out_of_window": "the relay's clock and this host's differ by more than the "
    "relay accepts, 300 s in hitl/v0: set both clocks by NTP; the "
    "secret is not the cause",
    "signature_mismatch": "the relay holds a different secret from relay.secret_env: give "
    "both the same secret",
    "signature_malformed": "the relay could not read the gate's X-Draftcat-Signature header: "
    "does something between them rewrite it?",
    "signature_missing": "the relay got no X-Draftcat-Signature header: does something "
    "between them drop it?",
}


def dispatch_hint(error: str | None) -> str:
    """The likely cause of a dispatch's ``last_error`` for an operator, or "": from the
    relay's reason when it gave a known one, else from its HTTP status."""
    refused = refusal_reason(error)
    if refused is None:
        return ""
    status, reason = refused
    return _REASON_HINTS.get(reason or "") or _DISPATCH_HINTS.get(status, "")


# per kind of request: its dispatch check's name, its tables, the relay it goes to, and the
# label of the check when there is no database yet
_DISPATCHES = {
    "approval": ("dispatch", APPROVAL_TABLES, "relay", "SKIP"),
    "question": ("question dispatch", QUESTION_TABLES, "question relay", ""),
}


def check_dispatch(path: Database, kind: str = "approval", now_ms: int | None = None) -> Check:
    """Pending requests of ``kind`` (approval, question) whose dispatch (a question's: its
    current version) the relay of that kind never acked: reachable is not enough if it
    refuses what the gate sends (a different secret answers 401 to every dispatch, a clock
    off by minutes too: the relay's reason, when it gives one, tells them apart). With
    ``now_ms`` (unix ms), also the follow-up sends (notices, reminders, escalations)
    given up in the 24 h before it: a WARN naming how many when nothing else fails. A
    database not created yet has none to check. ``path`` is the SQLite file or the
    PostgreSQL database (``PgTarget``)."""
    name, tables, relay, level = _DISPATCHES[kind]
    if isinstance(path, Path) and not path.exists():
        return Check(name, True, "no database yet", level)
    try:
        count, error = undelivered_dispatches(path, tables)
        given_up = None if now_ms is None else followup_failures(path, now_ms)
    except GateError as exc:
        return Check(name, False, exc.message)
    if count == 0:
        acked = f"every pending {kind}'s dispatch was acked"
        return warn(name, f"{acked}; but {given_up}") if given_up else Check(name, True, acked)
    hint = dispatch_hint(error)
    nouns = kind if count == 1 else f"{kind}s"
    detail = f"{count} pending {nouns} not delivered to the {relay}; latest error: {error}"
    detail += (f" ({hint})" if hint else "") + (f"; and {given_up}" if given_up else "")
    return Check(name, False, detail)


def followup_failures(path: Database, now_ms: int) -> str | None:
    """What was given up in the last 24 h before ``now_ms`` (unix ms) among the follow-up
    sends of the database at ``path`` (``3 follow-up sends given up in the last 24 h (2
    notices, 1 reminder); latest error: ...``), or None when nothing was. Raises GateError
    when the database cannot be read."""
    counts, error = inspection.failed_followups(path, now_ms - DAY_MS)
    total = sum(counts.values())
    if total == 0:
        return None
    # each kind (reminder, escalation, notice: the table allows no other) is its own noun
    kinds = ", ".join(counted(counts[kind], kind, f"{kind}s") for kind in sorted(counts))
    return (
        f"{counted(total, 'follow-up send', 'follow-up sends')} given up in the last 24 h "
        f"({kinds}); latest error: {error}"
    )
