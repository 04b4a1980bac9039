"""The gate's stored values, as the store returns them: an approval with its revisions,
decisions and dispatches. Frozen values; stdlib only (the store depends on this module)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

# a JSON object as stored (budget context, receipt objects): passed through unchanged
JsonObject = dict[str, Any]


def field_values(cls: type[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """A function returning a ``cls`` value's fields in their order, as a tuple: what
    ``dataclasses.astuple`` gives for these flat values (of two fields or more), without its
    deep copy of each field (the store binds them as a statement's parameters, once per row
    written)."""
    return attrgetter(*(field.name for field in fields(cls)))


@dataclass(frozen=True, slots=True)
class Revision:
    """One revision of the draft (table ``revisions``): ``body`` and its ``payload_hash``
    (``sha256:<hex>``), the ``nonce`` a decision on it must carry (32 hex), ``created_at``
    (unix ms, UTC) and ``created_by``: the operator id whose adjust made it (None for
    revision 1)."""

    revision: int
    body: str
    payload_hash: str
    nonce: str
    created_at: int
    created_by: int | None


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """An accepted decision (table ``decisions``, SPEC §2): the operator it counted for,
    the ``identity``, ``display`` and ``channel`` as the relay sent them, ``decision``
    (approve|skip|adjust), the ``payload_hash`` it answered, ``adjust_text``,
    ``decided_at`` (RFC 3339 text as sent), ``recorded_at`` (unix ms, the gate's clock) and
    the ``reason`` (None when none, or only White_Space, was sent) and
    ``on_behalf_of``: the principal's operator id when a delegate decided,
    else None; ``credential_id``: the approver credential whose signature it carried, else None."""

    revision: int
    operator_id: int
    identity: str
    display: str | None
    channel: str | None
    decision: str
    payload_hash: str
    adjust_text: str | None
    decided_at: str
    recorded_at: int
    reason: str | None = None
    on_behalf_of: int | None = None
    credential_id: str | None = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """The outbox row of one revision's dispatch: ``attempts`` so far, ``next_attempt_at``
    and ``delivered_at`` (the relay's ack; None before it), both unix ms, and the
    ``last_error``."""

    revision: int
    attempts: int
    next_attempt_at: int
    delivered_at: int | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class Approval:
    """One approval as stored (table ``approvals``, SPEC §3), with its ``revisions`` and
    ``decisions`` in order and its ``outbox`` rows (empty when loaded without them).

    ``scope`` is the frozen ``(operator id, identity)`` list of who may decide; times are
    unix ms, UTC; ``budget`` the budget context sent to the relay (or None); ``receipt``
    the receipt object of the resolution's audit entry and ``created_receipt`` that of the
    ``created`` entry (None when not loaded or absent); ``permit`` the compact JWS execution
    permit; ``requested_by``/``requested_by_id`` the requesting operator, if named.
    """

    approval_id: str
    run_id: str
    pipeline: str
    step: str
    risk: str
    content_type: str
    quorum_required: int
    scope: tuple[tuple[int, str], ...]
    budget: JsonObject | None
    spend: float | None
    revision: int
    state: str
    outcome: str | None
    created_at: int
    expires_at: int
    resolved_at: int | None
    idempotency_key: str | None
    request_hash: str
    receipt: JsonObject | None
    requested_by: str | None
    requested_by_id: int | None
    allow_self_approval: bool
    permit: str | None
    revisions: tuple[Revision, ...]
    decisions: tuple[DecisionRow, ...]
    outbox: tuple[Dispatch, ...] = ()
    created_receipt: JsonObject | None = None
    reminders_sent: int = 0  # reminder times passed (missed ones coalesce)
    escalation_level: int = 0  # escalation levels applied to ``scope``
    # the step's off | optional | required when it was created (None: created
    # before migration 7; the config in force decides)
    approver_signature: str | None = None

    def revision_row(self, revision: int) -> Revision | None:
        """Return revision ``revision`` of the draft, or None."""
        return next((r for r in self.revisions if r.revision == revision), None)


@dataclass(frozen=True, slots=True)
class Resolvable:
    """What resolving a pending approval without a permit needs (expiry, cancel): its id,
    current ``revision`` with that revision's ``payload_hash``, and ``quorum_required``."""

    approval_id: str
    revision: int
    payload_hash: str
    quorum_required: int


@dataclass(frozen=True, slots=True)
class QuestionVersion:
    """One version of a question (table ``question_versions``): ``question`` the
    normalized question object as dispatched and hashed (``QuestionSpec.to_json``), its
    ``request_hash`` (``sha256:<hex>``), the ``nonce`` an answer to it must carry (32 hex)
    and ``created_at`` (unix ms, UTC)."""

    version: int
    question: JsonObject
    request_hash: str
    nonce: str
    created_at: int


@dataclass(frozen=True, slots=True)
class QuestionAnswer:
    """The winning answer of a question: the ``value`` (decoded JSON), the
    ``operator_id`` it counted for, ``identity``/``display``/``channel`` as the relay sent
    them, the ``version`` answered, ``decided_at`` (RFC 3339 text as sent) and
    ``recorded_at`` (unix ms, the gate's clock)."""

    value: Any
    operator_id: int
    identity: str
    display: str | None
    channel: str | None
    version: int
    decided_at: str
    recorded_at: int


@dataclass(frozen=True, slots=True)
class Question:
    """One question as stored (table ``questions``) with its ``versions`` in order
    and its ``outbox`` rows (``Dispatch``, ``revision`` = the question's version).

    ``scope`` is the frozen ``(operator id, identity)`` list of who may answer; times are
    unix ms, UTC; ``answer`` the winning answer (None unless ``outcome`` is answered);
    ``receipt`` the receipt object of the ``question_resolved`` entry and
    ``created_receipt`` that of ``question_created`` (None when absent)."""

    question_id: str
    run_id: str
    pipeline: str
    step: str
    risk: str
    scope: tuple[tuple[int, str], ...]
    version: int
    state: str
    outcome: str | None
    created_at: int
    expires_at: int
    resolved_at: int | None
    idempotency_key: str | None
    request_body_hash: str
    requested_by: str | None
    requested_by_id: int | None
    answer: QuestionAnswer | None
    receipt: JsonObject | None
    versions: tuple[QuestionVersion, ...]
    outbox: tuple[Dispatch, ...] = ()
    created_receipt: JsonObject | None = None
    answer_salt: str = ""  # hex of the 16 random bytes value_hash is salted with (B3)

    @property
    def current(self) -> QuestionVersion:
        """The current version (the last one)."""
        return self.versions[-1]


@dataclass(frozen=True, slots=True)
class DueQuestion:
    """What resolving a due question needs (expiry): its id and current ``version`` with that
    version's ``request_hash``."""

    question_id: str
    version: int
    request_hash: str


@dataclass(frozen=True, slots=True)
class Credential:
    """An approver credential (table ``approver_credentials``): ``credential_id``
    (base64url, no padding), the ``operator_id`` it belongs to, ``type`` (ed25519 |
    webauthn), ``public_key`` (base64url: the raw 32 bytes of an Ed25519 key, the COSE key
    of a passkey), ``sign_count`` (WebAuthn's last counter; 0 for Ed25519), ``label`` (or
    None), ``created_at`` and ``revoked_at`` (unix ms; None while in force)."""

    credential_id: str
    operator_id: int
    type: str
    public_key: str
    sign_count: int
    label: str | None
    created_at: int
    revoked_at: int | None = None
