"""Repack what this interpreter has installed as wheels, for an install without the index.

    python scripts/wheelhouse.py DIR hitl_gate-0.1.0-py3-none-any.whl

Reads the wheel's ``Requires-Dist`` (no extras: the base install), follows the requirements
of each distribution it needs (their own extras included, e.g. ``pyjwt[crypto]``) through
this interpreter's installed packages, and writes each one as a wheel into DIR, from the
files its ``RECORD`` lists (a fresh ``RECORD`` with their hashes). ``pip install --no-index
--find-links DIR`` of the wheel then installs exactly what its metadata asks for: a
dependency the metadata forgets is missing there, as it would be from the index. Run it with
the Python of the venv it installs into (same version: compiled wheels are repacked as they
are). Exit 1 with one line when a needed distribution is not installed here.
"""

from __future__ import annotations

import base64
import csv
import email
import hashlib
import io
import re
import sys
import zipfile
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name

# what an install adds to a .dist-info folder; a wheel carries none of them
INSTALL_ONLY = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def needed(requirements: list[str], extras: set[str]) -> list[Requirement]:
    """The requirements that apply here, for a distribution installed with ``extras``."""
    out = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is None or any(
            req.marker.evaluate({"extra": extra}) for extra in extras | {""}
        ):
            out.append(req)
    return out


def closure(requirements: list[str]) -> list[Distribution]:
    """Every installed distribution ``requirements`` (a wheel's ``Requires-Dist``) needs,
    directly or not; SystemExit with one line when one is not installed."""
    found: dict[str, Distribution] = {}
    extras_of: dict[str, set[str]] = {}
    todo = needed(requirements, set())
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found and req.extras <= extras_of[name]:
            continue
        try:
            dist = found.get(name) or distribution(req.name)
        except PackageNotFoundError:
            raise SystemExit(f"wheelhouse: {req.name} is not installed in {sys.prefix}") from None
        found[name] = dist
        extras_of[name] = extras_of.get(name, set()) | set(req.extras)
        todo.extend(needed(dist.requires or [], extras_of[name]))
    return list(found.values())


def wheel_tag(wheel_text: str) -> str:
    """The first tag of a ``WHEEL`` file that this interpreter supports."""
    tags = [
        line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")
    ]
    supported = {str(tag) for tag in sys_tags()}
    return next(tag for tag in tags if tag in supported)


def repack(dist: Distribution, out: Path) -> Path:
    """Write the installed ``dist`` as a wheel into ``out`` (stored, not compressed: it is
    unpacked at once) and return its path."""
    files = [f for f in dist.files or () if ".." not in f.parts and "__pycache__" not in f.parts]
    info = next(f.parent for f in files if f.name == "METADATA" and f.parent.suffix == ".dist-info")
    wheel_text = (Path(str(dist.locate_file(info))) / "WHEEL").read_text()
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    path = out / f"{name}-{dist.version}-{wheel_tag(wheel_text)}.whl"
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as whl:
        for f in files:
            if f.parent == info and f.name in INSTALL_ONLY:
                continue
            data = Path(str(dist.locate_file(f))).read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            whl.writestr(f.as_posix(), data)
            writer.writerow([f.as_posix(), f"sha256={digest.decode()}", len(data)])
        writer.writerow([f"{info.as_posix()}/RECORD", "", ""])
        whl.writestr(f"{info.as_posix()}/RECORD", record.getvalue())
    return path


def main(argv: list[str]) -> int:
    """Repack the base closure of the wheel ``argv[1]`` into the folder ``argv[0]``."""
    out, wheel = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(whl.read(meta))
    dists = closure(metadata.get_all("Requires-Dist") or [])
    for dist in dists:
        repack(dist, out)
    print(f"   {len(dists)} installed distributions repacked into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
