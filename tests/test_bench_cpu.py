"""bench/cpu.py measures the CPU-seconds of real process trees: a busy process's own time,
a child's once its parent has waited for it, and a live descendant's. Each child reports its
own CPU (``time.process_time``: every thread, since its start) and the snapshots are taken
at points the child announces on its stdout, so nothing waits on the clock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from bench import cpu

pytestmark = pytest.mark.e2e

BURN_S = 0.3  # CPU-seconds each busy child spends
TICK_S = 1 / cpu.CLK_TCK
SLACK_S = 2 * TICK_S + 0.05  # /proc counts whole ticks; the harness's own few lines of Python

BURN = f"""
import time
def burn():
    t0 = time.process_time()
    while time.process_time() - t0 < {BURN_S}:
        pass
"""

OWN = (
    BURN
    + """
import sys
print("ready", flush=True)
sys.stdin.readline()
before = time.process_time()
burn()
print(time.process_time() - before, flush=True)
sys.stdin.readline()
"""
)

# the parent waits for a child that burns, then reports the child's whole CPU (start-up too)
WAITED = """
import subprocess, sys
print("ready", flush=True)
sys.stdin.readline()
done = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, check=True)
print(float(done.stdout), flush=True)
sys.stdin.readline()
"""

CHILD = (
    BURN
    + """
burn()
print(time.process_time())
"""
)

# the parent starts a child that stays alive after burning (it is in the tree, not waited for)
LIVE = """
import subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
)
assert child.stdout.readline() == "ready\\n"
print("ready", flush=True)
sys.stdin.readline()
child.stdin.write("go\\n"); child.stdin.flush()
print(child.stdout.readline(), end="", flush=True)
sys.stdin.readline()
child.stdin.close(); child.wait()
"""


class Script:
    """``python -c SOURCE ARGS`` driven line by line over its stdin and stdout."""

    def __init__(self, source: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(source), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.readline() == "ready"

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        assert self.proc.wait(60) == 0
        self.proc.stdout.close()


@pytest.fixture
def scripts() -> Iterator[list[Script]]:
    started: list[Script] = []
    yield started
    for script in started:
        if script.proc.poll() is None:
            script.proc.kill()
            script.proc.wait(60)


def _measure(script: Script) -> tuple[cpu.Usage, float]:
    """Snapshot, let ``script`` burn, snapshot: (what cpu measured, what the script says)."""
    before = cpu.snapshot([script.proc.pid])
    script.send("go")
    reported = float(script.readline())
    after = cpu.snapshot([script.proc.pid])
    script.send("end")
    return cpu.used(before, after), reported


def test_cpu_counts_a_busy_process_own_time(scripts: list[Script]) -> None:
    scripts.append(script := Script(OWN))

    usage, reported = _measure(script)
    script.finish()

    assert reported >= BURN_S
    assert reported - SLACK_S <= usage.seconds <= reported + SLACK_S
    assert usage.gone == () and usage.processes == 1


def test_cpu_counts_a_child_its_parent_waited_for(scripts: list[Script]) -> None:
    scripts.append(script := Script(WAITED, textwrap.dedent(CHILD)))

    usage, child_total = _measure(script)
    script.finish()

    assert child_total >= BURN_S
    # the child's whole life (it started after the first snapshot), in the parent's cutime
    assert child_total - SLACK_S <= usage.seconds <= child_total + SLACK_S + 0.1
    assert usage.processes == 1  # the child is gone, its time is not


def test_cpu_counts_a_live_descendant(scripts: list[Script]) -> None:
    scripts.append(script := Script(LIVE, textwrap.dedent(OWN)))

    usage, reported = _measure(script)
    script.finish()

    assert reported >= BURN_S
    assert reported - SLACK_S <= usage.seconds <= reported + SLACK_S
    assert usage.processes == 2 and usage.gone == ()


def test_cpu_tree_lists_a_process_and_its_descendants(scripts: list[Script]) -> None:
    scripts.append(script := Script(LIVE, textwrap.dedent(OWN)))

    members = cpu.tree(script.proc.pid)
    script.send("go")
    script.readline()
    script.send("end")
    script.finish()

    assert len(members) == 2 and members[0] == script.proc.pid
    assert cpu.tree(script.proc.pid) == []  # gone and reaped
