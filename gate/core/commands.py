"""The gate's write transactions as typed commands: the ``Transaction`` base every command
of the gate extends, and the commands of the lifecycle transactions ``Transactions`` runs
itself. The other commands stand next to their bodies (``decide_tx.Decide``,
``question_tx.CancelQuestion``, ``credentials.EnrolCredential``, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from gate.core.receipt_key import Settled
from gate.model import Approval
from gate.store import Command, WriteTx

if TYPE_CHECKING:
    from gate.config import Config
    from gate.core.requests import CreateRequest
    from gate.core.transactions import Policy, Transactions

R = TypeVar("R")


class Transaction(Command[R]):
    """A write transaction of the gate: its arguments as the fields of a frozen, slotted
    dataclass (pickled to a writer process), its result type as ``R`` and its body as
    ``run``, which ``Transactions.run`` calls on the writer with the state the writer owns
    (``t``). ``Store.transact(command)`` returns ``R``: mypy follows a call site into
    ``run`` and from there into the body."""

    __slots__ = ()

    def run(self, t: Transactions, tx: WriteTx) -> R:
        """Run the transaction in ``tx``; return its result or raise its refusal."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Configure(Command[None]):
    """Use ``config`` from now on (``Transactions.configure``): the one command sent with
    ``Store.apply``, run outside any transaction."""

    config: Config


@dataclass(frozen=True, slots=True)
class Create(Transaction[tuple[Approval, bool]]):
    """Create an approval (``Transactions.create``): ``(loaded approval, created)``."""

    req: CreateRequest
    idempotency_key: str | None
    requester: tuple[int, str] | None
    policy: Policy
    request_hash: str
    digest: str

    def run(self, t: Transactions, tx: WriteTx) -> tuple[Approval, bool]:
        return t.create(
            tx,
            self.req,
            self.idempotency_key,
            self.requester,
            self.policy,
            self.request_hash,
            self.digest,
        )


@dataclass(frozen=True, slots=True)
class ReceiptKey(Transaction[Settled]):
    """Settle the receipt key at start (``Transactions.receipt_key``)."""

    def run(self, t: Transactions, tx: WriteTx) -> Settled:
        return t.receipt_key(tx)


@dataclass(frozen=True, slots=True)
class Expire(Transaction[list[str]]):
    """Resolve the overdue approvals ``timeout`` (``Transactions.expire``): their ids."""

    def run(self, t: Transactions, tx: WriteTx) -> list[str]:
        return t.expire(tx)


@dataclass(frozen=True, slots=True)
class Cancel(Transaction[tuple[str, Approval]]):
    """Cancel a pending approval (``Transactions.cancel``): ``(outcome, loaded approval)``."""

    approval_id: str

    def run(self, t: Transactions, tx: WriteTx) -> tuple[str, Approval]:
        return t.cancel(tx, self.approval_id)


@dataclass(frozen=True, slots=True)
class DispatchResult(Transaction[None]):
    """Record one dispatch attempt of a revision (``Transactions.dispatch_result``)."""

    approval_id: str
    revision: int
    acked: bool
    error: str | None
    retry_at_ms: int

    def run(self, t: Transactions, tx: WriteTx) -> None:
        t.dispatch_result(
            tx, self.approval_id, self.revision, self.acked, self.error, self.retry_at_ms
        )


@dataclass(frozen=True, slots=True)
class Followups(Transaction[list[tuple[str, tuple[int, ...], int]]]):
    """Handle the due reminders and escalation levels (``Transactions.followups``)."""

    def run(self, t: Transactions, tx: WriteTx) -> list[tuple[str, tuple[int, ...], int]]:
        return t.followups(tx)


@dataclass(frozen=True, slots=True)
class FollowupResult(Transaction[str | None]):
    """Record one attempt of a follow-up send (``Transactions.followup_result``)."""

    key: tuple[str, str, int]
    acked: bool
    error: str | None
    retry_at_ms: int | None

    def run(self, t: Transactions, tx: WriteTx) -> str | None:
        return t.followup_result(tx, self.key, self.acked, self.error, self.retry_at_ms)
