#!/usr/bin/env bash
# Prove that workflow.json is a conformant hitl/v0 relay: install n8n 1.82.3 (cached in
# .node/ beside this script), start it on 127.0.0.1 with a throw-away user folder and
# SQLite, import + activate a copy of the workflow through n8n's own CLI, run
# `hitl-gate verify --questions` against its webhook (the question checks too),
# stop n8n.
#
#   HITL_N8N_HUMAN=auto (default)  the copy's human step ("Human decision", a Wait form)
#                                  is replaced by a Code node that always approves
#   HITL_N8N_HUMAN=form            the template is kept as is; a scripted "human" opens the
#                                  Wait node's form over HTTP and submits "approve"
#   Questions (both modes): the template's "Question step (replace me)" answers in its
#   demo/test mode, on because this script sets HITL_AUTO_ANSWER (default ok; a choice gets
#   its first option; empty: no answer, and verify's question checks fail).
#
# Exit code = hitl-gate verify's (0 conformant, 1 not); 2 = usage, 3 = setup failed.
# Verify's report goes to stdout (extra arguments are passed to it, e.g. --json); phase
# timings and diagnostics go to stderr, prefixed with [prove-n8n].
#
# Env: HITL_GATE_BIN (default <repo>/.venv/bin/hitl-gate), HITL_N8N_CACHE (default .node/
# beside this script), HITL_N8N_READY_TIMEOUT (s, default 180), HITL_N8N_VERIFY_TIMEOUT
# (s, default 60), HITL_N8N_KEEP=1 keeps the temp folder (n8n's log, the imported copy).
set -euo pipefail

N8N_VERSION=1.82.3
XLSX_VERSION=0.18.5            # n8n 1.x pins xlsx to a CDN tarball that is unreachable offline
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
CACHE="${HITL_N8N_CACHE:-$HERE/.node}"
GATE="${HITL_GATE_BIN:-$ROOT/.venv/bin/hitl-gate}"
READY_TIMEOUT="${HITL_N8N_READY_TIMEOUT:-180}"
VERIFY_TIMEOUT="${HITL_N8N_VERIFY_TIMEOUT:-60}"
HUMAN="${HITL_N8N_HUMAN:-auto}"
WEBHOOK_PATH=hitl-relay
WORKFLOW_ID=hitlRelayV0n8n01
APPROVER=alice@example.com

say() { echo "[prove-n8n] $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

case "$HUMAN" in auto|form) ;; *) say "HITL_N8N_HUMAN must be auto or form"; exit 2;; esac
[ -x "$GATE" ] || { say "hitl-gate not found at $GATE (set HITL_GATE_BIN)"; exit 2; }
for tool in node npm curl; do
  command -v "$tool" >/dev/null || { say "needs $tool"; exit 3; }
done
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$NODE_MAJOR" -lt 18 ] || [ "$NODE_MAJOR" -gt 22 ]; then
  say "warning: n8n $N8N_VERSION wants Node.js 18-22, this is $(node --version)"
fi

T_ALL="$(now)"

# --- phase 1: install (reused when the marker for this exact version is present) ----------
T="$(now)"
MARKER="$CACHE/.installed-n8n-$N8N_VERSION"
N8N="$CACHE/node_modules/.bin/n8n"
if [ -f "$MARKER" ] && [ -x "$N8N" ]; then
  say "install: reused $CACHE ($(since "$T") s)"
else
  say "install: n8n@$N8N_VERSION into $CACHE (cold: several minutes) ..."
  mkdir -p "$CACHE"
  rm -f "$MARKER"
  cat > "$CACHE/package.json" <<JSON
{
  "name": "hitl-relay-n8n-runtime",
  "private": true,
  "description": "n8n for conformance/relays/n8n/prove.sh; generated, not committed",
  "dependencies": { "n8n": "$N8N_VERSION" },
  "overrides": { "xlsx": "$XLSX_VERSION" }
}
JSON
  if ! (cd "$CACHE" && npm install --no-audit --no-fund --loglevel=error >"$CACHE/install.log" 2>&1); then
    say "npm install failed; last lines of $CACHE/install.log:"
    tail -n 30 "$CACHE/install.log" >&2
    exit 3
  fi
  [ -x "$N8N" ] || { say "npm install left no $N8N"; exit 3; }
  touch "$MARKER"
  say "install: done ($(since "$T") s, cold)"
fi

# --- phase 2: an isolated, offline n8n ----------------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/hitl-n8n-XXXXXX")"
N8N_PID=""
HUMAN_PID=""
stop_pid() {  # stop_pid PID: TERM, up to 20 s, then KILL
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
# shellcheck disable=SC2317  # called through the EXIT trap
cleanup() {
  [ -z "$HUMAN_PID" ] || stop_pid "$HUMAN_PID"
  [ -z "$N8N_PID" ] || stop_pid "$N8N_PID"
  if [ "${HITL_N8N_KEEP:-0}" = 1 ]; then say "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PORT="$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
BASE="http://127.0.0.1:$PORT"
SECRET="${HITL_RELAY_SECRET:-$(node -p 'require("crypto").randomBytes(24).toString("hex")')}"
ENCRYPTION_KEY="$(node -p 'require("crypto").randomBytes(24).toString("hex")')"

export N8N_USER_FOLDER="$WORK/user" DB_TYPE=sqlite N8N_ENCRYPTION_KEY="$ENCRYPTION_KEY"
export N8N_LISTEN_ADDRESS=127.0.0.1 N8N_HOST=127.0.0.1 N8N_PORT="$PORT" N8N_PROTOCOL=http
export WEBHOOK_URL="$BASE/"
export N8N_DIAGNOSTICS_ENABLED=false N8N_DIAGNOSTICS_CONFIG_FRONTEND='' N8N_DIAGNOSTICS_CONFIG_BACKEND=''
export N8N_VERSION_NOTIFICATIONS_ENABLED=false N8N_PERSONALIZATION_ENABLED=false
export N8N_TEMPLATES_ENABLED=false N8N_HIRING_BANNER_ENABLED=false EXTERNAL_FRONTEND_HOOKS_URLS=''
export N8N_COMMUNITY_PACKAGES_ENABLED=false N8N_RUNNERS_ENABLED=false
export N8N_ENFORCE_SETTINGS_FILE_PERMISSIONS=true N8N_SECURE_COOKIE=false
export N8N_LOG_LEVEL="${N8N_LOG_LEVEL:-warn}"
# what the workflow itself needs
export N8N_BLOCK_ENV_ACCESS_IN_NODE=false      # the Code nodes read $env (false is 1.x's default)
export NODE_FUNCTION_ALLOW_BUILTIN=crypto      # HMAC + timingSafeEqual in the Code nodes
export HITL_RELAY_SECRET="$SECRET" HITL_APPROVER_ID="$APPROVER" HITL_APPROVER_DISPLAY="Alice (prove.sh)"
export HITL_AUTO_ANSWER="${HITL_AUTO_ANSWER-ok}"   # the question step's demo/test mode
unset HITL_RELAY_SECRET_PREVIOUS

# the copy that is imported (see HITL_N8N_HUMAN above)
node - "$HERE/workflow.json" "$WORK/workflow.json" "$HUMAN" <<'JS'
const fs = require('fs');
const [src, dst, human] = process.argv.slice(2);
const wf = JSON.parse(fs.readFileSync(src, 'utf8'));
const i = wf.nodes.findIndex((n) => n.name === 'Human decision');
if (i < 0) { console.error('no "Human decision" node in ' + src); process.exit(1); }
const old = wf.nodes[i];
if (human === 'auto') {
  wf.nodes[i] = {
    id: old.id, name: old.name, type: 'n8n-nodes-base.code', typeVersion: 2,
    position: old.position,
    parameters: { jsCode: "// prove.sh: the human always approves\nreturn [{ json: { Decision: 'approve' } }];" },
  };
} else {
  // the form posts field-<index>; tell the scripted human which one is "Decision"
  const idx = old.parameters.formFields.values.findIndex((f) => f.fieldLabel === 'Decision');
  fs.writeFileSync(dst + '.decision-field', `field-${idx}`);
}
wf.active = false;
// `n8n import:workflow --input=FILE` wants an array of workflows (the editor imports the object)
fs.writeFileSync(dst, JSON.stringify([wf], null, 2));
JS
say "human step: $HUMAN"

# --- phase 3: import + activate through n8n's own CLI -------------------------------------
T="$(now)"
if ! "$N8N" import:workflow --input="$WORK/workflow.json" >"$WORK/import.log" 2>&1; then
  say "n8n import:workflow failed:"; tail -n 30 "$WORK/import.log" >&2; exit 3
fi
if ! "$N8N" update:workflow --id="$WORKFLOW_ID" --active=true >>"$WORK/import.log" 2>&1; then
  say "n8n update:workflow failed:"; tail -n 30 "$WORK/import.log" >&2; exit 3
fi
say "import+activate: $(since "$T") s"

# --- phase 4: start n8n and wait until the webhook answers -------------------------------
T="$(now)"
"$N8N" start >"$WORK/n8n.log" 2>&1 &
N8N_PID=$!
deadline=$(( $(date +%s) + READY_TIMEOUT ))
while :; do
  if ! kill -0 "$N8N_PID" 2>/dev/null; then
    say "n8n exited during start-up:"; tail -n 40 "$WORK/n8n.log" >&2; exit 3
  fi
  # an unsigned probe: the active workflow must refuse it with 401 (404: not registered yet)
  code="$(curl -s -o /dev/null -w '%{http_code}' -m 5 -X POST -H 'Content-Type: application/json' \
          --data '{}' "$BASE/webhook/$WEBHOOK_PATH" || true)"
  [ "$code" = 401 ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    say "n8n not ready after ${READY_TIMEOUT} s (last probe: HTTP $code):"
    tail -n 40 "$WORK/n8n.log" >&2; exit 3
  fi
  sleep 0.5
done
say "start (until the webhook refuses an unsigned probe with 401): $(since "$T") s"

# --- phase 5: hitl-gate verify ------------------------------------------------------------
if [ "$HUMAN" = form ]; then
  # the scripted human: find the execution whose Wait form is open, check that it shows
  # the draft, submit "approve" as a browser does (multipart/form-data)
  FIELD="$(cat "$WORK/workflow.json.decision-field")"
  (
    end=$(( $(date +%s) + VERIFY_TIMEOUT ))
    while [ "$(date +%s)" -lt "$end" ]; do
      for id in $(seq 1 40); do
        page="$(curl -s -m 5 "$BASE/form-waiting/$id" || true)"
        case "$page" in
          *"Approval requested"*"$FIELD"*)
            case "$page" in
              *"not a real request"*) ;;
              *) say "human: the form of execution $id does not show the draft" ;;
            esac
            code="$(curl -s -o /dev/null -w '%{http_code}' -m 10 -F "$FIELD=approve" \
                    "$BASE/form-waiting/$id" || true)"
            say "human: submitted approve on the form of execution $id (HTTP $code)"
            exit 0 ;;
        esac
      done
      sleep 0.5
    done
    say "human: no open form found"
  ) &
  HUMAN_PID=$!
fi
T="$(now)"
set +e
"$GATE" verify "$BASE/webhook/$WEBHOOK_PATH" --secret-env HITL_RELAY_SECRET \
  --approver "$APPROVER" --timeout "$VERIFY_TIMEOUT" --questions "$@"
RC=$?
set -e
say "verify: $(since "$T") s, exit $RC"
if [ -n "$HUMAN_PID" ]; then stop_pid "$HUMAN_PID"; HUMAN_PID=""; fi
if [ "$RC" != 0 ]; then say "last lines of n8n's log:"; tail -n 40 "$WORK/n8n.log" >&2; fi

# --- phase 6: stop ------------------------------------------------------------------------
T="$(now)"
stop_pid "$N8N_PID"
N8N_PID=""
say "stop: $(since "$T") s; total: $(since "$T_ALL") s"
exit "$RC"
