#!/usr/bin/env bash
# Prove the Node-RED relay template conforms: install node-red 4.1.x (cached in .node/), start it
# on 127.0.0.1 (free port, temporary userDir), deploy flow.json through the admin API with the
# automatic human and question steps, run `hitl-gate verify --questions` against it, stop Node-RED.
# With HITL_PROVE_SERVE=1 it runs no verify: once the flow answers it prints one line
# `READY http://127.0.0.1:PORT` on stdout and keeps Node-RED running until its stdin ends
# (the end of a pipe, Ctrl-D), then stops it (how tests/test_relay_node_red.py puts a real gate
# in front of the flow).
#
# Exit code: verify's (0 conformant, 1 a check failed, 2 usage); 3 when the set-up failed
# before verify could run (install, start, deploy); 0 for a serve run that stopped cleanly.
#
# Environment (all optional):
#   HITL_GATE_BIN          hitl-gate to run (default: <repo>/.venv/bin/hitl-gate)
#   HITL_FLOW_FILE         flow to deploy (default: flow.json beside this script)
#   HITL_RELAY_SECRET      shared secret (default: a random one for this run)
#   HITL_APPROVER_ID       identity the automatic human step decides as (default below)
#   HITL_AUTO_DECISION     the placeholder human step's decision (default approve; empty: none,
#                          the approval stays pending in the flow)
#   HITL_AUTO_ANSWER       the placeholder question step's demo/test mode (default ok: a choice
#                          gets its first option, free text this text; empty: no answer)
#   HITL_PROVE_SERVE       1: no verify; serve until stdin ends (above)
#   HITL_VERIFY_TIMEOUT    seconds verify waits for the decision (default 30)
#   HITL_NODE_RED_CACHE    where node-red is installed (default: .node/ beside this script)
#   NODE_RED_VERSION       npm version range (default ~4.1.0; 5.x needs Node 22.9)
#   HITL_NODE_RED_LOG      copy Node-RED's log to this file at the end
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GATE=${HITL_GATE_BIN:-$ROOT/.venv/bin/hitl-gate}
FLOW=${HITL_FLOW_FILE:-$HERE/flow.json}
CACHE=${HITL_NODE_RED_CACHE:-$HERE/.node}
VERSION=${NODE_RED_VERSION:-~4.1.0}
APPROVER=${HITL_APPROVER_ID:-conformance-bot@example.com}
VERIFY_TIMEOUT=${HITL_VERIFY_TIMEOUT:-30}
AUTO_DECISION=${HITL_AUTO_DECISION-approve}
AUTO_ANSWER=${HITL_AUTO_ANSWER-ok}
SERVE=${HITL_PROVE_SERVE:-}
START_DEADLINE_S=60
READY_DEADLINE_S=30

now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
say() { printf 'prove.sh: %s\n' "$*" >&2; }
setup_failed() { say "FAILED: $*"; exit 3; }

command -v node >/dev/null || setup_failed "node is not installed"
command -v npm >/dev/null || setup_failed "npm is not installed"
[ -x "$GATE" ] || setup_failed "no hitl-gate at $GATE (set HITL_GATE_BIN or run make venv)"
[ -f "$FLOW" ] || setup_failed "no flow at $FLOW"
if [ -z "${HITL_RELAY_SECRET:-}" ]; then
    HITL_RELAY_SECRET=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
fi
export HITL_RELAY_SECRET

# --- install (cached; a lock keeps concurrent runs from installing into the same dir) ------------
t0=$(now)
mkdir -p "$CACHE"
STAMP="$CACHE/.installed"
install_kind=warm
{
    if command -v flock >/dev/null; then
        flock -w 600 9 || setup_failed "could not lock $CACHE/.lock"
    fi
    t_lock=$(took "$t0")
    if awk -v w="$t_lock" 'BEGIN { exit !(w >= 1) }'; then
        install_kind="warm, waited ${t_lock} s for a concurrent install"
    fi
    if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$VERSION" ] \
        || [ ! -f "$CACHE/node_modules/node-red/red.js" ]; then
        install_kind=cold
        say "installing node-red@$VERSION into $CACHE"
        rm -f "$STAMP"
        [ -f "$CACHE/package.json" ] || printf '{"private": true}\n' > "$CACHE/package.json"
        npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error \
            "node-red@$VERSION" >&2 || setup_failed "npm install node-red@$VERSION"
        printf '%s' "$VERSION" > "$STAMP"
    fi
} 9>"$CACHE/.lock"
NR_VERSION=$(node -p "require(process.argv[1]).version" "$CACHE/node_modules/node-red/package.json")
t_install=$(took "$t0")
say "install ($install_kind): ${t_install} s (node-red $NR_VERSION, node $(node --version))"

# --- start Node-RED on loopback, port 0, temporary userDir ----------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hitl-node-red.XXXXXX")
NR_PID=""
stop_node_red() {
    if [ -n "$NR_PID" ] && kill -0 "$NR_PID" 2>/dev/null; then
        kill -TERM "$NR_PID" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$NR_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$NR_PID" 2>/dev/null || true
        wait "$NR_PID" 2>/dev/null || true
    fi
    NR_PID=""
}
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local rc=$?
    stop_node_red
    if [ -n "${HITL_NODE_RED_LOG:-}" ] && [ -f "$WORK/node-red.log" ]; then
        cp "$WORK/node-red.log" "$HITL_NODE_RED_LOG" || true
    fi
    if [ "$rc" -ne 0 ] && [ -f "$WORK/node-red.log" ]; then
        say "Node-RED log (last 40 lines):"
        tail -n 40 "$WORK/node-red.log" >&2 || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat > "$WORK/settings.js" <<'EOF'
module.exports = {
    uiHost: "127.0.0.1",            // loopback only: the admin API has no auth here
    flowFile: "flows.json",
    credentialSecret: false,
    disableEditor: true,            // admin API only, no editor
    telemetry: { enabled: false },
    diagnostics: { enabled: false, ui: false },
    externalModules: { autoInstall: false, palette: { allowInstall: false } },
    functionExternalModules: true,  // lets function nodes import the built-in crypto module
    logging: { console: { level: "info", metrics: false, audit: false } },
};
EOF

t0=$(now)
(
    cd "$WORK"
    # Node-RED's http request node honours proxy variables: the gate is on loopback.
    exec env -u http_proxy -u https_proxy -u HTTP_PROXY -u HTTPS_PROXY \
        NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost \
        HITL_AUTO_DECISION="$AUTO_DECISION" HITL_AUTO_ANSWER="$AUTO_ANSWER" \
        HITL_APPROVER_ID="$APPROVER" \
        node "$CACHE/node_modules/node-red/red.js" --userDir "$WORK" \
        --settings "$WORK/settings.js" --port 0
) > "$WORK/node-red.log" 2>&1 &
NR_PID=$!

PORT=""
deadline=$(( $(date +%s) + START_DEADLINE_S ))
while [ -z "$PORT" ]; do
    kill -0 "$NR_PID" 2>/dev/null || setup_failed "Node-RED exited during start"
    [ "$(date +%s)" -lt "$deadline" ] || setup_failed "Node-RED not listening after ${START_DEADLINE_S} s"
    PORT=$(sed -n 's|.*Server now running at http://127\.0\.0\.1:\([0-9][0-9]*\)/.*|\1|p' \
        "$WORK/node-red.log" | head -n 1)
    [ -n "$PORT" ] || sleep 0.1
done
BASE="http://127.0.0.1:$PORT"
t_start=$(took "$t0")
say "start: ${t_start} s (Node-RED on $BASE, userDir $WORK)"

# --- deploy the flow through the admin API, then wait until /hitl answers from the flow -----------
# http_status METHOD URL [BODY_FILE [HEADER...]]: prints the HTTP status, or 000 when no answer.
http_status() {
    node -e '
        const [method, url, file, ...hdrs] = process.argv.slice(1);
        const body = file ? require("fs").readFileSync(file) : Buffer.alloc(0);
        const headers = { "Content-Length": body.length };
        for (const h of hdrs) { const i = h.indexOf(":"); headers[h.slice(0, i)] = h.slice(i + 1).trim(); }
        const req = require("http").request(url, { method, headers, timeout: 5000 }, res => {
            res.resume(); res.on("end", () => console.log(res.statusCode));
        });
        req.on("timeout", () => req.destroy(new Error("timeout")));
        req.on("error", () => console.log("000"));
        req.end(body);
    ' "$@"
}

t0=$(now)
status=$(http_status POST "$BASE/flows" "$FLOW" "Content-Type: application/json" \
    "Node-RED-Deployment-Type: full")
case "$status" in 200|204) ;; *) setup_failed "deploying $FLOW: admin API answered HTTP $status" ;; esac
# An unsigned POST: 404 while the route is not there yet; any other answer comes from the flow.
printf '{}' > "$WORK/empty.json"
deadline=$(( $(date +%s) + READY_DEADLINE_S ))
while :; do
    status=$(http_status POST "$BASE/hitl" "$WORK/empty.json" "Content-Type: application/json")
    case "$status" in 000|404) ;; *) break ;; esac
    kill -0 "$NR_PID" 2>/dev/null || setup_failed "Node-RED exited after the deploy"
    [ "$(date +%s)" -lt "$deadline" ] || setup_failed "/hitl not served ${READY_DEADLINE_S} s after the deploy"
    sleep 0.1
done
t_deploy=$(took "$t0")
say "deploy: ${t_deploy} s (unsigned probe of /hitl answered HTTP $status)"

if [ "$SERVE" = 1 ]; then
    printf 'READY %s\n' "$BASE"
    while IFS= read -r _; do :; done  # until stdin ends
    stop_node_red
    exit 0
fi

# --- verify ----------------------------------------------------------------------------------------
t0=$(now)
set +e
"$GATE" verify "$BASE/hitl" --secret-env HITL_RELAY_SECRET --approver "$APPROVER" \
    --timeout "$VERIFY_TIMEOUT" --questions
rc=$?
set -e
t_verify=$(took "$t0")

t0=$(now)
stop_node_red
t_stop=$(took "$t0")
say "timings: install ($install_kind) ${t_install} s, start ${t_start} s, deploy ${t_deploy} s, verify ${t_verify} s, stop ${t_stop} s; verify exit $rc"
exit "$rc"
