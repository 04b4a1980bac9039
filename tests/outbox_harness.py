"""What tests of the outbox senders share: a relay whose answers are scripted per ``run_id``
(``ScriptedRelay``) and real ways to make the database refuse writes while a daemon runs
(``Fault``: a full tmpfs, ``chattr +i``, ``RLIMIT_FSIZE`` on the writer). A fault this machine
cannot produce (no root, no tmpfs mount, no chattr) skips its test with the reason."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.support import DEADLINE_S, CaptureRelay, GateProcess, writer_pid

# ---------------------------------------------------------------------------------------------
# Relays that misbehave on purpose
# ---------------------------------------------------------------------------------------------


class ScriptedRelay(CaptureRelay):
    """A capturing relay whose answer depends on the dispatch's ``run_id``.

    ``script[run_id] = (status, delay_s)`` (or ``script[f"{path} {run_id}"]`` for POSTs to
    that path only); other run ids get ``status``/``delay_s``. Each
    dispatch is recorded when it arrives (``record["status"]`` is the status it will get).
    3xx answers carry ``Location: <location>``. ``down()`` closes the listener and every
    open connection (connection refused from then on); ``up()`` listens on the same port again.
    """

    def __init__(self) -> None:
        super().__init__()
        self.script: dict[str, tuple[int, float]] = {}
        self.location = ""
        self.port = 0

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}/relay"
        self._started.set()

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        run_id = json.loads(raw).get("run_id")
        status, delay = self.script.get(
            f"{request.path} {run_id}", self.script.get(run_id, (self.status, self.delay_s))
        )
        with self._cond:
            self.received.append(
                {
                    "headers": dict(request.headers),
                    "raw": raw,
                    "status": status,
                    "at": time.time(),
                    "run_id": run_id,
                    "path": request.path,
                }
            )
            self._cond.notify_all()
        if delay:
            await asyncio.sleep(delay)
        headers = {"Location": self.location} if 300 <= status < 400 and self.location else {}
        return web.json_response({"status": "ok"}, status=status, headers=headers)

    def _call(self, coro: Any) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(DEADLINE_S)

    def down(self) -> None:
        """Stop listening and drop every connection: the relay is unreachable."""
        assert self._runner is not None
        self._call(self._runner.cleanup())
        self._runner = None

    def up(self) -> None:
        """Listen again on the same port."""
        self._started.clear()
        self._call(self._serve())

    def count(self, run_id: str, path: str | None = None) -> int:
        """How many dispatches carrying ``run_id`` arrived (at ``path``, when given)."""
        return len(self.arrivals(run_id, path))

    def arrivals(self, run_id: str, path: str | None = None) -> list[float]:
        """When (``time.time()``) each POST carrying ``run_id`` arrived (at ``path``)."""
        with self._cond:
            return [
                r["at"]
                for r in self.received
                if r["run_id"] == run_id and path in (None, r["path"])
            ]


@pytest.fixture
def scripted() -> Iterator[ScriptedRelay]:
    r = ScriptedRelay().start()
    yield r
    if r._runner is not None:
        r.stop()
    else:
        r._loop.call_soon_threadsafe(r._loop.stop)
        r._thread.join(10)


# ---------------------------------------------------------------------------------------------
# Storage faults
# ---------------------------------------------------------------------------------------------


class Fault:
    """A way to make the database refuse writes while the daemon runs, and to fix it."""

    name = ""

    def __init__(self, base: Path) -> None:
        self.dir = base

    @property
    def db(self) -> Path:
        return self.dir / "gate.db"

    def apply(self, gate: GateProcess) -> None:
        raise NotImplementedError

    def clear(self, gate: GateProcess) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        """Undo everything, also after a failed test."""


class DiskFull(Fault):
    """The database lives on an 8 MiB tmpfs; a filler file takes every free byte."""

    name = "disk_full"

    def __init__(self, base: Path) -> None:
        super().__init__(base / "mnt")
        self.dir.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(self.dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        self.filler = self.dir / "filler"

    def apply(self, gate: GateProcess) -> None:
        with open(self.filler, "wb", buffering=0) as out:
            for chunk in (1 << 20, 1 << 16, 1 << 12):
                with contextlib.suppress(OSError):
                    while True:
                        out.write(b"\0" * chunk)
        assert os.statvfs(self.dir).f_bfree == 0

    def clear(self, gate: GateProcess) -> None:
        self.filler.unlink()

    def teardown(self) -> None:
        if (
            subprocess.run(["umount", str(self.dir)], capture_output=True, check=False).returncode
            != 0
        ):
            subprocess.run(["umount", "-l", str(self.dir)], capture_output=True, check=False)


class ReadOnly(Fault):
    """``chattr +i`` on the database, its WAL and their directory: every write fails."""

    name = "read_only"

    def __init__(self, base: Path) -> None:
        super().__init__(base / "db")
        self.dir.mkdir()
        probe = self.dir / "probe"
        probe.touch()
        done = (
            subprocess.run(
                ["chattr", "+i", str(probe)], capture_output=True, text=True, check=False
            )
            if shutil.which("chattr")
            else None
        )
        if done is None or done.returncode != 0:
            pytest.skip(
                "chattr +i is not available here" + (f": {done.stderr.strip()}" if done else "")
            )
        subprocess.run(["chattr", "-i", str(probe)], check=True)
        probe.unlink()

    def _targets(self) -> list[str]:
        files = [self.db, self.db.with_name("gate.db-wal")]
        return [str(p) for p in files if p.exists()] + [str(self.dir)]

    def apply(self, gate: GateProcess) -> None:
        subprocess.run(["chattr", "+i", *self._targets()], check=True)

    def clear(self, gate: GateProcess) -> None:
        subprocess.run(["chattr", "-i", *self._targets()], check=True)

    def teardown(self) -> None:
        subprocess.run(["chattr", "-R", "-i", str(self.dir)], capture_output=True, check=False)


class FileSizeLimit(Fault):
    """``RLIMIT_FSIZE`` of the daemon's writer process lowered to the WAL's size (needs no
    privilege): the WAL cannot grow, so every commit fails (EFBIG)."""

    name = "file_size_limit"

    def __init__(self, base: Path) -> None:
        super().__init__(base / "db")
        self.dir.mkdir()
        self.saved: tuple[int, int] | None = None
        self.pid = 0

    def apply(self, gate: GateProcess) -> None:
        self.pid = writer_pid(gate)  # the process that writes the database
        wal = self.db.with_name("gate.db-wal").stat().st_size
        self.saved = resource.prlimit(self.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, (wal, self.saved[1]))

    def clear(self, gate: GateProcess) -> None:
        assert self.saved is not None
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, self.saved)


FAULTS: dict[str, type[Fault]] = {cls.name: cls for cls in (DiskFull, ReadOnly, FileSizeLimit)}


@pytest.fixture(params=sorted(FAULTS))
def fault(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fault]:
    made = FAULTS[request.param](tmp_path)
    yield made
    made.teardown()
