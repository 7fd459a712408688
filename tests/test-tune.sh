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
. "$(dirname "$0")/tap.sh"

printf '[opencl: another device]\nalpha = 1e-8\nbeta = 1e-5\nc = 1e-3\nchunk_tokens = 32\n' >"$tmp/p.ini"
# What the JSON must hold whatever the timings: the contexts, and alpha,
# beta, R^2 and the held-out error recomputed from its own points (weighted
# least squares, as pv_cost_fit_linear). Exit 3 when the run was disturbed
# (some point's spread above 25%: other processes took the cores), so its
# fit's quality is not judged; else the fit must be sound.
cat >"$tmp/check.py" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["backend"] == "cpu" and p["chunk_tokens"] == 32 and p["shape"] == "9,3,64,4", p
assert [q["context"] for q in p["points"]] == [32, 64, 128, 256, 512, 1024], p["points"]
assert [q["context"] for q in p["heldout"]] == [48, 96, 192, 384, 768], p["heldout"]
x = [q["context"] for q in p["points"]]
y = [q["seconds"] for q in p["points"]]
w = [1 / (t * t) for t in y]
s, sx, sy = sum(w), sum(a * b for a, b in zip(w, x)), sum(a * b for a, b in zip(w, y))
sxx = sum(a * b * b for a, b in zip(w, x))
sxy = sum(a * b * c for a, b, c in zip(w, x, y))
alpha = (s * sxy - sx * sy) / (s * sxx - sx * sx)
beta = (sxx * sy - sx * sxy) / (s * sxx - sx * sx)
if alpha < 0:
    alpha, beta = 0.0, sy / s
elif beta < 0:
    alpha, beta = sxy / sxx, 0.0
close = lambda a, b: abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-300)
assert close(p["alpha"], alpha) and close(p["beta"], beta), (p["alpha"], alpha, p["beta"], beta)
mean = sum(y) / len(y)
fit = [alpha * c + beta for c in x]
r2 = 1 - sum((f - t) ** 2 for f, t in zip(fit, y)) / sum((t - mean) ** 2 for t in y)
assert abs(p["r2"] - r2) < 1e-6, (p["r2"], r2)
held = sum(abs(alpha * q["context"] + beta - q["seconds"]) / q["seconds"] for q in p["heldout"]) / 5
assert abs(p["heldout_error"] - held) < 1e-6 * max(held, 1), (p["heldout_error"], held)
assert p["c"] > 0, p
if max(q["spread"] for q in p["points"] + p["heldout"]) > 0.25:
    sys.exit(3)
# undisturbed: a chunk's attention grows with its context, and the line fits
assert y[-1] > 4 * y[0], y
assert p["r2"] > 0.9, p["r2"]
assert p["heldout_error"] < 0.25, p["heldout_error"]
PY
# A few tries for an undisturbed run: make check runs other tests beside
# this one.
verdict=3
tries=0
while [ $tries -lt 3 ] && [ $verdict -eq 3 ]; do
    tries=$((tries + 1))
    start=$(date +%s)
    "$tune" --backend cpu --quick --repeats 9 --shape 9,3,64,4 --out "$tmp/p.ini" --json >"$tmp/out.json" 2>"$tmp/err"
    rc=$?
    secs=$(($(date +%s) - start))
    [ $rc -eq 0 ] || break
    python3 "$tmp/check.py" "$tmp/out.json" 2>"$tmp/why"
    verdict=$?
    [ $verdict -ne 3 ] || echo "# try $tries: disturbed (a point's spread above 25%)"
done
check $rc "pensieve-tune --quick runs ($(tr '\n' ' ' <"$tmp/err"))"
[ "$secs" -lt 30 ]
check $? "--quick takes under 30 s ($secs s)"
[ $verdict -eq 0 ] || [ $verdict -eq 3 ]
check $? "the JSON's fit, R^2 and held-out error follow from its points ($(tail -n 1 "$tmp/why"))"
if [ $verdict -eq 3 ]; then
    n=$((n + 1))
    echo "ok $n - # SKIP the fit's quality: every try was disturbed by other processes"
else
    check $verdict "an undisturbed run fits: R^2 > 0.9, held-out error < 25% (try $tries)"
fi
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
tap_done
