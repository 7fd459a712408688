#!/bin/sh
# pensieve-cuda-warm, which fills the CUDA kernel cache ahead of a run (no
# GPU needed): one family's sets compile into a new directory, a second run
# finds every one there and compiles none, --check counts another family's
# as missing (status 1), an entry whose image is damaged is compiled again,
# a directory that cannot be written fails after one set, and bad options
# are refused with status 2. Prints TAP.
set -u

tool=${PV_CUDA_WARM_TOOL:-./backends/cuda/pensieve-cuda-warm}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-cuda-warm.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
. "$(dirname "$0")/tap.sh"

need_program "$tool"
field() { # field NAME FILE: a number of the tool's JSON line
    sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p" "$2"
}

# recompute: the smallest family (20 sets), for sm_90
"$tool" --arch 90 --dir "$tmp/cache" --families recompute >"$tmp/first" 2>"$tmp/err"
st=$?
[ $st -eq 0 ] && [ "$(field sets "$tmp/first")" -eq 20 ] && [ "$(field compiled "$tmp/first")" -eq 20 ] &&
    [ "$(ls "$tmp/cache" | grep -c '\.cubin$')" -eq 20 ]
check $? "recompute's 20 sets for sm_90 compile into 20 entries (exit $st: $(cat "$tmp/first" "$tmp/err"))"

"$tool" --arch 90 --dir "$tmp/cache" --families recompute >"$tmp/second" 2>&1
st=$?
[ $st -eq 0 ] && [ "$(field present "$tmp/second")" -eq 20 ] && [ "$(field compiled "$tmp/second")" -eq 0 ]
check $? "a second run finds all 20 and compiles none (exit $st: $(cat "$tmp/second"))"

"$tool" --arch 90 --dir "$tmp/cache" --families recompute,gather --check >"$tmp/check" 2>&1
st=$?
[ $st -eq 1 ] && [ "$(field present "$tmp/check")" -eq 20 ] && [ "$(field missing "$tmp/check")" -eq 40 ] &&
    [ "$(ls "$tmp/cache" | wc -l)" -eq 20 ]
check $? "--check counts gather's 40 sets missing, compiles nothing, exits 1 (exit $st: $(cat "$tmp/check"))"

# the last byte of one entry's image flipped: a miss, compiled and rewritten
entry=$(ls "$tmp/cache"/*.cubin | head -n 1)
size=$(wc -c <"$entry")
cp "$entry" "$tmp/before"
printf '\377' | dd of="$entry" bs=1 seek=$((size - 1)) conv=notrunc 2>/dev/null
"$tool" --arch 90 --dir "$tmp/cache" --families recompute >"$tmp/third" 2>&1
st=$?
[ $st -eq 0 ] && [ "$(field present "$tmp/third")" -eq 19 ] && [ "$(field compiled "$tmp/third")" -eq 1 ] &&
    cmp -s "$entry" "$tmp/before"
check $? "a damaged entry is compiled again and rewritten as it was (exit $st: $(cat "$tmp/third"))"

# a directory that cannot be made: the first set fails alone, exit 1
"$tool" --arch 90 --dir /proc/pv-no-such/cache --families recompute >"$tmp/ro" 2>"$tmp/err"
st=$?
[ $st -eq 1 ] && [ "$(field failed "$tmp/ro")" -eq 1 ] && [ "$(field compiled "$tmp/ro")" -eq 0 ] &&
    grep -q "cannot be written" "$tmp/err"
check $? "a cache that cannot be written fails after the first set, exit 1 (exit $st: $(cat "$tmp/ro" "$tmp/err"))"

for bad in "" "--arch" "--arch 9x" "--arch 90 --families nosuch" "--arch 90 --jobs 0" "--arch 90 --jobs 4x" "--arch 90 --what"; do
    # shellcheck disable=SC2086
    "$tool" $bad >/dev/null 2>"$tmp/err"
    st=$?
    [ $st -eq 2 ] && grep -q "^usage:" "$tmp/err"
    check $? "'$bad' is refused with the usage (exit $st)"
done
tap_done
