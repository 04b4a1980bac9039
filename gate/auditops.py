"""Read audit rows from the database or an export file, for ``audit verify``/``export``."""

from __future__ import annotations

from pathlib import Path

from gate import audit
from gate.errors import GateError
from gate.store import Store


async def read_database(path: Path) -> list[audit.AuditRow]:
    """Return every audit row of the database at ``path``; GateError if it does not exist."""
    if not Path(path).exists():
        raise GateError("no_database", f"no database at {path}")
    store = Store(path)
    await store.open()
    try:
        return [row async for row in store.audit_rows()]
    finally:
        await store.close()


def read_export(path: Path) -> list[audit.AuditRow]:
    """Return the rows of a JSON Lines export; GateError naming the first unreadable line."""
    rows = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GateError("bad_export", f"cannot read {path}: {exc}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(audit.parse_export_line(line))
        except (ValueError, KeyError, TypeError):
            raise GateError("bad_export", f"{path}:{number}: not an audit export line") from None
    return rows
