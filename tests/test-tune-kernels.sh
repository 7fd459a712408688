#!/bin/sh
# pensieve-tune's kernel search on PoCL (issue 12): built with the test-only
# PV_TEST_BREAK_WG=32 (kernels/attention.cl), every attention candidate with
# PV_WG = 32 gives wrong results. The search must reject exactly those,
# pick a correct set for each bucket, write it to the profile, and the
# engine's profile loading must give the backend those sets.
set -u
top_builddir=${top_builddir:-.}
tune=$top_builddir/tuning/pensieve-tune
tmp=$(mktemp -d /tmp/pv-test-tune-kernels-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/tap.sh"

PV_TEST_KERNEL_DEFINES=-DPV_TEST_BREAK_WG=32 "$tune" --backend opencl --quick --shape 9,3,64,2 \
    --kernels attention --out "$tmp/p.ini" --json >"$tmp/out.json" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] && grep -Eq "backend 'opencl' (is not built|is unavailable)" "$tmp/err"; then
    echo "1..0 # SKIP no OpenCL device: $(tr '\n' ' ' <"$tmp/err")"
    exit 0
fi
check $rc "pensieve-tune --backend opencl --kernels attention runs ($(tr '\n' ' ' <"$tmp/err"))"

cat >"$tmp/check.py" <<'PY'
import json, re, sys
p = json.load(open(sys.argv[1]))
profile = open(sys.argv[2]).read()
buckets = p["kernels"]
assert [b["bucket"] for b in buckets] == [
    "attention.hd64.g4.decode.short", "attention.hd64.g4.decode.long",
    "attention.hd64.g4.prefill.short", "attention.hd64.g4.prefill.long"], [b["bucket"] for b in buckets]
for b in buckets:
    assert len(b["candidates"]) == 18, (b["bucket"], len(b["candidates"]))
    for c in b["candidates"]:
        broken = c["params"].startswith("PV_WG=32 ")
        # the broken build is off by the outputs' size; the others agree
        assert c["rejected"] == broken, (b["bucket"], c)
        assert (c["error"] is None or c["error"] > 1e-2) if broken else c["error"] < b["limit"], (b["bucket"], c)
        assert (c["seconds"] is None) == broken, (b["bucket"], c)
    assert not b["best"].startswith("PV_WG=32 "), b
    fastest = min((c for c in b["candidates"] if not c["rejected"]), key=lambda c: c["seconds"])
    # the fastest, or the default when the fastest did not gain 3% over
    # it in the alternating runs (whatever the timings, one of the two)
    if b["kept_default"]:
        assert b["best"] == b["default"] != fastest["params"] and b["best_s"] == b["default_s"], b
    else:
        assert b["best"] == fastest["params"], (b["best"], fastest)
        if b["best"] != b["default"] and b["default_s"] is not None:
            assert b["best_s"] <= 0.97 * b["default_s"], b
    line = "kernel.%s = %s" % (b["bucket"], b["best"])
    assert re.search("^" + re.escape(line) + "$", profile, re.M), line
print("# picked: " + ", ".join("%s %s" % (b["bucket"], b["best"]) for b in buckets))
PY
python3 "$tmp/check.py" "$tmp/out.json" "$tmp/p.ini" >"$tmp/why" 2>&1
check $? "each bucket rejects the 6 broken candidates (PV_WG=32) and only them, keeps the fastest of the rest ($(tail -n 1 "$tmp/why"))"
"$top_builddir/tests/test-tune-apply" "$tmp/p.ini" opencl >"$tmp/apply.tap"
check $? "the profile's kernel sets and constants reach the backend and the cache (test-tune-apply)"
sed 's/^/# /' "$tmp/apply.tap"
"$tune" --backend cpu --kernels gather --quick --shape 4,2,16,2 --out "$tmp/q.ini" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "cpu backend has no tunable kernels" "$tmp/err"
check $? "--kernels on the cpu backend is refused ($(cat "$tmp/err"))"
"$tune" --backend opencl --kernels attention,copy --quick --shape 4,2,16,2 --out "$tmp/q.ini" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "kernels 'attention,copy'" "$tmp/err"
check $? "an unknown family is refused ($(head -n 1 "$tmp/err"))"
tap_done
