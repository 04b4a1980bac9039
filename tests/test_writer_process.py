"""The store's writer in its own process (``gate.store.writer_process``), as ``gate serve`` runs it.

Store-level tests fork a real writer from this test process (``Store(path,
writer_process=True)``) and read the real SQLite file; daemon-level tests run ``python -m
gate serve`` and find its writer among its children in /proc.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.errors import Conflict, GateError, Unavailable
from gate.store import Store, WriteTx
from tests.support import (
    DEADLINE_S,
    CaptureRelay,
    GateProcess,
    Named,
    children,
    decision_body,
    post_decision,
    run_cli,
    running,
    wait_until,
    write_config,
    writer_pid,
)

KEY = b"writer-process-test-key"


# ---- the store with a writer process ---------------------------------------------------------


class Handler:
    """Transactions by name, as ``GateService.run_command`` provides them; forked with the
    store, so the writer process runs its own copy. ``hold`` blocks the writer on a pipe the
    test writes to, after saying so on another pipe (synchronisation across the fork)."""

    def __init__(self) -> None:
        self.entered_r, self.entered_w = os.pipe()
        self.release_r, self.release_w = os.pipe()
        self.setting = "start"

    def __call__(self, tx: WriteTx | None, command: Named) -> Any:
        if command.name == "configure":
            if command.args[0] == "broken":
                raise ValueError("a configuration this handler cannot apply")
            self.setting = command.args[0]
            return None
        assert tx is not None
        if command.name == "append":
            (label, refuse) = command.args
            row = tx.append_audit("test", None, 0, {"label": label, "setting": self.setting}, KEY)
            if refuse:
                raise Conflict(
                    "refused_on_purpose", f"{label} refused after writing", extra={"label": label}
                )
            return row.seq
        if command.name == "hold":
            os.write(self.entered_w, b"x")
            os.read(self.release_r, 1)
            return "held"
        if command.name == "pid":
            return os.getpid()
        if command.name == "stop_iteration":  # a bare next() gone wrong in a transaction
            raise StopIteration
        if command.name == "unpicklable_error":
            raise NeedsTwoArguments("first", "second")
        raise ValueError(command.name)


class NeedsTwoArguments(GateError):
    """An error that pickles but does not unpickle (like ``permit.PermitError``)."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__("needs_two", f"{first} {second}", status=422)


def audit_labels(db: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT entry FROM audit_log ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [(json.loads(r[0])["data"]["label"], json.loads(r[0])["data"]["setting"]) for r in rows]


async def cancelled_in_socket(store: Store, *tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks``, wait until each has taken its cancellation (its cancel frame is
    queued) and until every frame is in the writer's socket: only then does the writer see
    the cancellations before it runs the jobs. (Releasing the writer before that raced the
    cancel frame: these tests failed 8 runs in 10 on a loaded host.)"""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with pytest.raises(asyncio.CancelledError):
            await task
    deadline = asyncio.get_running_loop().time() + 10
    while store.unsent_bytes:
        assert asyncio.get_running_loop().time() < deadline, "frames never left"
        await asyncio.sleep(0.001)


@pytest.fixture
async def forked(tmp_path: Path) -> Any:
    store = Store(tmp_path / "gate.db", writer_process=True)
    handler = Handler()
    store.bind(handler)
    await store.open()
    try:
        yield store, handler
    finally:
        os.write(handler.release_w, b"x" * 8)  # never leave the writer blocked in ``hold``
        await store.close()


async def test_writer_process_is_another_process_and_commits_every_answered_job(
    forked: Any, tmp_path: Path
) -> None:
    store, _ = forked
    pid = await store.transact(Named("pid"))
    assert pid != os.getpid() and pid in children(os.getpid())
    seqs = await asyncio.gather(
        *(store.transact(Named("append", (f"j{n}", False))) for n in range(50))
    )
    assert sorted(seqs) == list(range(1, 51))
    # answered = committed: a fresh connection sees every one of them
    assert sorted(label for label, _ in audit_labels(tmp_path / "gate.db")) == sorted(
        f"j{n}" for n in range(50)
    )


async def test_writer_process_refusal_crosses_the_process_boundary_and_rolls_back_alone(
    forked: Any, tmp_path: Path
) -> None:
    store, _ = forked
    results = await asyncio.gather(
        *(store.transact(Named("append", (f"j{n}", n % 3 == 1))) for n in range(9)),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(refused) == 3
    for error in refused:
        assert isinstance(error, Conflict)
        assert (error.status, error.code) == (409, "refused_on_purpose")
        assert error.extra["label"] in {"j1", "j4", "j7"}
    assert sorted(label for label, _ in audit_labels(tmp_path / "gate.db")) == [
        "j0",
        "j2",
        "j3",
        "j5",
        "j6",
        "j8",
    ]
    # the chain stays whole: what committed links up in seq order
    assert sorted(r for r in results if isinstance(r, int)) == [1, 2, 3, 4, 5, 6]


async def test_writer_process_takes_commands_only(forked: Any) -> None:
    store, _ = forked
    with pytest.raises(TypeError):
        await store.transact(lambda tx: None)


async def test_writer_process_cancelled_job_never_runs(forked: Any, tmp_path: Path) -> None:
    store, handler = forked
    held = asyncio.create_task(store.transact(Named("hold")))
    await asyncio.to_thread(os.read, handler.entered_r, 1)  # the writer is inside ``hold``
    cancelled = asyncio.create_task(store.transact(Named("append", ("never", False))))
    await asyncio.sleep(0)  # its job is sent; cancel it before the writer is free
    await cancelled_in_socket(store, cancelled)
    os.write(handler.release_w, b"x")
    assert await held == "held"
    await store.transact(Named("append", ("after", False)))
    assert [label for label, _ in audit_labels(tmp_path / "gate.db")] == ["after"]


async def test_writer_process_applies_configuration_in_order(forked: Any, tmp_path: Path) -> None:
    store, _ = forked
    first = asyncio.create_task(store.transact(Named("append", ("before", False))))
    await asyncio.sleep(0)  # sent before the new setting
    store.apply(Named("configure", ("new",)))
    await store.transact(Named("append", ("after", False)))
    await first
    assert audit_labels(tmp_path / "gate.db") == [("before", "start"), ("after", "new")]


async def test_writer_process_gone_refuses_writes_503(forked: Any) -> None:
    store, _ = forked
    pid = await store.transact(Named("pid"))
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(Unavailable) as info:
        for _ in range(100):  # the first sends may still be buffered before the loss is seen
            await store.transact(Named("append", ("lost", False)))
    assert info.value.code == "storage_unavailable"
    assert "writer process exited" in info.value.message
    with pytest.raises(Unavailable):
        await store.check_writable()


async def test_writer_process_error_that_cannot_cross_fails_its_job_only(
    forked: Any, tmp_path: Path
) -> None:
    """A transaction raising StopIteration (a future refuses it) or an error that does not
    unpickle fails that caller with an error; the channel and every other job go on."""
    store, _ = forked
    with pytest.raises(Exception) as stopped:
        await asyncio.wait_for(store.transact(Named("stop_iteration")), 10)
    assert not isinstance(stopped.value, (StopIteration, asyncio.TimeoutError))
    with pytest.raises(GateError) as odd:
        await asyncio.wait_for(store.transact(Named("unpicklable_error")), 10)
    assert (odd.value.status, odd.value.code) == (422, "needs_two")
    assert await store.transact(Named("append", ("after", False))) == 1
    assert store.write_fault is None


async def test_thread_writer_error_a_future_refuses_fails_its_job_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "gate.db")
    store.bind(Handler())
    await store.open()
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                store.transact(Named("stop_iteration")),
                store.transact(Named("pid")),
                return_exceptions=True,
            ),
            10,
        )
        assert not isinstance(results[0], StopIteration) and isinstance(results[0], Exception)
        assert results[1] == os.getpid()
    finally:
        await store.close()


async def test_writer_process_cancel_behind_a_reload_or_a_full_batch_is_honoured(
    forked: Any, tmp_path: Path
) -> None:
    """Cancels queued behind where a batch was cut (a reload, or MAX_BATCH jobs) still
    reach the jobs of that batch before they run."""
    store, handler = forked
    held = asyncio.create_task(store.transact(Named("hold")))
    await asyncio.to_thread(os.read, handler.entered_r, 1)
    behind_reload = asyncio.create_task(store.transact(Named("append", ("r", False))))
    await asyncio.sleep(0)
    store.apply(Named("configure", ("reloaded",)))
    many = [
        asyncio.create_task(store.transact(Named("append", (f"m{n}", False)))) for n in range(300)
    ]
    await asyncio.sleep(0)  # all sent (one write at the next loop turn)
    await cancelled_in_socket(store, behind_reload, many[5])
    os.write(handler.release_w, b"x")
    assert await held == "held"
    done = await asyncio.gather(*many, return_exceptions=True)
    assert isinstance(done[5], asyncio.CancelledError)
    labels = [label for label, _ in audit_labels(tmp_path / "gate.db")]
    assert "r" not in labels and "m5" not in labels
    assert len(labels) == 299


async def test_writer_process_cancel_during_a_batch_stops_a_later_job_of_it(
    forked: Any, tmp_path: Path
) -> None:
    store, handler = forked
    held = asyncio.create_task(store.transact(Named("hold")))
    later = asyncio.create_task(store.transact(Named("append", ("later", False))))
    await asyncio.to_thread(os.read, handler.entered_r, 1)  # one batch: hold, then later
    await cancelled_in_socket(store, later)
    os.write(handler.release_w, b"x")
    assert await held == "held"
    await store.transact(Named("append", ("after", False)))
    assert [label for label, _ in audit_labels(tmp_path / "gate.db")] == ["after"]


async def test_writer_process_survives_a_configuration_it_cannot_apply(
    forked: Any, tmp_path: Path
) -> None:
    store, _ = forked
    store.apply(Named("configure", ("broken",)))
    assert await store.transact(Named("append", ("after", False))) == 1
    assert audit_labels(tmp_path / "gate.db") == [("after", "start")]


async def test_writer_process_holds_the_database_lock_too(forked: Any, tmp_path: Path) -> None:
    """After a kill -9 of the daemon the writer may still finish a batch: it keeps the
    lock file open, so no second gate starts on the file until it is gone as well."""
    store, _ = forked
    pid = await store.transact(Named("pid"))
    lock = str(tmp_path / "gate.db.lock")
    assert any(os.readlink(f"/proc/{pid}/fd/{fd}") == lock for fd in os.listdir(f"/proc/{pid}/fd"))


async def test_writer_process_that_stops_answering_makes_the_health_check_fail(
    forked: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stuck writer (stopped, or blocked in the kernel) holds writes without failing
    them; /healthz (``check_writable``) says so once the oldest unanswered transaction is
    older than ``STALL_S``, and recovers when the writer answers again. The log says so
    too, once each way (new-user review: nothing was logged while /healthz was 503)."""
    from gate.store import writer_process as writerproc

    store, _ = forked
    monkeypatch.setattr(writerproc, "STALL_S", 0.2)
    caplog.set_level(logging.WARNING, logger=writerproc.log.name)
    pid = await store.transact(Named("pid"))
    os.kill(pid, signal.SIGSTOP)
    try:
        waiting = asyncio.create_task(store.transact(Named("append", ("late", False))))
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                await store.check_writable()
            except Unavailable as exc:
                assert exc.code == "storage_unavailable"
                assert "has not answered for" in exc.message
                break
            assert asyncio.get_running_loop().time() < deadline, "never reported stalled"
            await asyncio.sleep(0.05)
        while not any("event=writer_stalled" in r.getMessage() for r in caplog.records):
            assert asyncio.get_running_loop().time() < deadline, "the stall was not logged"
            await asyncio.sleep(0.05)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert await waiting == 1
    await store.check_writable()  # answered: healthy again
    messages = [r.getMessage() for r in caplog.records]
    stalled = [m for m in messages if "event=writer_stalled" in m]
    assert len(stalled) == 1 and f"pid={pid} " in stalled[0] and "transactions=1" in stalled[0]
    assert [m for m in messages if "event=writer_answering_again" in m] == [
        f"event=writer_answering_again pid={pid}"
    ]


# ---- the daemon ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_serve_runs_one_writer_process_which_ends_with_the_gate(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    writer = writer_pid(gate)
    assert (
        Path(f"/proc/{writer}/cmdline").read_bytes()
        == Path(f"/proc/{gate.proc.pid}/cmdline").read_bytes()
    )  # a fork of the daemon
    # told apart by name (ps -o comm, top) and by the listening line
    assert Path(f"/proc/{writer}/comm").read_text(encoding="ascii").strip() == "hitl-gate-db"
    gate.wait_for_line(rf"event=listening .* writer_pid={writer}\b")
    approval = gate.api().create()
    dispatch = relay.wait_dispatch(approval["approval_id"])
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
    assert (status, answer["outcome"]) == (200, "approved")
    gate.kill9()  # not even a clean stop: the writer sees its socket close and exits
    wait_until(lambda: not running(writer), what="the writer process to exit")


@pytest.mark.e2e
def test_writer_process_killed_stops_the_gate_with_exit_1_for_a_restart(
    gate: GateProcess, tmp_path: Path, relay: CaptureRelay
) -> None:
    """A lost writer is not a state the gate can serve in: it stops cleanly and exits 1,
    so systemd (Restart=on-failure) starts it again with a new writer."""
    approval = gate.api().create()
    writer = writer_pid(gate)
    os.kill(writer, signal.SIGKILL)
    gate.wait_for_line(rf"event=writer_exited pid={writer} signal=SIGKILL")
    assert gate.proc is not None
    assert gate.proc.wait(30) == 1
    log = gate.log()
    assert "event=stopped" in log and "Traceback" not in log
    # the cause comes first: nothing it caused is logged before it
    assert log.index("event=writer_exited") < min(
        (log.index(word) for word in ("storage_unavailable", "event=stopping") if word in log),
        default=len(log),
    )
    assert not running(writer)
    again = GateProcess(write_config(tmp_path, relay.url)).start()
    try:  # nothing answered was lost
        assert again.api().get(approval["approval_id"])["state"] == "pending"
    finally:
        again.stop()


@pytest.mark.e2e
def test_a_stopped_writer_left_by_a_killed_gate_is_named_when_the_next_start_is_refused(
    tmp_path: Path, relay: CaptureRelay
) -> None:
    """After kill -9 of a gate whose writer is stopped (SIGSTOP, or blocked in the kernel),
    the writer keeps the database lock: the next start is refused, naming its pid (new-user
    review: the error did not say who held it), and starts once the writer is gone."""
    config = write_config(tmp_path, relay.url)
    first = GateProcess(config).start()
    writer = writer_pid(first)
    assert first.proc is not None
    os.kill(writer, signal.SIGSTOP)
    try:
        first.proc.kill()
        first.proc.wait(DEADLINE_S)
        refused = run_cli("serve", "-c", str(config))
        assert refused.returncode == 1, refused.stderr
        err = refused.stderr.decode()
        assert f"database in use by another hitl-gate process (pid {writer}): " in err, err
        assert "Traceback" not in err
    finally:
        os.kill(writer, signal.SIGCONT)  # it sees its input end and exits
    wait_until(lambda: not running(writer), what="the orphaned writer to exit")
    again = GateProcess(config).start()
    assert again.stop() == 0


@pytest.mark.e2e
def test_reload_reaches_the_writer_process(tmp_path: Path, relay: CaptureRelay) -> None:
    """The rate limit is checked inside the decision's transaction, i.e. in the writer
    process: a SIGHUP that lowers it must reach the writer's copy of the config."""
    config = write_config(tmp_path, relay.url)
    gate = GateProcess(config).start()
    try:
        api = gate.api()
        opened = []
        for _ in range(2):
            approval = api.create()
            opened.append(relay.wait_dispatch(approval["approval_id"]))
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
        data["relay"]["security"]["rate_limit"] = 1
        config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        assert gate.proc is not None
        gate.proc.send_signal(signal.SIGHUP)
        gate.wait_for_line(r"event=reloaded ")
        status, _, _ = post_decision(gate.callback_url, decision_body(opened[0]))
        assert status == 200
        status, answer, _ = post_decision(gate.callback_url, decision_body(opened[1]))
        assert (status, answer["reason"]) == (429, "rate_limited")
    finally:
        gate.stop()


def test_writer_frames_end_when_the_gate_dies_with_answers_unread() -> None:
    """A killed daemon with answers still unread resets the socket (ECONNRESET): for the
    writer that is the end of the stream, not a crash with a traceback in the gate's log
    (found by the kill -9 soak)."""
    from gate.store.writer_child import _Frames

    gate_end, writer_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    writer_end.sendall(b"an answer the daemon never read")
    gate_end.close()
    try:
        frames = _Frames(writer_end)
        assert frames.poll() == []
        assert frames.take() is None
    finally:
        writer_end.close()
