"""Whether the database takes writes: a storage fault's recovery probe and the writer
process's stall, what ``/healthz`` reports (``Store.check_writable``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from gate.errors import Fenced, Unavailable
from gate.store import writer_process
from gate.store.batch import PROBE, Faults, Probe

PROBE_INTERVAL_S = 1.0


class WriteHealth:
    """The probe state of one store: at most one probe transaction per
    ``PROBE_INTERVAL_S`` seconds while ``faults`` holds a storage fault."""

    def __init__(self, faults: Faults) -> None:
        self._faults = faults
        self._probing = False
        self._probed_at = 0.0
        self._fenced: Fenced | None = None

    @property
    def fenced(self) -> Fenced | None:
        """The first Fenced refusal (``fence``), or None."""
        return self._fenced

    def fence(self, error: Fenced) -> None:
        """A write was refused with ``error``: ``check`` raises it from now on (the first
        one kept)."""
        if self._fenced is None:
            self._fenced = error

    async def check(self, stalled_s: float, transact: Callable[[Probe], Awaitable[None]]) -> None:
        """Raise Unavailable 503 ``storage_unavailable`` while the last write failed on a
        storage fault, or while the writer process has left a transaction unanswered for
        ``stalled_s`` > ``writer_process.STALL_S`` seconds.

        At most once per ``PROBE_INTERVAL_S`` a probe transaction (``transact(PROBE)``)
        rewrites the database header (``PRAGMA user_version`` set to its own value,
        committed: it needs room in the WAL and a writable file); once it commits, the fault
        is over. Raises Fenced (503, its reason) once a write was refused so (``fence``):
        the gate writes no more until it restarts.
        """
        fenced = self._fenced
        if fenced is not None:
            raise Fenced(fenced.code, fenced.message, extra=fenced.extra)
        if stalled_s > writer_process.STALL_S:
            raise Unavailable(
                "storage_unavailable",
                f"the database writer process has not answered for {stalled_s:.0f} s",
            )
        if self._faults.write_fault is None:
            return
        if time.monotonic() - self._probed_at >= PROBE_INTERVAL_S and not self._probing:
            self._probed_at = time.monotonic()
            self._probing = True
            try:
                await transact(PROBE)
            except Unavailable:
                pass
            else:
                self._faults.recovered()
            finally:
                self._probing = False
        if self._faults.write_fault is not None:
            raise Unavailable(
                "storage_unavailable", f"database refuses writes: {self._faults.write_fault}"
            )
