"""Cross-check of the request records against the audit log, for ``audit verify -c``: one
engine for every kind of request (approvals, questions), each kind plugged in as a
``RecordKind`` table.

The chain, receipts and signatures (``gate.audit.chain``) prove the log; this proves that the
tables the API answers from say what the log says. Someone who can write the database file
but holds no receipt or signing key can change a row, not the log: an approved draft's body,
a question's text, an answer, an outcome, a decision. Every request must have:

- one created entry (``created``, ``question_created``) whose values are the row's, column by
  column as its kind's table pairs them (pipeline, step, expires_at, ...);
- exactly the versions the log names (revisions of an approval, versions of a question),
  each stored body hashing to the hash the log holds, the row's current one the last;
- what its verdict left (an approval's decisions, a question's answer) as its log holds it;
- a resolved entry if and only if the row is resolved, with the row's outcome and version,
  and the row's stored receipt being that entry's receipt;
- a dispatch-ack entry for every dispatch its outbox rows say the relay acked (the gate
  writes both in one transaction); at most one per version, only for versions the log
  holds, none for a dispatch the outbox says was never acked.

What each kind checks besides, and in which order, its kind module says
(``gate.audit.approval_kind``, ``gate.audit.question_kind``); the comparisons every kind
shares are ``gate.audit.record_checks``. Pure: takes records already read (by
``gate.store.audit_records``), reads nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

from gate.audit import chain as audit
from gate.audit.entries import Payload

# what ``problem`` turns into a disagreement (a row or entry edited to another type)
_EDITED = (TypeError, ValueError, KeyError, AttributeError, IndexError)

Entries = list[tuple[audit.AuditRow, dict[str, Any]]]
"""A record's audit rows, ascending seq, each with its decoded ``data`` object."""


class Versions(NamedTuple):
    """How a kind names its versions: ``word`` (``revision``; also the column of the current
    one and the field of its resolved and dispatch-ack entries), the ``table`` that stores
    them and what their ``hash`` is called there."""

    word: str
    table: str
    hash: str


class Payloads(NamedTuple):
    """The payloads of a kind's created, resolved and dispatch-ack entries."""

    created: type[Payload]
    resolved: type[Payload]
    ack: type[Payload]


@dataclass(frozen=True, slots=True)
class RecordKind:
    """One kind of request as the records check sees it: the words of its messages, its
    tables and its entries. ``noun`` names a request (``approval``; its table is the plural),
    ``orphan`` the rows of a request that neither that table nor the log has; ``columns``
    are the table's columns its created entry holds, in the order compared, each named as
    the entry's field or paired ``(column, field)``; ``versions`` and ``payloads`` as their
    types say. A ``resolved_hash`` field, when named, must be the logged hash of the resolved
    version. ``quiet``: the messages never quote a stored value (a question's text or an
    answer), so a value of a type the gate never writes is named by its exception's type
    only. ``compare`` runs the rest of the kind's comparisons, in its order, once the created
    entry is found: ``(record, row, entries, created entry, its payload) -> reason``."""

    noun: str
    orphan: str
    columns: tuple[str | tuple[str, str], ...]
    versions: Versions
    payloads: Payloads
    compare: Callable[[Any, dict[str, Any], Entries, audit.AuditRow, Any], str | None]
    resolved_hash: str | None = None
    quiet: bool = False

    @property
    def table(self) -> str:
        """The table of its rows (``approvals``)."""
        return f"{self.noun}s"


class Record(Protocol):
    """One request as the tables hold it, with its audit rows (``entries``, ascending seq);
    ``KIND`` the table of its kind."""

    KIND: ClassVar[RecordKind]

    @property
    def entries(self) -> list[audit.AuditRow]: ...

    @property
    def subject(self) -> tuple[str, dict[str, Any] | None]:
        """Its id and its table's row as a dict (None when only the log or another table
        names it)."""
        ...


@dataclass(frozen=True, slots=True)
class RecordsResult:
    """``checked`` requests matched the log; ``problem`` is ``(id, reason)`` of the first (in
    id order) that did not, else None. ``newer`` requests had entries after ``up_to_seq``
    (written after the chain was verified) and were not checked."""

    checked: int
    problem: tuple[str, str] | None
    newer: int = 0


def check(records: Iterable[Record], up_to_seq: int) -> RecordsResult:
    """Compare each request's rows with its audit entries (module docstring); stop at the
    first request that disagrees. Requests with an entry after ``up_to_seq`` (the last
    verified seq) are counted in ``newer`` and skipped: their entries are not verified."""
    checked = newer = 0
    for record in records:
        if record.entries and record.entries[-1].seq > up_to_seq:
            newer += 1
            continue
        reason = problem(record)
        if reason is not None:
            return RecordsResult(checked, (record.subject[0], reason), newer)
        checked += 1
    return RecordsResult(checked, None, newer)


def problem(record: Record) -> str | None:
    """Why ``record``'s rows disagree with its audit entries, or None when they agree. A
    value of a type the gate never writes (an edited row) is a disagreement too."""
    try:
        return _problem(record)
    except _EDITED as exc:
        if record.KIND.quiet:  # its text could quote a stored question or answer
            return f"a row or entry holds a value the gate never writes ({type(exc).__name__})"
        return f"a row or entry holds a value of a type the gate never writes ({exc})"


def _problem(record: Record) -> str | None:
    """The row and its created entry (there, once, with the row's values), then the kind's
    own comparisons (``RecordKind.compare``)."""
    kind, row = record.KIND, record.subject[1]
    entries = [(e, e.data) for e in record.entries]
    made = kind.payloads.created.kind
    created = [(e, kind.payloads.created.from_data(d)) for e, d in entries if e.kind == made]
    if row is None and not record.entries:
        return f"{kind.orphan} that neither the {kind.table} table nor the audit log has"
    if row is None:
        first = record.entries[0].seq
        return f"named by audit entry {first} but missing from the {kind.table} table (deleted?)"
    if len(created) != 1:
        return (
            f"{len(created)} {made} entries in the audit log (expected 1)"
            if created
            else f"no {made} entry in the audit log (row inserted outside the gate?)"
        )
    entry, data = created[0]
    for named in kind.columns:
        column, name = (named, named) if isinstance(named, str) else named
        if row[column] != getattr(data, name):
            return (
                f"{column} is {row[column]!r} in the {kind.table} table but "
                f"{getattr(data, name)!r} in audit entry {entry.seq}"
            )
    return kind.compare(record, row, entries, entry, data)
