"""Tests for gate.core: the pure rules, the rate limiter, and GateService over a real SQLite Store.

No mocks: a real config file (tests.support.write_config), a real Store in tmp_path, a real
GateService, and a ManualClock so expiry is tested without sleeping. Every store-backed test
runs with both writers (``writer_process``: a thread, and a forked process as ``gate serve``
uses; the clock is then in shared memory, ``SharedClock``). Nothing is dispatched
(the Dispatcher is not started), so the relay URL is never contacted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import mmap
import os
import pickle
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gate.audit import chain as audit
from gate.audit.receipts import receipt_object
from gate.config import Config, load_config
from gate.core.approvals import rules
from gate.core.approvals.create import CreateRequest, parse_create
from gate.core.approvals.kind import APPROVALS as APPROVAL_KIND
from gate.core.approvals.service import Approvals
from gate.core.commands import ReceiptKey, Transaction
from gate.core.questions.kind import QUESTIONS
from gate.core.ratelimit import RateLimiter
from gate.core.requests.lifecycle_tx import Cancel, DispatchResult
from gate.core.service import GateService
from gate.errors import Conflict, GateError, NotFound
from gate.model import Approval, DecisionRow, Revision
from gate.protocol.canonical import payload_hash, wire_json
from gate.protocol.envelope import Decision, build_decision, parse_decision
from gate.protocol.times import rfc3339
from gate.store import Command, Store, WriteTx
from gate.store.approvals import APPROVALS
from gate.store.batch import PROBE
from tests.support import Named, write_config

NOW_MS = 1767225600000
RECEIPT_KEY = b"test-receipt-key-91c2"
DRAFT = "Café — naïve résumé 👍\n"
DRAFT_HASH = "sha256:c0b8d811c2edb85cfa2cdeee45b1e680c3ee5c286d28c69150649868aa07dfdc"
REENCODED_HASH = "sha256:97fe2d5aaf6ba5731999ef64fb912e726246917fb4af150dedfb9eb743487796"
ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"
ALICE_ID, BOB_ID, CAROL_ID = 101, 102, 103
HOUR_MS = 3_600_000


@dataclasses.dataclass
class Gate:
    """A GateService's approvals on a real Store with its ManualClock and config."""

    service: Approvals
    store: Store
    clock: ManualClock
    config: Config

    async def create(
        self, step: str = "q1", body: str = DRAFT, key: str | None = None, run_id: str | None = None
    ) -> dict[str, Any]:
        view, created = await self.service.create(
            CreateRequest("p", step, run_id, "text/plain", body, None), key
        )
        assert created
        return view

    async def revision(self, approval_id: str, revision: int | None = None) -> dict[str, Any]:
        """The stored revision row (body, payload_hash, nonce); the current one by default."""
        full = await self.full(approval_id)
        wanted = full["revision"] if revision is None else revision
        return next(r for r in full["revisions"] if r["revision"] == wanted)

    async def decision(
        self,
        approval_id: str,
        /,
        identity: str = ALICE,
        verb: str = "approve",
        *,
        revision: int | None = None,
        adjust_text: str | None = None,
        channel: str = "test",
        **overrides: Any,
    ) -> Decision:
        """A decision answering ``revision`` (current by default), parsed from wire bytes.

        ``overrides`` replace envelope fields (e.g. ``nonce``, ``payload_hash``, ``approval_id``).
        """
        rev = await self.revision(approval_id, revision)
        body = build_decision(
            approval_id=approval_id,
            nonce=rev["nonce"],
            decision=verb,
            payload_hash=rev["payload_hash"],
            approver_id=identity,
            decided_at_ms=self.clock.now_ms(),
            channel=channel,
            adjust_text=adjust_text,
        )
        body.update(overrides)
        return parse_decision(wire_json(body))

    async def decide(
        self, approval_id: str, /, identity: str = ALICE, verb: str = "approve", **kwargs: Any
    ) -> dict[str, Any]:
        return await self.service.decide(await self.decision(approval_id, identity, verb, **kwargs))

    async def refused(
        self, approval_id: str, /, identity: str = ALICE, verb: str = "approve", **kwargs: Any
    ) -> GateError:
        decision = await self.decision(approval_id, identity, verb, **kwargs)
        with pytest.raises(GateError) as info:
            await self.service.decide(decision)
        return info.value

    async def audit_rows(self) -> list[audit.AuditRow]:
        return [row async for row in self.store.audit_rows()]

    async def full(self, approval_id: str) -> dict[str, Any]:
        """The stored approval (``gate.model.Approval``) as plain JSON values."""
        full = await self.store.reads.fetch(APPROVALS, approval_id)
        assert full is not None
        loaded: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(full)))
        return loaded


MakeGate = Callable[..., Awaitable[Gate]]


class ManualClock:
    """A clock that moves only when told to; expiry is tested without sleeping."""

    def __init__(self, start_ms: int) -> None:
        self._now = int(start_ms)

    def now_ms(self) -> int:
        """Return the set time in unix milliseconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (may be fractional)."""
        self._now += int(seconds * 1000)


class SharedClock(ManualClock):
    """A ManualClock whose time lives in shared memory (an anonymous MAP_SHARED page), so the
    writer process's copy of the service, forked at ``Store.open``, reads the time the test
    sets: the ``_tx_*`` transactions read the clock in the writer."""

    def __init__(self, start_ms: int) -> None:
        self._page = mmap.mmap(-1, 8)
        self._page[:8] = struct.pack("<q", int(start_ms))

    def now_ms(self) -> int:
        return int(struct.unpack("<q", self._page[:8])[0])

    def advance(self, seconds: float) -> None:
        self._page[:8] = struct.pack("<q", self.now_ms() + int(seconds * 1000))


@pytest.fixture(params=[False, True], ids=["thread_writer", "process_writer"])
def writer_process(request: pytest.FixtureRequest) -> bool:
    """Both writers: a thread of this process, and a forked process (``gate serve``'s)."""
    return bool(request.param)


@pytest.fixture
async def make_gate(tmp_path: Path, writer_process: bool) -> AsyncIterator[MakeGate]:
    """Factory: ``await make_gate(security={...})`` -> a Gate on its own database file, in
    each writer mode (``writer_process``)."""
    stores: list[Store] = []

    async def make(**config_overrides: Any) -> Gate:
        directory = tmp_path / f"gate{len(stores)}"
        directory.mkdir()
        config = load_config(
            write_config(directory, "http://127.0.0.1:9/relay", **config_overrides)
        )
        store = Store(config.storage.path, writer_process=writer_process)
        clock = SharedClock(NOW_MS)
        service = GateService(config, RECEIPT_KEY, store, clock)  # binds before the fork
        await store.open()
        stores.append(store)
        return Gate(service.approvals, store, clock, config)

    yield make
    for store in stores:
        await store.close()


@pytest.fixture
async def gate(make_gate: MakeGate) -> Gate:
    return await make_gate()


def assert_refusal(err: GateError, status: int, kind: str, reason: str) -> None:
    assert (err.status, err.kind, err.code) == (status, kind, reason), err.body()


# =========================================================================== GateService


async def test_service_create_pending_with_expiry(gate: Gate) -> None:
    view = await gate.create("q2", run_id="run-7")

    assert view["state"] == "pending"
    assert view["outcome"] is None
    assert view["run_id"] == "run-7"
    assert view["created_at"] == rfc3339(NOW_MS)
    assert view["expires_at"] == rfc3339(NOW_MS + HOUR_MS)  # step q2: timeout 1h
    assert view["quorum"] == {"required": 2, "collected": 0}
    assert view["approvers"] == [ALICE, BOB, CAROL]
    assert view["revision"] == 1
    assert view["payload_hash"] == DRAFT_HASH
    assert view["final_body"] is None
    assert view["receipt"] is None
    assert view["decisions"] == []
    full = await gate.full(view["approval_id"])
    assert full["expires_at"] == NOW_MS + HOUR_MS
    assert [o["revision"] for o in full["outbox"]] == [1]  # dispatch queued in the same tx
    rev = await gate.revision(view["approval_id"])
    assert rev["body"] == DRAFT and len(rev["nonce"]) == 32
    rows = await gate.audit_rows()
    assert [r.kind for r in rows] == ["created"]
    assert json.loads(rows[0].entry)["data"]["payload_hash"] == DRAFT_HASH


async def test_service_create_short_step_expiry(gate: Gate) -> None:
    view = await gate.create("short")

    assert (await gate.full(view["approval_id"]))["expires_at"] == NOW_MS + 3000


async def test_service_create_unknown_pipeline_or_step_404(gate: Gate) -> None:
    with pytest.raises(NotFound) as info:
        await gate.service.create(CreateRequest("nope", "q1", None, "text/plain", "x", None), None)
    assert (info.value.status, info.value.code) == (404, "unknown_pipeline")
    with pytest.raises(NotFound) as info:
        await gate.service.create(CreateRequest("p", "nope", None, "text/plain", "x", None), None)
    assert (info.value.status, info.value.code) == (404, "unknown_step")
    assert await gate.audit_rows() == []


async def test_service_get_unknown_404(gate: Gate) -> None:
    with pytest.raises(NotFound):
        await gate.service.get("01KDWZ8B00J3Q9V5X7Z2M4N6PR")


# --------------------------------------------------------------------------- expiry


async def test_service_expire_due_nothing_before_expiry(gate: Gate) -> None:
    view = await gate.create("short")  # 3 s
    gate.clock.advance(2.999)

    assert await gate.service.expire_due() == 0
    assert (await gate.service.get(view["approval_id"]))["state"] == "pending"


async def test_service_expire_due_at_exactly_expires_at(gate: Gate) -> None:
    view = await gate.create("short")
    gate.clock.advance(3)

    assert await gate.service.expire_due() == 1
    after = await gate.service.get(view["approval_id"])
    assert (after["state"], after["outcome"]) == ("resolved", "timeout")
    assert after["resolved_at"] == rfc3339(NOW_MS + 3000)
    assert after["final_body"] is None
    assert after["receipt"] is not None
    assert await gate.service.expire_due() == 0  # resolved once


async def test_service_expire_due_only_the_due_ones(gate: Gate) -> None:
    short = await gate.create("short")
    long = await gate.create("q1")
    gate.clock.advance(60)

    assert await gate.service.expire_due() == 1
    assert (await gate.service.get(short["approval_id"]))["outcome"] == "timeout"
    assert (await gate.service.get(long["approval_id"]))["state"] == "pending"


async def test_service_decision_after_expiry_before_sweep_is_410(gate: Gate) -> None:
    view = await gate.create("short")
    aid = view["approval_id"]
    decision = await gate.decision(aid)  # signed and sent in time, arrives late
    gate.clock.advance(3)

    with pytest.raises(GateError) as info:
        await gate.service.decide(decision)
    assert_refusal(info.value, 410, "expired", "expired")
    full = await gate.full(aid)
    assert full["state"] == "pending" and full["decisions"] == []  # nothing changed
    assert await gate.service.expire_due() == 1
    assert (await gate.service.get(aid))["outcome"] == "timeout"


async def test_service_case_h13_decision_after_timeout_is_410(gate: Gate) -> None:
    view = await gate.create("short")
    gate.clock.advance(30)
    assert await gate.service.expire_due() == 1

    err = await gate.refused(view["approval_id"])
    assert_refusal(err, 410, "expired", "expired")
    assert (await gate.full(view["approval_id"]))["decisions"] == []


async def test_service_decision_one_ms_before_expiry_counts(gate: Gate) -> None:
    view = await gate.create("short")
    gate.clock.advance(2.999)

    answer = await gate.decide(view["approval_id"])
    assert answer == {"status": "recorded", "resolved": True, "outcome": "approved"}


# --------------------------------------------------------------------------- quorum


async def test_service_quorum1_approve(gate: Gate) -> None:
    view = await gate.create("q1")

    answer = await gate.decide(view["approval_id"], ALICE)
    assert answer == {"status": "recorded", "resolved": True, "outcome": "approved"}
    after = await gate.service.get(view["approval_id"])
    assert after["final_body"] == DRAFT
    assert after["payload_hash"] == DRAFT_HASH
    assert after["quorum"] == {"required": 1, "collected": 1}
    assert [d["operator_id"] for d in after["decisions"]] == [ALICE_ID]


async def test_service_quorum1_skip(gate: Gate) -> None:
    view = await gate.create("q1")

    answer = await gate.decide(view["approval_id"], BOB, "skip")
    assert answer == {"status": "recorded", "resolved": True, "outcome": "skipped"}
    assert (await gate.service.get(view["approval_id"]))["final_body"] is None


async def test_service_quorum2_needs_two_operators(gate: Gate) -> None:
    view = await gate.create("q2")
    aid = view["approval_id"]

    assert await gate.decide(aid, ALICE) == {"status": "recorded", "resolved": False}
    assert (await gate.service.get(aid))["quorum"] == {"required": 2, "collected": 1}
    assert await gate.decide(aid, BOB) == {
        "status": "recorded",
        "resolved": True,
        "outcome": "approved",
    }


async def test_service_quorum2_skip_vetoes(gate: Gate) -> None:
    view = await gate.create("q2")
    aid = view["approval_id"]
    await gate.decide(aid, ALICE)

    answer = await gate.decide(aid, CAROL, "skip")
    assert answer == {"status": "recorded", "resolved": True, "outcome": "skipped"}


async def test_service_quorum1_adjust_resolves_adjusted(gate: Gate) -> None:
    view = await gate.create("q1")
    aid = view["approval_id"]
    edited = "Café — édité\n"

    answer = await gate.decide(aid, ALICE, "adjust", adjust_text=edited)
    assert answer == {"status": "recorded", "resolved": True, "outcome": "adjusted"}
    after = await gate.service.get(aid)
    assert after["revision"] == 2
    assert after["final_body"] == edited
    assert after["payload_hash"] == payload_hash(edited)
    full = await gate.full(aid)
    assert [o["revision"] for o in full["outbox"]] == [1]  # resolved: rev 2 not dispatched


async def test_service_adjust_same_text_counts_as_approve(gate: Gate) -> None:
    view = await gate.create("q1")

    answer = await gate.decide(view["approval_id"], ALICE, "adjust", adjust_text=DRAFT)
    assert answer == {"status": "recorded", "resolved": True, "outcome": "approved"}
    assert (await gate.service.get(view["approval_id"]))["revision"] == 1


async def test_service_quorum2_adjust_makes_revision2(gate: Gate) -> None:
    view = await gate.create("q2")
    aid = view["approval_id"]
    old = await gate.revision(aid, 1)
    edited = "Edited by alice\n"

    answer = await gate.decide(aid, ALICE, "adjust", adjust_text=edited)
    assert answer == {"status": "recorded", "resolved": False}
    after = await gate.service.get(aid)
    assert after["revision"] == 2
    assert after["quorum"] == {"required": 2, "collected": 1}  # the editor counts
    assert after["payload_hash"] == payload_hash(edited)
    new = await gate.revision(aid, 2)
    assert new["nonce"] != old["nonce"] and new["created_by"] == ALICE_ID
    full = await gate.full(aid)
    assert [o["revision"] for o in full["outbox"]] == [1, 2]  # revision 2 is dispatched

    stale = await gate.refused(aid, BOB, revision=1)  # old nonce, old hash
    assert_refusal(stale, 409, "superseded", "superseded")
    wrong_hash = await gate.refused(aid, BOB, payload_hash=old["payload_hash"])
    assert_refusal(wrong_hash, 403, "forbidden", "payload_hash_mismatch")
    again = await gate.refused(aid, ALICE)  # creator's approval is already counted
    assert_refusal(again, 409, "duplicate", "duplicate")

    answer = await gate.decide(aid, BOB)
    assert answer == {"status": "recorded", "resolved": True, "outcome": "adjusted"}
    assert (await gate.service.get(aid))["final_body"] == edited


async def test_service_quorum2_earlier_approvals_stop_counting_after_adjust(gate: Gate) -> None:
    view = await gate.create("q2")
    aid = view["approval_id"]
    await gate.decide(aid, ALICE)  # 1/2 on revision 1

    await gate.decide(aid, BOB, "adjust", adjust_text="Bob's version\n")
    after = await gate.service.get(aid)
    assert after["quorum"] == {"required": 2, "collected": 1}  # only bob, on revision 2

    answer = await gate.decide(aid, ALICE)
    assert answer["outcome"] == "adjusted"
    resolved = [json.loads(r.entry) for r in await gate.audit_rows() if r.kind == "resolved"]
    assert resolved[0]["data"]["approved_by"] == [BOB_ID, ALICE_ID]
    assert len((await gate.service.get(aid))["decisions"]) == 3  # history kept


# --------------------------------------------------------------------------- check 14


async def test_service_duplicate_vs_already_decided(gate: Gate) -> None:
    view = await gate.create("q2")
    aid = view["approval_id"]
    await gate.decide(aid, ALICE)

    assert_refusal(await gate.refused(aid, ALICE), 409, "duplicate", "duplicate")
    # H09: same operator through another channel; H10: case and whitespace of the identity
    assert_refusal(await gate.refused(aid, ALICE, channel="slack"), 409, "duplicate", "duplicate")
    assert_refusal(await gate.refused(aid, "Alice@Example.COM "), 409, "duplicate", "duplicate")
    assert_refusal(
        await gate.refused(aid, ALICE, "skip"), 409, "already_decided", "already_decided"
    )
    assert_refusal(
        await gate.refused(aid, ALICE, "adjust", adjust_text="x"),
        409,
        "already_decided",
        "already_decided",
    )
    assert (await gate.service.get(aid))["quorum"]["collected"] == 1

    assert (await gate.decide(aid, BOB))["outcome"] == "approved"
    late = await gate.refused(aid, CAROL)
    assert_refusal(late, 409, "already_resolved", "already_resolved")
    assert late.extra == {"outcome": "approved"}
    assert len((await gate.full(aid))["decisions"]) == 2


async def test_service_case_h10_identity_casefold_counts_for_operator(gate: Gate) -> None:
    view = await gate.create("q2")
    aid = view["approval_id"]

    await gate.decide(aid, "Alice@Example.COM")
    full = await gate.full(aid)
    assert [d["operator_id"] for d in full["decisions"]] == [ALICE_ID]
    assert_refusal(await gate.refused(aid, " alice@example.com"), 409, "duplicate", "duplicate")


# --------------------------------------------------------------------------- refusals 6-12


async def test_service_refusals_change_nothing(gate: Gate) -> None:
    view = await gate.create("q1")
    aid = view["approval_id"]
    other = await gate.create("q1", body="another draft\n")
    other_rev = await gate.revision(other["approval_id"])
    audit_before = len(await gate.audit_rows())
    cyrillic_alice = "\u0430lice@example.com"  # Cyrillic а

    cases = [
        (
            dict(approval_id="01KDWZ8B00J3Q9V5X7Z2M4N6PR"),
            404,
            "unknown_approval",
            "unknown_approval",
        ),
        (dict(nonce=other_rev["nonce"]), 403, "forbidden", "nonce_mismatch"),
        (dict(nonce="0" * 32), 403, "forbidden", "nonce_mismatch"),
        (dict(payload_hash=REENCODED_HASH), 403, "forbidden", "payload_hash_mismatch"),  # H12
        (dict(identity="dave@example.com"), 403, "forbidden", "approver_not_allowed"),
        (dict(identity="relay-bot@example.com"), 403, "forbidden", "approver_not_allowed"),  # H11
        (dict(identity=cyrillic_alice), 403, "forbidden", "approver_not_allowed"),  # H10
        # op04 is an allowed operator, but not in step q1's approvers
        (dict(identity="op04@example.com"), 403, "forbidden", "approver_not_allowed"),
        (dict(verb="adjust"), 422, "invalid", "adjust_text_required"),
        (dict(verb="adjust", adjust_text=" \n\t "), 422, "invalid", "adjust_text_required"),
        (dict(verb="adjust", adjust_text="x" * 51), 422, "invalid", "adjust_text_too_long"),
    ]
    for overrides, status, kind, reason in cases:
        overrides = dict(overrides)
        identity = overrides.pop("identity", ALICE)
        verb = overrides.pop("verb", "approve")
        err = await gate.refused(aid, identity, verb, **overrides)
        assert_refusal(err, status, kind, reason)

    full = await gate.full(aid)
    assert (full["state"], full["revision"], full["decisions"]) == ("pending", 1, [])
    assert len(await gate.audit_rows()) == audit_before


async def test_service_adjust_text_at_max_length_accepted(gate: Gate) -> None:
    view = await gate.create("q1")

    answer = await gate.decide(view["approval_id"], ALICE, "adjust", adjust_text="é" * 50)
    assert answer["outcome"] == "adjusted"


# --------------------------------------------------------------------------- rate limit


def test_ratelimit_retry_after_seconds() -> None:
    clock = ManualClock(NOW_MS)
    limiter = RateLimiter(2)
    limiter.check(ALICE_ID, clock.now_ms())
    clock.advance(1)
    limiter.check(ALICE_ID, clock.now_ms())
    clock.advance(1)

    with pytest.raises(GateError) as info:
        limiter.check(ALICE_ID, clock.now_ms())
    assert_refusal(info.value, 429, "rate_limited", "rate_limited")
    assert info.value.extra == {"retry_after": 58}  # the first attempt leaves the window at +60 s
    limiter.check(BOB_ID, clock.now_ms())  # per approver

    clock.advance(57.999)  # 1 ms before the first attempt leaves the window
    with pytest.raises(GateError) as info:
        limiter.check(ALICE_ID, clock.now_ms())
    assert info.value.extra == {"retry_after": 1}
    clock.advance(0.001)
    limiter.check(ALICE_ID, clock.now_ms())


async def test_service_rate_limited_per_approver(make_gate: MakeGate) -> None:
    gate = await make_gate(security={"rate_limit": 2})
    views = [await gate.create("q1") for _ in range(4)]

    await gate.decide(views[0]["approval_id"], ALICE)
    await gate.decide(views[1]["approval_id"], ALICE)
    err = await gate.refused(views[2]["approval_id"], ALICE)
    assert_refusal(err, 429, "rate_limited", "rate_limited")
    assert err.extra == {"retry_after": 60}
    assert (await gate.full(views[2]["approval_id"]))["decisions"] == []
    await gate.decide(views[3]["approval_id"], BOB)  # another approver is not limited

    gate.clock.advance(60)
    assert (await gate.decide(views[2]["approval_id"], ALICE))["outcome"] == "approved"


# --------------------------------------------------------------------------- idempotency


async def test_service_idempotency_key(gate: Gate) -> None:
    req = CreateRequest("p", "q1", "run-1", "text/plain", DRAFT, None)
    first, created = await gate.service.create(req, "key-1")
    assert created

    again, created = await gate.service.create(req, "key-1")
    assert not created
    assert again["approval_id"] == first["approval_id"]
    assert again == first

    changed = dataclasses.replace(req, body=DRAFT + "!")
    with pytest.raises(Conflict) as info:
        await gate.service.create(changed, "key-1")
    assert (info.value.status, info.value.code) == (409, "idempotency_key_reused")

    other, created = await gate.service.create(req, None)
    assert created and other["approval_id"] != first["approval_id"]
    ids = [v["approval_id"] for v in (await gate.service.list("all", None, 10, None))["items"]]
    assert len(ids) == 2
    assert [r.kind for r in await gate.audit_rows()] == ["created", "created"]


async def test_service_idempotency_same_key_after_resolution(gate: Gate) -> None:
    req = parse_create({"pipeline": "p", "step": "q1", "draft": {"body": DRAFT}})
    first, _ = await gate.service.create(req, "key-2")
    await gate.decide(first["approval_id"])

    again, created = await gate.service.create(req, "key-2")
    assert not created
    assert again["outcome"] == "approved"


# --------------------------------------------------------------------------- cancel


async def test_service_cancel(gate: Gate) -> None:
    view = await gate.create("q1")
    aid = view["approval_id"]

    cancelled = await gate.service.cancel(aid)
    assert (cancelled["state"], cancelled["outcome"]) == ("resolved", "cancelled")
    assert cancelled["final_body"] is None
    assert cancelled["receipt"] is not None

    with pytest.raises(Conflict) as info:
        await gate.service.cancel(aid)
    assert (info.value.status, info.value.code, info.value.extra) == (
        409,
        "already_resolved",
        {"outcome": "cancelled"},
    )
    err = await gate.refused(aid, ALICE)
    assert_refusal(err, 409, "already_resolved", "already_resolved")
    assert err.extra == {"outcome": "cancelled"}
    with pytest.raises(NotFound):
        await gate.service.cancel("01KDWZ8B00J3Q9V5X7Z2M4N6PR")


async def test_service_cancel_after_approval_conflicts(gate: Gate) -> None:
    view = await gate.create("q1")
    await gate.decide(view["approval_id"])

    with pytest.raises(Conflict) as info:
        await gate.service.cancel(view["approval_id"])
    assert info.value.extra == {"outcome": "approved"}


async def test_service_cancel_past_expires_at_resolves_timeout(gate: Gate) -> None:
    view = await gate.create("q1")
    aid = view["approval_id"]
    gate.clock.advance(((await gate.full(aid))["expires_at"] - NOW_MS) / 1000)  # no scheduler

    with pytest.raises(Conflict) as info:
        await gate.service.cancel(aid)
    assert (info.value.status, info.value.code, info.value.extra) == (
        409,
        "already_resolved",
        {"outcome": "timeout"},
    )
    full = await gate.full(aid)
    assert (full["state"], full["outcome"]) == ("resolved", "timeout")
    assert [r.kind for r in await gate.audit_rows()] == ["created", "resolved"]


async def test_store_refuses_a_database_opened_by_another_gate(gate: Gate) -> None:
    other = Store(gate.config.storage.path)
    with pytest.raises(GateError) as info:
        await other.open()
    assert info.value.code == "storage_unavailable"
    assert "database in use by another hitl-gate process" in info.value.message
    await other.close()
    await gate.store.close()
    again = Store(gate.config.storage.path)  # released on close
    await again.open()
    await again.close()


class StoreHandler:
    """Store-level transactions by name, bound to a bare Store as ``GateService.run_command``
    is (``Store.bind``); with a writer process its copy runs in the writer. ``hold`` blocks
    the writer on a pipe the test writes to, after saying so on another pipe (this
    synchronises across the fork as well as with a thread)."""

    def __init__(self) -> None:
        self.entered_r, self.entered_w = os.pipe()
        self.release_r, self.release_w = os.pipe()

    def __call__(self, tx: WriteTx | None, command: Named) -> Any:
        assert tx is not None
        if command.name == "append":  # args: (n, refuse)
            n, refuse = command.args
            row = tx.append_audit("note", None, NOW_MS, {"n": n}, RECEIPT_KEY)
            if refuse:
                raise Conflict("refused", f"transaction {n} refused")
            return int(row.seq)
        if command.name == "hold":
            os.write(self.entered_w, b"x")
            os.read(self.release_r, 1)
            return "held"
        if command.name == "noop":
            return None
        raise ValueError(command.name)

    def entered(self) -> Awaitable[bytes]:
        """Wait (off the loop) until the writer is inside ``hold``."""
        return asyncio.to_thread(os.read, self.entered_r, 1)

    def release(self) -> None:
        os.write(self.release_w, b"x")


@pytest.fixture
async def bare_store(
    tmp_path: Path, writer_process: bool
) -> AsyncIterator[tuple[Store, StoreHandler]]:
    """A Store on its own file with ``StoreHandler`` bound, in both writer modes."""
    store = Store(tmp_path / "bare.db", writer_process=writer_process)
    handler = StoreHandler()
    store.bind(handler)
    await store.open()
    try:
        yield store, handler
    finally:
        os.write(handler.release_w, b"x" * 8)  # never leave the writer blocked in ``hold``
        await store.close()


def append(n: Any, refuse: bool = False) -> Named:
    return Named("append", (n, refuse))


async def store_audit_rows(store: Store) -> list[audit.AuditRow]:
    return [row async for row in store.audit_rows()]


def every_command(cls: type[Command[Any]] = Command) -> list[type[Command[Any]]]:
    """Every subclass of ``Command`` the gate defines (imported with ``GateService``); not
    the classes a slotted dataclass replaced (``__subclasses__`` may still list them)."""
    found = []
    for sub in cls.__subclasses__():
        if getattr(sys.modules[sub.__module__], sub.__qualname__, None) is sub:
            found.append(sub)
        found += every_command(sub)
    return found


def test_store_every_command_is_a_frozen_slotted_dataclass() -> None:
    """A command pickles as its class and ``__match_args__`` (``Command.__reduce__``): one
    that is not a dataclass would cross to the writer process without its fields."""
    commands = [c for c in every_command() if c is not Transaction]
    assert len(commands) >= 20
    for command in commands:
        params = getattr(command, "__dataclass_params__", None)
        assert params is not None and params.frozen, command
        assert not any("__dict__" in k.__dict__ for k in command.__mro__), command  # slotted
        assert command.__match_args__ == tuple(f.name for f in dataclasses.fields(command))


def test_store_command_pickles_by_value_and_logs_its_transaction_name() -> None:
    command = DispatchResult(
        APPROVAL_KIND, "01KDWZ8B00J3Q9V5X7Z2M4N6PR", 2, False, "timeout", 1_000
    )
    crossed = pickle.loads(pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL))
    assert crossed == command and crossed.kind is APPROVAL_KIND  # a kind crosses by its name
    assert pickle.loads(pickle.dumps(Cancel(QUESTIONS, "q"))).kind is QUESTIONS
    assert pickle.loads(pickle.dumps(PROBE)) == PROBE
    assert (command.name, Cancel(QUESTIONS, "q").name, PROBE.name, ReceiptKey().name) == (
        "dispatch_result",
        "question_cancel",
        "probe",
        "receipt_key",
    )


async def test_store_transactions_sharing_a_commit_roll_back_alone(
    bare_store: tuple[Store, StoreHandler],
) -> None:
    store, _ = bare_store
    results = await asyncio.gather(
        *(store.transact(append(n, n % 3 == 1)) for n in range(30)), return_exceptions=True
    )
    refused = [n for n, r in enumerate(results) if isinstance(r, Conflict)]
    assert refused == [n for n in range(30) if n % 3 == 1]
    rows = await store_audit_rows(store)
    assert [json.loads(r.entry)["data"]["n"] for r in rows] == [n for n in range(30) if n % 3 != 1]
    assert sorted(r for r in results if isinstance(r, int)) == [r.seq for r in rows]
    assert audit.verify(rows, RECEIPT_KEY).ok


@pytest.mark.parametrize("writer_process", [False], ids=["thread_writer"])
async def test_a_commit_logs_the_chain_head_it_kept_once(
    bare_store: tuple[Store, StoreHandler], caplog: pytest.LogCaptureFixture
) -> None:
    """One ``event=audit_head`` per group commit that appended entries, naming the newest
    entry the commit kept: a refused transaction's entry, rolled back to its SAVEPOINT, is
    not the head, whether or not a later one in the batch appended again. (Thread writer
    only: a writer process logs the line in its own process, out of caplog's reach.)"""
    store, handler = bare_store
    caplog.set_level(logging.INFO, logger="gate.store.batch")

    async def batch(*commands: Named) -> list[Any]:
        held = asyncio.create_task(store.transact(Named("hold")))
        await handler.entered()  # the writer is busy while the next batch queues up
        tasks = [asyncio.create_task(store.transact(c)) for c in commands]
        await asyncio.sleep(0)  # one loop turn: each task has queued its job (no timing)
        handler.release()
        await held
        return await asyncio.gather(*tasks, return_exceptions=True)

    kept_last = await batch(append(1), append(2, refuse=True), append(3))
    kept_first = await batch(append(4), append(5, refuse=True))
    # appends nothing, so logs nothing; and the writer answers it only after it logged
    # the head of the batch before (it logs once the batch's callers are answered)
    await store.transact(Named("noop"))
    rows = {json.loads(r.entry)["data"]["n"]: r for r in await store_audit_rows(store)}
    assert (kept_last[0], kept_last[2], kept_first[0]) == (rows[1].seq, rows[3].seq, rows[4].seq)
    heads = [r.getMessage() for r in caplog.records if "event=audit_head" in r.getMessage()]
    assert heads == [
        f"event=audit_head seq={rows[3].seq} hash={rows[3].entry_hash}",
        f"event=audit_head seq={rows[4].seq} hash={rows[4].entry_hash}",
    ]


async def test_store_transaction_cancelled_before_it_ran_never_runs(
    bare_store: tuple[Store, StoreHandler],
) -> None:
    store, handler = bare_store
    held = asyncio.create_task(store.transact(Named("hold")))
    await handler.entered()  # the writer is inside ``hold``
    cancelled = asyncio.create_task(store.transact(append("never")))
    await asyncio.sleep(0.05)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    while store.unsent_bytes:  # a writer process: the cancel frame is in its socket
        await asyncio.sleep(0.001)
    handler.release()
    assert await held == "held"
    await store.transact(Named("noop"))  # the queue has drained past ``never``
    assert await store_audit_rows(store) == []


# --------------------------------------------------------------------------- wait


async def test_service_wait_wakes_when_decided(gate: Gate) -> None:
    view = await gate.create("q1")
    aid = view["approval_id"]
    decision = await gate.decision(aid)

    async def decide_once_waiting() -> dict[str, Any]:
        # this read is queued on the reader connection behind the waiter's first read, so
        # when it returns the waiter has seen "pending" and is blocked on its event
        assert (await gate.service.get(aid))["state"] == "pending"
        return await gate.service.decide(decision)

    async with asyncio.timeout(10):  # far below the 300 s wait: only a wake-up ends it
        waited, answer = await asyncio.gather(gate.service.wait(aid, 300), decide_once_waiting())
    assert answer["outcome"] == "approved"
    assert (waited["state"], waited["outcome"]) == ("resolved", "approved")
    assert waited["final_body"] == DRAFT


async def test_service_wait_wakes_on_cancel_and_expiry(gate: Gate) -> None:
    one = (await gate.create("q1"))["approval_id"]
    two = (await gate.create("short"))["approval_id"]

    async def resolve_both() -> None:
        await gate.service.get(one)
        await gate.service.cancel(one)
        gate.clock.advance(3)
        assert await gate.service.expire_due() == 1

    async with asyncio.timeout(10):
        a, b, _ = await asyncio.gather(
            gate.service.wait(one, 300), gate.service.wait(two, 300), resolve_both()
        )
    assert (a["outcome"], b["outcome"]) == ("cancelled", "timeout")


async def test_service_wait_returns_at_once_when_resolved_or_zero(gate: Gate) -> None:
    pending = (await gate.create("q1"))["approval_id"]
    done = (await gate.create("q1"))["approval_id"]
    await gate.decide(done)

    async with asyncio.timeout(5):
        assert (await gate.service.wait(pending, 0))["state"] == "pending"
        assert (await gate.service.wait(done, 300))["outcome"] == "approved"


# --------------------------------------------------------------------------- audit


async def test_service_dispatch_ack_audited_once(gate: Gate) -> None:
    aid = (await gate.create("q1"))["approval_id"]

    await gate.service.dispatch_result(
        aid, 1, acked=False, error="http_503", retry_at_ms=NOW_MS + 1000
    )
    await gate.service.dispatch_result(aid, 1, acked=True, error=None, retry_at_ms=NOW_MS)
    await gate.service.dispatch_result(aid, 1, acked=True, error=None, retry_at_ms=NOW_MS)

    acks = [
        json.loads(r.entry)["data"] for r in await gate.audit_rows() if r.kind == "dispatch_ack"
    ]
    assert acks == [{"revision": 1, "attempts": 2}]
    view = await gate.service.get(aid)
    assert view["dispatch"]["attempts"] == 2
    assert view["dispatch"]["delivered_at"] == rfc3339(NOW_MS)


async def test_service_audit_chain_verifies_and_receipts_match(gate: Gate) -> None:
    ids = {}
    ids["approved"] = (await gate.create("q1"))["approval_id"]
    await gate.service.dispatch_result(
        ids["approved"], 1, acked=True, error=None, retry_at_ms=NOW_MS
    )
    await gate.decide(ids["approved"], BOB)
    ids["adjusted"] = (await gate.create("q2"))["approval_id"]
    await gate.decide(ids["adjusted"], ALICE, "adjust", adjust_text="Zoë's edit 👍\n")
    await gate.decide(ids["adjusted"], CAROL)
    ids["skipped"] = (await gate.create("q2"))["approval_id"]
    await gate.decide(ids["skipped"], ALICE)
    await gate.decide(ids["skipped"], BOB, "skip")
    ids["cancelled"] = (await gate.create("q1"))["approval_id"]
    await gate.service.cancel(ids["cancelled"])
    ids["timeout"] = (await gate.create("short"))["approval_id"]
    pending = (await gate.create("q1"))["approval_id"]
    await gate.refused(ids["approved"], ALICE)  # refusals write nothing
    gate.clock.advance(10)
    await gate.service.expire_due()

    rows = await gate.audit_rows()
    assert audit.verify(rows, RECEIPT_KEY) == audit.VerifyResult(True, len(rows))
    assert [r.seq for r in rows] == list(range(1, len(rows) + 1))
    assert sum(r.kind == "created" for r in rows) == 6
    assert sum(r.kind == "dispatch_ack" for r in rows) == 1
    assert sum(r.kind == "decision" for r in rows) == 5
    assert not audit.verify(rows, b"wrong-key").ok

    resolved_rows = {r.approval_id: r for r in rows if r.kind == "resolved"}
    assert set(resolved_rows) == set(ids.values())
    for outcome, aid in ids.items():
        view = await gate.service.get(aid)
        assert view["outcome"] == outcome
        assert view["receipt"] == receipt_object(resolved_rows[aid])
        assert json.loads(resolved_rows[aid].entry)["data"]["outcome"] == outcome
    assert (await gate.service.get(pending))["receipt"] is None


async def test_service_audit_survives_reopen(make_gate: MakeGate) -> None:
    gate = await make_gate()
    aid = (await gate.create("q1"))["approval_id"]
    await gate.decide(aid)
    await gate.store.close()

    store = Store(gate.config.storage.path)
    await store.open()
    try:
        rows = [row async for row in store.audit_rows()]
        assert [r.kind for r in rows] == ["created", "decision", "resolved"]
        assert audit.verify(rows, RECEIPT_KEY).ok
        full = await store.reads.fetch(APPROVALS, aid)
        assert full is not None and full.outcome == "approved"
    finally:
        await store.close()


# =========================================================================== pure rules


def small_approval(**overrides: Any) -> Approval:
    """The shape ``Store.fetch_approval`` returns, reduced to what the rules read
    (``revisions`` given as dicts; nonces and times the rules do not read are filled in)."""
    values: dict[str, Any] = {
        "approval_id": "a1",
        "state": "pending",
        "outcome": None,
        "expires_at": NOW_MS + 1000,
        "revision": 1,
        "quorum_required": 2,
        "scope": [[ALICE_ID, ALICE], [BOB_ID, "Bob@Example.com"]],
        "revisions": [
            {"revision": 1, "body": "v1", "payload_hash": "sha256:v1", "created_by": None}
        ],
        "decisions": [],
    }
    values.update(overrides)
    revisions = tuple(
        Revision(
            r["revision"], r["body"], r["payload_hash"], f"n{r['revision']}", 0, r["created_by"]
        )
        for r in values.pop("revisions")
    )
    return Approval(
        **{
            "run_id": "r1",
            "pipeline": "p",
            "step": "s",
            "risk": "low",
            "content_type": "text/plain",
            "budget": None,
            "spend": None,
            "created_at": NOW_MS - 1000,
            "resolved_at": None,
            "idempotency_key": None,
            "request_hash": "",
            "receipt": None,
            "requested_by": None,
            "requested_by_id": None,
            "allow_self_approval": False,
            "permit": None,
            **values,
            "scope": tuple((int(op_id), str(identity)) for op_id, identity in values["scope"]),
            "decisions": tuple(values["decisions"]),
            "revisions": revisions,
        }
    )


def small_decision(verb: str = "approve", **overrides: Any) -> Decision:
    values: dict[str, Any] = dict(
        approval_id="a1",
        nonce="n1",
        decision=verb,
        payload_hash="sha256:v1",
        approver_id=ALICE,
        approver_display=None,
        approver_channel=None,
        adjust_text=None,
        decided_at="2026-01-01T00:00:00Z",
    )
    values.update(overrides)
    return Decision(**values)


def row(
    operator_id: int, verb: str = "approve", revision: int = 1, adjust_text: str | None = None
) -> DecisionRow:
    return DecisionRow(
        revision=revision,
        operator_id=operator_id,
        identity=f"op{operator_id}@example.com",
        display=None,
        channel=None,
        decision=verb,
        payload_hash=f"sha256:v{revision}",
        adjust_text=adjust_text,
        decided_at="2026-01-01T00:00:00Z",
        recorded_at=NOW_MS,
    )


@pytest.mark.parametrize(
    ("identity", "key"),
    [
        ("alice@example.com", "alice@example.com"),
        ("  Alice@Example.COM\t", "alice@example.com"),
        ("STRASSE@example.com", "strasse@example.com"),
        ("Straße@example.com", "strasse@example.com"),
        ("\u0430lice@example.com", "\u0430lice@example.com"),
    ],
    ids=["plain", "trim_case", "upper", "casefold_sharp_s", "cyrillic_kept"],
)
def test_rules_identity_key(identity: str, key: str) -> None:
    assert rules.identity_key(identity) == key


def test_rules_check_state_ok() -> None:
    rules.check_state(small_approval(), 1, small_decision(), NOW_MS)


@pytest.mark.parametrize(
    ("overrides", "nonce_rev", "decision", "now", "expected"),
    [
        (
            dict(state="resolved", outcome="approved"),
            1,
            {},
            NOW_MS,
            (409, "already_resolved", "already_resolved"),
        ),
        (dict(state="resolved", outcome="timeout"), 1, {}, NOW_MS, (410, "expired", "expired")),
        ({}, 1, {}, NOW_MS + 1000, (410, "expired", "expired")),
        ({}, 1, {}, NOW_MS + 999_999, (410, "expired", "expired")),
        (
            dict(
                revision=2,
                revisions=[
                    {"revision": 1, "body": "v1", "payload_hash": "sha256:v1", "created_by": None},
                    {
                        "revision": 2,
                        "body": "v2",
                        "payload_hash": "sha256:v2",
                        "created_by": ALICE_ID,
                    },
                ],
            ),
            1,
            {},
            NOW_MS,
            (409, "superseded", "superseded"),
        ),
        (
            {},
            1,
            {"payload_hash": "sha256:other"},
            NOW_MS,
            (403, "forbidden", "payload_hash_mismatch"),
        ),
    ],
    ids=[
        "resolved",
        "resolved_timeout",
        "at_expires_at",
        "past_expires_at",
        "superseded",
        "hash_mismatch",
    ],
)
def test_rules_check_state_refusals(
    overrides: dict[str, Any],
    nonce_rev: int,
    decision: dict[str, Any],
    now: int,
    expected: tuple[int, str, str],
) -> None:
    with pytest.raises(GateError) as info:
        rules.check_state(small_approval(**overrides), nonce_rev, small_decision(**decision), now)
    assert (info.value.status, info.value.kind, info.value.code) == expected


def test_rules_check_state_resolved_carries_outcome() -> None:
    with pytest.raises(GateError) as info:
        rules.check_state(
            small_approval(state="resolved", outcome="skipped"), 1, small_decision(), NOW_MS
        )
    assert info.value.body() == {
        "status": "already_resolved",
        "reason": "already_resolved",
        "outcome": "skipped",
    }


def test_rules_check_approver() -> None:
    approval = small_approval()

    assert rules.check_approver(approval, ALICE) == ALICE_ID
    assert rules.check_approver(approval, " bob@example.COM ") == BOB_ID
    for outsider in ("carol@example.com", "\u0430lice@example.com", "", "alice"):
        with pytest.raises(GateError) as info:
            rules.check_approver(approval, outsider)
        assert info.value.code == "approver_not_allowed"


@pytest.mark.parametrize(
    ("verb", "text", "reason"),
    [
        ("approve", None, None),
        ("skip", None, None),
        ("adjust", "ok", None),
        ("adjust", "x" * 10, None),
        ("adjust", "x" * 11, "adjust_text_too_long"),
        ("adjust", "👍" * 10, None),
        ("adjust", None, "adjust_text_required"),
        ("adjust", "", "adjust_text_required"),
        ("adjust", " \t\r\n\u00a0", "adjust_text_required"),
    ],
    ids=[
        "approve",
        "skip",
        "short",
        "at_limit",
        "over_limit",
        "emoji_chars_not_bytes",
        "null",
        "empty",
        "whitespace",
    ],
)
def test_rules_check_adjust_text(verb: str, text: str | None, reason: str | None) -> None:
    decision = small_decision(verb, adjust_text=text)
    if reason is None:
        rules.check_adjust_text(decision, 10)
        return
    with pytest.raises(GateError) as info:
        rules.check_adjust_text(decision, 10)
    assert (info.value.status, info.value.code) == (422, reason)


def test_rules_check_not_decided() -> None:
    approval = small_approval(decisions=[row(ALICE_ID)])

    rules.check_not_decided(approval, BOB_ID, small_decision())
    with pytest.raises(GateError) as info:
        rules.check_not_decided(approval, ALICE_ID, small_decision())
    assert info.value.code == "duplicate"
    with pytest.raises(GateError) as info:
        rules.check_not_decided(approval, ALICE_ID, small_decision("skip"))
    assert info.value.code == "already_decided"


def test_rules_check_not_decided_only_current_revision() -> None:
    approval = small_approval(
        revision=2,
        decisions=[row(ALICE_ID, revision=1)],
        revisions=[
            {"revision": 1, "body": "v1", "payload_hash": "sha256:v1", "created_by": None},
            {"revision": 2, "body": "v2", "payload_hash": "sha256:v2", "created_by": BOB_ID},
        ],
    )

    rules.check_not_decided(approval, ALICE_ID, small_decision())  # decided rev 1 only
    with pytest.raises(GateError) as info:  # bob's adjust created rev 2: his approval
        rules.check_not_decided(approval, BOB_ID, small_decision())
    assert info.value.code == "duplicate"


def test_rules_verdict() -> None:
    approval = small_approval()

    assert rules.verdict(approval, 1, small_decision()) == rules.Verdict(1, "approve")
    assert rules.verdict(approval, 1, small_decision("skip")) == rules.Verdict(1, "skip")
    assert rules.verdict(approval, 1, small_decision("adjust", adjust_text="v2")) == rules.Verdict(
        1, "adjust", "v2"
    )
    assert rules.verdict(approval, 1, small_decision("adjust", adjust_text="v1")) == rules.Verdict(
        1, "approve"
    )


def test_rules_approvers_of() -> None:
    approval = small_approval(
        revision=2,
        revisions=[
            {"revision": 1, "body": "v1", "payload_hash": "h1", "created_by": None},
            {"revision": 2, "body": "v2", "payload_hash": "h2", "created_by": BOB_ID},
        ],
        decisions=[
            row(ALICE_ID),
            row(CAROL_ID),
            row(BOB_ID, "adjust", 1, "v2"),
            row(ALICE_ID, "adjust", 2, "v2"),
            row(CAROL_ID, "skip", 2),
        ],
    )

    assert rules.approvers_of(approval, 1) == [ALICE_ID, CAROL_ID]
    assert rules.approvers_of(approval, 2) == [BOB_ID, ALICE_ID]
    assert rules.approvers_of(approval, 3) == []


@pytest.mark.parametrize(
    ("required", "collected", "revision", "effects", "outcome"),
    [
        (1, 1, 1, ["approve"], "approved"),
        (2, 1, 1, ["approve"], None),
        (2, 2, 1, ["approve"], "approved"),
        (1, 1, 2, ["adjust"], "adjusted"),
        (2, 1, 2, ["adjust"], None),
        (2, 2, 3, ["approve"], "adjusted"),
        (3, 0, 1, ["skip"], "skipped"),
        (1, 5, 2, ["skip"], "skipped"),
    ],
    ids=["q1", "q2_half", "q2_full", "q1_adjust", "q2_adjust", "q2_rev3", "skip_veto", "skip_wins"],
)
def test_rules_outcome_after(
    required: int, collected: int, revision: int, effects: list[str], outcome: str | None
) -> None:
    assert rules.outcome_after(required, collected, revision, effects) == outcome


def test_rules_current_revision_missing_raises() -> None:
    with pytest.raises(LookupError):
        rules.current_revision(small_approval(revision=9))


async def test_store_reads_see_each_commit_while_other_reads_run(gate: Gate) -> None:
    """Regression (bench round trip: 404 right after 201): a reader statement left active by
    one coroutine kept the shared reader connection on an old snapshot for the others."""
    stop = asyncio.Event()

    async def busy_reader() -> None:
        while not stop.is_set():
            await gate.store.reads.page(APPROVALS, "all", None, 20, None)

    readers = [asyncio.create_task(busy_reader()) for _ in range(8)]
    try:
        for _ in range(150):
            view = await gate.create()
            assert await gate.store.reads.fetch(APPROVALS, view["approval_id"]) is not None
    finally:
        stop.set()
        await asyncio.gather(*readers)
