"""Smoke: a decision round trip through the real daemon and the capturing relay."""

import pytest

from tests.support import decision_body, post_decision

pytestmark = pytest.mark.e2e


def test_e2e_approve_quorum_1(gate, relay):
    api = gate.api()
    approval = api.create("q1", "Hi Anna — invoice 2026-114 is due. 👍\n")
    dispatch = relay.wait_dispatch(approval["approval_id"])
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    final = api.wait_resolved(approval["approval_id"])
    assert final["final_body"] == "Hi Anna — invoice 2026-114 is due. 👍\n"
