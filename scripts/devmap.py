"""Print the README's map of gate/ from the packages' and top-level modules' docstrings.

``python scripts/devmap.py`` prints the block that README.md holds between
``<!-- map:start -->`` and ``<!-- map:end -->``; ``tests/test_docs.py`` fails when the two
differ, so the map cannot drift from the code it describes.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GATE = ROOT / "gate"
WIDTH = 100
COLUMN = 28  # where the descriptions start

# who runs what, in the order a reader needs it (STYLE.md's layout)
ORDER = (
    "protocol",
    "core",
    "core/requests",
    "core/approvals",
    "core/questions",
    "store",
    "postgres",
    "audit",
    "trust",
    "config",
    "web",
    "daemon",
    "client",
    "relay",
    "tools",
    "tools/conformance",
    "tools/reference_relay",
    "inbox",
    "cli",
)


def first_line(path: Path) -> str:
    """The first paragraph of a module's docstring, as one line ('' when it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n")[0].split())


def entries() -> list[tuple[str, str]]:
    """``(path as shown, description)`` for every package of gate/ and every top-level module."""
    packages = sorted(
        p.parent.relative_to(GATE).as_posix() for p in GATE.rglob("__init__.py") if p.parent != GATE
    )
    unknown = [p for p in packages if p not in ORDER]
    out = [
        (f"gate/{name}/", first_line(GATE / name / "__init__.py"))
        for name in [*ORDER, *unknown]
        if name in packages
    ]
    modules = sorted(
        p.name for p in GATE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    out += [(f"gate/{name}", first_line(GATE / name)) for name in modules]
    return out


def render() -> str:
    """The map block, one entry per package or module, wrapped at 100 columns."""
    lines: list[str] = []
    for name, text in entries():
        wrapped = textwrap.wrap(text, WIDTH - COLUMN) or [""]
        lines.append(f"{name:<{COLUMN}}{wrapped[0]}".rstrip())
        lines += [" " * COLUMN + more for more in wrapped[1:]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
