"""Shared fixtures: a capturing relay and a running gate wired to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support import CaptureRelay, CliProcess, GateProcess, write_config


@pytest.fixture
def relay() -> Iterator[CaptureRelay]:
    """A capturing relay on loopback, stopped after the test."""
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture
def gate(tmp_path, relay) -> Iterator[GateProcess]:
    """A real ``hitl-gate serve`` on port 0 with the default test config, dispatching to
    ``relay``."""
    proc = GateProcess(write_config(tmp_path, relay.url)).start()
    yield proc
    if proc.proc and proc.proc.poll() is None:
        proc.stop()


@pytest.fixture
def clis() -> Iterator[Callable[..., CliProcess]]:
    """Start background CLI processes (``clis("relay", ...)``); any still running after the
    test is stopped."""
    procs: list[CliProcess] = []

    def start(*args: str, stdin: bytes | None = None, keep_stdin: bool = False) -> CliProcess:
        proc = CliProcess(*args, stdin=stdin, keep_stdin=keep_stdin)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stop()
