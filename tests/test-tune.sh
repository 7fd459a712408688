#!/bin/sh
# pensieve-tune --quick on the CPU backend (a synthetic model's shape, so no
# download is needed): it writes a profile whose fit is sound, keeps another
# device's section in the same file, draws the plot when gnuplot is present,
# and the profile reaches the cache (test-tune-apply).
set -u
top_builddir=${top_builddir:-.}
tune=$top_builddir/tuning/pensieve-tune
tmp=$(mktemp -d /tmp/pv-test-tune-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
n=0
fails=0
check() { # check COND-STATUS MESSAGE
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fails=$((fails + 1)); fi
}

printf '[opencl: another device]\nalpha = 1e-8\nbeta = 1e-5\nc = 1e-3\nchunk_tokens = 32\n' >"$tmp/p.ini"
start=$(date +%s)
"$tune" --backend cpu --quick --shape 9,3,64,4 --out "$tmp/p.ini" --json >"$tmp/out.json" 2>"$tmp/err"
check $? "pensieve-tune --quick runs ($(tr '\n' ' ' <"$tmp/err"))"
secs=$(($(date +%s) - start))
[ "$secs" -lt 30 ]
check $? "--quick takes under 30 s ($secs s)"
python3 - "$tmp/out.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["backend"] == "cpu" and p["chunk_tokens"] == 32 and p["shape"] == "9,3,64,4", p
assert p["alpha"] > 0 and p["beta"] >= 0 and p["c"] > 0, p
assert len(p["points"]) == 6 and len(p["heldout"]) == 5, p
# the attention of a chunk grows with its context: the last point costs
# several times the first
assert p["points"][-1]["seconds"] > 4 * p["points"][0]["seconds"], p["points"]
assert p["r2"] > 0.9, p["r2"]
assert p["heldout_error"] < 0.25, p["heldout_error"]
PY
check $? "the JSON holds a sound fit (6 points, R^2 > 0.9, held-out error < 25%)"
grep -q '^\[opencl: another device\]$' "$tmp/p.ini" && grep -q '^\[cpu: ' "$tmp/p.ini"
check $? "the file keeps the other device's section beside the new one"
"$top_builddir/tests/test-tune-apply" "$tmp/p.ini" >"$tmp/apply.tap"
check $? "the profile reaches the cache (test-tune-apply)"
sed 's/^/# /' "$tmp/apply.tap"
if command -v gnuplot >/dev/null 2>&1; then
    "$tune" --backend cpu --quick --shape 4,2,16,2 --out "$tmp/p.ini" --plot "$tmp/fit.png" >/dev/null 2>&1 &&
        [ "$(head -c 4 "$tmp/fit.png" | od -An -c | tr -d ' ')" = "211PNG" ]
    check $? "--plot writes a PNG"
else
    n=$((n + 1))
    echo "ok $n - # SKIP gnuplot is not installed (scripts/install-deps installs it)"
fi
"$tune" --backend cpu --quick --shape 9,4,64,2 --out "$tmp/q.ini" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "kv_heads dividing heads" "$tmp/err"
check $? "a shape whose kv heads do not divide the heads is refused ($(cat "$tmp/err"))"
echo "1..$n"
[ $fails -eq 0 ]
