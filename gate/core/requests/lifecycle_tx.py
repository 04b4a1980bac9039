"""The write transactions every kind of request shares: create (idempotency, scope, expiry),
cancel, expire and the dispatch bookkeeping, for any ``Kind``, with what every version and
verdict row takes the same way (``new_nonce``, ``said_by``). Run on the store's writer with
the state ``Transactions`` owns (``t``); each with its command, the kind a field of it
(``Cancel(QUESTIONS, question_id)``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from ulid import ULID

from gate.core.commands import Transaction
from gate.core.requests.kind import Full, Kind, Stored
from gate.errors import Conflict, NotFound
from gate.store import WriteTx
from gate.store.outbox import OutboxTable

if TYPE_CHECKING:
    from gate.core.transactions import Transactions

EXPIRE_BATCH = 500  # requests of one kind resolved ``timeout`` per transaction
NOTICE_GIVE_UP_MS = 3_600_000  # a resolution notice is retried for an hour


class Opened(Protocol):
    """What every create request names (``CreateRequest``, ``QuestionRequest``)."""

    @property
    def pipeline(self) -> str: ...
    @property
    def step(self) -> str: ...
    @property
    def run_id(self) -> str | None: ...


class Scoped(Protocol):
    """What every step's policy resolves at create time (``Policy``, ``QuestionPolicy``)."""

    @property
    def scope(self) -> tuple[tuple[int, str], ...]: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def risk(self) -> str: ...


class VerdictEnvelope(Protocol):
    """What every verdict envelope says of who gave it (``Decision``, ``Answer``)."""

    @property
    def approver_id(self) -> str: ...
    @property
    def approver_display(self) -> str | None: ...
    @property
    def approver_channel(self) -> str | None: ...
    @property
    def decided_at(self) -> str: ...


class SaidBy(TypedDict):
    """Who gave a verdict, as its stored row keeps it (``DecisionRow``, ``QuestionAnswer``)."""

    identity: str
    display: str | None
    channel: str | None
    decided_at: str


def said_by(envelope: VerdictEnvelope) -> SaidBy:
    """The approver fields of a verdict's stored row, as its envelope gives them: identity,
    display name, channel and the relay's ``decided_at`` (RFC 3339, kept as sent)."""
    return SaidBy(
        identity=envelope.approver_id,
        display=envelope.approver_display,
        channel=envelope.approver_channel,
        decided_at=envelope.decided_at,
    )


def new_nonce() -> str:
    """Return a fresh 128-bit nonce as 32 lowercase hex digits."""
    return secrets.token_hex(16)


def unknown(kind: Kind[Any, Any]) -> NotFound:
    """404 ``unknown_<kind>``: no request of this kind with this id."""
    return NotFound(f"unknown_{kind.name}", f"no {kind.name} with this {kind.id_field}")


def load(kind: Kind[Full, Any], tx: WriteTx, request_id: str) -> Full:
    """The request ``request_id`` as seen in this transaction; raises NotFound 404
    ``unknown_<kind>``."""
    found = tx.requests(kind.tables).load(request_id)
    if found is None:
        raise unknown(kind)
    return found


def check_pending(full: Stored, message: str) -> None:
    """Conflict 409 ``already_resolved`` (with its ``outcome``) for a resolved request."""
    if full.state == "resolved":
        raise Conflict("already_resolved", message, extra={"outcome": full.outcome})


def send_result(
    t: Transactions,
    tx: WriteTx,
    outbox: OutboxTable[Any],
    key: tuple[Any, ...],
    acked: bool,
    error: str | None,
    retry_at_ms: int | None,
) -> str | None:
    """Record one attempt at the gate's now of the send ``key`` of a table with a give-up
    time (``OutboxStatements.attempted``): delivered, retried at ``retry_at_ms``, or failed
    once that is None (dropped unsent, ``error`` says why) or not before the row's
    ``give_up_at``. Returns ``"delivered"``/``"retry"``/``"failed"``, None when nothing
    changed."""
    attempt = tx.outbox.attempted(
        outbox, key, t.clock.now_ms(), acked=acked, error=error, retry_at_ms=retry_at_ms
    )
    return None if attempt is None else attempt.state


@dataclass(frozen=True, slots=True)
class Create(Transaction[tuple[Full, bool]]):
    """Insert a new request of ``kind`` (``Kind.insert``: its row, first version, dispatch
    and created entry; nothing waits on the relay). Returns ``(loaded request, created)``;
    ``created`` is False for an Idempotency-Key seen before with the same ``body_hash``
    (SHA-256 hex of the body's canonical JSON). Raises Conflict 409
    ``idempotency_key_reused`` for the key with another body (SPEC §3)."""

    kind: Kind[Full, Any]
    req: Opened
    idempotency_key: str | None
    requester: tuple[int, str] | None
    policy: Scoped
    body_hash: str
    digest: str | None = None

    @property
    def name(self) -> str:
        return self.kind.event + "create"

    def run(self, t: Transactions, tx: WriteTx) -> tuple[Full, bool]:
        kind, key, requester, policy = self.kind, self.idempotency_key, self.requester, self.policy
        if key is not None:
            seen = tx.requests(kind.tables).by_idempotency_key(key)
            if seen is not None:
                if seen[1] != self.body_hash:
                    raise Conflict(
                        "idempotency_key_reused",
                        "Idempotency-Key was used before with a different body",
                    )
                return load(kind, tx, seen[0]), False
        now = t.clock.now_ms()
        row: dict[str, Any] = {
            kind.id_field: str(ULID()),
            "run_id": self.req.run_id or str(ULID()),
            "pipeline": self.req.pipeline,
            "step": self.req.step,
            "risk": policy.risk,
            "scope": [list(pair) for pair in policy.scope],
            "state": "pending",
            "created_at": now,
            "expires_at": now + int(policy.timeout_s * 1000),
            "idempotency_key": key,
            "requested_by": requester[1] if requester else None,
            "requested_by_id": requester[0] if requester else None,
        }
        kind.insert(t, tx, row, self.req, policy, now, self.body_hash, self.digest)
        return load(kind, tx, row[kind.id_field]), True


@dataclass(frozen=True, slots=True)
class Cancel(Transaction[tuple[str, Full]]):
    """Resolve a pending request of ``kind`` ``cancelled`` (``timeout`` when past
    ``expires_at``): ``(outcome, loaded request)``. Raises NotFound 404
    ``unknown_<kind>``, Conflict 409 ``already_resolved`` (with its ``outcome``)."""

    kind: Kind[Full, Any]
    request_id: str

    @property
    def name(self) -> str:
        return self.kind.event + "cancel"

    def run(self, t: Transactions, tx: WriteTx) -> tuple[str, Full]:
        kind, now = self.kind, t.clock.now_ms()
        full = load(kind, tx, self.request_id)
        check_pending(full, kind.already_resolved)
        outcome = "timeout" if now >= full.expires_at else "cancelled"
        kind.resolve(t, tx, kind.target(full), outcome, now)
        return outcome, load(kind, tx, self.request_id)


@dataclass(frozen=True, slots=True)
class Expire(Transaction[list[str]]):
    """Resolve up to ``EXPIRE_BATCH`` pending requests of ``kind`` past ``expires_at`` as
    ``timeout``, oldest deadline first: their ids."""

    kind: Kind[Any, Any]

    @property
    def name(self) -> str:
        return self.kind.event + "expire"

    def run(self, t: Transactions, tx: WriteTx) -> list[str]:
        kind, now = self.kind, t.clock.now_ms()
        due = tx.requests(kind.tables).due(now, EXPIRE_BATCH)
        for target in due:  # a timeout fires nothing: no permit, so no full load
            kind.resolve(t, tx, target, "timeout", now)
        return [str(getattr(target, kind.id_field)) for target in due]


@dataclass(frozen=True, slots=True)
class DispatchResult(Transaction[None]):
    """Count one dispatch attempt of ``version``; the first ack (unix ms now) writes the
    kind's dispatch-ack audit entry, a failure sets the next attempt at ``retry_at_ms``."""

    kind: Kind[Any, Any]
    request_id: str
    version: int
    acked: bool
    error: str | None
    retry_at_ms: int

    @property
    def name(self) -> str:
        return self.kind.event + "dispatch_result"

    def run(self, t: Transactions, tx: WriteTx) -> None:
        now, key = t.clock.now_ms(), (self.request_id, self.version)
        attempt = tx.outbox.attempted(
            self.kind.dispatches,
            key,
            now,
            acked=self.acked,
            error=self.error,
            retry_at_ms=self.retry_at_ms,
        )
        if self.acked and attempt is not None:
            ack = self.kind.dispatch_ack(self.version, attempt.attempts)
            t.audit(tx, ack.kind, self.request_id, now, ack.to_data())
