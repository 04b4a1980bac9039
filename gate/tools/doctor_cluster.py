"""Doctor's check of the gates sharing a PostgreSQL database: the live ones, their versions,
whether they run one config (this one) and whether any clock is off the database's."""

from __future__ import annotations

from gate.errors import Unavailable
from gate.store.pg_instances import assess, live, named
from gate.store.pg_lease import TIMERS, current
from gate.store.pg_session import close_quietly, connect
from gate.tools.doctor_check import Check, counted, warn

NAME = "cluster"


async def check_cluster(url: str, password: str | None, config_hash: str) -> Check:
    """The gates on the database at ``url`` (``gate_instances``): FAIL when live gates run
    configs of different hashes, when they run another config than this one
    (``config_hash``: the file doctor checks), or when a live gate's clock is off the
    database's (``pg_instances.assess``); WARN when no gate is live; else PASS naming how
    many are live, their versions and the holder of the timers' lease. FAIL when the
    database cannot be reached. Nothing is written."""
    conn = None
    try:
        conn = await connect(url, "doctor", "doctor", password)
        gates = await live(conn)
        lease = await current(conn, TIMERS)
    except Unavailable as exc:
        return Check(NAME, False, exc.message)
    finally:
        await close_quietly(conn)
    if not gates:
        return warn(NAME, "no gate is running on this database (no heartbeat in the last 15 s)")
    health = assess(None, gates)
    problems = list(health.details)
    others = [g.instance_id for g in gates if g.config_hash != config_hash]
    if others and not health.problems:
        problems.append(
            f"the live gates run another config ({gates[0].config_hash[:12]}) than this file"
            f" ({config_hash[:12]})"
        )
    if problems:
        return Check(NAME, False, "; ".join(problems))
    holder = "nobody"
    if lease is not None and lease.expires_at > lease.now:
        holder = next((named(g) for g in gates if g.instance_id == lease.holder), lease.holder)
    versions = ", ".join(sorted({g.version for g in gates}))
    live_gates = counted(len(gates), "gate", "gates")
    return Check(
        NAME, True, f"{live_gates} live (version {versions}), one config; timers on {holder}"
    )
