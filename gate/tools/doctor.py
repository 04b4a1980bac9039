"""``hitl-gate doctor``: health checks of a deployment, one PASS/WARN/FAIL/SKIP line each.

Checks, in order: the config, its secret variables, its Ed25519 key files, the database
(``PRAGMA integrity_check``, schema version), the audit chain (hashes, receipts, signatures),
the relay URL (reachable: any HTTP answer to HEAD or OPTIONS), the dispatches, for a config
that asks questions a separate question relay URL and the questions' dispatches,
and the clock (after this release's date, and close to the relay's ``Date`` header).
Nothing is written: the database is opened read-only and nothing is dispatched.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

import aiohttp
from yarl import URL

from gate.audit.spans import matches
from gate.audit.verify import verify_database
from gate.config import (
    Config,
    ReceiptsConfig,
    Secrets,
    load_config,
    load_secrets,
    read_receipt_key,
)
from gate.config.followups import ended_delegations
from gate.config.policy import policy_notes
from gate.config.secrets import _secret_vars
from gate.daemon.dispatch import redact
from gate.errors import ConfigError, GateError
from gate.protocol.envelope import rfc3339_ms
from gate.protocol.relay_answers import refusal_reason
from gate.store import inspection as maintenance
from gate.tools.doctor_followups import followup_failures, followups_summary
from gate.tools.doctor_passkeys import passkeys_findings, passkeys_summary
from gate.tools.doctor_questions import (
    asks_questions,
    check_question_dispatch,
    separate_question_url,
)
from gate.tools.doctor_signers import signers_findings
from gate.trust.keys import ReceiptKeys, load_receipt_keys

# A system clock before this release's date is certainly wrong (e.g. a board without a
# battery-backed clock that booted without NTP). Bump it with each release (CHANGELOG.md).
RELEASE_DATE = "2026-11-30"
CLOCK_WARN_S = 60.0
MAX_ERRORS_SHOWN = 3


@dataclass(frozen=True, slots=True)
class Check:
    """One check's result: ``ok`` False fails the run (exit 1). ``level`` "WARN" (ok, but
    look at it) or "SKIP" (not run, because of an earlier check or nothing to check yet)
    overrides the PASS/FAIL label."""

    name: str
    ok: bool
    detail: str
    level: str = ""

    @property
    def label(self) -> str:
        """PASS, FAIL, WARN or SKIP."""
        return self.level or ("PASS" if self.ok else "FAIL")

    def line(self) -> str:
        """The report line: ``LABEL name: detail``."""
        return f"{self.label} {self.name}: {self.detail}"


def _warn(name: str, detail: str) -> Check:
    return Check(name, True, detail, "WARN")


def _skip(name: str, detail: str, ok: bool = True) -> Check:
    return Check(name, ok, detail, "SKIP")


def _errors(errors: list[str], hint: str = "") -> str:
    shown = "; ".join(errors[:MAX_ERRORS_SHOWN])
    more = len(errors) - MAX_ERRORS_SHOWN
    return shown + (f"; and {more} more" if more > 0 else "") + hint


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


def check_config(path: str) -> tuple[Check, Config | None]:
    """Load and validate the config file (as ``check-config``, without its secrets)."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        hint = f" (hitl-gate check-config -c {path} lists all)"
        return Check("config", False, _errors(exc.errors, hint)), None
    steps = sum(len(p.steps) for p in config.pipelines)
    detail = (
        f"{config.source}: {len(config.pipelines)} pipelines, "
        f"{steps} steps, {len(config.relay.operators)} operators"
    )
    notes = policy_notes(config)  # approve rules standing in for a quorum
    if notes:
        detail += "; " + "; ".join(notes)
    ended = ended_delegations(config.delegations, int(time.time() * 1000))
    if ended:  # ignored by the gate; check-config refuses the file until they are removed
        return _warn("config", f"{detail}; but {'; '.join(ended)}"), config
    return Check("config", True, detail), config


def check_secrets(config: Config, environ: Mapping[str, str]) -> tuple[Check, Secrets | None]:
    """Every secret the config names is set, clean, at least 16 bytes and distinct
    (``load_secrets``); WARN when one is shorter than 32 bytes or others may read the
    credentials directory."""
    try:
        secrets = load_secrets(config, environ)
    except ConfigError as exc:
        return Check("secrets", False, _errors(exc.errors)), None
    names = [name for _, name in _secret_vars(config)]
    detail = ", ".join(names) + " set and distinct"
    exposed = _exposed_credentials(environ.get("CREDENTIALS_DIRECTORY"))
    concerns = [*secrets.warnings, *([exposed] if exposed else [])]
    if concerns:
        return _warn("secrets", f"{detail}; but {'; '.join(concerns)}"), secrets
    return Check("secrets", True, detail), secrets


def _exposed_credentials(directory: str | None) -> str:
    """What in a credentials directory others may read (docs/operating.md: mode 0700 and
    0600 or stricter, as systemd's ``LoadCredential=`` makes them), or ""."""
    if not directory or not os.path.isdir(directory):
        return ""
    loose = []
    for path in [Path(directory), *sorted(Path(directory).iterdir())]:
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            continue
        if mode & 0o077:
            loose.append(f"{path} is mode {mode:04o}")
    if not loose:
        return ""
    return (
        ", ".join(loose[:3])
        + (" and more" if len(loose) > 3 else "")
        + (": readable by other users (chmod go-rwx)")
    )


def check_keys(config: Config) -> tuple[Check, ReceiptKeys | None]:
    """The Ed25519 signing key and trusted public keys load (``receipts.*``)."""
    try:
        keys = load_receipt_keys(config.receipts)
    except ConfigError as exc:
        return Check("keys", False, _errors(exc.errors)), None
    if keys.signer is None:
        detail = "no signing key (receipts.signing_key_file): HMAC receipts only"
    else:
        detail = f"signing key {keys.signer.key_id}"
    if config.receipts.trusted_public_keys:
        detail += f", {len(config.receipts.trusted_public_keys)} trusted public keys"
    return Check("keys", True, detail), keys


def check_database(path: Path) -> Check:
    """The database file passes ``PRAGMA integrity_check`` and has a schema this code knows;
    a missing file is a warning when the gate can create it on first start."""
    if not path.exists():
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if os.access(parent, os.W_OK | os.X_OK):
            return _warn(
                "database", f"{path} does not exist yet; the gate creates it on first start"
            )
        return Check("database", False, f"{path} does not exist and {parent} is not writable")
    try:
        info = maintenance.inspect(path)
    except GateError as exc:
        return Check("database", False, exc.message)
    if info.problems:
        return Check("database", False, f"{path}: integrity_check: " + _errors(list(info.problems)))
    if info.schema_version > info.code_schema_version:
        return Check(
            "database",
            False,
            f"{path}: schema {info.schema_version} is newer than "
            f"this hitl-gate's ({info.code_schema_version}); upgrade hitl-gate",
        )
    counts = (
        f"{info.approvals} approvals, {info.audit_entries} audit entries"
        if info.approvals is not None and info.audit_entries is not None
        else "no tables"
    )
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        return _warn(
            "database",
            f"{path} is readable by others (mode {mode:04o}; it holds "
            f"drafts, final bodies and permits): chmod 600 {path}",
        )
    if info.schema_version < info.code_schema_version:
        return _warn(
            "database",
            f"{path}: integrity ok, schema {info.schema_version} (the "
            f"gate migrates it to {info.code_schema_version} on start), {counts}",
        )
    return Check("database", True, f"{path}: integrity ok, schema {info.schema_version}, {counts}")


def check_audit(
    path: Path,
    receipt_key: bytes | None,
    keys: ReceiptKeys | None,
    previous_key: bytes | None = None,
    receipts: ReceiptsConfig | None = None,
) -> Check:
    """Recompute the audit chain, its receipts (with the receipt key, and the previous one of
    a rotation: each entry with the key of its span, ``gate.audit.spans``) and its
    signatures (when the config names Ed25519 keys), then compare the approval records with
    it: the one check ``hitl-gate audit verify -c`` runs (``gate.audit.verify.
    verify_database``), formatted as the doctor's. A newest entry that neither key verifies
    FAILs naming the settings (the gate would refuse to start); one the previous key
    verifies WARNs (the gate writes the rotation entry at its next start). Spans before the first
    one whose key is configured (keys retired by earlier rotations) are checked for the
    chain only, and said so. ``receipts`` (the config's section) names the variables."""
    if not path.exists():
        return _skip("audit", "no database yet")
    try:
        newest = maintenance.newest_audit_row(path)
    except GateError as exc:
        return Check("audit", False, exc.message)
    newest = newest if receipt_key is not None else None
    public = keys.public if keys is not None and keys.public else None
    given = tuple(k for k in (receipt_key, previous_key) if k is not None)
    pending = False
    if newest is not None and not matches(receipt_key or b"", newest.entry_hash, newest.receipt):
        pending = previous_key is not None and matches(
            previous_key, newest.entry_hash, newest.receipt
        )
        if not pending:
            return Check("audit", False, _key_mismatch(newest.seq, receipts))
    try:  # the one check audit verify -c runs too (gate.audit.verify)
        report = verify_database(path, given, public_keys=public, leading_unknown=True)
    except GateError as exc:
        return Check("audit", False, exc.message)
    result = report.chain
    if result.wrong_key:
        named = _key_names(receipts)
        # no span found although the newest entry verifies with a configured key (checked
        # above): the entry that began the newest span lost its receipt
        caught = (
            f"; yet the newest entry (seq {newest.seq}) verifies with {named}: the "
            "receipt of the entry that began its span (entry 1 or a "
            "receipt_key_rotated entry) was changed"
            if newest is not None and result.first_bad_seq == newest.seq
            else ""
        )
        return Check(
            "audit", False, f"entry {result.first_bad_seq}: {result.reason}{caught} (check {named})"
        )
    if not result.ok:
        return Check(
            "audit",
            False,
            f"TAMPERED: entry {result.first_bad_seq}: {result.reason} "
            f"({result.checked} entries before it verified)",
        )
    if report.anchor is not None:
        anchor = report.anchor
        return Check(
            "audit", False, f"TAMPERED: entry {anchor.seq}: {anchor.reason} ({anchor.source})"
        )
    records = report.records
    assert records is not None  # verify_database checks them unless told not to
    if records.problem is not None:
        return Check(
            "audit",
            False,
            f"TAMPERED: approval {records.problem[0]}: "
            f"{records.problem[1]}; the audit log itself verified",
        )
    asked = report.questions
    if asked is not None and asked.problem is not None:
        return Check(
            "audit",
            False,
            f"TAMPERED: question {asked.problem[0]}: {asked.problem[1]}; the audit log "
            "itself verified",
        )
    signed = report.signatures
    if signed is not None and signed.findings:
        return Check("audit", False, f"TAMPERED: approver signature: {signed.findings[0].line()}")
    if report.credentials is not None:
        return Check(
            "audit", False, f"TAMPERED: {report.credentials}; the audit log itself verified"
        )
    what = ["chain"] + ["receipts"] * (receipt_key is not None) + ["signatures"] * bool(public)
    detail = (
        f"{result.checked} entries, {', '.join(what)} intact; {records.checked} approvals match it"
    )
    if asked is not None and asked.checked:
        detail += f", {asked.checked} questions too"
    if receipt_key is None:
        detail += " (receipts not checked: no receipt key)"
    elif result.spans and result.spans[0][0] > 1:
        first = result.spans[0][0]
        detail += (
            f" (receipts from entry {first}: entries 1-{first - 1} are receipted with "
            "a key retired by a rotation, which the config no longer names; audit "
            "verify --key-env checks them with it)"
        )
    if pending:
        previous = receipts.previous_key_env if receipts is not None else "the previous key"
        return _warn(
            "audit",
            f"{detail}; the newest entries are receipted with "
            f"receipts.previous_key_env's key ({previous}): the gate writes the "
            "receipt_key_rotated entry at its next start",
        )
    return Check("audit", True, detail)


def _key_names(receipts: ReceiptsConfig | None) -> str:
    if receipts is None:
        return "receipts.key_env"
    named = f"receipts.key_env ({receipts.key_env})"
    if receipts.previous_key_env is not None:
        named += f" and receipts.previous_key_env ({receipts.previous_key_env})"
    return named


def _key_mismatch(seq: int, receipts: ReceiptsConfig | None) -> str:
    """The doctor's words for a newest entry that no configured receipt key verifies."""
    current = f" ({receipts.key_env})" if receipts is not None else ""
    previous = (
        f" nor with receipts.previous_key_env ({receipts.previous_key_env})"
        if receipts is not None and receipts.previous_key_env is not None
        else ""
    )
    return (
        f"the newest audit entry's receipt (seq {seq}) does not verify with "
        f"receipts.key_env{current}{previous}, so the gate refuses to start: set "
        "receipts.key_env to the variable holding the key this log was written with, or, "
        "to rotate the key, receipts.previous_key_env to that variable"
    )


async def probe_relay(
    url: str, timeout_s: float, ca_file: Path | None, now: Callable[[], float] = time.time
) -> RelayProbe:
    """Send HEAD, then OPTIONS if HEAD got no HTTP answer, to ``url`` (redirects not
    followed, TLS verified as for dispatches). Any HTTP status counts as an answer."""
    from gate.daemon.dispatch import relay_session

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


def check_relay(url: str, probe: RelayProbe) -> Check:
    """Reachable = any HTTP answer (401, 404, 405 included); 3xx warns (never followed)."""
    where = safe_url(url)
    if probe.status is None:
        return Check("relay", False, f"{where} unreachable: {probe.error}")
    detail = (
        f"{where} answered HTTP {probe.status} to {probe.method} in {probe.elapsed_s * 1000:.0f} ms"
    )
    if 300 <= probe.status < 400:
        return _warn(
            "relay",
            detail + "; redirects are not followed, so a dispatch answered "
            "with a redirect is never acked",
        )
    return Check("relay", True, detail)


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
        return _warn("clock", detail + f" (more than {CLOCK_WARN_S:g} s; check NTP)")
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


def check_dispatch(path: Path, now_ms: int | None = None) -> Check:
    """Pending approvals whose dispatch the relay never acked: reachable is not enough if it
    refuses what the gate sends (a different secret answers 401 to every dispatch, a clock
    off by minutes too: the relay's reason, when it gives one, tells them apart). With
    ``now_ms`` (unix ms), also the follow-up sends (notices, reminders, escalations)
    given up in the 24 h before it: a WARN naming how many when nothing else fails."""
    if not path.exists():
        return _skip("dispatch", "no database yet")
    try:
        count, error = maintenance.undelivered_dispatches(path)
        given_up = None if now_ms is None else followup_failures(path, now_ms)
    except GateError as exc:
        return Check("dispatch", False, exc.message)
    if count == 0:
        if given_up is not None:
            return _warn("dispatch", f"every pending approval's dispatch was acked; but {given_up}")
        return Check("dispatch", True, "every pending approval's dispatch was acked")
    hint = dispatch_hint(error)
    noun = "approval" if count == 1 else "approvals"
    return Check(
        "dispatch",
        False,
        f"{count} pending {noun} not delivered to the relay; "
        f"latest error: {error}"
        + (f" ({hint})" if hint else "")
        + (f"; and {given_up}" if given_up is not None else ""),
    )


def _passkeys(config: Config, path: Path, now_ms: int) -> list[Check]:
    level, detail = passkeys_summary(config, path)
    line = Check("passkeys", level != "FAIL", detail, "" if level == "FAIL" else level)
    found = [*passkeys_findings(config, path), *signers_findings(config, path, now_ms)]
    return [line, *(_warn("passkeys", finding) for finding in found)]


async def run_checks(
    config_path: str, environ: Mapping[str, str], now: Callable[[], float] = time.time
) -> list[Check]:
    """Run every check against the config at ``config_path`` and the secrets in ``environ``;
    return them in report order. Checks needing a valid config are SKIP (not ok) without one."""
    config_check, config = check_config(config_path)
    if config is None:
        return [config_check] + [
            _skip(name, "needs a valid config", ok=False)
            for name in (
                "followups",
                "secrets",
                "keys",
                "database",
                "audit",
                "relay",
                "dispatch",
                "passkeys",
                "clock",
            )
        ]
    secrets_check, secrets = check_secrets(config, environ)
    keys_check, keys = check_keys(config)
    path = config.storage.path
    database_check = await asyncio.to_thread(check_database, path)
    # the receipt key is checked on its own: other secrets missing do not hide it
    receipt_key = secrets.receipt_key if secrets is not None else read_receipt_key(config, environ)
    previous_key = (
        secrets.previous_receipt_key
        if secrets is not None
        else read_receipt_key(config, environ, previous=True)
    )
    audit_check = await asyncio.to_thread(
        check_audit, path, receipt_key, keys, previous_key, config.receipts
    )
    probe = await probe_relay(
        config.relay.url, config.relay.dispatch_timeout, config.relay.ca_file, now
    )
    now_ms = int(now() * 1000)
    asked: list[Check] = []  # only for a config that asks questions
    if asks_questions(config):
        url = separate_question_url(config)
        if url is not None:
            found = check_relay(
                url,
                await probe_relay(url, config.relay.dispatch_timeout, config.relay.ca_file, now),
            )
            asked.append(replace(found, name="question relay"))
        ok, detail = await asyncio.to_thread(check_question_dispatch, path, dispatch_hint)
        asked.append(Check("question dispatch", ok, detail))
    return [
        config_check,
        Check("followups", True, followups_summary(config, now_ms, safe_url)),
        secrets_check,
        keys_check,
        database_check,
        audit_check,
        check_relay(config.relay.url, probe),
        await asyncio.to_thread(check_dispatch, path, now_ms),
        *asked,
        *_passkeys(config, path, now_ms),
        check_clock(now(), probe, config.relay.security.max_skew),
    ]
