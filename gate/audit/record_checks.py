"""The comparisons of a request's rows with its audit entries that every kind shares: its
versions, its resolution, its outbox (``gate.audit.records`` says what each checks; a kind
module runs them in its order, worded by its ``RecordKind``).

Pure. Each takes values already read (rows as stored, entries with their decoded ``data``
objects, ``logged``: version -> ``(seq, hash)`` of the entry that made it) and returns why
they disagree, or None. A value of a type the gate never writes may raise TypeError,
ValueError, KeyError, AttributeError or IndexError; ``records.problem`` turns that into a
disagreement.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from gate.audit import chain as audit
from gate.audit.entries import DispatchAckData, Payload
from gate.audit.receipts import receipt_object
from gate.audit.records import Entries, RecordKind

Logged = dict[Any, tuple[int, Any]]
"""Version -> ``(seq, hash)`` of the audit entry that made it."""


def versions_problem(
    kind: RecordKind,
    row: dict[str, Any],
    stored: Mapping[Any, tuple[Any, ...]],
    logged: Logged,
    content: Callable[[Any, tuple[Any, ...], int, Any], str | None],
    first: Any = 1,
) -> str | None:
    """The stored versions (``stored``: version -> its row ``(version, body, hash, ...)``)
    against ``logged``: the same versions (the created entry's, ``first``, being 1), each
    body as the log holds it (``content(version, stored row, seq, logged hash)``: why not,
    or None), each stored hash the logged one, and the row's current version the last
    logged one."""
    word, where = kind.versions.word, kind.versions.table
    if first != 1 or sorted(stored) != sorted(logged):
        return (
            f"{word}s {sorted(stored)} in the {where} table but {sorted(logged)} in the audit log"
        )
    for version, item in sorted(stored.items()):
        seq, expected = logged[version]
        reason = content(version, item, seq, expected)
        if reason is not None:
            return reason
        if item[2] != expected:
            return (
                f"{word} {version}'s {kind.versions.hash} is {item[2]} in the {where} "
                f"table but {expected} in audit entry {seq}"
            )
    if row[word] != max(logged):
        return (
            f"current {word} is {row[word]} in the {kind.table} table but "
            f"{max(logged)} in the audit log"
        )
    return None


def resolution_problem(
    kind: RecordKind,
    row: dict[str, Any],
    entries: Entries,
    logged: Logged,
    *,
    settled: bool = False,
    outcome: Callable[[audit.AuditRow, Any], str | None] | None = None,
) -> str | None:
    """The row's state, outcome, version and stored receipt against its resolved entry: at
    most one, present if and only if the row is resolved (and, when ``settled``, the log
    says the request was settled, e.g. answered); resolving the row's current version (on
    its logged hash when the kind names ``resolved_hash``), what ``outcome(entry, payload)``
    asks of it, and the row's receipt that entry's receipt
    (``gate.audit.receipts.receipt_object``)."""
    table, word, kind_of = kind.table, kind.versions.word, kind.payloads.resolved
    resolved: list[tuple[audit.AuditRow, Any]] = [
        (e, kind_of.from_data(d)) for e, d in entries if e.kind == kind_of.kind
    ]
    if len(resolved) > 1:
        return f"{len(resolved)} {kind_of.kind} entries in the audit log (expected at most 1)"
    if not resolved:
        if row["state"] != "pending" or settled:
            return (
                f"state is {row['state']!r} ({row['outcome']}) in the {table} table "
                "but the audit log holds no resolution"
            )
        return None
    entry, data = resolved[0]
    if row["state"] != "resolved":
        return (
            f"state is {row['state']!r} in the {table} table but audit entry "
            f"{entry.seq} resolved it {data.outcome!r}"
        )
    if row["outcome"] != data.outcome:
        return (
            f"outcome is {row['outcome']!r} in the {table} table but "
            f"{data.outcome!r} in audit entry {entry.seq}"
        )
    version = getattr(data, word)
    if row[word] != version or (
        kind.resolved_hash is not None and getattr(data, kind.resolved_hash) != logged[version][1]
    ):
        return (
            f"resolved at {word} {version} in audit entry {entry.seq} "
            f"but the {table} table's current {word} is {row[word]}"
        )
    reason = outcome(entry, data) if outcome is not None else None
    if reason is not None:
        return reason
    try:
        receipt = json.loads(row["receipt"]) if row["receipt"] is not None else None
    except ValueError:
        receipt = None
    if receipt != receipt_object(entry):
        return f"its stored receipt is not the receipt of audit entry {entry.seq}"
    return None


def dispatches_problem(
    kind: RecordKind,
    dispatches: list[tuple[Any, Any, Any]],
    entries: Entries,
    logged: Logged,
) -> str | None:
    """The outbox rows ``(version, attempts, delivered_at)`` against the dispatch-ack
    entries: an acked dispatch has its entry (with the same attempts, where the entry counts
    them), an entry its acked dispatch (when the outbox holds the version's row); one ack per
    version, each of a logged one. An outbox row missing altogether is not named (the gate
    would not send it again)."""
    word, ack_kind = kind.versions.word, kind.payloads.ack.kind
    acks: dict[Any, list[tuple[audit.AuditRow, Payload]]] = {}
    for e, d in entries:
        if e.kind == ack_kind:
            logged_ack = kind.payloads.ack.from_data(d)
            acks.setdefault(getattr(logged_ack, word), []).append((e, logged_ack))
    for version, found in acks.items():
        if len(found) > 1:
            return (
                f"{len(found)} {ack_kind} entries for {word} {version} in the audit "
                "log (expected at most 1)"
            )
        if version not in logged:
            return (
                f"audit entry {found[0][0].seq} records the relay's ack of {word} "
                f"{version}, which the audit log does not hold"
            )
    for version, attempts, delivered_at in dispatches:
        if version not in logged:
            return f"its outbox row dispatches {word} {version}, which the audit log does not hold"
        ack = acks.get(version)
        if delivered_at is None:
            if ack is not None:
                return (
                    f"its outbox row says the dispatch of {word} {version} was never "
                    f"acked, but audit entry {ack[0][0].seq} records the relay's ack"
                )
            continue
        if ack is None:
            plural = "" if attempts == 1 else "s"
            return (
                f"its outbox row says the relay acked the dispatch of {word} {version} "
                f"(after {attempts} attempt{plural}), but the audit log holds no "
                f"{ack_kind} entry for it (deleted?)"
            )
        entry, data = ack[0]
        if isinstance(data, DispatchAckData) and data.attempts != attempts:
            return (
                f"its outbox row counts {attempts!r} attempts for the acked dispatch of "
                f"{word} {version}, audit entry {entry.seq} {data.attempts!r}"
            )
    return None


def scope_problem(
    kind: RecordKind, row: dict[str, Any], approvers: list[Any], seq: int, frozen: str
) -> str | None:
    """The operators of the row's ``scope`` (JSON ``[[operator_id, identity], ...]``) are
    ``approvers``, in order, as the log says (``frozen``: what entry ``seq`` froze, worded)."""
    scope = [pair[0] for pair in json.loads(row["scope"])]
    if scope != approvers:
        return (
            f"scope holds operators {scope} in the {kind.table} table but audit entry "
            f"{seq} froze {frozen}"
        )
    return None
