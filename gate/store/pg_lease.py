"""Leases among the gates on one PostgreSQL database (``gate_lease``), River's way: one row
per lease; a gate claims it when nobody holds it or the holder let it lapse, renews it while
it holds it, and gives it up on a clean stop (the row stays, lapsed: the term only grows).
Each new holding is a new ``term``, a gate reclaiming its own lapsed lease too. The
database's clock decides when a lease lapses, so the gates' own clocks do not matter.

A lease only picks which gate does a job (the timers and the senders: ``TIMERS``); it is
never what makes the job happen once. The statements take a psycopg async connection
(``pg_session.connect``); nothing here imports the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.store.pg_session import DB_NOW_MS, unavailable

TIMERS = "timers"  # the lease of the timers (expiry, follow-ups) and the senders


@dataclass(frozen=True, slots=True)
class Term:
    """A lease as the database holds it: ``holder`` (an instance id) in its ``term``
    (1, 2, ...: +1 each time the lease is claimed anew: another holder, or the same one
    after its lease lapsed or was released; never back), elected at ``elected_at`` and lapsing at
    ``expires_at`` (database clock, unix ms); ``now`` is the database's clock when read."""

    name: str
    holder: str
    term: int
    elected_at: int
    expires_at: int
    now: int


# the database's clock read once for the whole statement (clock_timestamp() moves between
# two calls: elected_at and expires_at would not be TTL apart)
_CLAIM = f"""
WITH clock AS (SELECT {DB_NOW_MS} AS now_ms)
INSERT INTO gate_lease AS l (name, holder, term, elected_at, expires_at)
SELECT %(name)s, %(me)s, 1, clock.now_ms, clock.now_ms + %(ttl)s FROM clock
ON CONFLICT (name) DO UPDATE SET
    holder = EXCLUDED.holder,
    term = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > EXCLUDED.elected_at
                THEN l.term ELSE l.term + 1 END,
    elected_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > EXCLUDED.elected_at
                      THEN l.elected_at ELSE EXCLUDED.elected_at END,
    expires_at = EXCLUDED.expires_at
WHERE l.holder = EXCLUDED.holder OR l.expires_at <= EXCLUDED.elected_at
RETURNING name, holder, term, elected_at, expires_at, (SELECT now_ms FROM clock)
"""


async def claim(conn: Any, name: str, me: str, ttl_ms: int) -> Term | None:
    """Claim or renew the lease ``name`` for the gate ``me`` (an instance id) for ``ttl_ms``
    from the database's now, in one statement: granted when ``me`` holds it already (its
    term kept) or nobody does (a new row: term 1) or the holder's lapsed or was released
    (term + 1, ``me``'s own lapsed lease too).
    Returns the lease ``me`` now holds, or None when another gate holds it. Raises
    Unavailable."""
    with unavailable(f"claiming the {name} lease"):
        cursor = await conn.execute(_CLAIM, {"name": name, "me": me, "ttl": ttl_ms})
        row = await cursor.fetchone()
    return None if row is None else Term(*row)


async def release(conn: Any, name: str, me: str) -> bool:
    """Give up the lease ``name`` if ``me`` holds it (a clean stop: another gate claims it at
    its next attempt, without waiting for it to lapse): the row stays, lapsed now, so the
    next claim counts on from its term. True when it held it. Raises Unavailable."""
    with unavailable(f"releasing the {name} lease"):
        cursor = await conn.execute(
            f"UPDATE gate_lease SET expires_at = {DB_NOW_MS}"
            f" WHERE name = %s AND holder = %s AND expires_at > {DB_NOW_MS}",
            (name, me),
        )
    return bool(cursor.rowcount)


async def current(conn: Any, name: str) -> Term | None:
    """The lease ``name`` as it stands (lapsed or not: compare ``expires_at`` with
    ``now``; a released lease has lapsed), or None when nobody ever claimed it. Raises
    Unavailable."""
    with unavailable(f"reading the {name} lease"):
        cursor = await conn.execute(
            f"SELECT name, holder, term, elected_at, expires_at, {DB_NOW_MS} FROM gate_lease"
            " WHERE name = %s",
            (name,),
        )
        row = await cursor.fetchone()
    return None if row is None else Term(*row)
