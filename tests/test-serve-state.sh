#!/bin/sh
# pensieve-serve --state-dir end to end, on the synthetic model over
# loopback: a session saved at shutdown is restored at the next start and
# its next turn reuses the saved KV (cached tokens) and gives the tokens a
# server that never stopped gives (greedy); DELETE removes the file; the
# background saver writes an idle session so that it survives kill -9; a
# corrupt file is skipped with a warning naming the reason. Prints TAP.
set -u
top_builddir=${top_builddir:-.}
serve=$top_builddir/apps/pensieve-serve
. "$(dirname "$0")/tap.sh"

need_program "$serve"
if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP no python3"
    exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pv-test-serve-state.XXXXXX") || exit 99
pid=

. "$(dirname "$0")/serve-start.sh"
trap 'stop_server; rm -rf "$tmp"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
# Piped into a reader that quits (head): the EXIT trap still stops the server.
trap 'exit 141' PIPE
export OMP_NUM_THREADS=1
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY

# turn N FILE: the session's turn N (1 or 2; turn 2 carries turn 1's answer
# from $tmp/turn1.ids) as a greedy chat completion; writes the answer's
# token ids to FILE and prints the cached prompt tokens.
cat >"$tmp/turn.py" <<'PY'
import json, sys, urllib.request
port, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tmp = sys.argv[4]
msgs = [{"role": "user", "content": "tell me about tiered caches, please"}]
if n == 2:
    first = json.load(open(tmp + "/turn1.json"))
    msgs += [{"role": "assistant", "content": first["text"]},
             {"role": "user", "content": "and what happens after a restart?"}]
body = json.dumps({"model": "x", "messages": msgs, "temperature": 0, "max_tokens": 12,
                   "ignore_eos": True, "return_token_ids": True}).encode()
req = urllib.request.Request("http://127.0.0.1:%s/v1/chat/completions" % port, data=body,
                             headers={"Content-Type": "application/json", "X-Session-Id": "alice"})
r = json.load(urllib.request.urlopen(req, timeout=30))
c = r["choices"][0]
json.dump({"text": c["message"]["content"], "ids": c["token_ids"]}, open(out, "w"))
print(r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
PY
turn() { python3 "$tmp/turn.py" "$port" "$1" "$2" "$tmp"; }
ids() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ids"])' "$1"; }
files() { ls "$tmp/state" 2>/dev/null | grep -c '\.pvs$'; }

# The reference: both turns on a server that never stops.
start_server
turn 1 "$tmp/ref1.json" >/dev/null && cp "$tmp/ref1.json" "$tmp/turn1.json" && turn 2 "$tmp/ref2.json" >/dev/null
check $? "reference: two turns on a server without a state directory"
stop_server

# Turn 1, a graceful stop (the state is written), a new server, turn 2.
start_server --state-dir "$tmp/state" --state-save-idle 0
turn 1 "$tmp/turn1.json" >/dev/null
check $? "turn 1 on a server with --state-dir"
stop_server
check $(( rc != 0 || $(files) != 1 )) "a graceful stop writes the session's file (exit $rc, $(files) files)"
grep -q 'state: saved 1 sessions' "$tmp/server.log"
check $? "the server says what it saved"
start_server --state-dir "$tmp/state" --state-save-idle 0
grep -q 'restored 1 sessions' "$tmp/server.log"
check $? "a new server restores the session"
cached=$(turn 2 "$tmp/got2.json")
check $(( ${cached:-0} == 0 )) "turn 2 after the restart reuses the saved KV ($cached prompt tokens cached)"
[ "$(ids "$tmp/got2.json")" = "$(ids "$tmp/ref2.json")" ]
check $? "turn 2 after the restart gives the tokens of a server that never stopped"
code=$(python3 -c 'import urllib.request,sys
r = urllib.request.Request("http://127.0.0.1:%s/v1/sessions/alice" % sys.argv[1], method="DELETE")
print(urllib.request.urlopen(r, timeout=10).status)' "$port")
check $(( code != 200 || $(files) != 0 )) "DELETE /v1/sessions/alice removes its file too (HTTP $code, $(files) files)"
stop_server
check $(( $(files) != 0 )) "a deleted session is not written again at shutdown"

# Background saves: an idle session's file exists before any shutdown, so
# it survives kill -9.
start_server --state-dir "$tmp/state" --state-save-idle 0.2
turn 1 "$tmp/turn1.json" >/dev/null
i=0
while [ "$(files)" -lt 1 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
check $(( $(files) != 1 )) "the background saver writes an idle session ($(files) files)"
kill -KILL "$pid"
wait "$pid" 2>/dev/null
pid=
start_server --state-dir "$tmp/state" --state-save-idle 0
grep -q 'restored 1 sessions' "$tmp/server.log"
check $? "after kill -9 the session is restored from the background save"
cached=$(turn 2 "$tmp/got2.json")
[ "${cached:-0}" -gt 0 ] && [ "$(ids "$tmp/got2.json")" = "$(ids "$tmp/ref2.json")" ]
check $? "and its next turn reuses it ($cached cached) with the same tokens"
stop_server

# Moving a session between two running servers (a drain): GET its state
# from one, PUT it into the other, whose next turn reuses it.
cat >"$tmp/state.py" <<'PY'
import sys, urllib.error, urllib.request
method, port, path, file = sys.argv[1:5]
data = open(file, "rb").read() if method == "PUT" else None
req = urllib.request.Request("http://127.0.0.1:%s%s" % (port, path), data=data, method=method)
try:
    r = urllib.request.urlopen(req, timeout=30)
    body = r.read()
    if method == "GET":
        open(file, "wb").write(body)
    print(r.status)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode(errors="replace"))
PY
state() { python3 "$tmp/state.py" "$@"; }
start_server
turn 1 "$tmp/turn1.json" >/dev/null
out=$(state GET "$port" /v1/session-states/alice "$tmp/alice.pvs")
check $(( ${out%% *} != 200 )) "GET /v1/session-states/alice exports the session ($out, $(wc -c <"$tmp/alice.pvs") bytes)"
out=$(state GET "$port" /v1/session-states/nobody "$tmp/nobody.pvs")
check $(( ${out%% *} != 404 )) "an unknown session's state is 404 (${out%% *})"
pid_a=$pid
pid=
start_server
out=$(state PUT "$port" /v1/session-states/alice "$tmp/alice.pvs")
check $(( ${out%% *} != 201 )) "PUT /v1/session-states/alice imports it into a second server ($out)"
cached=$(turn 2 "$tmp/got2.json")
[ "${cached:-0}" -gt 0 ] && [ "$(ids "$tmp/got2.json")" = "$(ids "$tmp/ref2.json")" ]
check $? "its next turn there reuses the moved KV ($cached cached) with the same tokens"
out=$(state PUT "$port" /v1/session-states/alice "$tmp/alice.pvs")
check $(( ${out%% *} != 409 )) "a second PUT of an existing session is 409 (${out%% *})"
out=$(state PUT "$port" /v1/session-states/bob "$tmp/alice.pvs")
case $out in 400*session_mismatch*) r=0 ;; *) r=1 ;; esac
check $r "alice's state PUT as bob's is refused: $out"
python3 -c 'import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-1] ^= 0x40; open(p, "wb").write(bytes(b))' "$tmp/alice.pvs"
out=$(state PUT "$port" /v1/session-states/carol "$tmp/alice.pvs")
case $out in 400*checksum*) r=0 ;; *) r=1 ;; esac
check $r "a corrupt state is refused, naming the checksum: $out"
stop_server
pid=$pid_a
stop_server

# A corrupt file: skipped, with the reason; the session starts afresh.
f=$(ls "$tmp/state"/*.pvs | head -n 1)
python3 -c 'import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-1] ^= 0x40; open(p, "wb").write(bytes(b))' "$f"
start_server --state-dir "$tmp/state" --state-save-idle 0
grep -q 'skipped .*checksum mismatch' "$tmp/server.log" && grep -q 'restored 0 sessions' "$tmp/server.log"
check $? "a file with a flipped byte is skipped, naming the checksum"
cached=$(turn 1 "$tmp/turn1.json")
check $(( ${cached:-1} != 0 )) "the session starts afresh ($cached cached)"
stop_server
tap_done
