"""A batch's one passkey assertion with a COUNTING authenticator: the gate
accepts the very assertion that set a credential's counter again, at that counter, on
another item of its batch, and nothing else (docs/protocol.md "Approver signatures"). The
real gate (its dispatches received by the real inbox, read from the inbox's SQLite file),
real signed decisions posted to the gate's callback, a software passkey whose counter goes
up with every assertion, ``audit verify`` and ``audit signatures`` on the database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.protocol.approver_signature import b64url, batch_digest, decision_digest
from tests.inbox_harness import ENV, RP_ID, InboxWorld, start_world
from tests.support import decision_body, post_decision, run_cli, wait_until

pytestmark = pytest.mark.e2e

ALICE = "alice@example.com"  # operator 101


@pytest.fixture
def world(tmp_path: Path) -> Iterator[InboxWorld]:
    box = start_world(tmp_path, enrol=(101,))
    yield box
    box.stop()


def dispatches(world: InboxWorld, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The dispatches of ``ids`` as the relay (the inbox) received them."""
    assert world.inbox is not None
    inbox = world.inbox

    def found() -> dict[str, dict[str, Any]] | None:
        if not inbox.db.exists():
            return None
        got = {
            r["approval_id"]: json.loads(r["dispatch"])
            for r in inbox.rows("SELECT approval_id, dispatch FROM items")
        }
        return got if set(ids) <= set(got) else None

    return dict(wait_until(found, timeout=60, what=f"{len(ids)} dispatches at the relay"))


def approve_digest(dispatch: dict[str, Any]) -> bytes:
    return decision_digest(
        approval_id=dispatch["approval_id"],
        revision=dispatch["revision"],
        nonce=dispatch["callback"]["nonce"],
        payload_hash=dispatch["payload_hash"],
        decision="approve",
    )


def post(world: InboxWorld, dispatch: dict[str, Any], assertion: dict[str, Any]) -> Any:
    assert world.gate is not None
    body = decision_body(dispatch, ALICE, approver_assertion=assertion)
    status, answer, _ = post_decision(world.gate.callback_url, body)
    return status, answer


def test_batch_assertion_of_a_counting_passkey_decides_each_item_and_nothing_else(
    world: InboxWorld,
) -> None:
    assert world.gate is not None
    api = world.gate.api()
    batch_ids = [api.create(step="q2", body=f"batch {n}")["approval_id"] for n in range(3)]
    outside = api.create(step="q2", body="outside")["approval_id"]
    sent = dispatches(world, [*batch_ids, outside])
    passkey = world.passkeys[101]
    passkey.counter = 41  # a hardware key that has signed before: the next assertion is 42
    hexes = [approve_digest(sent[i]).hex() for i in batch_ids]
    challenge = batch_digest([bytes.fromhex(h) for h in hexes])
    signed = passkey.assert_(b64url(challenge), RP_ID, world.inbox_origin) | {"batch": hexes}

    answers = [post(world, sent[i], signed) for i in batch_ids]

    assert answers == [(200, {"status": "recorded", "resolved": False})] * 3, answers
    [(count,)] = world.gate_rows("SELECT sign_count FROM approver_credentials")
    assert count == 42
    # the same assertion again: on an item it decided (409), on an approval outside it
    status, answer = post(world, sent[batch_ids[0]], signed)
    assert (status, answer["reason"]) == (409, "duplicate"), answer
    status, answer = post(world, sent[outside], signed)
    assert (status, answer["detail"]) == (403, "not_in_batch"), answer
    # a NEW single assertion at the stored counter: a cloned authenticator
    passkey.counter = 41
    single = passkey.assert_(b64url(approve_digest(sent[outside])), RP_ID, world.inbox_origin)
    status, answer = post(world, sent[outside], single)
    assert (status, answer["detail"]) == (403, "counter_regressed"), answer
    # a newer assertion is accepted as ever
    raised = passkey.assert_(b64url(approve_digest(sent[outside])), RP_ID, world.inbox_origin)
    assert post(world, sent[outside], raised)[0] == 200
    recorded = world.gate_rows("SELECT approval_id FROM decisions WHERE credential_id IS NOT NULL")
    assert sorted(r["approval_id"] for r in recorded) == sorted([*batch_ids, outside])

    config = str(world.gate.config)
    verify = run_cli("audit", "verify", "-c", config, env=ENV)
    assert verify.returncode == 0, verify.stdout.decode() + verify.stderr.decode()
    listed = run_cli("audit", "signatures", "-c", config, env=ENV)
    assert listed.returncode == 0, listed.stderr.decode()
    header, *rows = listed.stdout.decode().splitlines()
    assert header.split()[0] == "approval", header
    assert len(rows) == 4 and all(row.split()[-2:] == ["webauthn", "yes"] for row in rows), rows
