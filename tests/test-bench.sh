#!/bin/sh
# pensieve-bench end to end on the synthetic model (no download): a few
# conversations in every mode, in process. Every request sent completes,
# every answer has the length the workload drew (ignore_eos), the history
# tokens each turn found add up by tier, stateless mode recomputes all of
# them and pensieve mode some fewer, and bad options are refused.
set -u
top_builddir=${top_builddir:-.}
bench=$top_builddir/bench/pensieve-bench
tmp=$(mktemp -d /tmp/pv-test-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/tap.sh"

"$bench" --synthetic --conversations 6 --rate 50 --think 0.2 --length-scale 0.25 --seed 3 --json \
    >"$tmp/out.json" 2>"$tmp/err"
check $? "pensieve-bench runs the three modes ($(tail -n 1 "$tmp/err"))"
cat >"$tmp/check.py" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
runs = {r["mode"]: r for r in p["runs"]}
assert sorted(runs) == ["gpu-only", "pensieve", "stateless"], sorted(runs)
for mode, r in runs.items():
    assert r["workload_conversations"] == 6, r
    # every turn of the workload was sent and completed
    assert r["requests"] == r["workload_requests"] > 6, r
    assert r["failed"] == 0 and r["engine"]["turns_done"] == r["requests"], r
    # ignore_eos: every answer as long as drawn
    assert r["generated_tokens"] == r["target_tokens"] > 0, r
    # the history each turn found, by where it came from (each turn's
    # per-layer averages round separately: one token of slack a request)
    found = r["reused_device"] + r["reused_host"] + r["recomputed"]
    assert abs(found - r["history_tokens"]) <= r["requests"], r
    assert r["requests_per_s"] > 0 and r["norm_latency_mean"] > 0 and r["ttft_p90"] >= r["ttft_p50"] > 0, r
assert runs["stateless"]["recomputed"] == runs["stateless"]["history_tokens"] > 0, runs["stateless"]
assert runs["pensieve"]["recomputed"] < runs["pensieve"]["history_tokens"], runs["pensieve"]
assert runs["pensieve"]["history_tokens"] == runs["stateless"]["history_tokens"], (runs["pensieve"], runs["stateless"])
print("# pensieve: %d of %d history tokens reused; stateless recomputed all" % (
    runs["pensieve"]["reused_device"] + runs["pensieve"]["reused_host"], runs["pensieve"]["history_tokens"]))
PY
python3 "$tmp/check.py" "$tmp/out.json" >"$tmp/why" 2>&1
check $? "every request completes, answers have their drawn lengths, history tokens add up by tier ($(tail -n 1 "$tmp/why"))"

# A device tier too small for every history: pensieve mode swaps to the
# host tier and back, gpu-only mode drops and recomputes.
"$bench" --synthetic --conversations 8 --rate 50 --think 0.3 --length-scale 0.5 --seed 3 --device-mem 128K \
    --host-mem 1M --modes pensieve,gpu-only --json >"$tmp/small.json" 2>"$tmp/err"
check $? "a run with a 128K device tier ($(tail -n 1 "$tmp/err"))"
cat >"$tmp/small.py" <<'PY'
import json, sys
runs = {r["mode"]: r for r in json.load(open(sys.argv[1]))["runs"]}
for mode, r in runs.items():
    assert r["failed"] == 0 and r["requests"] == r["workload_requests"], r
    # the cap keeps every conversation within the device pool
    assert 0 < r["context_cap"] < 1024, r
    found = r["reused_device"] + r["reused_host"] + r["recomputed"]
    assert abs(found - r["history_tokens"]) <= r["requests"], r
p, g = runs["pensieve"], runs["gpu-only"]
assert p["reused_host"] > 0 and p["engine"]["swap_out_chunks"] > 0 and p["engine"]["swap_in_chunks"] > 0, p
assert g["reused_host"] == 0 and g["engine"]["swap_out_chunks"] == 0 and g["engine"]["dropped_chunks"] > 0, g
assert g["recomputed"] > p["recomputed"], (g["recomputed"], p["recomputed"])
print("# host tier reused %d tokens in pensieve mode; gpu-only recomputed %d, pensieve %d" % (
    p["reused_host"], g["recomputed"], p["recomputed"]))
PY
python3 "$tmp/small.py" "$tmp/small.json" >"$tmp/why" 2>&1
check $? "pensieve mode swaps through the host tier, gpu-only drops and recomputes more; counts add up ($(tail -n 1 "$tmp/why"))"
"$bench" --synthetic --conversations 2 --modes pensieve --rate 50 --think 0 --length-scale 0.1 >"$tmp/table" 2>&1 &&
    grep -q "^pensieve " "$tmp/table"
check $? "the table names the mode ($(head -n 2 "$tmp/table" | tail -n 1))"
"$bench" --synthetic --modes pensieve,fast >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "modes 'pensieve,fast'" "$tmp/err"
check $? "an unknown mode is refused ($(cat "$tmp/err"))"
"$bench" --synthetic --rate 0 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "rate '0'" "$tmp/err"
check $? "a zero rate is refused ($(cat "$tmp/err"))"
tap_done
