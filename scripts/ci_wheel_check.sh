#!/usr/bin/env bash
# Packaging check: build the sdist and the wheel with `python -m build` from a clean copy of
# the source tree (the wheel is built from the sdist, so a file missing from the sdist fails
# here; the sdist must also carry the example config, the example agent, the docs and the
# vectors), install the wheel without extras into a fresh venv outside the source tree, and
# run the installed console script from another directory: `hitl-gate --help`, `hitl-gate
# check-config`, `import gate.sdk`, and `hitl-gate inbox serve` / `hitl-gate mcp`, which
# without their extras must say in one line which extra to install (exit 2).
#
#   scripts/ci_wheel_check.sh              # uses .venv/bin/python (needs `build`) if present
#   PYTHON=python3.12 scripts/ci_wheel_check.sh
#   DEPS=venv scripts/ci_wheel_check.sh    # no package index (below)
#   KEEP=1 scripts/ci_wheel_check.sh       # keep the scratch directory (path printed)
#
# PYTHON makes the fresh venv; BUILD_PYTHON (default: .venv/bin/python, else PYTHON) runs
# `python -m build`. DEPS=index (default) needs the package index (build isolation and the
# wheel's dependencies). DEPS=venv needs none: BUILD_PYTHON builds without isolation (its
# setuptools) and scripts/wheelhouse.py repacks what the wheel's metadata requires from
# BUILD_PYTHON's installed packages; pip installs from those alone (no index, no pip config),
# so a dependency the metadata forgets is missing as it would be from the index. PYTHON and
# BUILD_PYTHON must then be the same Python version.
# Exit 0 when everything worked; otherwise the failing step is named on stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
if [ -z "${BUILD_PYTHON:-}" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then BUILD_PYTHON=$ROOT/.venv/bin/python; else BUILD_PYTHON=$PYTHON; fi
fi
DEPS=${DEPS:-index}
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV
case "$DEPS" in
    index) ISOLATION=() ;;
    venv)
        ISOLATION=(--no-isolation)
        # pip sees the wheelhouse alone: no index, find-links or constraints from the
        # environment or a config file
        while IFS= read -r var; do unset "$var"; done < <(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p')
        export PIP_CONFIG_FILE=/dev/null
        ;;
    *) echo "wheel check: DEPS must be index or venv, not $DEPS" >&2; exit 2 ;;
esac
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hitl-gate-wheel.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then
    echo "wheel check: scratch directory $WORK (kept)"
else
    trap 'rm -rf "$WORK"' EXIT
fi

step() { echo "== wheel check: $*"; }
die() { echo "wheel check: FAILED: $*" >&2; exit 1; }

step "copy the source tree (files git knows or would add) to $WORK/src"
mkdir -p "$WORK/src" "$WORK/dist" "$WORK/elsewhere"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
else
    tar -C "$ROOT" --exclude=./.venv --exclude=./var --exclude=./build --exclude=./dist \
        --exclude='*.egg-info' --exclude=__pycache__ --exclude=.git -cf - . | tar -xf - -C "$WORK/src"
fi

step "python -m build (sdist, then the wheel from the sdist) with $BUILD_PYTHON"
"$BUILD_PYTHON" -m build "${ISOLATION[@]}" --outdir "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 ||
    { tail -n 40 "$WORK/build.log" >&2; die "python -m build (full log: $WORK/build.log)"; }
shopt -s nullglob
wheels=("$WORK"/dist/*.whl)
sdists=("$WORK"/dist/*.tar.gz)
[ ${#wheels[@]} = 1 ] || die "expected one wheel in $WORK/dist, found ${#wheels[@]}"
[ ${#sdists[@]} = 1 ] || die "expected one sdist in $WORK/dist, found ${#sdists[@]}"
echo "   built $(basename "${sdists[0]}") and $(basename "${wheels[0]}")"

step "sdist contents"
"$BUILD_PYTHON" - "${sdists[0]}" <<'EOF' || die "sdist contents"
import sys, tarfile
names = {n.split("/", 1)[1] for n in tarfile.open(sys.argv[1]).getnames() if "/" in n}
for needed in ("config.example.yaml", "examples/agent.py", "docs/operating.md", "LICENSE",
               "conformance/vectors/audit_entry.json", "systemd/hitl-gate.service"):
    assert needed in names, f"{needed} missing from the sdist"
EOF

step "wheel contents and metadata"
"$BUILD_PYTHON" - "${wheels[0]}" <<'EOF' || die "wheel contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for needed in ("gate/__init__.py", "gate/cli/__init__.py", "gate/tools/doctor.py", "gate/store/schema.py",
               "gate/protocol/signing.py"):
    assert needed in names, f"{needed} missing from the wheel"
stray = [n for n in names if n.split("/")[0] in ("tests", "bench", "scripts", "conformance")]
assert not stray, f"not part of the package: {stray[:5]}"
meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
text = zipfile.ZipFile(sys.argv[1]).read(meta).decode()
assert "License-Expression: Apache-2.0" in text, "no License-Expression: Apache-2.0"
entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
assert "hitl-gate = gate.cli:main" in zipfile.ZipFile(sys.argv[1]).read(entry).decode()
EOF

FROM=()
if [ "$DEPS" = venv ]; then
    step "wheelhouse: what the wheel requires, repacked from $BUILD_PYTHON's packages"
    "$BUILD_PYTHON" "$ROOT/scripts/wheelhouse.py" "$WORK/wheelhouse" "${wheels[0]}" ||
        die "scripts/wheelhouse.py"
    FROM=(--no-index --find-links "$WORK/wheelhouse")
fi

step "fresh venv with $PYTHON, install the wheel (no extras, dependencies from $DEPS)"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet "${FROM[@]}" "${wheels[0]}" >"$WORK/pip.log" 2>&1 ||
    { tail -n 40 "$WORK/pip.log" >&2; die "pip install of the wheel"; }

cd "$WORK/elsewhere"
step "the installed package is the wheel's, not the source tree's"
where=$("$WORK/venv/bin/python" -c 'import gate; print(gate.__file__)')
case "$where" in
    "$WORK/venv/"*) echo "   gate imported from $where" ;;
    *) die "gate imported from $where, not from the fresh venv" ;;
esac

step "hitl-gate --help (from $PWD)"
"$WORK/venv/bin/hitl-gate" --help >"$WORK/help.txt" || die "hitl-gate --help"
grep -q '^Usage: hitl-gate ' "$WORK/help.txt" || die "hitl-gate --help printed no usage"
"$WORK/venv/bin/hitl-gate" doctor --help >/dev/null || die "hitl-gate doctor --help"
"$WORK/venv/bin/hitl-gate" --version

step "hitl-gate check-config -c $ROOT/config.example.yaml"
HITL_RELAY_SECRET=wheel-check-relay-secret-0a9f3e61c2d8 \
    HITL_API_TOKEN=wheel-check-api-token-7b1e4d90c3a5 \
    HITL_RECEIPT_KEY=wheel-check-receipt-key-5c8a2f1d06e4 \
    "$WORK/venv/bin/hitl-gate" check-config -c "$ROOT/config.example.yaml" ||
    die "hitl-gate check-config of config.example.yaml"

step "the SDK imports; no package of the inbox, MCP or postgres extra is installed"
"$WORK/venv/bin/python" - <<'EOF' || die "the base install"
import importlib.util

import gate.sdk
from gate.cli import EXTRAS

for extra, modules in EXTRAS.items():
    there = [m for m in modules if importlib.util.find_spec(m) is not None]
    assert not there, f"the base install has {there} of the {extra} extra"
print(f"   {gate.sdk.__name__} imported; none of the {', '.join(EXTRAS)} extras installed")
EOF

# without its extra, a command prints one line naming it (exit 2); its --help still works
for extra in inbox mcp; do
    case $extra in
        inbox) command=(inbox serve) ;;
        *) command=("$extra") ;;
    esac
    step "hitl-gate ${command[*]} without the $extra extra"
    "$WORK/venv/bin/hitl-gate" "${command[@]}" --help >/dev/null || die "hitl-gate ${command[*]} --help"
    rc=0
    "$WORK/venv/bin/hitl-gate" "${command[@]}" -c "$WORK/none.yaml" \
        >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
    sed 's/^/   /' "$WORK/err.txt"
    [ "$rc" = 2 ] || die "hitl-gate ${command[*]} exited $rc, not 2"
    [ ! -s "$WORK/out.txt" ] || die "hitl-gate ${command[*]} printed on standard output"
    [ "$(wc -l <"$WORK/err.txt")" = 1 ] || die "hitl-gate ${command[*]} printed more than one line"
    grep -qF "pip install 'hitl-gate[$extra]'" "$WORK/err.txt" ||
        die "hitl-gate ${command[*]} does not name the $extra extra"
done

# a gate on PostgreSQL (storage.url) without the postgres extra: serve says so in one line
step "hitl-gate serve with storage.url without the postgres extra"
"$WORK/venv/bin/python" - "$ROOT/config.example.yaml" "$WORK/pg.yaml" <<'EOF' || die "pg.yaml"
import sys

import yaml

data = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
data["storage"] = {"url": "postgresql://hitl@127.0.0.1:9/hitl"}
yaml.safe_dump(data, open(sys.argv[2], "w", encoding="utf-8"))
EOF
rc=0
HITL_RELAY_SECRET=wheel-check-relay-secret-0a9f3e61c2d8 \
    HITL_API_TOKEN=wheel-check-api-token-7b1e4d90c3a5 \
    HITL_RECEIPT_KEY=wheel-check-receipt-key-5c8a2f1d06e4 \
    "$WORK/venv/bin/hitl-gate" serve -c "$WORK/pg.yaml" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
sed 's/^/   /' "$WORK/err.txt"
[ "$rc" = 2 ] || die "hitl-gate serve on PostgreSQL exited $rc, not 2"
[ "$(wc -l <"$WORK/err.txt")" = 1 ] || die "hitl-gate serve printed more than one line"
grep -qF "pip install 'hitl-gate[postgres]'" "$WORK/err.txt" ||
    die "hitl-gate serve does not name the postgres extra"

echo "wheel check: OK"
