"""One doctor check's result (PASS/WARN/FAIL/SKIP) and its report line."""

from __future__ import annotations

from dataclasses import dataclass

MAX_ERRORS_SHOWN = 3


@dataclass(frozen=True, slots=True)
class Check:
    """One check's result: ``ok`` False fails the run (exit 1). ``level`` "WARN" (ok, but
    look at it) or "SKIP" (not run, because of an earlier check or nothing to check yet)
    overrides the PASS/FAIL label."""

    name: str
    ok: bool
    detail: str
    level: str = ""

    @property
    def label(self) -> str:
        """PASS, FAIL, WARN or SKIP."""
        return self.level or ("PASS" if self.ok else "FAIL")

    def line(self) -> str:
        """The report line: ``LABEL name: detail``."""
        return f"{self.label} {self.name}: {self.detail}"


def warn(name: str, detail: str) -> Check:
    """A passing check to look at (WARN)."""
    return Check(name, True, detail, "WARN")


def skip(name: str, detail: str, ok: bool = True) -> Check:
    """A check not run (SKIP): because of an earlier check (``ok`` False) or nothing to check."""
    return Check(name, ok, detail, "SKIP")


def shown_errors(errors: list[str], hint: str = "") -> str:
    """The first MAX_ERRORS_SHOWN errors, how many more, then ``hint``."""
    shown = "; ".join(errors[:MAX_ERRORS_SHOWN])
    more = len(errors) - MAX_ERRORS_SHOWN
    return shown + (f"; and {more} more" if more > 0 else "") + hint


def counted(count: int, one: str, many: str) -> str:
    """``1 step reminds``, ``2 steps remind``: ``count`` and its noun, ``one`` or ``many``."""
    return f"{count} {one if count == 1 else many}"
