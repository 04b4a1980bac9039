"""Two disruptions of the cluster soak (tests/soak/cluster.py) beyond kill -9 and a
PostgreSQL crash: a gate's writer frozen while it holds the ``audit_head`` lock, and a gate
cut off from the database while the others keep it.

``freeze_writer``: SIGSTOP a gate's writer process (the daemon's child that runs the write
batches), aiming at the moment its session ``hitl-gate/writer/<instance>`` is inside a
batch: it polls ``pg_stat_activity`` until that session has a transaction open, stops the
process, and reads the session again: ``idle in transaction`` after its ``BEGIN`` means it
holds the lock every batch opens with (it tries again, thawing in between, for up to
``AIM_S``). It stays frozen longer than ``idle_in_transaction_session_timeout`` (PostgreSQL
then ends the session and its lock) while probes post decisions through the balancer: the
other gates must record some before the thaw (on a loaded machine it stays frozen until
they have, up to ``FROZEN_MAX_S``). Then SIGCONT, not kill -9: a kill is a
disruption of its own; the thaw is the case only a freeze makes, a writer that wakes up in
a transaction the server has ended, which must answer its callers 503 (never 200) and
reconnect by itself. The thawed gate must answer ``/healthz`` 200 and take a create (201)
within ``RECOVER_S``.

``cut_off``: reset every connection of one gate's TCP proxy to PostgreSQL
(tests/pg_proxy.py) and refuse new ones for a few seconds. Meanwhile that gate must answer
``/healthz`` 503 and a create 503 (never 500, never 201); after the restore it must answer
``/healthz`` 200 by itself within ``RECOVER_S``.

After either, as after a kill: everything answered 201/200 so far is in the database.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from typing import TYPE_CHECKING, Any

from gate.postgres.target import IDLE_IN_TRANSACTION_MS, LOCK_TIMEOUT_MS
from tests.soak.soak import CreateAttempt, Kill, send
from tests.support import writer_pid

if TYPE_CHECKING:
    from tests.soak.cluster import ClusterSoak

RECOVER_S = 5.0  # a gate answers /healthz 200 this soon after the database is back for it
AIM_S = 3.0  # how long the freeze tries to stop the writer inside a batch
SETTLE_S = 1.0  # a stopped writer's statement in flight ends this soon (else: not holding)
FROZEN_EXTRA_S = (2.0, 3.0)  # frozen this much longer than the server's idle timeout
FROZEN_MAX_S = 15.0  # frozen longer (up to this) while the others have answered nothing yet
CUT_S = (2.0, 4.0)  # how long a gate stays cut off
PROBES = 3  # threads posting through the balancer while a writer is frozen
PROBE_TIMEOUT_S = 1.0  # a probe that reached the frozen gate gives up (unanswered) after this
WRITER_SESSION = (
    "SELECT pid, state, xact_start IS NOT NULL, query FROM pg_stat_activity"
    " WHERE application_name = %s"
)


def _session(conn: Any, name: str) -> tuple[int, str, bool, str] | None:
    row = conn.execute(WRITER_SESSION, (name,)).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), bool(row[2]), str(row[3]))


def _holds_lock(conn: Any, name: str) -> tuple[bool | None, str]:
    """After the writer was stopped: whether its session holds the head lock (a transaction
    open past its ``BEGIN``, idle; None while a statement of it is still running), and what
    the session showed (its state and first word of its last statement)."""
    session = _session(conn, name)
    if session is None:
        return False, "no session"
    _, state, in_tx, query = session
    seen = f"{state} after {query.split(maxsplit=1)[0] if query.strip() else '-'}"
    if state == "active":
        return None, seen
    held = state == "idle in transaction" and in_tx and not query.upper().startswith("BEGIN")
    return held, seen


def _stop_inside_batch(conn: Any, name: str, pid: int) -> tuple[bool, Counter[str]]:
    """SIGSTOP ``pid`` (left stopped), aiming inside a batch of its session ``name``; returns
    whether it holds the head lock and what the session showed at the stops that missed."""
    deadline = time.monotonic() + AIM_S
    missed: Counter[str] = Counter()
    while True:
        session = _session(conn, name)
        last_try = time.monotonic() > deadline
        if not (session is not None and session[2]) and not last_try:
            continue  # not in a transaction now: look again at once
        os.kill(pid, signal.SIGSTOP)
        settle = time.monotonic() + SETTLE_S
        held, seen = _holds_lock(conn, name)
        while held is None and time.monotonic() < settle:
            time.sleep(0.01)
            held, seen = _holds_lock(conn, name)
        if held or last_try:
            return bool(held), missed
        missed[seen] += 1
        os.kill(pid, signal.SIGCONT)  # between batches: let it run and aim again
        time.sleep(0.005)


def _until(check: Callable[[], bool], deadline: float, pause: float = 0.05) -> bool:
    """Poll ``check`` until it is true (True) or ``deadline`` (monotonic) passes (False)."""
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(pause)
    return False


def _healthz(api_url: str) -> int | None:
    return send(api_url + "/healthz", "GET", None, {}, timeout=5.0)[1]


def _attempt(soak: ClusterSoak, run_id: str) -> CreateAttempt:
    """The recorded create of ``run_id`` (made by this thread: one of the newest)."""
    with soak.lock:
        return next(c for c in reversed(soak.creates) if c.run_id == run_id)


def _created(soak: ClusterSoak, api_url: str, tag: str, deadline: float) -> bool:
    """Create approvals directly on one gate (recorded like the load's) until one gets 201
    (True) or ``deadline`` passes (False)."""
    rng = random.Random(f"{soak.seed}-{tag}")
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        run_id = f"soak-{soak.seed}-{tag}-{attempt}"
        soak._create(rng, api_url, run_id)
        if _attempt(soak, run_id).status == 201:
            return True
        time.sleep(0.1)
    return False


def _probe(soak: ClusterSoak, number: int, until: threading.Event) -> None:
    """Post decisions (creates while nothing is open) through the balancer until ``until``,
    each given up after PROBE_TIMEOUT_S."""
    rng = random.Random(f"{soak.seed}-probe-{number}")
    soak.local.timeout = PROBE_TIMEOUT_S
    counter = 0
    try:
        while not until.is_set() and not soak.stop.is_set():
            with soak.lock:
                n_open = len(soak.open)
            if n_open:
                soak._decide(rng, soak.callback_url)
            else:
                counter += 1
                soak._create(rng, soak.api_url, f"soak-{soak.seed}-probe-{number}-{counter}")
            until.wait(0.02)
    except BaseException as exc:  # reported by run()
        soak.errors.append(exc)


def _served_between(soak: ClusterSoak, start: float, end: float) -> int:
    """Decisions answered 200 and creates answered 201 in (start, end) (wall clock)."""
    with soak.lock:
        decided = sum(start < d.answered_at < end for d in soak.decisions if d.status == 200)
        created = sum(start < c.answered_at < end for c in soak.creates if c.status == 201)
    return decided + created


def freeze_writer(soak: ClusterSoak, index: int) -> Kill:
    """One frozen-writer disruption (see the module docstring); its Kill for the checker."""
    assert soak.cluster is not None
    victim = soak.rng.randrange(len(soak.cluster))
    gate = soak.cluster[victim]
    status, health = send(gate.api_url + "/healthz", "GET", None, {}, timeout=5.0)[1:]
    instance = health["cluster"]["instance"] if status == 200 else "?"
    name = f"hitl-gate/writer/{instance}"
    pid = writer_pid(gate)
    frozen_for = IDLE_IN_TRANSACTION_MS / 1000 + soak.rng.uniform(*FROZEN_EXTRA_S)
    until = threading.Event()
    probes = [
        threading.Thread(target=_probe, args=(soak, n, until), daemon=True) for n in range(PROBES)
    ]
    left: tuple[int, str, bool, str] | None = None
    with closing(soak.admin()) as conn:
        held, missed = _stop_inside_batch(conn, name, pid)
        frozen_at, frozen = time.time(), time.monotonic()
        try:
            backend = _session(conn, name)
            for probe in probes:
                probe.start()
            ended = (
                not held
                or backend is None
                or _until(
                    lambda: _session(conn, name) is None,
                    frozen + (IDLE_IN_TRANSACTION_MS + LOCK_TIMEOUT_MS) / 1000 + 1.0,
                )
            )
            time.sleep(max(0.0, frozen + frozen_for - time.monotonic()))
            _until(  # a loaded machine: give the others until FROZEN_MAX_S to answer one
                lambda: _served_between(soak, frozen_at, time.time()) > 0,
                frozen + FROZEN_MAX_S,
                pause=0.1,
            )
            left = _session(conn, name) if held else None
        finally:
            os.kill(pid, signal.SIGCONT)
    thawed_at, thawed = time.time(), time.monotonic()
    until.set()
    for probe in probes:
        probe.join(PROBE_TIMEOUT_S + 30)
    served = _served_between(soak, frozen_at, thawed_at)
    soak.fig.writer_freezes += 1
    soak.fig.freezes_holding_lock += held
    soak.fig.served_while_frozen += served
    if held and not ended:
        soak._problem(
            f"freeze {index}: PostgreSQL did not end the frozen writer's session holding the "
            f"lock within its timeouts (at the thaw: {left})"
        )
    if served == 0:
        soak._problem(
            f"freeze {index}: no gate recorded anything in the {thawed - frozen:.1f} s gate "
            f"{victim} was frozen (its writer's session at the thaw: {left})"
        )
    healthy = _until(lambda: _healthz(gate.api_url) == 200, thawed + RECOVER_S)
    wrote = healthy and _created(soak, gate.api_url, f"thawed-{index}", thawed + RECOVER_S)
    if not wrote:
        soak._problem(
            f"freeze {index}: gate {victim} did not answer /healthz 200 and a create 201 within "
            f"{RECOVER_S:g} s of its writer's thaw"
        )
    kill = soak.checked(index, time.time())
    tries = "; ".join(f"{n}x {seen}" for seen, n in missed.most_common(3)) or "none"
    soak.say(
        f"{index}/{soak.kills}: gate {victim}'s writer frozen {thawed - frozen:.1f} s "
        f"({'holding' if held else 'not holding'} the lock; stops that missed: {tries}), "
        f"{served} answered 200/201 meanwhile, thawed"
    )
    return kill


def cut_off(soak: ClusterSoak, index: int) -> Kill:
    """One cut-off disruption (see the module docstring); its Kill for the checker."""
    assert soak.cluster is not None
    victim = soak.rng.randrange(len(soak.cluster))
    gate, proxy = soak.cluster[victim], soak.proxies[victim]
    cut_for = soak.rng.uniform(*CUT_S)
    proxy.cut()
    at, cut = time.time(), time.monotonic()
    try:
        if not _until(lambda: _healthz(gate.api_url) == 503, cut + cut_for):
            soak._problem(f"cut {index}: gate {victim} never answered /healthz 503 while cut off")
        run_id = f"soak-{soak.seed}-cut-{index}"
        soak._create(random.Random(run_id), gate.api_url, run_id)
        attempt = _attempt(soak, run_id)
        if attempt.fate != "unavailable":
            soak._problem(
                f"cut {index}: a create on the cut-off gate {victim} was answered "
                f"{attempt.status} ({attempt.fate}), not 503"
            )
        time.sleep(max(0.0, cut + cut_for - time.monotonic()))
    finally:
        proxy.restore()
    back = time.monotonic()
    if not _until(lambda: _healthz(gate.api_url) == 200, back + 60.0):
        soak._problem(f"cut {index}: gate {victim} never answered /healthz 200 again")
    recovered = soak.recovered(f"cut {index}: gate {victim}", back)
    soak.fig.gate_cuts += 1
    soak.fig.cut_recover_max_s = max(soak.fig.cut_recover_max_s, recovered)
    kill = soak.checked(index, at)
    soak.say(
        f"{index}/{soak.kills}: gate {victim} cut off from PostgreSQL for {cut_for:.1f} s, "
        f"back in {recovered:.2f} s"
    )
    return kill
