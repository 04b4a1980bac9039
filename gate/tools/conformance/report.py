"""What ``hitl-gate verify`` reports: the checks in order, as JSON or as text (SPEC §6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gate.tools.conformance.checks import CheckResult


@dataclass
class Report:
    """The checks in order, plus the ephemeral gate's callback URL used."""

    callback_url: str
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True only when every check passed."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        """Return ``{"ok", "callback_url", "checks": [...]}``."""
        return {
            "ok": self.ok,
            "callback_url": self.callback_url,
            "checks": [c.as_json() for c in self.checks],
        }

    def as_text(self) -> str:
        """Return the human-readable report: one line per check, fixes under failures."""
        lines = [f"hitl/v0 conformance of the relay (callback {self.callback_url})"]
        width = max((len(c.name) for c in self.checks), default=0)  # the longest name's
        for c in self.checks:
            label = "PASS" if c.ok else "SKIP" if c.skipped else "FAIL"
            lines.append(f"{label}  {c.name:{width}} {c.observed}")
            if not c.ok and c.fix and not c.skipped:
                lines.append(f"      fix: {c.fix}")
        passed_n = sum(c.ok for c in self.checks)
        skipped_n = sum(c.skipped for c in self.checks)
        lines.append(
            f"{passed_n}/{len(self.checks)} checks passed"
            + (f", {skipped_n} not run" if skipped_n else "")
            + f": {'CONFORMANT' if self.ok else 'NOT CONFORMANT'}"
        )
        return "\n".join(lines)
