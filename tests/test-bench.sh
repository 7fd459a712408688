#!/bin/sh
# pensieve-bench end to end on the synthetic model (no download): a few
# conversations in every mode, in process. Every request sent completes,
# every answer has the length the workload drew (ignore_eos), the history
# tokens each turn found add up by tier, stateless mode recomputes all of
# them and pensieve mode some fewer, and bad options are refused. A shared
# preamble (issue 28) goes once in front of each conversation and stays in
# its history; the report names it and the prefix-sharing switch.
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
# A preamble of 64 tokens: the same conversations (the cap is far), each
# turn's prompt 64 tokens longer (it is in the history), each first turn's
# input 64 longer; the report names the preamble and the switch.
for tokens in 0 64; do
    unshared=
    [ $tokens -eq 0 ] || unshared=--no-prefix-sharing
    "$bench" --synthetic --conversations 6 --rate 50 --think 0.2 --length-scale 0.25 --seed 3 --modes pensieve,stateless \
        --system-prompt-tokens $tokens --system-prompts 3 $unshared --json >"$tmp/pre$tokens.json" 2>"$tmp/err" || break
done
python3 - "$tmp/pre0.json" "$tmp/pre64.json" >"$tmp/why" 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert (b["workload"]["system_prompt_tokens"], b["workload"]["system_prompts"]) == (64, 3), b["workload"]
assert a["workload"]["system_prompt_tokens"] == 0 and a["workload"]["system_prompts"] == 3 and a["prefix_sharing"] is True and b["prefix_sharing"] is False, a
for ra, rb in zip(a["runs"], b["runs"]):
    assert ra["mode"] == rb["mode"] and rb["failed"] == 0, (ra, rb)
    n, convs = ra["requests"], ra["workload_conversations"]
    assert rb["requests"] == n and rb["target_tokens"] == ra["target_tokens"], (ra, rb)
    assert rb["prompt_tokens"] - ra["prompt_tokens"] == 64 * n, (ra["prompt_tokens"], rb["prompt_tokens"], n)
    assert rb["input_tokens"] - ra["input_tokens"] == 64 * convs, (ra["input_tokens"], rb["input_tokens"])
print("# %d requests: prompts %d -> %d tokens" % (n, ra["prompt_tokens"], rb["prompt_tokens"]))
PY
check $? "a 64-token preamble is in every turn's prompt once, the conversations otherwise the same ($(tail -n 1 "$tmp/why"))"
# The switch reaches the engine: one preamble for all, with sharing the
# engine prefills fewer tokens than without (the same greedy answers). In
# virtual time, so a slow build (sanitizers) does not start every first
# turn before any is saved (a first turn shares what an earlier one saved).
for sharing in on off; do
    flag=
    [ $sharing = on ] || flag=--no-prefix-sharing
    "$bench" --synthetic --conversations 6 --rate 2 --think 0.2 --length-scale 0.25 --seed 3 --modes pensieve \
        --system-prompt-tokens 64 --system-prompts 1 --virtual-time 5,0.5 $flag --json >"$tmp/share-$sharing.json" \
        2>"$tmp/err" || break
done
python3 - "$tmp/share-on.json" "$tmp/share-off.json" >"$tmp/why" 2>&1 <<'PY'
import json, sys
on, off = (json.load(open(f))["runs"][0] for f in sys.argv[1:])
assert on["failed"] == 0 and off["failed"] == 0 and on["requests"] == off["requests"], (on, off)
a, b = on["engine"]["prefill_tokens"], off["engine"]["prefill_tokens"]
assert a < b, (a, b)
print("# prefilled tokens: %d with sharing, %d without" % (a, b))
PY
check $? "--no-prefix-sharing reaches the engine ($(tail -n 1 "$tmp/why"))"
"$bench" --synthetic --conversations 2 --modes pensieve --rate 50 --think 0 --length-scale 0.1 --system-prompt-tokens 40 \
    >"$tmp/table" 2>&1 && grep -q "^system prompt 40 tokens, one of 4; prefix sharing on" "$tmp/table" &&
    "$bench" --synthetic --conversations 2 --modes pensieve --rate 50 --think 0 --length-scale 0.1 --no-prefix-sharing \
        >"$tmp/table2" 2>&1 && grep -q "^no system prompt; prefix sharing off" "$tmp/table2"
check $? "the table names the preamble and prefix sharing ($(grep -m 1 "prefix sharing" "$tmp/table"); $(grep -m 1 "prefix sharing" "$tmp/table2"))"
"$bench" --synthetic --conversations 2 --modes pensieve --rate 50 --device-mem 128K --system-prompt-tokens 2000 \
    >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "no room for a 2000-token system prompt.*--device-mem" "$tmp/err"
check $? "a preamble past what the device pool holds for a conversation fails naming --device-mem ($(cat "$tmp/err" | tail -n 1))"

# A sweep: each mode runs at rising rates until one misses the target; the
# best rates, the throughput ratios and the policies' runs follow from the
# runs listed. Tiers small enough that pensieve mode drops history at some
# rates.
"$bench" --synthetic --conversations 4 --rates 20,40,80 --think 0.1 --length-scale 0.25 --seed 5 --target 100 \
    --policies pensieve,lru --device-mem 128K --host-mem 64K --json >"$tmp/sweep.json" 2>"$tmp/err"
check $? "a sweep over three rates ($(tail -n 1 "$tmp/err"))"
cat >"$tmp/sweep.py" <<'PY'
import json, math, sys
p = json.load(open(sys.argv[1]))
target = p["sweep"]["target_norm_latency"]
by_mode = {}
for r in p["runs"]:
    by_mode.setdefault(r["mode"], []).append(r)
assert sorted(by_mode) == ["gpu-only", "pensieve", "stateless"], sorted(by_mode)
for mode, runs in by_mode.items():
    rates = [r["rate"] for r in runs]
    assert rates == sorted(rates) and rates[0] == 20, rates
    # a run meets the target when every turn was answered within it
    for r in runs:
        assert r["meets_target"] == (r["failed"] == 0 and r["requests"] == r["workload_requests"]
                                     and r["norm_latency_mean"] <= target), r
    # the sweep stops at a mode's first miss
    assert all(r["meets_target"] for r in runs[:-1]), rates
    assert len(runs) == 3 or not runs[-1]["meets_target"], rates
    met = [r for r in runs if r["meets_target"]]
    best = p["sweep"]["best"][mode]
    if met:
        assert best["rate"] == met[-1]["rate"] and best["requests_per_s"] == met[-1]["requests_per_s"], (best, met)
    else:
        assert best is None, best
    if met:
        # offered requests/s where the latency crosses the target: between
        # the last rate met and the miss after it, linear in latency
        b = met[-1]
        nxt = runs[len(met)] if len(met) < len(runs) else None
        want = b["offered_requests_per_s"]
        if nxt and nxt["failed"] == 0 and nxt["norm_latency_mean"] > b["norm_latency_mean"]:
            f = (target - b["norm_latency_mean"]) / (nxt["norm_latency_mean"] - b["norm_latency_mean"])
            want += f * (nxt["offered_requests_per_s"] - b["offered_requests_per_s"])
        assert math.isclose(best["requests_per_s_at_target"], want, rel_tol=1e-5), (best, want)
        assert best["lower_bound"] == (nxt is None), best
        for r in runs:  # the workload's rate: conversations/s (time-scaled) x turns a conversation
            assert math.isclose(r["offered_requests_per_s"],
                                r["rate"] * r["workload_requests"] / r["workload_conversations"], rel_tol=1e-5), r
def ratio(other):
    b, o = p["sweep"]["best"]["pensieve"], p["sweep"]["best"][other]
    return b["requests_per_s_at_target"] / o["requests_per_s_at_target"] if b and o else None
for key, other in (("throughput_ratio_vs_stateless", "stateless"), ("throughput_ratio_vs_gpu_only", "gpu-only")):
    want = ratio(other)
    assert (p[key] is None) == (want is None) and (want is None or math.isclose(p[key], want, rel_tol=1e-5)), (key, p[key], want)
# the policies: pensieve mode, on one workload, at the lowest rate where it
# recomputed dropped history, else at its best rate
pol = p["policies"]
assert [r["policy"] for r in pol] == ["pensieve", "lru"], pol
best = p["sweep"]["best"]["pensieve"]
dropped = [r["rate"] for r in by_mode["pensieve"] if r["recomputed"] > 0]
want = dropped[0] if dropped else (best["rate"] if best else 20)
assert p["policy_rate"] == want, (p["policy_rate"], want, best)
for r in pol:
    assert r["mode"] == "pensieve" and r["rate"] == p["policy_rate"] and r["failed"] == 0, r
    assert r["history_tokens"] == pol[0]["history_tokens"] and r["requests"] == r["workload_requests"], r
print("# best rates: %s; ratios %s, %s" % ({m: b and b["rate"] for m, b in p["sweep"]["best"].items()},
      p["throughput_ratio_vs_stateless"], p["throughput_ratio_vs_gpu_only"]))
PY
python3 "$tmp/sweep.py" "$tmp/sweep.json" >"$tmp/why" 2>&1
check $? "the sweep stops each mode at its first miss; best rates, ratios and policies follow from its runs ($(tail -n 1 "$tmp/why"))"

# A target no run meets: one run per mode, no ratio, the policies at the
# lowest rate.
"$bench" --synthetic --conversations 2 --rates 20,40 --think 0 --length-scale 0.1 --target 1e-6 --policies lru \
    --json >"$tmp/miss.json" 2>"$tmp/err"
python3 - "$tmp/miss.json" >"$tmp/why" 2>&1 <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert [r["rate"] for r in p["runs"]] == [20, 20, 20], [r["rate"] for r in p["runs"]]
assert not any(r["meets_target"] for r in p["runs"]), p["runs"]
assert p["throughput_ratio_vs_stateless"] is None and p["throughput_ratio_vs_gpu_only"] is None, p
assert p["policy_rate"] == 20 and [r["policy"] for r in p["policies"]] == ["lru"], p
PY
check $? "a target no rate meets: one run a mode and no ratios ($(tail -n 1 "$tmp/why"))"

# --duration: a fixed arrival window, so the offered load grows with the
# rate (rate / time scale * duration conversations, at least 2).
"$bench" --synthetic --rates 20,40,100 --duration 0.1 --time-scale 0.5 --think 0 --length-scale 0.1 --target 100 \
    --modes pensieve --policies none --json >"$tmp/dur.json" 2>"$tmp/err"
python3 - "$tmp/dur.json" >"$tmp/why" 2>&1 <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
got = [r["workload_conversations"] for r in runs]
assert got == [4, 8, 20], got
print("# %s conversations" % got)
PY
check $? "--duration: the conversations grow with the rate ($(tail -n 1 "$tmp/why"))"

# --virtual-time: the clock moves only by the cost model, so two runs of one
# workload give the same figures to the last digit, drops and all, and every
# output token costs at least one iteration (10 ms).
for k in 1 2; do
    "$bench" --synthetic --conversations 8 --rate 20 --think 0.5 --length-scale 0.25 --seed 7 --modes pensieve \
        --device-mem 128K --host-mem 64K --virtual-time 10,0.5 --json >"$tmp/virtual$k.json" 2>"$tmp/err" || break
done
python3 - "$tmp/virtual1.json" "$tmp/virtual2.json" >"$tmp/why" 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["virtual_time"] == {"step_s": 0.01, "token_s": 0.0005}, a["virtual_time"]
ra, rb = a["runs"][0], b["runs"][0]
assert ra == rb, [(k, ra[k], rb[k]) for k in ra if ra[k] != rb[k]]
assert ra["engine"]["dropped_chunks"] > 0 and ra["recomputed"] > 0 and ra["failed"] == 0, ra
assert ra["norm_latency_mean"] >= 0.01, ra["norm_latency_mean"]
print("# %d recomputed, %d chunks dropped, norm latency %.4g s/token, twice" % (
    ra["recomputed"], ra["engine"]["dropped_chunks"], ra["norm_latency_mean"]))
PY
check $? "--virtual-time: a run repeats to the last digit ($(tail -n 1 "$tmp/why"))"

# --sweep with --rates: the given rates, the rest of the preset (its time
# and length scales) still applies.
"$bench" --synthetic --sweep --rates 50 --conversations 2 --think 0.1 --modes pensieve --policies none --json \
    >"$tmp/preset.json" 2>"$tmp/err"
python3 - "$tmp/preset.json" >"$tmp/why" 2>&1 <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
w = p["workload"]
assert [r["rate"] for r in p["runs"]] == [50], p["runs"]
assert (w["time_scale"], w["length_scale"], w["conversations"]) == (0.05, 0.25, 2), w
print("# time scale %g, length scale %g" % (w["time_scale"], w["length_scale"]))
PY
check $? "--sweep --rates keeps the rest of the preset ($(tail -n 1 "$tmp/why"))"

if command -v gnuplot >/dev/null 2>&1; then
    "$bench" --synthetic --conversations 2 --rates 20,40 --think 0 --length-scale 0.1 --target 100 \
        --policies none --plot "$tmp/sweep.png" >"$tmp/table" 2>"$tmp/err" &&
        [ "$(head -c 4 "$tmp/sweep.png" | tail -c 3)" = PNG ] && grep -q "highest rate meeting it" "$tmp/table"
    check $? "--plot draws the sweep into a PNG ($(tail -n 1 "$tmp/err"))"
else
    skip "--plot draws the sweep into a PNG" "gnuplot is not installed"
fi
if command -v script >/dev/null 2>&1; then
    script -qec "$bench --synthetic --conversations 2 --modes pensieve --rate 50 --think 0 --length-scale 0.1" \
        /dev/null >"$tmp/tty" 2>&1 </dev/null
    grep -q "pensieve pensieve at 50/s .*/.* requests" "$tmp/tty" && tr '\r' '\n' <"$tmp/tty" | grep -q "^pensieve pensieve at 50/s"
    check $? "a progress line on a terminal ($(tr '\r' '\n' <"$tmp/tty" | grep -m 1 requests))"
    "$bench" --synthetic --conversations 2 --modes pensieve --rate 50 --think 0 --length-scale 0.1 >"$tmp/table" 2>&1
    ! grep -q "requests *[0-9]*s" "$tmp/table"
    check $? "no progress line when stderr is not a terminal"
else
    skip "a progress line on a terminal" "script (util-linux) is not installed"
    skip "no progress line when stderr is not a terminal" "script (util-linux) is not installed"
fi
"$bench" --synthetic --rates 2,1 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "rates '2,1'" "$tmp/err"
check $? "falling rates are refused ($(cat "$tmp/err"))"
"$bench" --http http://127.0.0.1:9 --modes pensieve >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "server's own" "$tmp/err"
check $? "--http with the stack's options is refused ($(cat "$tmp/err"))"
"$bench" --synthetic --modes pensieve,fast >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "modes 'pensieve,fast'" "$tmp/err"
check $? "an unknown mode is refused ($(cat "$tmp/err"))"
"$bench" --synthetic --rate 0 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "rate '0'" "$tmp/err"
check $? "a zero rate is refused ($(cat "$tmp/err"))"
"$bench" --http http://127.0.0.1:9 --ban-tokens 2,x >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "ban-tokens '2,x'" "$tmp/err"
check $? "a token list with a non-number is refused ($(cat "$tmp/err"))"
"$bench" --synthetic --ban-tokens 2 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "is for --http" "$tmp/err"
check $? "--ban-tokens in process is refused ($(cat "$tmp/err"))"
"$bench" --synthetic --virtual-time 10 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "STEP_MS,TOKEN_MS" "$tmp/err"
check $? "--virtual-time without the token cost is refused ($(cat "$tmp/err"))"
"$bench" --http http://127.0.0.1:9 --virtual-time 10,1 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "in process only" "$tmp/err"
check $? "--virtual-time over HTTP is refused ($(cat "$tmp/err"))"
# refused: want STATUS PATTERN ARGS...
refused() {
    want=$1 pattern=$2
    shift 2
    "$bench" "$@" >/dev/null 2>"$tmp/err"
    st=$?
    [ $st -eq 2 ] && grep -q -- "$pattern" "$tmp/err"
    check $? "$want is refused (status $st: $(cat "$tmp/err"))"
}
refused "a time limit that is not a number" "time-limit" --synthetic --time-limit soon

# Stopping early: rate 1 is 2 conversations of one turn (about 1 s; more
# than 6 s in a sanitizer build on a busy machine), rate 2000 is 2000 of
# them at once (some 70 s): a 12 s limit ends the second run, whose name
# is reported, and keeps the first whole.
"$bench" --synthetic --rates 1,2000 --duration 1 --time-scale 1 --think 0 --seed 3 --modes pensieve --policies none \
    --time-limit 12 --json >"$tmp/limit.json" 2>"$tmp/err"
st=$?
cat >"$tmp/cut.py" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
cut = p["interrupted"]
assert cut and cut["label"] == "pensieve" and cut["signal"] == int(sys.argv[2]), cut
# the runs reported ended before the cut one, each whole
assert all(r["rate"] < cut["rate"] and r["requests"] == r["workload_requests"] for r in p["runs"]), p["runs"]
if sys.argv[3] == "limit":
    assert p["time_limit_s"] == 12 and cut["rate"] == 2000 and [r["rate"] for r in p["runs"]] == [1], (cut, p["runs"])
print("# %s at %g/s cut short, %d run(s) before it" % (cut["label"], cut["rate"], len(p["runs"])))
PY
[ $st -eq 0 ] && python3 "$tmp/cut.py" "$tmp/limit.json" 0 limit >"$tmp/why" 2>&1
check $? "--time-limit cuts the run under way and reports the ones before it (status $st; $(tail -n 1 "$tmp/why"))"
start=$(date +%s)
"$bench" --synthetic --rates 1,400 --duration 1 --time-scale 1 --think 0 --seed 3 --modes pensieve --policies none \
    --json >"$tmp/term.json" 2>"$tmp/err" &
pid=$!
sleep 3
kill -TERM $pid
wait $pid
st=$?
took=$(($(date +%s) - start))
[ $st -eq 143 ] && [ $took -le 8 ] && python3 "$tmp/cut.py" "$tmp/term.json" 15 signal >"$tmp/why" 2>&1
check $? "SIGTERM does the same, exit status 143 (status $st after ${took} s; $(tail -n 1 "$tmp/why"))"
timeout -k 5 60 "$bench" --synthetic --conversations 2 --rate 50 --think 1000 --modes pensieve --time-limit 1 >"$tmp/table" 2>&1
grep -q "^--time-limit 1 s: pensieve at 50/s was cut short" "$tmp/table"
check $? "the table says which run the limit cut ($(grep -m 1 "cut short" "$tmp/table"))"

refused "a negative preamble" "system-prompt-tokens" --synthetic --system-prompt-tokens -1
refused "a preamble that is not a number" "system-prompt-tokens" --synthetic --system-prompt-tokens 10x
refused "no preambles to draw from" "system-prompts" --synthetic --system-prompt-tokens 10 --system-prompts 0
refused "a preamble leaving no turn under the cap" "system_prompt_tokens = 99: must be in \[0, context_cap - 2 = 98\]" \
    --synthetic --system-prompt-tokens 99 --context-cap 100
refused "a preamble with --replay" "a replay sends" --synthetic --replay /dev/null --system-prompt-tokens 10
refused "--no-prefix-sharing over HTTP" "server's own setting" --http http://127.0.0.1:9 --no-prefix-sharing
tap_done
