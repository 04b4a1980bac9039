#!/bin/sh
# Compile script.csx with Mono against stand-ins for the connector host, then run Harness.exe.
# Needs: apt-get install mono-mcs mono-runtime libnewtonsoft-json-cil-dev libmono-system-net-http4.0-cil
# Usage: ./run.sh vectors ../../../../vectors
#        HITL_RELAY_SECRET=... ./run.sh relay http://127.0.0.1:8196/ alice@example.com [--as-sent]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/hitl-connector-test.$(id -u)
mkdir -p "$out"
json=$(ls /usr/lib/mono/gac/Newtonsoft.Json/*/Newtonsoft.Json.dll 2>/dev/null | tail -n 1)
[ -n "$json" ] || { echo "run.sh: Newtonsoft.Json not found (apt-get install libnewtonsoft-json-cil-dev)" >&2; exit 2; }
{  # the host compiles script.csx with these namespaces imported (the custom-code allow list)
  for ns in System System.Collections System.Collections.Generic System.IO System.Linq System.Net \
            System.Net.Http System.Net.Http.Headers System.Security.Cryptography System.Text \
            System.Text.RegularExpressions System.Threading System.Threading.Tasks \
            Microsoft.Extensions.Logging Newtonsoft.Json Newtonsoft.Json.Linq; do
    echo "using $ns;"
  done
  cat "$here/../script.csx"
} > "$out/Script.g.cs"
mcs -nologo -out:"$out/Harness.exe" -r:System.Net.Http -r:"$json" \
  "$here/ScriptBase.cs" "$out/Script.g.cs" "$here/Harness.cs"
cp "$json" "$out/"
exec mono "$out/Harness.exe" "$@"
