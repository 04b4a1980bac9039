"""Fail-over in CI: the cluster soak of ``tests/soak/cluster.py``, short.

Three gates on one throwaway PostgreSQL behind haproxy, under the SQLite soak's mixed load
(creates, signed decisions, re-sends, cancels; a relay answering 503 to a quarter of the
dispatches). Six disruptions at random moments, each kind at least once: two immediate
restarts of PostgreSQL (down 0-3 s; every gate answers /healthz 200 within 5 s of it being
back), and in a random order a ``kill -9`` of a random gate (restarted 0-3 s later on its
ports), a gate's writer frozen while it holds the ``audit_head`` lock past PostgreSQL's
idle-in-transaction timeout (the others record decisions meanwhile; thawed, it serves again
within 5 s) and a gate cut off from PostgreSQL for 2-4 s (503 meanwhile, ``/healthz`` too;
back within 5 s), plus one more of these three. Then the soak's checker: every answered
201/200 present, nothing counted or resolved twice, nothing refused recorded, ``audit
verify`` with every logged head and every kept receipt, no 5xx but 503.

A longer run: ``HITL_SOAK_CLUSTER_KILLS=40`` here (``HITL_SOAK_SEED`` changes the seed), or
``python -m tests.soak.cluster --kills 40`` (docs/fuzzing.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster_gates import server_and_balancer
from tests.pg_server import PgServer, psycopg_or_skip
from tests.soak.cluster import run_cluster_soak

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.toolchain,
    pytest.mark.postgres,
    pytest.mark.cluster,
]

psycopg_or_skip()

KILLS = int(os.environ.get("HITL_SOAK_CLUSTER_KILLS", "6"))
SEED = int(os.environ.get("HITL_SOAK_SEED", "2718"))


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from server_and_balancer()


@pytest.mark.timeout(240 + 20 * KILLS)
def test_soak_cluster_kills_freezes_cuts_and_postgres_restarts_lose_and_double_nothing(
    server: PgServer, tmp_path: Path
) -> None:
    figures = run_cluster_soak(
        KILLS,
        (0.5, 2.5),  # 1-3 s before freezes and cuts, which last longer than a kill
        SEED,
        server=server,
        url=server.database("soak"),
        gates=3,
        pg_every=3,
        workers=4,
        fail_rate=0.25,
        drain_timeout=60.0,
        workdir=tmp_path,
    )
    report = figures.assert_passed(KILLS)
    others = (figures.gate_kills, figures.writer_freezes, figures.gate_cuts)
    assert figures.pg_restarts == KILLS // 3 and sum(others) == KILLS - KILLS // 3, report
    assert min(others) >= 1 or KILLS - KILLS // 3 < 3, report
    assert figures.freezes_holding_lock >= 1 or figures.writer_freezes == 0, report
    assert figures.cut_recover_max_s <= 5.0, report
    assert figures.heads_anchored > 0 and figures.receipts_anchored == figures.creates_201, report
    assert figures.recover_max_s <= 5.0, report
