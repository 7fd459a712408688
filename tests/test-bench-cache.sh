#!/bin/sh
# bench-cache out of the box (issue 29): its default sizes fit this
# machine (budgets and memory checked as the run would, without running),
# --help says how the budgets are set, a small size runs end to end, and
# a size the machine cannot hold is refused before anything runs.
set -u
top_builddir=${top_builddir:-.}
bench=$top_builddir/bench/bench-cache
tmp=$(mktemp -d /tmp/pv-test-bench-cache-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/tap.sh"

"$bench" --plan >"$tmp/plan" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && grep -q '^1000 sessions: 1920000 records; budgets' "$tmp/plan" &&
    grep -q '^10000 sessions: 19200000 records; budgets' "$tmp/plan"
check $? "the default sizes fit this machine (exit $rc: $(cat "$tmp/plan" "$tmp/err" | tr '\n' ' '))"

"$bench" --help >"$tmp/help" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q 'nominal 64-byte slots' "$tmp/help" && grep -q 'default 1000 and 10000' "$tmp/help"
check $? "--help says how the budgets are counted and the default sizes (exit $rc)"

"$bench" --sessions 20 --repeats 1 --json >"$tmp/run.json" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && grep -q '"sessions": 20, "records": 38400' "$tmp/run.json"
check $? "a small size runs end to end (exit $rc: $(cat "$tmp/err"))"

# 100000 sessions take about 7 GiB: a machine with less is told so at once;
# with more, the plan passes. Either way nothing runs (no table).
pages=$(getconf _PHYS_PAGES) page=$(getconf PAGESIZE)
"$bench" --plan --sessions 100000 >"$tmp/big" 2>"$tmp/err"
rc=$?
if [ $((pages / 1024 * page / 1024 / 1024)) -lt 8 ]; then
    [ $rc -eq 1 ] && grep -q 'ask for fewer with --sessions' "$tmp/err"
else
    [ $rc -eq 0 ] && grep -q '^100000 sessions: 192000000 records' "$tmp/big"
fi
check $? "a size is checked against the machine's memory (exit $rc)"
! grep -q 'store/s' "$tmp/big"
check $? "--plan runs nothing"
tap_done
