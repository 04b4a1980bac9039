"""Shared fixtures (a capturing relay and a running gate wired to it) and the test tiers.

Tiers (markers registered in pyproject.toml; ``make test-fast`` deselects all three):

- ``e2e``: starts a daemon or another process (``python -m gate ...``, a relay, a tool);
- ``slow``: waits out real timeouts or backoffs, or takes more than 2 s;
- ``toolchain``: needs an external toolchain (node/npm, mono, a wheel build, bench, soak).

The tiers cannot rot: an audit hook (PEP 578) sees every process this interpreter starts
(``subprocess.Popen``, hence ``subprocess.run``, asyncio subprocesses, ``GateProcess``,
``CliProcess``, ...). A test that starts one without an ``e2e``, ``slow`` or ``toolchain``
marker fails there, with the command line in the message.

No process outlives its module: every ``subprocess.Popen`` this interpreter makes is
remembered, and when a module's last test has been torn down (its fixtures with it) any of
them still running is stopped and that teardown fails, naming the command. A test that
fails half-way still has its processes ended here.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TextIO

import pytest

from tests.outbox_harness import fault, scripted  # noqa: F401 (shared fixtures)
from tests.support import CaptureRelay, CliProcess, GateProcess, write_config

TIER_MARKERS = ("e2e", "slow", "toolchain")

_running: list[pytest.Item] = []  # the test being set up, run or torn down (at most one)
_unmarked_spawns: dict[str, list[str]] = {}  # test id -> commands it started unmarked


class UnmarkedProcessError(AssertionError):
    """A test started a process but carries none of the markers ``e2e``, ``slow`` or
    ``toolchain`` (see this module's docstring)."""


def _audit(event: str, args: tuple[object, ...]) -> None:
    """PEP 578 hook: refuse a ``subprocess.Popen`` made by a test without a tier marker.

    Raising here makes the ``Popen`` call itself fail; the spawn is also recorded, so a
    process started from another thread (where the error might be swallowed) still fails the
    test at its teardown."""
    if event != "subprocess.Popen" or not _running:
        return
    item = _running[-1]
    if any(item.get_closest_marker(name) for name in TIER_MARKERS):
        return
    argv = args[1]
    command = " ".join(map(str, argv)) if isinstance(argv, list | tuple) else str(argv)
    _unmarked_spawns.setdefault(item.nodeid, []).append(command)
    raise UnmarkedProcessError(
        f"{item.nodeid} starts a process ({command[:200]}) but is not marked "
        "e2e, slow or toolchain (tests/conftest.py; make test-fast would run it)"
    )


sys.addaudithook(_audit)

_children: list[subprocess.Popen[bytes]] = []  # every process started here, not yet reaped
_popen_init = subprocess.Popen.__init__


def _remembered_init(self: subprocess.Popen[bytes], *args: object, **kwargs: object) -> None:
    """``subprocess.Popen.__init__``, then remember the process (see the module docstring)."""
    _popen_init(self, *args, **kwargs)  # type: ignore[arg-type]
    _children.append(self)


subprocess.Popen.__init__ = _remembered_init  # type: ignore[method-assign]


def _end_leftovers() -> list[str]:
    """Stop (SIGTERM, then SIGKILL after 10 s) every remembered process still running, reap
    those that ended, and return the command lines of the ones that had to be stopped."""
    left: list[str] = []
    for proc in _children:
        if proc.poll() is not None:
            continue
        args = proc.args
        left.append(" ".join(map(str, args)) if isinstance(args, list | tuple) else str(args))
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    _children.clear()
    return left


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Remember which test is running, for the audit hook (fixtures included: a
    module-scoped daemon is started during the setup of the module's first test)."""
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.remove(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Fail the test (as a teardown error) if it started a process without a tier marker."""
    result = yield
    if nextitem is None or nextitem.path != item.path:  # the module's fixtures are gone too
        left = _end_leftovers()
        if left:
            pytest.fail(
                f"{item.path.name} left {len(left)} process(es) running after its last test "
                f"(now stopped): " + "; ".join(command[:200] for command in left),
                pytrace=False,
            )
    spawned = _unmarked_spawns.pop(item.nodeid, None)
    if spawned:
        pytest.fail(
            f"{item.nodeid} started {len(spawned)} process(es) without an e2e, slow or "
            f"toolchain marker: {spawned[0][:200]}",
            pytrace=False,
        )
    return result


def _module_weight(item: pytest.Item) -> int:
    """0 for a test needing a toolchain, 1 slow, 2 e2e, 3 the rest (the fast tier)."""
    for weight, name in enumerate(("toolchain", "slow", "e2e")):
        if item.get_closest_marker(name):
            return weight
    return 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (a worker collects), hand out the heaviest modules first: with
    ``--dist loadfile`` a worker takes whole modules in collection order, and a wheel build
    or a bench run started last is the run's long tail. Modules keep their own test order,
    so a module-scoped daemon still serves one contiguous run of tests.

    Every test has its own node id: schemathesis names its items ``test_x[POST /v1/...]``
    but gave them all the node id ``test_x``, and pytest-xdist, which hands out tests by
    node id, then ran one operation of each such test instead of every one (25 of
    tests/test_openapi.py's 58). Such an item's id gets its name's ``[...]``; any other
    id seen twice fails the collection."""
    _unique_node_ids(items)
    if not hasattr(config, "workerinput"):
        return
    weight: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        weight[module] = min(weight.get(module, 3), _module_weight(item))
    items.sort(key=lambda item: weight[item.nodeid.split("::", 1)[0]])


def _unique_node_ids(items: list[pytest.Item]) -> None:
    seen: set[str] = set()
    for item in items:
        nodeid = item.nodeid
        if "[" in item.name and not nodeid.endswith("]") and item.parent is not None:
            item._id = item.parent.id.child(item.name)  # type: ignore[attr-defined]
            nodeid = item.nodeid
        if nodeid in seen:
            raise pytest.UsageError(f"two tests share the node id {nodeid}")
        seen.add(nodeid)


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
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    """A file for an MCP server's stderr (``tests.mcp_support.stdio_mcp``), kept open."""
    with (tmp_path / "mcp.log").open("w+", encoding="utf-8") as f:
        yield f


@pytest.fixture
def spawn() -> Iterator[Callable[[Path], GateProcess]]:
    """Start gates on given configs (restarts, custom configs); each still running after the
    test is stopped."""
    procs: list[GateProcess] = []

    def start(config: Path) -> GateProcess:
        proc = GateProcess(config)
        procs.append(proc)
        return proc.start()

    yield start
    for proc in procs:
        if proc.proc is not None and proc.proc.poll() is None:
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
