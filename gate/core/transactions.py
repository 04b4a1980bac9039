"""The gate's write transactions: what runs on the store's writer (a thread, or the writer
process on its forked copy), looked up in one explicit table. No HTTP, no SQL of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gate.audit.chain import AuditRow
from gate.clock import Clock
from gate.config import Config
from gate.core import credentials, invites
from gate.core.approvals import followup_tx
from gate.core.approvals.decide_tx import decide
from gate.core.approvals.followups import Plan
from gate.core.approvals.kind import APPROVALS
from gate.core.approvals.policy import Verdict as PolicyVerdict
from gate.core.questions import revise_tx
from gate.core.questions.answer_tx import answer_question
from gate.core.questions.kind import QUESTIONS
from gate.core.ratelimit import RateLimiter
from gate.core.receipt_key import Settled, settle
from gate.core.requests import lifecycle_tx
from gate.store import Command, WriteTx
from gate.trust.keys import Signer


@dataclass(frozen=True, slots=True)
class Policy:
    """What the service needs of the config for one step, resolved at create time."""

    quorum: int
    scope: tuple[tuple[int, str], ...]
    timeout_s: float
    risk: str
    allow_self_approval: bool = False
    allow_empty_draft: bool = False
    followups: Plan | None = None  # reminders and escalation levels
    approver_signature: str = "off"  # off | optional | required, frozen here
    verdict: PolicyVerdict | None = None  # what the step's rules decided
    remember_ms: int | None = None  # the step's remember_approval window


class Transactions:
    """The write transactions of one gate and exactly the state the writer owns.

    ``config`` (budgets, limits), the decision ``rate`` limiter (SPEC §2 check 13: its
    memory lives here), the HMAC ``receipt_key`` (and ``previous_receipt_key``, for a
    declared rotation) and the Ed25519 ``signer`` (or None) of the audit entries and
    permits. With a writer process, the process runs its forked copy of this object
    (``Store.bind``, forked at ``Store.open``): state changed afterwards reaches that copy
    only through a ``configure`` command (``Store.apply``). Every transaction reads the
    gate's ``clock`` inside the transaction.
    """

    def __init__(
        self,
        config: Config,
        clock: Clock,
        receipt_key: bytes,
        signer: Signer | None,
        *,
        previous_receipt_key: bytes | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.rate = RateLimiter(config.relay.security.rate_limit)
        self._receipt_key = receipt_key
        self._previous_receipt_key = previous_receipt_key
        self.signer = signer

    def run(self, tx: WriteTx, command: Command) -> Any:
        """Run the transaction ``command`` names (a key of ``TABLE``) in ``tx``; the store's
        writer calls this (``Store.bind``). Returns what that transaction returns; raises
        what it raises (GateError for a refusal), ValueError for an unknown name."""
        body = TABLE.get(command.name)
        if body is None:
            raise ValueError(f"unknown write transaction {command.name!r}")
        return body(self, tx, *command.args)

    def configure(self, tx: WriteTx | None, config: Config) -> None:
        """Use ``config`` from now on (SIGHUP reload): budgets, limits, the rate limit.
        Runs outside any transaction (``tx`` None, sent with ``Store.apply``)."""
        self.config = config
        self.rate.per_minute = config.relay.security.rate_limit

    def audit(
        self, tx: WriteTx, kind: str, approval_id: str | None, now: int, data: dict[str, Any]
    ) -> AuditRow:
        """Append one audit entry (``kind``, ``data``) at ``now``, receipted with the receipt
        key and signed with the signer the writer owns; return its row."""
        return tx.append_audit(kind, approval_id, now, data, self._receipt_key, self.signer)

    # ---- receipt key -------------------------------------------------------------

    def receipt_key(self, tx: WriteTx) -> Settled:
        """``GateService.settle_receipt_key``'s transaction (``gate.core.receipt_key.settle``
        with this gate's keys, at the gate's time)."""
        return settle(
            tx,
            self._receipt_key,
            self._previous_receipt_key,
            self.config.receipts,
            self.clock.now_ms(),
            self.signer,
        )


# The write transactions by name (``Command.name``): the one table ``Transactions.run`` reads.
# "configure" runs outside a transaction (``Store.apply``), "receipt_key" once at start.
TABLE: dict[str, Callable[..., Any]] = {
    "create": partial(lifecycle_tx.create, APPROVALS),  # gate.core.requests.lifecycle_tx
    "decide": decide,
    "expire": partial(lifecycle_tx.expire, APPROVALS),
    "cancel": partial(lifecycle_tx.cancel, APPROVALS),
    "dispatch_result": partial(lifecycle_tx.dispatch_result, APPROVALS),
    "followups": followup_tx.handle_due,  # gate.core.approvals.followup_tx
    "followup_result": followup_tx.result,
    "create_question": partial(lifecycle_tx.create, QUESTIONS),
    "revise_question": revise_tx.revise,  # gate.core.questions.revise_tx
    "cancel_question": partial(lifecycle_tx.cancel, QUESTIONS),
    "expire_questions": partial(lifecycle_tx.expire, QUESTIONS),
    "answer_question": answer_question,
    "question_dispatch_result": partial(lifecycle_tx.dispatch_result, QUESTIONS),
    "question_notice_result": revise_tx.notice_result,
    "enrol_credential": credentials.enrol,  # gate.core.credentials
    "revoke_credential": credentials.revoke,
    "list_credentials": credentials.list_all,
    "create_invite": invites.create_invite,  # passkeys, gate.core.invites
    "invite_page": invites.invite_page,
    "register_passkey": invites.register,
    "configure": Transactions.configure,
    "receipt_key": Transactions.receipt_key,
}
