"""Typed ``data`` payloads of the questions' audit entries: question_created,
question_revised, question_dispatch_ack, question_answered, question_resolved. Built by the
writer (``gate.core.questions.kind``), read back by the records check.

Pure, like ``gate.audit.entries``, whose ``Payload`` they are: ``to_data()`` is the exact
object chained (optional keys left out, not null); ``from_data()`` reads a logged object back
as logged, unvalidated. The entry's subject id (``approval_id`` of the entry and of its
audit_log row) is the question's ``question_id``: one ULID space, so the two never collide.
An answer's value is never logged, only its ``value_hash`` (like a draft's body).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gate.audit.entries import Payload

QUESTION_CREATED = "question_created"
QUESTION_REVISED = "question_revised"
QUESTION_DISPATCH_ACK = "question_dispatch_ack"
QUESTION_ANSWERED = "question_answered"
QUESTION_RESOLVED = "question_resolved"
QUESTION_KINDS = (
    QUESTION_CREATED,
    QUESTION_REVISED,
    QUESTION_DISPATCH_ACK,
    QUESTION_ANSWERED,
    QUESTION_RESOLVED,
)


@dataclass(frozen=True, slots=True)
class QuestionCreatedData(Payload):
    """``question_created``: what was frozen at creation. ``version`` is 1, ``request_hash``
    that of version 1, ``approvers`` the operator ids in scope (scope order), ``expires_at``
    unix ms; ``requested_by`` an operator id, written only when one was named."""

    kind: ClassVar[str] = QUESTION_CREATED

    pipeline: str
    step: str
    version: int
    request_hash: str
    response_type: str
    approvers: Sequence[int]
    expires_at: int
    requested_by: int | None = None


@dataclass(frozen=True, slots=True)
class QuestionRevisedData(Payload):
    """``question_revised``: version ``version`` with ``request_hash`` replaced the question."""

    kind: ClassVar[str] = QUESTION_REVISED

    version: int
    request_hash: str


@dataclass(frozen=True, slots=True)
class QuestionDispatchAckData(Payload):
    """``question_dispatch_ack``: the question relay acked the dispatch of ``version``."""

    kind: ClassVar[str] = QUESTION_DISPATCH_ACK

    version: int


@dataclass(frozen=True, slots=True)
class QuestionAnsweredData(Payload):
    """``question_answered``: operator ``operator_id`` answered ``version`` (its
    ``request_hash``, with the ``nonce`` of that version); ``value_hash`` is
    ``gate.protocol.question.value_hash`` of the value (the value is not logged)."""

    kind: ClassVar[str] = QUESTION_ANSWERED

    operator_id: int
    version: int
    request_hash: str
    nonce: str
    value_hash: str


@dataclass(frozen=True, slots=True)
class QuestionResolvedData(Payload):
    """``question_resolved``: ``outcome`` (answered|timeout|cancelled) on ``version`` with its
    ``request_hash``; ``value_hash`` only for answered. Its receipt is the question's."""

    kind: ClassVar[str] = QUESTION_RESOLVED

    outcome: str
    version: int
    request_hash: str
    value_hash: str | None = None
