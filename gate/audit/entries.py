"""Typed ``data`` payloads of the audit entries the gate writes (created, decision, resolved,
dispatch_ack, escalated, receipt_key_rotated): built by the writer (``gate.core``), read back
by the records check (``gate.audit.records``); ``Payload``, what every entry payload shares
(a question's: ``gate.audit.question_entries``; a credential's:
``gate.audit.credential_entries``).

Pure. ``to_data()`` is the exact object the chain hashes (``gate.audit.chain.make_entry``
canonicalises it: sorted keys, so field order does not matter, but the set of keys does: an
optional field is left out, not written as null, exactly as the gate always wrote it).
``from_data()`` reads a logged object back as logged, without validating it: a missing key
reads None and a value of another type stays as it is, so that the records check compares
it with the rows and names the disagreement (an entry from an edited database, or one the
gate never wrote, must be reported, not raise here). Every payload has both from
``Payload``; only ``DecisionData`` writes by rules of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Self

from gate.audit.spans import ROTATED

if TYPE_CHECKING:
    from gate.model import DecisionRow

CREATED = "created"
DECISION = "decision"
RESOLVED = "resolved"
DISPATCH_ACK = "dispatch_ack"
ESCALATED = "escalated"
# the operator id of a policy's decision: configured operator ids are >= 1
POLICY_OPERATOR = 0
# the fields of a decision entry written together: the first decides for the group
_DECISION_GROUPS = (
    ("new_revision", "new_payload_hash"),
    ("credential_id", "assertion", "adjust_text_sha256", "reason_sha256"),
    ("by", "rule", "remembered_from"),
)


@dataclass(frozen=True, slots=True)
class Payload:
    """What every entry payload shares: its entry ``kind`` (a class constant), the ``data``
    object it writes and the reading back of a logged one. Each payload is a frozen
    dataclass of this whose fields are the keys of ``data``, by name."""

    kind: ClassVar[str]

    def to_data(self) -> dict[str, Any]:
        """The entry's ``data`` object (keys as the gate writes them): every field without a
        default, and a field with one (an optional field) only when it is not None, never as
        null; a sequence written as a list, a mapping as a dict."""
        data: dict[str, Any] = {}
        for name, optional in _shape(type(self)):
            value = getattr(self, name)
            if value is None:
                if optional:
                    continue
            elif type(value) in _SCALARS:  # most fields: no abstract-class check per value
                pass
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, Sequence) and not isinstance(value, str):
                value = list(value)
            data[name] = value
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Self:
        """The payload with each field read from a logged ``data`` object by its name, as
        logged and unvalidated: a missing key reads as None and a value of another type is
        kept, so the records check reports it as a disagreement."""
        return cls(**{field.name: data.get(field.name) for field in fields(cls)})


_SCALARS = frozenset({str, int, float, bool})


_SHAPES: dict[type[Payload], tuple[tuple[str, bool], ...]] = {}


def _shape(cls: type[Payload]) -> tuple[tuple[str, bool], ...]:
    """Each field of the payload class ``cls`` by name, in order, with whether it is optional
    (has a default): read once per class, not at each entry written."""
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = tuple((f.name, f.default is not MISSING) for f in fields(cls))
    return shape


@dataclass(frozen=True, slots=True)
class CreatedData(Payload):
    """The ``created`` entry (SPEC §2, one per approval): what was frozen at creation.
    ``revision`` is 1; ``payload_hash`` that of revision 1's body; ``quorum`` the approvals
    needed; ``approvers`` the operator ids in scope, in scope order; ``expires_at`` unix ms,
    UTC. ``requested_by`` (an operator id) and ``allow_self_approval`` are written only for
    a request made by an operator (both or neither). ``approver_signature``
    (``optional`` or ``required``, frozen with the approval) is written only for a step
    whose mode is not ``off``."""

    kind: ClassVar[str] = CREATED

    pipeline: str
    step: str
    revision: int
    payload_hash: str
    quorum: int
    approvers: Sequence[int]
    expires_at: int
    requested_by: int | None = None
    allow_self_approval: bool | None = None
    approver_signature: str | None = None


@dataclass(frozen=True, slots=True)
class DecisionData(Payload):
    """A ``decision`` entry: one accepted decision (SPEC §2). ``revision`` and
    ``payload_hash`` are what was decided on; ``effect`` is ``approve``, ``skip`` or
    ``adjust``; an adjust also names the revision it made and that draft's payload hash
    (``new_revision``, ``new_payload_hash``: both or neither). ``reason`` is
    written only when the decision had one, and ``on_behalf_of`` (the principal's operator
    id) only for a delegate's decision, and ``credential_id`` with
    ``assertion`` (the ``approver_assertion`` object as received, so it can be re-verified
    offline) only for a signed decision, so entries without them are as the
    gate always wrote them. A signed decision also logs what its digest covered that the
    entry does not hold as signed: ``adjust_text_sha256`` (an adjust's text as sent) and
    ``reason_sha256`` (a reason sent blank, so recorded as none): lowercase hex SHA-256.
    A policy's decision has ``operator_id`` 0 (``POLICY_OPERATOR``, no
    operator's id) and names its decider ``by`` (``policy:<rule id>``), the ``rule`` and, for
    a remembered approval, the approval it remembers (``remembered_from``)."""

    kind: ClassVar[str] = DECISION

    operator_id: int
    decision: str
    revision: int
    payload_hash: str
    nonce: str
    effect: str
    new_revision: int | None = None
    new_payload_hash: str | None = None
    reason: str | None = None
    on_behalf_of: int | None = None
    credential_id: str | None = None
    assertion: Mapping[str, Any] | None = None
    adjust_text_sha256: str | None = None
    reason_sha256: str | None = None
    by: str | None = None
    rule: str | None = None
    remembered_from: str | None = None

    @classmethod
    def of(cls, row: DecisionRow, nonce: str, effect: str, **more: Any) -> Self:
        """The entry of the decision ``row`` as stored (its operator, decision, revision,
        payload hash, reason, principal and credential) with ``nonce``, ``effect`` and the
        ``more`` fields only the entry holds."""
        return cls(
            operator_id=row.operator_id,
            decision=row.decision,
            revision=row.revision,
            payload_hash=row.payload_hash,
            nonce=nonce,
            effect=effect,
            reason=row.reason,
            on_behalf_of=row.on_behalf_of,
            credential_id=row.credential_id,
            **more,
        )

    def to_data(self) -> dict[str, Any]:
        """The entry's ``data`` object (keys as the gate writes them): as every payload's,
        but each group below is written whole or not at all, by its first field: an adjust's
        new revision with its payload hash, a signature's credential with its assertion
        (``{}`` if none) and hashes, a policy's ``by`` with its rule (null if none) and the
        approval it remembers."""
        data = Payload.to_data(self)
        for group in _DECISION_GROUPS:
            if getattr(self, group[0]) is None:
                for name in group:
                    data.pop(name, None)
        if self.new_revision is not None:
            data["new_payload_hash"] = self.new_payload_hash
        if self.credential_id is not None:
            data["assertion"] = dict(self.assertion or {})
        if self.by is not None:  # a policy decided
            data["rule"] = self.rule
        return data


@dataclass(frozen=True, slots=True)
class ResolvedData(Payload):
    """The ``resolved`` entry (one per resolved approval): ``outcome`` at ``revision`` (its
    ``payload_hash``), the operator ids counted (``approved_by``: empty for an outcome that
    fires no permit) and the frozen ``quorum``."""

    kind: ClassVar[str] = RESOLVED

    outcome: str
    revision: int
    payload_hash: str
    approved_by: Sequence[int]
    quorum: int


@dataclass(frozen=True, slots=True)
class DispatchAckData(Payload):
    """A ``dispatch_ack`` entry: the relay acked the dispatch of ``revision`` after
    ``attempts`` attempts (written in the transaction that marks the outbox row delivered)."""

    kind: ClassVar[str] = DISPATCH_ACK

    revision: int
    attempts: int


@dataclass(frozen=True, slots=True)
class EscalatedData(Payload):
    """An ``escalated`` entry: escalation ``level`` (1, 2, ...) widened the
    approver scope by the operator ids ``added`` (possibly none); ``approvers`` is the whole
    new scope, operator ids in scope order (like ``created``'s). Check 11 uses it from this
    entry on."""

    kind: ClassVar[str] = ESCALATED

    level: int
    added: Sequence[int]
    approvers: Sequence[int]


@dataclass(frozen=True, slots=True)
class ReceiptKeyRotatedData(Payload):
    """The ``receipt_key_rotated`` entry (docs/auditing.md section 5, ``gate.audit.spans``):
    the entries up to ``previous_key_last_seq`` are receipted with the key of the variable
    ``previous_key_env``, this one and those after it with ``key_env``'s. Both names are
    always written (``previous_key_env`` as null when unset)."""

    kind: ClassVar[str] = ROTATED

    previous_key_last_seq: int
    key_env: str
    previous_key_env: str | None
