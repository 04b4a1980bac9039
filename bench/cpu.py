"""CPU-seconds spent by process trees between two snapshots, from Linux ``/proc``.

A snapshot reads, for every process of each tree (a root pid and all its descendants, found
through ``/proc/<pid>/task/<tid>/children``), ``utime + stime`` (all its threads) and
``cutime + cstime`` (the children it has waited for). ``used(before, after)`` is the
CPU-seconds between them: the sum over ``after`` minus the sum over ``before``. So a process
that is new since ``before`` counts from its start (a PostgreSQL backend opened for the load
is part of it), and one that ended in between and was waited for by its parent in the tree
(a gate's writer process, a PostgreSQL backend reaped by the postmaster) counts exactly its
time in the interval: its whole time moved into the parent's ``cutime``, its ticks in
``before`` are subtracted. A zombie keeps its times until it is reaped.

What it gets wrong: a process that ended without being waited for by a process of the tree
(its time went to whoever reaped it, and its ticks in ``before`` are still subtracted: the
figure errs low; ``gone`` lists every process seen in ``before`` and not in ``after`` so a
caller can tell), and one that started and ended between the snapshots unwaited-for (not
seen at all). Resolution: one clock tick (10 ms on Linux) per process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ProcessTimes:
    """One process's CPU in clock ticks: its own (``utime + stime``) and that of the children
    it waited for (``cutime + cstime``)."""

    pid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat: with the pid, names the process
    own: int
    waited: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The processes of some trees at one moment, by ``(pid, start_ticks)``."""

    processes: dict[tuple[int, int], ProcessTimes] = field(default_factory=dict)

    def ticks(self) -> int:
        """The sum of every process's own and waited-for ticks."""
        return sum(p.own + p.waited for p in self.processes.values())


def read_times(pid: int) -> ProcessTimes | None:
    """``pid``'s CPU from ``/proc/<pid>/stat``; None when it is gone. A zombie still has its
    times (they move into its parent's ``cutime`` when it is reaped)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime..cstime are fields 14-17, starttime field 22
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return ProcessTimes(pid, int(fields[19]), utime + stime, cutime + cstime)


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children, over all its threads (a child forked by any thread is
    listed under that thread)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text(encoding="ascii")
        except OSError:
            continue
        found.extend(int(word) for word in text.split())
    return found


def tree(root: int) -> list[int]:
    """``root`` and all its descendants (breadth first); empty when ``root`` is gone."""
    if not Path(f"/proc/{root}").exists():
        return []
    order, queue, seen = [], [root], {root}
    while queue:
        pid = queue.pop(0)
        order.append(pid)
        for child in children(pid):
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return order


def snapshot(roots: Iterable[int]) -> Snapshot:
    """The CPU of every process in the trees of ``roots`` now (a pid in two trees once)."""
    processes: dict[tuple[int, int], ProcessTimes] = {}
    for root in roots:
        for pid in tree(root):
            times = read_times(pid)
            if times is not None:
                processes[(times.pid, times.start_ticks)] = times
    return Snapshot(processes)


@dataclass(frozen=True, slots=True)
class Usage:
    """CPU between two snapshots: ``seconds`` over the trees, the processes ``gone`` since
    ``before`` (not waited for by a process of the tree: their last interval is unseen) and
    how many ``processes`` the trees had at the end."""

    seconds: float
    gone: tuple[int, ...]
    processes: int


def used(before: Snapshot, after: Snapshot) -> Usage:
    """The CPU-seconds the trees used from ``before`` to ``after`` (the module's docstring
    says what is counted)."""
    ticks = after.ticks() - before.ticks()
    gone = tuple(
        sorted(pid for pid, start in before.processes if (pid, start) not in after.processes)
    )
    return Usage(ticks / CLK_TCK, gone, len(after.processes))
