"""What a kind of request (approval, question) gives the shared lifecycle: its names, its
statements in the writer's transaction, its reads and its object in the pipeline API, as one
small table (``Kind``). ``gate.core.approvals.kind`` and ``gate.core.questions.kind`` are the
two; the lifecycle (``lifecycle_tx``, ``service``) knows a kind only through ``Kind``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from gate.store import WriteTx
from gate.store.outbox import OutboxTable
from gate.store.requests import RequestTables

if TYPE_CHECKING:
    from gate.config import Config
    from gate.core.transactions import Transactions


class Stored(Protocol):
    """The fields every loaded request has (``gate.model.Approval``, ``Question``)."""

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


Full = TypeVar("Full", bound=Stored)  # the loaded request (``gate.model.Approval``, ...)
Target = TypeVar("Target")  # what resolving it needs (``gate.model.Resolvable``, ...)


@dataclass(frozen=True, slots=True)
class Kind(Generic[Full, Target]):
    """A kind of request as the shared lifecycle sees it.

    Names: ``name`` in messages and reason codes (``unknown_<name>``, 404), ``id_field`` of
    its id in views, log lines and its targets (its tables' ``id``), ``event`` before its
    log events (``""`` for approvals: ``event=resolved``; ``"question_"``:
    ``event=question_resolved``), ``already_resolved`` the message of a cancel's 409,
    ``logger`` of its service's lines (``gate.core.service`` for approvals, as before the
    kinds shared a lifecycle: filters on it keep working).

    ``tables`` are its tables in the store (``gate.store.requests.RequestTables``): the
    reads and statements every kind shares serve it through them (``Reads.fetch``,
    ``Reads.page``; in a transaction ``WriteTx.requests(tables)``).

    In the writer's transaction (``tx``, whose statements are called on it, so any storage
    backend's serves): ``insert`` a new one (``t``, ``tx``, the columns every kind has, the
    parsed request, the step's policy, now, the body hash, the payload hash when computed
    before the transaction: its own columns, first version, dispatch and created entry);
    ``target`` what resolving a loaded one needs; ``resolve`` a target as an outcome at now
    (no permit: timeout, cancelled); ``dispatches`` is its outbox table in the store's one
    outbox contract (``gate.store.outbox``: one attempt of a version is recorded there) and
    ``dispatch_ack`` is the audit entry of its first ack. Outside it: ``notices_on`` whether
    a resolution notice is queued (its relay target set), ``view`` is the pipeline API's
    object (JSON-ready).
    """

    name: str
    tables: RequestTables[Full, Target]
    event: str
    already_resolved: str
    logger: str
    insert: Callable[[Transactions, WriteTx, dict[str, Any], Any, Any, int, str, str | None], None]
    target: Callable[[Full], Target]
    resolve: Callable[[Transactions, WriteTx, Target, str, int], None]
    dispatches: OutboxTable[Any]
    dispatch_ack: Callable[[int, int], Entry]
    notices_on: Callable[[Config], bool]
    view: Callable[[Full], dict[str, Any]]

    def __post_init__(self) -> None:
        _KINDS[self.name] = self

    @property
    def id_field(self) -> str:
        """The column, view field and target attribute of its id."""
        return self.tables.id

    def __reduce__(self) -> tuple[Callable[[str], Kind[Any, Any]], tuple[str]]:
        # a command names its kind (``lifecycle_tx.Cancel``): it crosses to the writer
        # process by name, and is the same object there (its fields are functions)
        return kind_named, (self.name,)


_KINDS: dict[str, Kind[Any, Any]] = {}


def kind_named(name: str) -> Kind[Any, Any]:
    """The kind whose ``name`` is ``name`` (every ``Kind`` made so far)."""
    return _KINDS[name]
