"""GateService: one gate's services over its Store, by kind of request and by feature
(``approvals``, ``questions``, ``credentials``, ``invites``), and what the daemon asks of the
gate as a whole: the receipt key at start, reloads, health. No HTTP, no SQL."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gate.clock import Clock
from gate.config import Config
from gate.core.approvals.resolve_tx import Resolution
from gate.core.approvals.service import Approvals, DecisionResult
from gate.core.commands import Configure, ReceiptKey
from gate.core.credentials import Credentials
from gate.core.invites import Invites
from gate.core.longpoll import wake
from gate.core.questions.service import AnswerResult, Questions
from gate.core.ratelimit import RateLimiter
from gate.core.receipt_key import refusal
from gate.core.requests.service import Shared
from gate.core.transactions import Policy, Transactions
from gate.errors import Unavailable
from gate.store import Store
from gate.store.approvals import APPROVALS
from gate.trust.keys import ReceiptKeys, load_receipt_keys

__all__ = ["AnswerResult", "DecisionResult", "GateService", "Policy", "Resolution"]

log = logging.getLogger(__name__)

# (pipeline, step, oldest pending created_at in unix ms) per step: ``oldest_pending_by_step``
StepAges = list[tuple[str, str, int]]


class GateService:
    """The gate's rules over a Store: ``approvals`` and ``questions`` (the two kinds of
    request, each the shared lifecycle with its verdict), ``credentials`` (approver keys,
    for the admin API) and ``invites`` (passkey enrolment).

    ``config`` is a ``gate.config.Config``; ``receipt_key`` the HMAC receipt key (bytes);
    ``previous_receipt_key`` the one before a declared rotation (``receipts.previous_key_env``,
    used only by ``settle_receipt_key``); ``clock`` anything with ``now_ms()``;
    ``receipt_keys`` the Ed25519 signing key and
    trusted keys (default: loaded from ``config.receipts``, which raises ConfigError for a
    bad key file). With a signing key every audit entry is signed and every approved or
    adjusted approval gets a permit. Events ``dispatch_wakeup`` and ``expiry_wakeup`` tell
    the workers there is new work.
    """

    def __init__(
        self,
        config: Config,
        receipt_key: bytes,
        store: Store,
        clock: Clock,
        *,
        receipt_keys: ReceiptKeys | None = None,
        previous_receipt_key: bytes | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.receipt_keys = receipt_keys or load_receipt_keys(config.receipts)
        # what the writer runs, and the state it owns (a writer process: its forked copy)
        self.transactions = Transactions(
            config,
            clock,
            receipt_key,
            self.receipt_keys.signer,
            previous_receipt_key=previous_receipt_key,
        )
        self.shared = Shared(config, store)
        self.dispatch_wakeup = self.shared.dispatch_wakeup
        self.expiry_wakeup = self.shared.expiry_wakeup
        self.credentials = Credentials(self.shared)
        self.invites = Invites(self.shared)
        self.approvals = Approvals(self.shared, self.invites.webauthn)
        self.questions = Questions(self.shared)
        store.bind(self.transactions.run)
        # on PostgreSQL, the daemon's membership of the cluster (gate.daemon.cluster.Cluster
        # .status): what /healthz says about the gates on the database; None on SQLite
        self.cluster_status: Callable[[], dict[str, Any]] | None = None

    @property
    def config(self) -> Config:
        """The config in force (``reconfigure`` replaces it)."""
        return self.shared.config

    def wake(self, request_id: str) -> None:
        """Wake the long-polls waiting on ``request_id`` (an approval or a question) now:
        another gate on the same database resolved it, or revised the question
        (``gate.daemon.cluster``'s change feed)."""
        wake(self.shared.waiters, request_id)

    @property
    def rate(self) -> RateLimiter:
        """The decision rate limiter (SPEC §2 check 13) of this process's ``Transactions``
        (with a writer process, the one that counts is the writer's copy; on PostgreSQL its
        attempts are the database's, every gate's)."""
        return self.transactions.rate

    def reconfigure(self, config: Config) -> None:
        """Use ``config`` from now on (SIGHUP reload): budgets, limits, the rate limit.

        With a writer process, its copy of ``Transactions`` takes it too, after the
        transactions sent before and before those sent after (``Store.apply``).
        """
        self.shared.config = config
        self.transactions.configure(config)
        self.store.apply(Configure(config))

    async def settle_receipt_key(self) -> int | None:
        """At start (``gate serve``), before anything else is written: go on with the audit
        log only with the key its newest entry is receipted with, or after a declared
        rotation (docs/auditing.md section 5; ``gate.audit.spans``).

        Nothing happens when the log is empty or its newest receipt verifies with
        ``receipts.key_env``'s key (restarts are idempotent). When it verifies with
        ``receipts.previous_key_env``'s instead, one ``receipt_key_rotated`` entry is
        appended, receipted (and signed) with the new key, holding the seq boundary and the
        variable names, nothing secret; returns its seq (else None). Raises ConfigError
        (``receipts.key_env: ...``, nothing written) when neither key verifies it (a typo is
        likelier than a rotation), GateError ``audit_tampered`` when the previous key
        verifies it but the log already went over to the current key (an entry forged with
        a retired key). Never logs a key.
        """
        settled = await self.store.transact(ReceiptKey())
        receipts = self.config.receipts
        problem = refusal(settled, receipts)
        if problem is not None:
            raise problem
        outcome, seq, _ = settled
        if outcome == "rotated":
            log.info(
                "event=receipt_key_rotated seq=%d previous_key_last_seq=%d key_env=%s "
                "previous_key_env=%s",
                seq,
                seq - 1,
                receipts.key_env,
                receipts.previous_key_env,
            )
            return int(seq)
        return None

    # ---- health (for /healthz and the /metrics scrape: neither reaches the store) ----

    async def health(self) -> int:
        """Return the database's schema version (``PRAGMA user_version``), what ``/healthz``
        reports. Raises Unavailable 503 ``storage_unavailable`` while the database refuses
        writes or the writer process has left a write unanswered too long
        (``Store.schema_version``)."""
        return await self.store.schema_version()

    def cluster(self) -> dict[str, Any] | None:
        """What ``/healthz`` says about the other gates on the database (``cluster_status``:
        this gate's id, whether it holds the timers' lease, the live gates, its clock's
        offset, problems such as ``config_divergent``), or None for a gate alone on its
        SQLite file. Raises Unavailable 503 ``cluster_joining`` before the gate's first
        heartbeat (no gate live, not even itself: its clock and config not checked yet),
        and 503 ``clock_skew`` when this gate's clock is off the database's (the balancer
        drains it)."""
        if self.cluster_status is None:
            return None
        view = self.cluster_status()
        if view["live_gates"] == 0:
            raise Unavailable(
                "cluster_joining",
                "this gate has not written its first heartbeat yet (clock and config unchecked)",
            )
        if "clock_skew" in view["problems"]:
            offset_s = (view["clock_offset_ms"] or 0) / 1000
            raise Unavailable(
                "clock_skew", f"this gate's clock is {offset_s:+.1f} s off the database's"
            )
        return view

    async def pending_summary(self) -> tuple[int, int | None]:
        """Return ``(number of pending approvals, earliest created_at in unix ms or None)``:
        one statement over the pending partial index (``Store.pending_summary``). Raises
        GateError when the database cannot be read."""
        return await self.store.reads.pending_summary(APPROVALS)

    async def oldest_pending_by_step(self) -> StepAges:
        """Return ``(pipeline, step, oldest pending created_at in unix ms)`` per step with a
        pending approval (``Store.oldest_pending_by_step``). Raises GateError
        when the database cannot be read."""
        return await self.store.reads.oldest_pending_by_step()

    @property
    def writer_unanswered_s(self) -> float:
        """Seconds the oldest write sent to the writer process has waited for its answer
        (0.0 when none waits, and always with a writer thread)."""
        return self.store.writer_unanswered_s
