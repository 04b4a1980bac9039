"""SQLite persistence: the only package that speaks SQL. One set of reads and statements for
every kind of request (requests; each kind's own in approvals, questions), one outbox contract
(outbox), a write transaction's statements by composition (tx)."""

from gate.store.batch import Command, Writer
from gate.store.facade import Store
from gate.store.tx import WriteTx

__all__ = ["Command", "Store", "WriteTx", "Writer"]
