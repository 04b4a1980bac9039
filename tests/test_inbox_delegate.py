"""A delegate deciding through the inbox (untested): a real gate with a
delegation in force (bob → op04), the real inbox, software passkeys over real HTTP; the
gate's SQLite file read as it is on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.inbox_harness import STEPS, start_world
from tests.test_inbox_decide import followed, pipeline, signed_in

pytestmark = pytest.mark.e2e

DELEGATION = {"from": 102, "to": 104, "until": "2999-01-01T00:00:00Z", "reason": "away"}
STEP = {"name": "d1", "quorum": 1, "approvers": [101, 102], "timeout": "1h",
        "approver_signature": "required"}  # fmt: skip


def test_a_delegate_in_force_sees_and_decides_the_principals_item(tmp_path: Path) -> None:
    world = start_world(tmp_path, enrol=(103, 104), steps=[*STEPS, STEP], delegations=[DELEGATION])
    try:
        op04, carol = signed_in(world, 104), signed_in(world, 103)
        proc, approval_id = pipeline(world, "d1", "Pay 5 EUR")

        assert approval_id in op04.get("/").text
        assert approval_id not in carol.get("/").text  # not an approver, not a delegate
        assert carol.get(f"/items/{approval_id}").status == 404
        page = followed(op04, op04.decide(approval_id, world.passkeys[104]))

        assert "Your decision was recorded and the approval is resolved." in page
        assert "Recorded on behalf of bob@example.com." in page  # whose decision it counts as
        code, out, err = proc.finish()
        assert (code, out.decode()) == (0, "Pay 5 EUR"), err
        recorded = world.gate_rows(
            "SELECT operator_id, on_behalf_of FROM decisions WHERE approval_id = ?", approval_id
        )
        assert [tuple(r) for r in recorded] == [(104, 102)]
    finally:
        world.stop()
