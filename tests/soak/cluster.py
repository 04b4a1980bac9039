"""The soak with several gates on one PostgreSQL behind a balancer: kill any gate, freeze
its writer, cut it off from the database, restart PostgreSQL, then the same proof as
``tests/soak/soak.py``.

    python -m tests.soak.cluster --kills 40 --seconds-between 1-4 --seed 7

Three ``hitl-gate serve`` processes (``--gates``) share one database on a throwaway server
(tests/pg_server.py) behind two haproxys (tests/cluster_gates.py: the pipeline API and the
decision callback). The load generator of the SQLite soak sends every request through the
balancers. Every ``--pg-every``-th disruption is an immediate restart of PostgreSQL
(``pg_ctl -m immediate``: a crash) down for 0-3 s; after it every running gate must answer
``/healthz`` 200 again within 5 s of the server accepting connections. The others are drawn
from ``--kinds`` like cards from a deck shuffled afresh when it runs out (so a few
disruptions show every kind), each on a random gate:

* ``kill``: ``kill -9``, restarted 0-3 s later on its ports (the others serve meanwhile);
* ``freeze``: its writer process stopped (SIGSTOP) inside a write batch, holding the
  ``audit_head`` lock, longer than PostgreSQL's idle-in-transaction timeout; the other gates
  must record decisions meanwhile; then thawed (tests/soak/faults.py);
* ``cut``: every gate reaches PostgreSQL through a TCP proxy of its own (tests/pg_proxy.py);
  one proxy resets its connections and refuses new ones for 2-4 s: that gate answers 503
  (``/healthz`` too) and comes back by itself (tests/soak/faults.py).

After each disruption everything answered 201/200 before it must be in the database. Then
the load stops and the soak's checker runs on the database: every answered 201/200 present,
nothing counted or resolved twice, nothing refused recorded, every pending dispatch acked,
``hitl-gate audit verify`` with every head any gate logged (``--expect-head``) and every
``created_receipt`` the clients kept (``--expect``), no 5xx but 503, no traceback and no
database password in any gate's log.

Through a balancer a client cannot always know what happened: a 502 of the balancer (the
gate died with the request) and a gate's 503 (PostgreSQL went away, maybe during COMMIT)
both mean "maybe": the checker treats them like an unanswered request (present or absent,
never twice). ``tests/test_soak_cluster.py`` runs a short version in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.cluster_gates import DB_PASSWORD, Gates
from tests.pg_proxy import CutProxy
from tests.pg_server import PgServer, pg_bindir
from tests.soak.faults import RECOVER_S, cut_off, freeze_writer
from tests.soak.soak import (
    LOG_NEEDLES,
    SECURITY,
    STEPS,
    Figures,
    Kill,
    Soak,
    parse_range,
    send,
)
from tests.support import gate_env

KINDS = ("kill", "freeze", "cut")  # the disruptions between PostgreSQL restarts
REQUEST_TIMEOUT_S = 30.0
# storage_unavailable and the loops' failures are what a PostgreSQL restart is expected to log
CLUSTER_NEEDLES = tuple(
    n
    for n in LOG_NEEDLES
    if n not in ("storage_unavailable", "event=expiry_failed", "event=dispatch_loop_failed")
) + (DB_PASSWORD,)


class Row(dict[Any, Any]):
    """A row read by column name (``row["seq"]``, ``dict(row)``) and by position
    (``row[0]``), as ``sqlite3.Row``."""

    def __init__(self, names: list[str], values: tuple[Any, ...]) -> None:
        super().__init__(zip(names, values, strict=True))
        self._values = values

    def __getitem__(self, key: Any) -> Any:
        return self._values[key] if isinstance(key, int) else super().__getitem__(key)


class Reader:
    """A read-only snapshot of the PostgreSQL database (REPEATABLE READ) that takes the
    soak's SQL as written for SQLite (``?`` placeholders)."""

    def __init__(self, url: str) -> None:
        import psycopg

        def rows(cursor: Any) -> Callable[[Any], Row]:
            names = [c.name for c in cursor.description or ()]
            return lambda values: Row(names, tuple(values))

        self.conn = psycopg.connect(url, row_factory=rows)  # type: ignore[arg-type]
        self.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self.conn.read_only = True

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self.conn.execute(sql.replace("?", "%s"), params)

    def close(self) -> None:
        self.conn.close()


class ClusterSoak(Soak):
    """One soak over several gates (see the module docstring). ``server`` is running;
    ``url`` an empty database on it (the gates migrate it as they start together)."""

    balanced = True
    log_needles = CLUSTER_NEEDLES
    resend_proof = False  # another gate may have acked it in the moment of the snapshot

    def __init__(
        self,
        kills: int,
        between: tuple[float, float],
        seed: int,
        *,
        server: PgServer,
        url: str,
        gates: int = 3,
        pg_every: int = 3,
        down: tuple[float, float] = (0.0, 3.0),
        kinds: tuple[str, ...] = KINDS,
        **options: Any,
    ) -> None:
        super().__init__(kills, between, seed, **options)
        self.server = server
        self.url = url
        self.n_gates = gates
        self.pg_every = pg_every
        self.down = down
        self.plan = plan(kills, pg_every, kinds, self.rng)
        self.cluster: Gates | None = None
        self.proxies: list[CutProxy] = []
        self.local = threading.local()  # ``timeout``: this thread's requests' (s)
        self.fig.gates = gates

    def _prepare(self) -> None:
        assert self.relay is not None
        if "cut" in self.plan:  # every gate through a proxy of its own, so any can be cut
            target = ("127.0.0.1", self.server.port)
            self.proxies = [CutProxy(target).start() for _ in range(self.n_gates)]
        self.cluster = Gates(
            self.dir,
            self.relay.url,
            self.url,
            self.n_gates,
            urls={i: proxy.url(self.url) for i, proxy in enumerate(self.proxies)},
            steps=STEPS,
            security=SECURITY,
        )
        self.config = self.cluster.configs[0]

    def _start_gate(self) -> float:
        assert self.cluster is not None
        spawned = time.time()
        self.cluster.start(balanced=True)
        with self.lock:
            self.callback_url = self.cluster.decisions_url
            self.api_url = self.cluster.api_url
        self.up.set()
        return spawned

    def _connect(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.closing(Reader(self.url))

    def _send(
        self, url: str, method: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[str, int | None, Any]:
        """Through a balancer (``send(balanced=True)``), or straight to one gate (a 503 of
        its own is ``unavailable`` too), within this thread's ``local.timeout``."""
        timeout = getattr(self.local, "timeout", REQUEST_TIMEOUT_S)
        assert self.cluster is not None
        if not url.startswith((self.cluster.api_url, self.cluster.decisions_url)):
            fate, status, answer = send(url, method, body, headers, timeout=timeout)
            return ("unavailable", None, answer) if status == 503 else (fate, status, answer)
        answer = send(url, method, body, headers, timeout=timeout, balanced=True)
        if answer[0] in ("unsent", "unavailable"):  # no gate can take it now: back off a little
            self.stop.wait(0.05)
        return answer

    def _tool_env(self) -> dict[str, str]:
        return gate_env(HITL_DB_PASSWORD=DB_PASSWORD)

    def admin(self) -> Any:
        """A new autocommit psycopg connection to the database (straight, not proxied)."""
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    # ---- disruptions -----------------------------------------------------------------------

    def _disrupt(self, index: int) -> None:
        kind = self.plan[index - 1]
        if kind == "postgres":
            kill = self._restart_postgres(index)
        elif kind == "freeze":
            kill = freeze_writer(self, index)
        elif kind == "cut":
            kill = cut_off(self, index)
        else:
            kill = self._kill_gate(index)
        self.kill_log.append(kill)

    def _kill_gate(self, index: int) -> Kill:
        assert self.cluster is not None
        victim = self.rng.randrange(len(self.cluster))
        self.cluster.kill9(victim)
        kill = Kill(index, time.time())
        self._check_after_kill(kill)
        kill.pending_expires = {}  # the other gates expire them meanwhile
        self.stop.wait(self.rng.uniform(*self.down))  # how long it stays down
        kill.restarted_at = time.time()
        self.cluster.restart(victim)
        self.fig.gate_kills += 1
        self.say(f"{index}/{self.kills}: gate {victim} killed -9 and restarted")
        return kill

    def _restart_postgres(self, index: int) -> Kill:
        assert self.cluster is not None
        at = time.time()  # what was answered before this is committed
        self.server.stop("immediate")
        self.stop.wait(self.rng.uniform(*self.down))
        self.server.start()
        back = time.monotonic()
        for gate in self.cluster.live():
            if not _healthy_within(gate.api_url, back + 60.0):
                self._problem(f"PostgreSQL restart {index}: a gate never answered /healthz 200")
        recovered = self.recovered(f"PostgreSQL restart {index}: the gates", back)
        self.fig.recover_max_s = max(self.fig.recover_max_s, recovered)
        kill = self.checked(index, at)
        self.fig.pg_restarts += 1
        self.say(f"{index}/{self.kills}: PostgreSQL restarted, gates back in {recovered:.2f} s")
        return kill

    def recovered(self, who: str, back: float) -> float:
        """Seconds since ``back`` (monotonic: the moment the database was there again for
        ``who``, who now answers /healthz 200); a problem when more than RECOVER_S."""
        recovered = time.monotonic() - back
        if recovered > RECOVER_S:
            self._problem(
                f"{who} answered /healthz 200 {recovered:.1f} s after the database was back, "
                f"not within {RECOVER_S:g} s"
            )
        return recovered

    def checked(self, index: int, at: float) -> Kill:
        """The record of disruption ``index`` that began at ``at`` (wall clock), checked as
        after a kill: everything answered 201/200 before it is in the database. No approval
        counts as expired while a gate was down: the others ran on."""
        kill = Kill(index, at)
        self._check_after_kill(kill)
        kill.pending_expires = {}
        kill.restarted_at = time.time()
        return kill

    # ---- the end -----------------------------------------------------------------------------

    def _stop_gates(self) -> None:
        assert self.cluster is not None
        codes = self.cluster.stop()
        self.logs = self.cluster.logs()
        if any(codes):
            self._problem(f"the gates' clean stops exited {codes}")

    def _end_gates(self) -> None:
        if self.cluster is not None:
            self.cluster.remove()
            if not self.logs:
                self.logs = self.cluster.logs()
        for proxy in self.proxies:
            proxy.stop()

    def _audit_anchors(self) -> list[str]:
        assert self.cluster is not None
        heads = self.cluster.heads()
        receipts = self.dir / "receipts"
        receipts.mkdir(exist_ok=True)
        options: list[str] = []
        for seq, digest in heads:
            options += ["--expect-head", f"{seq}:{digest}"]
        kept = [c.receipt for c in self.creates if c.status == 201 and c.receipt]
        for number, receipt in enumerate(kept):
            path = receipts / f"{number}.json"
            path.write_text(json.dumps(receipt), encoding="utf-8")
            options += ["--expect", str(path)]
        self.fig.heads_anchored, self.fig.receipts_anchored = len(heads), len(kept)
        return options

    def _verify(self) -> None:
        self.fig.unavailable_503 = sum(
            a.fate == "unavailable" for a in [*self.creates, *self.decisions, *self.cancels]
        )
        super()._verify()


def plan(kills: int, pg_every: int, kinds: tuple[str, ...], rng: random.Random) -> list[str]:
    """The kind of each disruption: every ``pg_every``-th ``postgres`` (a restart), the
    others drawn from ``kinds`` like cards from a deck shuffled afresh when it runs out."""
    deck: list[str] = []
    kinds_of: list[str] = []
    for index in range(1, kills + 1):
        if pg_every and index % pg_every == 0:
            kinds_of.append("postgres")
            continue
        if not deck:
            deck = rng.sample(kinds, len(kinds))
        kinds_of.append(deck.pop())
    return kinds_of


def _healthy_within(api_url: str, deadline: float) -> bool:
    """Poll ``/healthz`` until 200 (True) or ``deadline`` (monotonic; False)."""
    while time.monotonic() < deadline:
        fate, status, _ = send(api_url + "/healthz", "GET", None, {}, timeout=5.0)
        if status == 200:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def postgres() -> Iterator[tuple[PgServer, str]]:
    """A throwaway server and an empty database on it; removed afterwards."""
    bindir = pg_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL binaries (apt-get install postgresql, or PG_BINDIR)")
    server = PgServer(bindir).start()
    try:
        yield server, server.database("soak")
    finally:
        server.remove()


def run_cluster_soak(
    kills: int, between: tuple[float, float], seed: int, **options: Any
) -> Figures:
    """Run one cluster soak (see ``ClusterSoak``) and return its figures."""
    return ClusterSoak(kills, between, seed, **options).run()


def kinds_arg(text: str) -> tuple[str, ...]:
    """Parse ``--kinds`` (comma-separated, each one of KINDS)."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(KINDS)}, comma-separated")
    return kinds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak.cluster",
        description="Several gates on one PostgreSQL behind haproxy: kill -9 gates, freeze "
        "their writers, cut them off from PostgreSQL and restart PostgreSQL under mixed load, "
        "then prove nothing was lost, doubled or invented. Exit 0 only with zero "
        "losses/problems.",
    )
    parser.add_argument("--kills", type=int, default=30, help="disruptions")
    parser.add_argument(
        "--seconds-between", type=parse_range, default=(1.0, 4.0), metavar="A-B",
        help="random delay before each disruption (s), e.g. 1-4",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--gates", type=int, default=3, help="gate processes")
    parser.add_argument(
        "--pg-every", type=int, default=3,
        help="every Nth disruption restarts PostgreSQL (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--kinds", type=kinds_arg, default=KINDS, metavar="K,K",
        help="the other disruptions, drawn in turn: kill (-9 and restart), freeze (the "
        "writer stopped holding the lock), cut (a gate cut off from PostgreSQL); "
        "default: all three",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=4, help="load generator threads")
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to drain")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    workdir = Path(tempfile.mkdtemp(prefix="hitl-soak-cluster-"))
    print(
        f"cluster soak: {args.gates} gates, {args.kills} disruptions, "
        f"{args.seconds_between[0]:g}-{args.seconds_between[1]:g} s apart, seed {seed}, "
        f"work dir {workdir}",
        flush=True,
    )
    with postgres() as (server, url):
        figures = run_cluster_soak(
            args.kills,
            args.seconds_between,
            seed,
            server=server,
            url=url,
            gates=args.gates,
            pg_every=args.pg_every,
            kinds=args.kinds,
            workers=args.workers,
            drain_timeout=args.drain_timeout,
            workdir=workdir,
            say=lambda m: print(m, flush=True),
        )
    print(figures.report(), flush=True)
    if figures.ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"work dir kept for inspection: {workdir}")
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())
