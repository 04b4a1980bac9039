"""The gate's write transactions: what runs on the store's writer (a thread, or the writer
process on its forked copy), each a typed command (``gate.core.commands.Transaction``) run
by ``Transactions.run``. No HTTP, no SQL of its own."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gate.audit.chain import AuditRow
from gate.audit.spans import matches
from gate.clock import Clock
from gate.config import Config
from gate.core.approvals.followups import Plan
from gate.core.approvals.policy import Verdict as PolicyVerdict
from gate.core.commands import Configure, ReceiptKey, Transaction
from gate.core.ratelimit import RateLimiter
from gate.core.receipt_key import Settled, settle
from gate.errors import Fenced
from gate.store import Command, WriteTx
from gate.trust.keys import Signer

log = logging.getLogger(__name__)

RETIRED = (
    "another gate rotated the receipt key; restart this gate with receipts.key_env "
    "holding the new key"
)


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
    memory lives here on SQLite; on PostgreSQL its attempts are the database's, every
    gate's: ``WriteTx.rate_events``), the HMAC ``receipt_key`` (and
    ``previous_receipt_key``, for a declared rotation) and the Ed25519 ``signer`` (or None)
    of the audit entries and permits. With a writer process, the process runs its forked
    copy of this object (``Store.bind``, forked at ``Store.open``): state changed afterwards
    reaches that copy only through a ``Configure`` command (``Store.apply``). Every
    transaction reads the gate's ``clock`` inside the transaction.
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
        self._retired_logged = False

    def run(self, tx: WriteTx | None, command: Command[Any]) -> Any:
        """Run ``command`` on the store's writer (``Store.bind``): a ``Transaction`` in
        ``tx`` (its ``run``), returning what it returns and raising what it raises
        (GateError for a refusal); ``Configure`` outside any transaction (``tx`` None, sent
        with ``Store.apply``). Raises ValueError for any other command.

        On PostgreSQL a transaction runs only after an entry receipted with this gate's key
        (``WriteTx.follows``): after another gate's rotation (``receipt_key_rotated``), an
        entry this gate appended would be receipted with the retired key, a forgery to
        ``audit verify``. It raises Fenced 503 ``receipt_key_retired`` then (logged once:
        ``event=receipt_key_retired``), and nothing is written. The start's own settling
        (``ReceiptKey``) is the one transaction that runs after an entry of the previous key.
        """
        if isinstance(command, Configure):
            self.configure(command.config)
            return None
        if not isinstance(command, Transaction) or tx is None:
            raise ValueError(f"unknown write transaction {command.name!r}")
        if not isinstance(command, ReceiptKey) and not tx.follows(self._receipt_key):
            self._retired()
        return command.run(self, tx)

    def _retired(self) -> None:
        """Refuse a write: the newest entry is receipted with a key not this gate's."""
        raise self.retired()

    def retired(self) -> Fenced:
        """The refusal of a gate whose receipt key another gate retired, logged the first
        time (``event=receipt_key_retired``)."""
        if not self._retired_logged:
            self._retired_logged = True
            log.error(
                "event=receipt_key_retired key_env=%s message=%s",
                self.config.receipts.key_env,
                RETIRED,
            )
        return Fenced("receipt_key_retired", RETIRED, extra={"message": RETIRED})

    def follows(self, entry_hash: str, receipt: str) -> bool:
        """Whether this gate may append after the entry ``entry_hash`` with ``receipt``
        (the newest on PostgreSQL, as another session reads it): receipted with its key."""
        return matches(self._receipt_key, entry_hash, receipt)

    def configure(self, config: Config) -> None:
        """Use ``config`` from now on (SIGHUP reload): budgets, limits, the rate limit.
        The writer process's copy takes it from a ``Configure`` command (``Store.apply``)."""
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
