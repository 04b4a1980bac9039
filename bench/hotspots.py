"""Summarise a py-spy profile (``record --threads --native --format raw``: folded stacks).

    python -m bench.hotspots PROFILE.folded [--top 25]

Each sample is one thread's stack at one instant. It is put in a *state* by its frames below
the innermost Python frame: ``idle`` (the event loop in epoll_wait, an aiosqlite thread
waiting on its queue), ``fsync`` (fdatasync/fsync), ``sqlite`` (inside libsqlite3),
``waiting`` (a lock or condition: usually the GIL), ``socket`` (send/recv), or ``python``
(the interpreter running Python or C-extension code). Printed: the states per thread, then
the top functions of the busy (not idle) samples of the event-loop thread (``MainThread``):
*self* by innermost Python frame and *inclusive* (anywhere on the stack, once per sample).
Frames are grouped by ``function (file)``; line numbers are dropped.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
_IDLE = ("epoll_wait", "_queue_SimpleQueue_get", "EpollSelector.select (selectors.py)")
_STATES = (
    ("fsync", ("fdatasync", "fsync")),
    ("sqlite", ("libsqlite3",)),
    ("socket", ("send (", "recv (", "sendto", "recvfrom", "sock_send", "sock_recv")),
    (
        "waiting",
        (
            "pthread_cond_timedwait",
            "pthread_cond_wait",
            "sem_wait",
            "take_gil",
            "PyThread_acquire_lock",
            "futex",
        ),
    ),
)


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    if "lib/python3." in path:
        return "stdlib/" + path.split("lib/python3.", 1)[1].split("/", 1)[-1]
    return path


def _split(frame: str) -> tuple[str, str]:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip(), ""
    return match.group("func"), _short_path(match.group("file"))


def _is_python(file: str) -> bool:
    return file.endswith(".py") or file.startswith("<frozen") or file == "<string>"


def _state(native_tail: list[str], leaf_python: str | None) -> str:
    joined = ";".join(native_tail)
    if any(marker in joined for marker in _IDLE) or (
        not native_tail and leaf_python is not None and leaf_python in _IDLE
    ):
        return "idle"
    for name, markers in _STATES:
        if any(marker in joined for marker in markers):
            return name
    return "python"


def summarise(path: Path, top: int = 25) -> dict[str, Any]:
    """Return ``{"samples", "threads": {name: {state: share}}, "busy_main_samples",
    "self": [[function, share of busy main-thread samples], ...], "inclusive": [...]}``."""
    per_thread: dict[str, Counter[str]] = defaultdict(Counter)
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = busy_main = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f.strip()]
        thread = "?"
        if frames and frames[0].startswith("thread ("):
            thread = frames.pop(0).split(": ", 1)[-1]
            thread = re.sub(r"^Thread-\d+ ", "", thread)
        split = [_split(f) for f in frames]
        last_py = max((i for i, (_, file) in enumerate(split) if _is_python(file)), default=-1)
        names = [f"{func} ({file})" for func, file in split]
        leaf = names[last_py] if last_py >= 0 else None
        state = _state(names[last_py + 1 :], leaf)
        total += count
        per_thread[thread][state] += count
        if thread == "MainThread" and state != "idle":
            busy_main += count
            if leaf is not None:
                own[leaf] += count
            for name in {n for n, (_, file) in zip(names, split, strict=True) if _is_python(file)}:
                inclusive[name] += count

    def shares(counter: Counter[str], base: int) -> list[list[Any]]:
        # frames on (almost) every busy stack (runpy, click, the loop itself) say nothing
        return (
            [[name, round(n / base, 4)] for name, n in counter.most_common() if n < 0.98 * base][
                :top
            ]
            if base
            else []
        )

    threads = {
        name: {state: round(n / sum(c.values()), 4) for state, n in c.most_common()}
        | {"samples": sum(c.values())}
        for name, c in per_thread.items()
    }
    return {
        "samples": total,
        "threads": threads,
        "busy_main_samples": busy_main,
        "self": shares(own, busy_main),
        "inclusive": shares(inclusive, busy_main),
    }


def render(summary: dict[str, Any]) -> str:
    """The summary as text."""
    out = [f"{summary['samples']} samples"]
    for thread, states in summary["threads"].items():
        parts = ", ".join(f"{k} {v * 100:.1f}%" for k, v in states.items() if k != "samples")
        out.append(f"  {thread} ({states['samples']} samples): {parts}")
    out.append(f"\nevent loop thread, busy samples ({summary['busy_main_samples']}), top self:")
    out += [f"  {frac * 100:6.2f}%  {name}" for name, frac in summary["self"]]
    out.append("\nevent loop thread, busy samples, top inclusive:")
    out += [f"  {frac * 100:6.2f}%  {name}" for name, frac in summary["inclusive"]]
    return "\n".join(out) + "\n"


def main() -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.hotspots")
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    sys.stdout.write(render(summarise(Path(args.profile), args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
