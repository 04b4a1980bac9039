"""What a kind of request (approval, question) gives the shared lifecycle: its names, its
rows in the writer's transaction, its object in the pipeline API. ``gate.core.approvals.kind``
and ``gate.core.questions.kind`` are the two; the lifecycle (``lifecycle_tx``, ``service``)
knows a kind only through ``Kind``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from gate.config import Config
    from gate.core.transactions import Transactions
    from gate.store import WriteTx
    from gate.store.reads import Reads

Full = TypeVar("Full", bound="Stored")  # the loaded request (``gate.model.Approval``, ...)
Target = TypeVar("Target")  # what resolving it needs (``gate.model.Resolvable``, ...)


class Stored(Protocol):
    """The fields every loaded request has (``gate.model.Approval``, ``Question``)."""

    @property
    def pipeline(self) -> str: ...
    @property
    def step(self) -> str: ...
    @property
    def state(self) -> str: ...  # pending | resolved
    @property
    def outcome(self) -> str | None: ...
    @property
    def expires_at(self) -> int: ...  # unix ms, UTC


class Entry(Protocol):
    """A typed audit entry payload (``gate.audit.entries``): its ``kind`` and data."""

    @property
    def kind(self) -> str: ...
    def to_data(self) -> dict[str, Any]: ...


class Kind(Protocol[Full, Target]):
    """A kind of request as the shared lifecycle sees it.

    ``name`` says it in messages and reason codes (``unknown_<name>``, 404), ``id_field``
    names its id in views and log lines, ``event`` prefixes its log events (``""`` for
    approvals: ``event=resolved``; ``"question_"``: ``event=question_resolved``),
    ``already_resolved`` is what a cancel of a resolved one is told (409), ``logger`` the
    logger of its service's lines (``gate.core.service`` for approvals, as before the kinds
    shared a lifecycle, so filters on it keep working). The
    methods taking ``tx`` run on the store's writer inside the caller's transaction;
    ``fetch``/``page`` read outside it; ``view`` builds the pipeline API's object.
    """

    name: str
    id_field: str
    event: str
    already_resolved: str  # the message of 409 ``already_resolved`` for a cancel
    logger: str  # the logger its service's lines go to (names operators filter on)

    def request_id(self, full: Full) -> str:
        """The request's id (``approval_id``, ``question_id``)."""
        ...

    def notices_on(self, config: Config) -> bool:
        """Whether a resolution notice is queued with each resolution (its relay target set)."""
        ...

    def load(self, tx: WriteTx, request_id: str) -> Full | None:
        """The request as seen in this transaction, or None."""
        ...

    def seen(self, tx: WriteTx, idempotency_key: str) -> tuple[str, str] | None:
        """``(id, body hash)`` of the request created with ``idempotency_key``, or None."""
        ...

    def insert(
        self,
        t: Transactions,
        tx: WriteTx,
        row: dict[str, Any],
        req: Any,
        policy: Any,
        now: int,
        body_hash: str,
        digest: str | None,
    ) -> None:
        """Insert a new request: ``row`` holds the columns every kind has
        (``lifecycle_tx.first_row``), ``req`` and ``policy`` what the service parsed and
        resolved, ``body_hash`` the Idempotency-Key comparison's hash of the body, ``digest``
        the payload hash when computed before the transaction. Adds the kind's own
        columns, its first version, its dispatch and its created entry."""
        ...

    def target(self, full: Full) -> Target:
        """What resolving the loaded request at its current version needs."""
        ...

    def due(self, tx: WriteTx, now: int, limit: int) -> list[Target]:
        """Up to ``limit`` pending requests past ``expires_at`` at ``now``, oldest first."""
        ...

    def target_id(self, target: Target) -> str:
        """The id of ``target``."""
        ...

    def resolve(self, t: Transactions, tx: WriteTx, target: Target, outcome: str, now: int) -> None:
        """Resolve ``target`` as ``outcome`` at ``now`` (no permit: timeout, cancelled)."""
        ...

    def dispatch_attempted(
        self,
        tx: WriteTx,
        request_id: str,
        version: int,
        *,
        delivered_at: int | None,
        next_attempt_at: int,
        error: str | None,
    ) -> int:
        """Count one dispatch attempt of ``version``; the attempts so far, -1 when acked."""
        ...

    def dispatch_ack(self, version: int, attempts: int) -> Entry:
        """The audit entry of the first ack of ``version``'s dispatch."""
        ...

    def view(self, full: Full) -> dict[str, Any]:
        """The pipeline API's object of the request (JSON-ready)."""
        ...

    async def fetch(self, reads: Reads, request_id: str) -> Full | None:
        """The request as stored, or None (outside any write transaction)."""
        ...

    async def page(
        self, reads: Reads, state: str, pipeline: str | None, limit: int, cursor: str | None
    ) -> list[Full]:
        """Up to ``limit`` requests of ``state`` (and ``pipeline``) after ``cursor``."""
        ...
