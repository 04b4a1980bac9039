"""The gates running on one PostgreSQL database (``gate_instances``): each records itself at
start and at every heartbeat (version, config hash, host, pid, its clock's offset to the
database's), and what the live ones say about the cluster (``assess``: different configs,
a clock too far off).

Every time is the database's clock (unix ms). The statements take a psycopg async
connection (``pg_session.connect``); nothing here imports the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.store.pg_session import DB_NOW_MS, unavailable

# a gate whose last heartbeat is younger than this is live (heartbeats come every few
# seconds: three missed ones and it is not)
LIVE_MS = 15_000
# a row whose heartbeat is older than this is removed by the next heartbeat of any gate
FORGET_MS = 24 * 3600 * 1000
# |the gate's clock - the database's| above this is ``clock_skew`` (the design's "a few
# seconds"; what the gate itself uses is the database's clock either way)
MAX_OFFSET_MS = 5_000
# a reading of the database's clock is off by up to half its round trip (all of a delay may
# lie on one way): one slower than this is taken again, up to READINGS times
PROMPT_MS = 1_000
READINGS = 3

CONFIG_DIVERGENT = "config_divergent"
CLOCK_SKEW = "clock_skew"


@dataclass(frozen=True, slots=True)
class Instance:
    """One gate's row: its id (a ULID made at start), ``version`` (the package's), the hash
    of its config (``gate.config.config_hash``), ``host`` and ``pid``, its clock minus the
    database's at the last heartbeat (ms), and when it started and last beat (database
    clock, unix ms)."""

    instance_id: str
    version: str
    config_hash: str
    host: str
    pid: int
    clock_offset_ms: int
    started_at: int
    heartbeat_at: int


@dataclass(frozen=True, slots=True)
class ClusterHealth:
    """What the live gates say (``assess``): ``problems`` (``config_divergent``,
    ``clock_skew``: the second concerns the gate that asks only), the live gates, and
    one sentence per problem for a person."""

    live: tuple[Instance, ...]
    problems: tuple[str, ...]
    details: tuple[str, ...]


async def clock_offset_ms(conn: Any, local_ms: Callable[[], int]) -> int | None:
    """The gate's clock (``local_ms()``, unix ms) minus the database's: the database's time
    against the middle of a round trip no longer than PROMPT_MS, read up to READINGS times;
    None when none was that prompt (a stall between the gate and the database: such a
    reading could be off by half of it, and a gate on the right clock would look skewed).
    Raises Unavailable."""
    with unavailable("reading the database's clock"):
        for _ in range(READINGS):
            before = local_ms()
            cursor = await conn.execute(f"SELECT {DB_NOW_MS}")
            (db_ms,) = await cursor.fetchone()
            after = local_ms()
            if after - before <= PROMPT_MS:
                return (before + after) // 2 - int(db_ms)
    return None


async def beat(conn: Any, me: Instance) -> None:
    """Record ``me`` (its first row at start, then its heartbeat): everything but
    ``started_at`` (kept from the first row) and ``heartbeat_at`` (the database's now);
    forget rows older than FORGET_MS. Raises Unavailable."""
    with unavailable("recording this gate's heartbeat"):
        await conn.execute(
            "INSERT INTO gate_instances (instance_id, version, config_hash, host, pid,"
            f" clock_offset_ms, started_at, heartbeat_at) VALUES (%s, %s, %s, %s, %s, %s,"
            f" {DB_NOW_MS}, {DB_NOW_MS}) ON CONFLICT (instance_id) DO UPDATE SET"
            " version = EXCLUDED.version, config_hash = EXCLUDED.config_hash,"
            " host = EXCLUDED.host, pid = EXCLUDED.pid,"
            " clock_offset_ms = EXCLUDED.clock_offset_ms, heartbeat_at = EXCLUDED.heartbeat_at",
            (me.instance_id, me.version, me.config_hash, me.host, me.pid, me.clock_offset_ms),
        )
        await conn.execute(
            f"DELETE FROM gate_instances WHERE heartbeat_at < {DB_NOW_MS} - %s", (FORGET_MS,)
        )


async def leave(conn: Any, instance_id: str) -> None:
    """Remove this gate's row (a clean stop). Raises Unavailable."""
    with unavailable("removing this gate's row"):
        await conn.execute("DELETE FROM gate_instances WHERE instance_id = %s", (instance_id,))


async def live(conn: Any, within_ms: int = LIVE_MS) -> list[Instance]:
    """The gates whose heartbeat is younger than ``within_ms`` (database clock), oldest
    start first. Raises Unavailable."""
    with unavailable("reading the gates' heartbeats"):
        cursor = await conn.execute(
            "SELECT instance_id, version, config_hash, host, pid, clock_offset_ms, started_at,"
            f" heartbeat_at FROM gate_instances WHERE heartbeat_at >= {DB_NOW_MS} - %s"
            " ORDER BY started_at, instance_id",
            (within_ms,),
        )
        rows = await cursor.fetchall()
    return [Instance(*row) for row in rows]


def assess(
    me: str | None, live: list[Instance], max_offset_ms: int = MAX_OFFSET_MS
) -> ClusterHealth:
    """What ``live`` says: ``config_divergent`` when live gates run configs of different
    hashes; ``clock_skew`` when the gate ``me`` (an instance id; None: any live gate, as
    ``doctor`` asks) is off the database's clock by more than ``max_offset_ms``."""
    problems: list[str] = []
    details: list[str] = []
    hashes: dict[str, list[str]] = {}
    for gate in live:
        hashes.setdefault(gate.config_hash, []).append(named(gate))
    if len(hashes) > 1:
        problems.append(CONFIG_DIVERGENT)
        groups = "; ".join(
            f"config {digest[:12]} on {', '.join(ids)}" for digest, ids in sorted(hashes.items())
        )
        details.append(f"live gates run different configs: {groups}")
    skewed = [
        g
        for g in live
        if (me is None or g.instance_id == me) and abs(g.clock_offset_ms) > max_offset_ms
    ]
    if skewed:
        problems.append(CLOCK_SKEW)
        offsets = ", ".join(f"{named(g)} {g.clock_offset_ms / 1000:+.1f} s" for g in skewed)
        details.append(
            f"clock off the database's by more than {max_offset_ms / 1000:g} s: {offsets}"
        )
    return ClusterHealth(tuple(live), tuple(problems), tuple(details))


def named(gate: Instance) -> str:
    """A gate as a person finds it: ``<instance id> (<host> pid <pid>)``."""
    return f"{gate.instance_id} ({gate.host} pid {gate.pid})"
