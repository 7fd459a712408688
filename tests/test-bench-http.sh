#!/bin/sh
# pensieve-bench's HTTP driver end to end, against pensieve-serve on the
# synthetic model (no download) on a loopback port: with sessions every
# turn is answered at its drawn length, later turns find their history
# cached, the client's usage and the server's /metrics counters agree, and
# the sessions are deleted at the end; without sessions nothing is cached;
# a stateless server recomputes the history instead; a preamble reaches
# the server in every turn; an unreachable URL fails at once naming it.
# Prints TAP.
set -u
top_builddir=${top_builddir:-.}
bench=$top_builddir/bench/pensieve-bench
serve=$top_builddir/apps/pensieve-serve
. "$(dirname "$0")/tap.sh"

need_program "$serve"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pv-test-bench-http.XXXXXX") || exit 99
pid=

. "$(dirname "$0")/serve-start.sh"
trap 'stop_server; rm -rf "$tmp"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
# Piped into a reader that quits (head): the EXIT trap still stops the server.
trap 'exit 141' PIPE

# One thread: the synthetic model is tiny, and OpenMP threads spinning on
# shared cores only slow the test down. The runs go straight to the
# loopback port, whatever proxy the environment names.
export OMP_NUM_THREADS=1
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY


# run_bench NAME ARGS...: a run of the workload against the server, JSON in
# $tmp/NAME.json; its status is the bench's.
run_bench() {
    name=$1
    shift
    "$bench" --http "http://127.0.0.1:$port" --conversations 4 --rate 20 --think 0.2 --length-scale 0.1 --seed 3 \
        --json "$@" >"$tmp/$name.json" 2>"$tmp/$name.err"
}

# check_json NAME DESCRIPTION: checks $tmp/NAME.json with the Python on
# stdin, after the common checks (r: the run; gauge(name): a value of the
# server's /metrics page as it is now).
check_json() {
    { cat <<'PY'; cat; } >"$tmp/check.py"
import json, sys, urllib.request
p = json.load(open(sys.argv[1]))
metrics = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[2], timeout=10).read().decode()
def gauge(name):
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("%s not in /metrics" % name)
assert len(p["runs"]) == 1, p
r = p["runs"][0]
assert r["mode"] == "http", r
# every turn of the workload was sent and answered, at its drawn length
assert r["workload_conversations"] == 4 and r["requests"] == r["workload_requests"] > 4, r
assert r["failed"] == 0 and not r["first_error"], r
assert r["generated_tokens"] == r["target_tokens"] > 0, r
assert r["ttft_p90"] >= r["ttft_p50"] > 0, r
PY
    python3 "$tmp/check.py" "$tmp/$1.json" "$port" >"$tmp/why" 2>&1
    check $? "$2 ($(tail -n 1 "$tmp/why"))"
}

start_server
check $? "pensieve-serve (pensieve mode) listens on an ephemeral port (${port:-none})"
if [ -n "$port" ]; then
    run_bench sessions
    check $? "pensieve-bench --http runs with sessions ($(tail -n 1 "$tmp/sessions.err"))"
    check_json sessions "with sessions, later turns find their history cached; usage and /metrics agree" <<'PY'
e = r["engine"]
assert e is not None, "counters unknown against pensieve-serve"
assert e["turns_done"] == r["requests"] and e["turns_failed"] == 0, e
# what the server prefilled is what the answers said was not cached, and
# it decoded every token but each turn's first (which comes from prefill);
# a suspended turn would be forwarded again, but none is at these sizes
assert e["suspensions"] == 0, e
assert e["prefill_tokens"] == r["prompt_tokens"] - r["cached_tokens"], (e, r)
assert e["decode_tokens"] == r["generated_tokens"] - r["requests"], (e, r)
assert r["prompt_tokens"] > r["cached_tokens"] > 0 and e["recomputed_tokens"] == 0, (e, r)
# each conversation's session was deleted once it ended
assert gauge("pensieve_sessions") == 0, gauge("pensieve_sessions")
print("# %d of %d prompt tokens cached" % (r["cached_tokens"], r["prompt_tokens"]))
PY
    run_bench preamble --system-prompt-tokens 48 --system-prompts 2
    check $? "pensieve-bench --http runs with a preamble ($(tail -n 1 "$tmp/preamble.err"))"
    check_json preamble "with a preamble the server answers every turn, each prompt carrying it" <<'PY'
assert p["workload"]["system_prompt_tokens"] == 48 and p["prefix_sharing"] is None, p
# 48 words are at least 48 tokens on any vocabulary, in every turn's prompt
assert r["prompt_tokens"] >= 48 * r["requests"], r
assert r["input_tokens"] >= 48 * r["workload_conversations"], r
print("# %d prompt tokens over %d requests" % (r["prompt_tokens"], r["requests"]))
PY
    run_bench plain --no-sessions
    check $? "pensieve-bench --http runs without sessions ($(tail -n 1 "$tmp/plain.err"))"
    check_json plain "without sessions nothing is cached: every prompt token is prefilled" <<'PY'
e = r["engine"]
assert e is not None and e["turns_done"] == r["requests"], e
assert r["cached_tokens"] == 0 and e["recomputed_tokens"] == 0, (e, r)
assert e["prefill_tokens"] == r["prompt_tokens"] > 0, (e, r)
print("# %d prompt tokens, all prefilled" % r["prompt_tokens"])
PY
fi
stop_server

start_server --mode stateless
check $? "pensieve-serve (stateless mode) listens on an ephemeral port (${port:-none})"
if [ -n "$port" ]; then
    run_bench stateless
    check $? "pensieve-bench --http runs against a stateless server ($(tail -n 1 "$tmp/stateless.err"))"
    check_json stateless "a stateless server caches nothing and recomputes the history it is sent" <<'PY'
e = r["engine"]
assert e is not None and e["turns_done"] == r["requests"], e
assert r["cached_tokens"] == 0 and e["prefill_tokens"] == r["prompt_tokens"], (e, r)
assert 0 < e["recomputed_tokens"] < r["prompt_tokens"], (e, r)
print("# %d of %d prompt tokens recomputed history" % (e["recomputed_tokens"], r["prompt_tokens"]))
PY
    # 1,000 s between turns: the run is cut at the limit, by name
    start=$(date +%s)
    timeout -k 5 60 "$bench" --http "http://127.0.0.1:$port" --conversations 2 --rate 20 --think 1000 --no-sessions \
        --length-scale 0.1 --seed 3 --time-limit 2 --json >"$tmp/cut.json" 2>"$tmp/cut.err"
    st=$?
    took=$(($(date +%s) - start))
    python3 - "$tmp/cut.json" >"$tmp/why" 2>&1 <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["runs"] == [] and p["time_limit_s"] == 2, p
assert p["interrupted"] == {"label": "http", "policy": None, "rate": 20, "signal": 0}, p["interrupted"]
print("# %s at %g/s cut short" % (p["interrupted"]["label"], p["interrupted"]["rate"]))
PY
    [ $? -eq 0 ] && [ $st -eq 0 ] && [ $took -le 5 ]
    check $? "--time-limit ends a run over HTTP in time (status $st after ${took} s; $(tail -n 1 "$tmp/why"))"
fi
stop_server

# Nothing listens on port 1 of the loopback (binding it takes root).
"$bench" --http http://127.0.0.1:1 --conversations 2 --json >"$tmp/none.json" 2>"$tmp/none.err"
st=$?
[ $st -eq 1 ] && grep -q "http://127.0.0.1:1" "$tmp/none.err"
check $? "an unreachable server fails at once with status 1, naming the URL (status $st: $(head -n 1 "$tmp/none.err"))"
tap_done
