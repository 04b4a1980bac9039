"""Persistence on SQLite or PostgreSQL: the only package that speaks SQL. One set of reads
and statements for every kind of request (requests; each kind's own in approvals,
questions), one outbox contract (outbox), a write transaction's statements by composition
(tx), one batch runner with each backend's part behind a small object (backend,
pg_backend); what several gates on one PostgreSQL database share: their rows (pg_instances),
the timers' lease (pg_lease) and the change feed (pg_feed), on sessions of their own
(pg_session)."""

from gate.store.batch import Command, Writer
from gate.store.facade import Store
from gate.store.tx import WriteTx

__all__ = ["Command", "Store", "WriteTx", "Writer"]
