"""The gate's write transactions as typed commands: the ``Transaction`` base every command
of the gate extends, ``Configure`` (sent with ``Store.apply``) and ``ReceiptKey``. The other
commands stand next to their bodies (``requests.lifecycle_tx.Cancel``,
``approvals.decide_tx.Decide``, ``credentials.EnrolCredential``, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from gate.core.receipt_key import Settled
from gate.store import Command, WriteTx

if TYPE_CHECKING:
    from gate.config import Config
    from gate.core.transactions import Transactions

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
class ReceiptKey(Transaction[Settled]):
    """Settle the receipt key at start (``Transactions.receipt_key``)."""

    def run(self, t: Transactions, tx: WriteTx) -> Settled:
        return t.receipt_key(tx)
