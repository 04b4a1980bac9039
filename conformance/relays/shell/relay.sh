#!/bin/sh
# shellcheck disable=SC2015  # "A && B || reply ...": refuse when any test fails, on purpose
# hitl/v0 relay in POSIX sh: socat accepts, openssl signs, jq reads/builds JSON, curl posts back.
# Run:  HITL_RELAY_SECRET=... RELAY_APPROVER=alice@example.com ./relay.sh serve 127.0.0.1:8194
# Without "serve" the script is socat's per-connection handler: HTTP request on stdin, answer on
# stdout. Env: HITL_RELAY_SECRET (required), RELAY_APPROVER (default: first approver in the
# dispatch), RELAY_AUTO=approve|skip|skip:REASON|adjust:TEXT|ask (default approve; ask prompts
# on /dev/tty, a skip's reason too),
# RELAY_STATE (directory remembering handled nonces), RELAY_ANSWER (the answer to every question,
# text, or JSON for a multi choice or a form). Details and limits: README.md beside it.
set -uf
export LC_ALL=C
SECRET=${HITL_RELAY_SECRET:?HITL_RELAY_SECRET is not set}
MAX_SKEW=300 MAX_BODY=65536 CR=$(printf '\r')
STATE=${RELAY_STATE:-${TMPDIR:-/tmp}/hitl-relay-shell.$(id -u)}
log() { printf 'relay.sh: %s\n' "$*" >&2; }
hmac() { openssl dgst -sha256 -hmac "$SECRET" | awk '{printf "%s", $NF}'; }  # stdin -> hex

case ${RELAY_AUTO:=approve} in approve|skip|ask|adjust:?*|skip:?*) ;; *)
  log "RELAY_AUTO must be approve, skip, skip:REASON, adjust:TEXT or ask"; exit 2 ;; esac
if [ "${1:-}" = serve ]; then  # the listener: socat forks one handler (this script) per connection
  addr=${2:-127.0.0.1:8194} self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
  # socat says when it listens (-d -d: "listening on ..."), or why it cannot (port taken)
  log "starting socat on http://$addr/ (RELAY_AUTO=$RELAY_AUTO)"
  exec socat -d -d -T 30 "TCP-LISTEN:${addr##*:},bind=${addr%:*},reuseaddr,fork" \
    "EXEC:/bin/sh $self"
fi

reply() {  # reply STATUS REASON-OR-JSON: write the HTTP answer and end this connection
  case $2 in '{'*) body=$2 ;; *) body="{\"status\":\"unauthorized\",\"reason\":\"$2\"}" ;; esac
  printf 'HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %s\r\n' "$1" "${#body}"
  printf 'Connection: close\r\n\r\n%s' "$body"
  case $1 in 2*) ;; *) log "refused dispatch: $1 $body" ;; esac
  exit 0
}

# 1. request line, headers (only Content-Length and the signature matter), exact body bytes
read -r method _ _ || exit 0
len='' sig=''
while IFS= read -r line; do
  line=${line%"$CR"}
  [ -n "$line" ] || break
  case $(printf %s "$line" | tr '[:upper:]' '[:lower:]') in
    content-length:*) len=$(printf %s "${line#*:}" | tr -d ' \t') ;;
    x-draftcat-signature:*) sig=$(printf %s "${line#*:}" | tr -d ' \t' | tr 'A-F' 'a-f') ;;
    expect:*100-continue*) printf 'HTTP/1.1 100 Continue\r\n\r\n' ;;
  esac
done
[ "$method" = POST ] || reply '405 Method Not Allowed' '{"status":"invalid","reason":"method"}'
case $len in ''|*[!0-9]*)
  reply '411 Length Required' '{"status":"invalid","reason":"length"}' ;; esac
[ ${#len} -le 6 ] && [ "$len" -le $MAX_BODY ] ||
  reply '413 Payload Too Large' '{"status":"invalid","reason":"body_too_large"}'
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
head -c "$len" > "$tmp/dispatch"
[ "$(wc -c < "$tmp/dispatch")" -eq "$len" ] ||
  reply '400 Bad Request' '{"status":"invalid","reason":"truncated"}'

# 2. signature: t=<unix s>,v1=<hex>[,v1=...]; window first, then HMAC over t "." body
[ -n "$sig" ] || reply '401 Unauthorized' signature_missing
t='' v1s=''
IFS=,
for kv in $sig; do
  case $kv in
    t=*) [ -z "$t" ] || reply '401 Unauthorized' signature_malformed; t=${kv#t=} ;;
    v1=*) v=${kv#v1=}  # one that is not 64 hex digits is skipped: any v1 may match
          case $v in *[!0-9a-f]*) ;; *) [ ${#v} -ne 64 ] || v1s="$v1s $v" ;; esac ;;
  esac
done
unset IFS
case $t in ''|*[!0-9]*) reply '401 Unauthorized' signature_malformed ;; esac
[ -n "$v1s" ] || reply '401 Unauthorized' signature_malformed
t10=${t#"${t%%[!0]*}"}  # without leading zeros: sh arithmetic would read them as octal
[ ${#t10} -le 12 ] && skew=$(( $(date +%s) - ${t10:-0} )) && [ "${skew#-}" -le $MAX_SKEW ] ||
  reply '401 Unauthorized' timestamp_out_of_window
# compare HMACs of the digests, not the digests: the (not constant-time) [ = ] then leaks nothing
want=$({ printf '%s.' "$t"; cat "$tmp/dispatch"; } | hmac | hmac) ok=''  # t exactly as sent
for v in $v1s; do [ "$(printf %s "$v" | hmac)" = "$want" ] && ok=1; done
[ -n "$ok" ] || reply '401 Unauthorized' signature_mismatch

# what a terminal would not show as itself (controls such as CR and ESC, bidi and zero-width
# format characters, line separators) is shown as <U+XXXX>; `line` marks newline and tab too
SHOW='def hex: if . < 16 then "0123456789ABCDEF"[.:.+1]
    else (./16|floor|hex) + ("0123456789ABCDEF"[(.%16):(.%16)+1]) end;
  def mark: "<U+" + (explode[0] | hex | ("000"[0:(4-length|if . < 0 then 0 else . end)]) + .) + ">";
  def visible: gsub("(?<c>(?![\\n\\t])[\\p{Cc}\\p{Cf}\\p{Zl}\\p{Zp}\\p{Cs}\\p{Cn}])"; .c | mark);
  def line: tostring | visible | gsub("(?<c>[\\n\\t])"; .c | mark);
  def hidden: [match("(?![\\n\\t])[\\p{Cc}\\p{Cf}\\p{Zl}\\p{Zp}\\p{Cs}\\p{Cn}]"; "g")] | length;'

# 3. the envelope (one jq run: jq starts slowly): fields we use, payload_hash really is the
#    draft's, each nonce handled once. A resolution notice ("type":"notice"; no
#    callback, nonce or draft) is never a request: step 3a.
jq -ej "$SHOW"'if .type == "notice" then (if .protocol == "hitl/v0" and (.approval_id|type) ==
  "string" and (.approval_id|test("^[A-Za-z0-9_-]{1,128}$")) and (.outcome|type) == "string"
  then "notice\n", .approval_id, "\n", (.outcome|line), "\n", ("Approval \(.approval_id) resolved elsewhere: "
  + (.outcome|line) + (if (.outcome|IN("approved", "adjusted", "skipped")) and
  ((.decided_by|type) == "array") and (.decided_by|length) > 0 then " by " +
  (.decided_by[-1].identity|line) + (if (.decided_by[-1].on_behalf_of|type) == "string" then
  " on behalf of " + (.decided_by[-1].on_behalf_of|line) else "" end) else "" end) + (if
  (.reason|type) == "string" then " (reason: \(.reason|line))" else "" end)
  + "; not asking any more."), "\n" else false end)
  elif .kind == "question" then (if .protocol == "hitl/v0" and (.question_id|type) == "string"
  and (.question_id|test("^[A-Za-z0-9_-]{1,128}$")) and (.callback.url|type) == "string" and
  (.callback.nonce|test("^[A-Za-z0-9_-]{1,128}$")) and (.request_hash|type) == "string" and
  (.request_hash|test("^sha256:[0-9a-f]{64}$")) and (.question.text|type) == "string" and
  (.question.response_type|type) == "string" then "question\n", .callback.nonce, "\n"
  else false end)
  elif .protocol == "hitl/v0" and (.approval_id|type) == "string" and (.callback.url|type) ==
  "string" and (.callback.nonce|test("^[A-Za-z0-9_-]{1,128}$")) and (.draft.body|type) == "string"
  and (.payload_hash|test("^sha256:[0-9a-f]{64}$")) then .payload_hash, "\n", .callback.nonce,
  "\n", .draft.body else false end' "$tmp/dispatch" > "$tmp/fields" 2>/dev/null ||
  reply '400 Bad Request' '{"status":"invalid","reason":"envelope"}'
if [ "$(head -n 1 "$tmp/fields")" = notice ]; then
  # 3a. the approval ended elsewhere, for good: remember it (a queued prompt about it is never
  #     shown), drop its prompt if it is the one on the terminal, with a line there; ack 200.
  #     A repeat (the gate retries a missed ack) does the same again. No reason in the log.
  { read -r _; read -r id; IFS= read -r outcome; IFS= read -r said; } < "$tmp/fields"
  mkdir -p "$STATE/.done" && : > "$STATE/.done/$id" ||
    reply '500 Internal Server Error' '{"status":"error","reason":"state"}'
  log "notice: approval $id $outcome; not asking any more"
  if IFS=' ' read -r asked pid < "$STATE/.asking" 2>/dev/null && [ "$asked" = "$id" ]; then
    kill -TERM "$pid" 2>/dev/null &&
      { printf '\n%s\n' "$said" > /dev/tty; } 2>/dev/null
  fi
  reply '200 OK' '{"status":"accepted"}'
fi
if [ "$(head -n 1 "$tmp/fields")" = question ]; then
  # 3b. a question: its request_hash is echoed, not recomputed (jq's numbers are
  #     not the gate's canonical JSON); answered by RELAY_ANSWER only (step 4b)
  nonce=$(sed -n 2p "$tmp/fields") kind=question
  [ -n "${RELAY_ANSWER+set}" ] ||
    reply '503 Service Unavailable' '{"status":"unavailable","reason":"no_answer_configured"}'
else
  { read -r want_hash; read -r nonce; hash=sha256:$(openssl dgst -sha256 | awk '{print $NF}'); } \
    < "$tmp/fields"
  [ "$hash" = "$want_hash" ] ||
    reply '400 Bad Request' '{"status":"invalid","reason":"payload_hash"}'
  kind=approval
fi
mkdir -p "$STATE" || reply '500 Internal Server Error' '{"status":"error","reason":"state"}'
mkdir "$STATE/$nonce" 2>/dev/null || reply '202 Accepted' '{"status":"accepted","duplicate":true}'

# 4. decide, build, sign and POST in the background (own temp dir, not holding the socket)
drain() {  # discard what was typed so far, whole lines and half a line: read the terminal's
  # input queue without waiting (non-canonical, MIN 0 TIME 0: a read returns what is there)
  mode=$(stty -g <&3) && stty -icanon min 0 time 0 <&3 && cat <&3 >/dev/null &&
    stty "$mode" <&3 && mode=''
}

ask() {  # show the draft on /dev/tty (fd 3), then set verb (and text) from the answer typed
  # after it. Risk low/normal: a, s, e or the word; any other risk: the whole word only
  # (approve, skip, edit or adjust), any case, trimmed. Anything else is "Not taken".
  jq -r "$SHOW"'
    "\n== \(.pipeline|line)/\(.step|line) risk=\(.risk|line) approval \(.approval_id|line)"
    + (if (.draft.body|hidden) > 0 then "\nwarning: the draft holds \(.draft.body|hidden) control"
       + " or invisible characters, shown as <U+XXXX>; the draft approved is exactly as sent"
       else "" end)
    + "\n" + (if .draft.body == "" then "(the draft is empty)"  # say it, never show nothing
       elif (.draft.body | test("\\A\\s+\\z")) then
         "(the draft is only whitespace, \(.draft.body | length) characters)"
       else .draft.body | visible end) + "\n=="' "$d" >&3 &&
  jq -r --arg who "$who" "$SHOW"'if .risk == "low" or .risk == "normal" then "" else "whole"
    end, (.risk|line), ($who|line)' "$d" > "$tmp/ask" &&
  { IFS= read -r whole; IFS= read -r risk; IFS= read -r me; } < "$tmp/ask" || return 1
  if [ -n "$whole" ]; then
    prompt="decide as $me. Risk $risk: type the whole word approve, skip or edit: "
    hint="Not taken: at risk $risk type the whole word approve, skip or edit."
  else
    prompt="decide as $me: [a]pprove, [s]kip or [e]dit (adjust)? "
    hint='Not taken: type a, s or e (or approve, skip, edit).'
  fi
  # only an answer typed after the whole draft was on screen counts
  drain || { log "ask: cannot discard what was typed ahead, $id left undecided"; return 1; }
  while printf '%s' "$prompt" >&3; do
    IFS= read -r ans <&3 || break
    word=$(printf '%s\n' "$ans" | tr '[:upper:]' '[:lower:]' |
      sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
    case $word in
      approve|skip) verb=$word ;; edit|adjust) verb=adjust ;;
      a) [ -n "$whole" ] || verb=approve ;; s) [ -n "$whole" ] || verb=skip ;;
      e) [ -n "$whole" ] || verb=adjust ;;
    esac
    case $verb in approve) return 0 ;; skip|adjust) break ;; esac
    printf '%s\n' "$hint" >&3
  done
  [ "$verb" = skip ] && ask_reason && return 0
  [ "$verb" = adjust ] && printf 'Type the new text (one line): ' >&3 &&
    IFS= read -r text <&3 && text="${text%"$CR"}
" && return 0
  log "ask: the terminal gave no answer, $id left undecided (the gate times it out)"
  return 1
}

ask_reason() {  # a skip's reason, one line: until one is typed when the dispatch's
  # skip action says "reason":"required", else an empty line is none
  required=$(jq -r '[.actions[]? | select(.verb == "skip" and .reason == "required")] | length' \
    "$d") || return 1
  while :; do
    if [ "$required" -gt 0 ]; then
      printf 'Why skip? What should change (required, one line): ' >&3
    else
      printf 'Why skip? What should change (optional, one line; empty for none): ' >&3
    fi
    IFS= read -r text <&3 || return 1
    text=${text%"$CR"}
    [ -n "$(printf '%s' "$text" | tr -d '[:space:]')" ] && return 0
    text='' && [ "$required" -eq 0 ] && return 0
    printf 'This step needs a reason for a skip.\n' >&3
  done
}

decide() {
  d=$tmp/dispatch verb=$RELAY_AUTO text=''
  id=$(jq -r .approval_id "$d")
  who=${RELAY_APPROVER:-$(jq -r '.approvers[0] // empty' "$d")}
  case $verb in adjust:*) text=${verb#adjust:} verb=adjust ;; skip:*) text=${verb#skip:} verb=skip ;;
  esac
  if [ "$verb" = ask ]; then
    (: <>/dev/tty) 2>/dev/null || { log "ask: no terminal, $id left undecided"; return 1; }
    until mkdir "$STATE/.tty" 2>/dev/null; do sleep 1; done  # one prompt at a time
    mode=''  # the terminal's settings while drain has changed them: put back on any exit
    trap '[ -z "$mode" ] || stty "$mode" <&3; rm -f "$STATE/.asking"; rmdir "$STATE/.tty"
      rm -rf "$tmp"' EXIT
    trap 'exit 143' TERM  # a notice about this approval drops the prompt (step 3a)
    exec 3<>/dev/tty
    # resolved elsewhere while it waited for the terminal: never shown
    [ ! -e "$STATE/.done/$id" ] || { log "$id resolved elsewhere, not asking"; return 1; }
    printf '%s %s\n' "$id" "$(exec sh -c 'echo "$PPID"')" > "$STATE/.asking"
    ask || return 1
  fi
  jq -c --arg v "$verb" --arg who "$who" --arg text "$text" \
    --arg now "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    '{protocol: "hitl/v0", approval_id, nonce: .callback.nonce, decision: $v, payload_hash,
      approver: {id: $who, display: $who, channel: "shell"},
      adjust_text: (if $v == "adjust" then $text else null end), decided_at: $now}
      + (if $v == "skip" and $text != "" then {reason: $text} else {} end)' \
    "$d" > "$tmp/decision" || return 1
  ts=$(date +%s)
  mac=$({ printf '%s.' "$ts"; cat "$tmp/decision"; } | hmac)
  code=$(curl -sS --proto =http,https --max-time 30 --retry 4 -o "$tmp/answer" -w '%{http_code}' \
    -H 'Content-Type: application/json; charset=utf-8' -H 'X-Hitl-Protocol: hitl/v0' \
    -H "X-Draftcat-Signature: t=$ts,v1=$mac" --data-binary @"$tmp/decision" \
    "$(jq -r .callback.url "$d")")
  log "$id: $verb as $who -> HTTP $code $(cat "$tmp/answer" 2>/dev/null)"
}
answer() {  # 4b. a question: print it on stderr, answer RELAY_ANSWER as its type
  # wants (the text for free text and a single choice, JSON for a multi choice or a form)
  d=$tmp/dispatch
  id=$(jq -r .question_id "$d")
  who=${RELAY_APPROVER:-$(jq -r '.approvers[0] // empty' "$d")}
  jq -r "$SHOW"'"QUESTION \(.question_id|line) \(.pipeline|line)/\(.step|line) version \(.version|line) (\(.question.response_type|line)): \(.question.text|line)"
    + (if (.question.options|type) == "array" then " options: " + ([.question.options[] | line]
    | join(" | ")) else "" end)' "$d" >&2
  jq -c --arg a "$RELAY_ANSWER" --arg who "$who" --arg now "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    '{protocol: "hitl/v0", kind: "question", question_id, nonce: .callback.nonce,
      decision: "answer", request_hash,
      value: (if .question.response_type == "free_text" or .question.response_type ==
        "single_choice" then $a else ($a | fromjson) end),
      approver: {id: $who, display: $who, channel: "shell"}, decided_at: $now}' \
    "$d" > "$tmp/decision" || { log "RELAY_ANSWER is not JSON for question $id"; return 1; }
  ts=$(date +%s)
  mac=$({ printf '%s.' "$ts"; cat "$tmp/decision"; } | hmac)
  code=$(curl -sS --proto =http,https --max-time 30 --retry 4 -o "$tmp/answer" -w '%{http_code}' \
    -H 'Content-Type: application/json; charset=utf-8' -H 'X-Hitl-Protocol: hitl/v0' \
    -H "X-Draftcat-Signature: t=$ts,v1=$mac" --data-binary @"$tmp/decision" \
    "$(jq -r .callback.url "$d")")
  log "question $id: answer as $who -> HTTP $code $(cat "$tmp/answer" 2>/dev/null)"
}
trap - EXIT
if [ "$kind" = question ]; then
  ( trap 'rm -rf "$tmp"' EXIT; answer ) </dev/null >&2 &
  reply '202 Accepted' '{"status":"accepted"}'
fi
( trap 'rm -rf "$tmp"' EXIT; decide ) </dev/null >&2 &
reply '202 Accepted' '{"status":"accepted"}'
