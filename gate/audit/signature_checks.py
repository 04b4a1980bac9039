"""Re-verify every approver signature an audit log holds (proof that travels),
with nothing but the log: ``audit verify`` runs it on the database and on an export.

Walking the verified entries in seq order, each signed ``decision`` entry (one with a
``credential_id``) must name a credential that

- an ``approver_credential_enrolled`` entry before it enrolled (that entry carries the key),
  and no ``approver_credential_revoked`` entry before it revoked;
- belongs to the decision's ``operator_id`` (a delegate's own id for a delegate's decision);
- signed ``challenge_for(assertion, decision_digest(...))``, the digest rebuilt from the
  entry (approval id, revision, nonce, payload hash, decision, the reason as logged or
  ``reason_sha256``, ``adjust_text_sha256``): Ed25519 with ``verify_ed25519``; a passkey
  with ``verify_webauthn`` against the ``rp_id`` its enrolment logged, its client data's
  own origin (which must be https, or http on localhost: the allowed origins are config,
  not log) and its counter, which must increase in log order per credential from the
  ``sign_count`` enrolled (both zero allowed: authenticators without counters), or stay
  equal for the very batch assertion that set it (the same authenticator data, client data
  and signature: another item of that batch).

And a decision on an approval whose ``created`` entry says ``approver_signature:
required`` must be signed, but for a policy's deny (a policy may only deny there).

Then the approver_credentials table against the credentials the verified log enrolled and
revoked (``credentials_problem``): the gate reads the table when it checks a decision's
signature, so a key swapped, moved to another operator, un-revoked, added or deleted by
whoever can write the database file is named by ``audit verify -c`` (like a decision row
edited, ``gate.audit.records``). Pure: reads nothing but the rows it is given.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gate.audit import chain as audit
from gate.audit.credential_entries import CREDENTIAL_ENROLLED, CREDENTIAL_REVOKED
from gate.audit.entries import CREATED, DECISION, POLICY_OPERATOR
from gate.protocol.approver_signature import (
    ApproverAssertion,
    challenge_for,
    decision_digest_of_hashes,
    parse_approver_assertion,
    sha256_hex,
    signature_invalid,
    unb64,
    verify_ed25519,
)
from gate.protocol.approver_webauthn import (
    assertion_sha256,
    counter_refused,
    verify_webauthn,
)
from gate.protocol.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class SignedDecision:
    """One signed decision of the log, re-verified: entry ``seq``, ``approval_id``,
    ``revision``, ``payload_hash``, ``decision``, ``operator_id``, ``credential_id``,
    credential ``type`` (ed25519|webauthn, None when no enrolment names it) and ``problem``
    (None: the signature verified; else why not)."""

    seq: int
    approval_id: str | None
    revision: Any
    payload_hash: Any
    decision: Any
    operator_id: Any
    credential_id: str
    type: str | None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """A decision whose signature does not hold: entry ``seq``, its approval, operator and
    credential (None for an unsigned decision on a ``required`` step) and ``reason``."""

    seq: int
    approval_id: str | None
    operator_id: Any
    credential_id: str | None
    reason: str

    def line(self) -> str:
        """The one-line finding ``audit verify`` prints."""
        credential = self.credential_id if self.credential_id is not None else "none"
        return (
            f"entry {self.seq}: approval {self.approval_id}, operator {self.operator_id}, "
            f"credential {credential}: {self.reason}"
        )


@dataclass(slots=True)
class SignatureReport:
    """What ``check`` found: every signed decision (``signed``, in log order) and the
    ``findings`` (signatures that do not hold, unsigned decisions on required steps)."""

    signed: list[SignedDecision] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # every credential the log enrolled, as the log leaves it (``credentials_problem``
    # compares the approver_credentials table with it)
    credentials: dict[str, LoggedCredential] = field(default_factory=dict)


@dataclass(slots=True)
class LoggedCredential:
    """A credential as the log holds it: its enrolment entry's ``data``, the seq of the entry
    that revoked it (None: in force), its last passkey ``counter`` and the batch assertion
    that set it (``counter_assertion``, SHA-256 hex; None for a single decision)."""

    data: Mapping[str, Any]
    revoked_seq: int | None = None
    counter: int = 0
    counter_assertion: str | None = None  # the batch assertion that set ``counter``


def check(rows: Iterable[audit.AuditRow]) -> SignatureReport:
    """Re-verify every signed decision among ``rows`` (ascending seq, already verified by the
    chain check: give only those) and find unsigned decisions on ``required`` steps (module
    docstring). Never raises for what a row holds: a value the gate never writes is a
    finding."""
    report = SignatureReport()
    credentials = report.credentials
    modes: dict[str | None, Any] = {}
    for row in rows:
        if row.kind not in (CREATED, DECISION, CREDENTIAL_ENROLLED, CREDENTIAL_REVOKED):
            continue
        if not _may_matter(row, modes):  # most entries: one substring scan, no JSON parse
            continue
        data = row.data
        if row.kind == CREATED:
            if data.get("approver_signature") is not None:  # few: keep only those
                modes[row.approval_id] = data.get("approver_signature")
        elif row.kind == CREDENTIAL_ENROLLED:
            credential_id = data.get("credential_id")
            if isinstance(credential_id, str):
                counter = data.get("sign_count")
                credentials[credential_id] = LoggedCredential(
                    data, None, counter if isinstance(counter, int) else 0
                )
        elif row.kind == CREDENTIAL_REVOKED:
            known = credentials.get(str(data.get("credential_id")))
            if known is not None and known.revoked_seq is None:
                known.revoked_seq = row.seq
        elif data.get("credential_id") is not None or "assertion" in data:
            report.signed.append(_signed(row, data, credentials, report.findings))
        elif modes.get(row.approval_id) == "required" and not _policy_skip(data):
            report.findings.append(
                Finding(
                    row.seq,
                    row.approval_id,
                    data.get("operator_id"),
                    None,
                    "an unsigned decision on an approval whose step required the "
                    "approver's signature",
                )
            )
    return report


def _policy_skip(data: Mapping[str, Any]) -> bool:
    """A policy's deny (operator 0, ``by: policy:<rule id>``, decision skip): it
    needs no signature on a ``required`` step, where a policy may only deny."""
    by = data.get("by")
    return (
        data.get("operator_id") == POLICY_OPERATOR
        and data.get("decision") == "skip"
        and isinstance(by, str)
        and by.startswith("policy:")
    )


def _may_matter(row: audit.AuditRow, modes: Mapping[str | None, Any]) -> bool:
    """False for a ``created`` entry of an unsigned step and an unsigned ``decision`` on an
    approval whose ``created`` said nothing: the entry text is canonical JSON, so a key
    that is there appears as ``"name":`` (a text holding that string is merely parsed)."""
    if row.kind == CREATED:
        return '"approver_signature":' in row.entry
    if row.kind == DECISION:
        return (
            row.approval_id in modes
            or '"credential_id":' in row.entry
            or '"assertion":' in row.entry
        )
    return True


def _signed(
    row: audit.AuditRow,
    data: Mapping[str, Any],
    credentials: dict[str, LoggedCredential],
    findings: list[Finding],
) -> SignedDecision:
    """Re-verify one signed decision entry; a failure is appended to ``findings``."""
    credential_id = str(data.get("credential_id"))
    known = credentials.get(credential_id)
    problem = _problem(row, data, credential_id, known)
    if problem is not None:
        findings.append(
            Finding(row.seq, row.approval_id, data.get("operator_id"), credential_id, problem)
        )
    return SignedDecision(
        row.seq,
        row.approval_id,
        data.get("revision"),
        data.get("payload_hash"),
        data.get("decision"),
        data.get("operator_id"),
        credential_id,
        None if known is None else str(known.data.get("type")),
        problem,
    )


def _problem(
    row: audit.AuditRow,
    data: Mapping[str, Any],
    credential_id: str,
    known: LoggedCredential | None,
) -> str | None:
    """Why a signed decision entry's signature does not hold, else None."""
    if known is None:
        return "no approver_credential_enrolled entry before it enrols this credential"
    if known.revoked_seq is not None:
        return f"the credential was revoked by entry {known.revoked_seq}, before this decision"
    if known.data.get("operator_id") != data.get("operator_id"):
        return (
            f"the credential belongs to operator {known.data.get('operator_id')}, "
            "not to the operator who decided"
        )
    if data.get("reason") is not None and data.get("reason_sha256") is not None:
        return "the entry logs both a reason and reason_sha256 (the gate writes one)"
    try:
        assertion = parse_approver_assertion(data.get("assertion"))
        if assertion is None or assertion.credential_id_b64 != credential_id:
            return "the logged assertion does not name the entry's credential"
        reason = data.get("reason")
        digest = decision_digest_of_hashes(
            approval_id=str(row.approval_id),
            revision=data["revision"],
            nonce=data["nonce"],
            payload_hash=data["payload_hash"],
            decision=data["decision"],
            adjust_text_sha256=data.get("adjust_text_sha256"),
            reason_sha256=data.get("reason_sha256") if reason is None else sha256_hex(str(reason)),
        )
        challenge = challenge_for(assertion, digest)
        if known.data.get("type") == "ed25519":
            verify_ed25519(unb64(str(known.data["public_key"])), assertion, challenge)
            return None
        if known.data.get("type") != "webauthn":
            return f"the enrolment names credential type {known.data.get('type')!r}"
        origin = _client_origin(assertion.client_data_json)
        new = verify_webauthn(
            unb64(str(known.data["public_key"])),
            0,  # the counter rule below, as the gate applies it
            assertion,
            challenge,
            str(known.data.get("rp_id")),
            (origin,),
        )
        return _counter_problem(known, assertion, new)
    except ProtocolError as exc:
        detail = exc.extra.get("detail") if exc.extra else None
        return f"the approver's signature does not verify ({detail or exc.code}: {exc.message})"
    except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
        return f"the entry or its enrolment holds a value the gate never writes ({exc})"


def _counter_problem(known: LoggedCredential, assertion: ApproverAssertion, new: int) -> str | None:
    """The counter rule (``counter_refused``) in log order, against the credential's last
    counter and the batch assertion that set it; ``known`` then takes ``new`` (and, for a
    batch, its assertion's hash)."""
    if counter_refused(assertion, known.counter, new, lambda: known.counter_assertion):
        return (
            "the approver's signature does not verify (counter_went_backwards: the "
            "authenticator's counter did not increase: a cloned authenticator?)"
        )
    if new != known.counter:
        known.counter, known.counter_assertion = new, assertion_sha256(assertion)
    return None


def _client_origin(client_data_json: bytes) -> str:
    """The origin in a passkey's client data, after checking it is one a browser could have
    signed for a gate: https, or http on localhost. Raises 403 ``approver_signature_invalid``
    / ``origin_mismatch`` otherwise, ValueError for client data without an origin."""
    origin = json.loads(client_data_json).get("origin")
    if not isinstance(origin, str):
        raise ValueError("client data holds no origin")
    parts = urlsplit(origin)
    if parts.scheme == "https" or (parts.scheme == "http" and parts.hostname == "localhost"):
        return origin
    raise signature_invalid(
        "origin_mismatch", f"client data origin {origin!r} is neither https nor http://localhost"
    )


def credentials_problem(
    stored: Iterable[tuple[Any, ...]],
    logged: Mapping[str, LoggedCredential],
    newer: set[str],
) -> str | None:
    """The first way the ``stored`` rows ``(credential_id, operator_id, type, public_key,
    revoked_at)`` disagree with the credentials the verified log enrolled and revoked
    (``logged``), else None; ids in ``newer`` (entries after the verified part) are skipped.
    The answer names the credential: ``credential ID: why``."""
    seen: set[str] = set()
    for credential_id, operator_id, kind, public_key, revoked_at in stored:
        seen.add(str(credential_id))
        if credential_id in newer:
            continue
        known = logged.get(str(credential_id))
        where = f"credential {credential_id}"
        if known is None:
            return f"{where}: in the table but never enrolled in the audit log"
        data = known.data
        if operator_id != data.get("operator_id"):
            return (
                f"{where}: operator_id is {operator_id!r} in the table but "
                f"{data.get('operator_id')!r} in its enrolment entry"
            )
        if kind != data.get("type"):
            return f"{where}: type is {kind!r} in the table but {data.get('type')!r} logged"
        if public_key != data.get("public_key"):
            return f"{where}: public_key differs from its enrolment entry"
        if revoked_at is None and known.revoked_seq is not None:
            return f"{where}: in force in the table but revoked by audit entry {known.revoked_seq}"
        if revoked_at is not None and known.revoked_seq is None:
            return f"{where}: revoked in the table but no audit entry revokes it"
    for credential_id in sorted(set(logged) - seen - newer):
        return f"credential {credential_id}: enrolled in the audit log but missing from the table"
    return None
