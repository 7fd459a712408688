#!/bin/sh
# pensieve-chat end to end through --script on the synthetic model: several
# conversations side by side under device and host budgets small enough to
# swap, an answer and a status line per turn, reuse of a returning
# conversation's KV, /cache (a line per session; /cache NAME: one session's
# grid) and /stats, the same answers as stateless mode,
# and bad options refused with a message naming them. Prints TAP.
set -u

chat=${PV_CHAT:-./apps/pensieve-chat}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-chat.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

n=0
failed=0
ok() { # ok CONDITION-STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $n - $2"
    else
        echo "not ok $n - $2"
        failed=1
    fi
}
diag() { sed 's/^/# /' "$@"; }

if [ ! -x "$chat" ]; then
    echo "1..0 # SKIP $chat not built"
    exit 0
fi

# Small budgets: a synthetic slot (32 tokens of one layer's K and V) is
# 8 KiB, so 192K holds 24 slots and 64K 8: four conversations cannot all
# stay on the device nor all fit on the host, so chunks are swapped out,
# dropped and recovered.
budget="--device-mem 192K --host-mem 64K"
# One thread: the synthetic model is tiny, and OpenMP threads spinning on
# shared cores only slow the test down.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Without prefix sharing: the accounting checks below follow each session's
# own records (sharing is checked on its own further down).
common="--synthetic -n 8 $budget --no-prefix-sharing"

cat >"$tmp/chat.txt" <<'EOF'
/switch alice
Hello, I am Alice. Tell me about caches.
/switch bob
Hi, Bob here. What is a GPU?
/switch carol
Carol: please count to five.
/switch dave
Dave asks about tiered memory.
/switch alice
Alice again: and what about swapping?
/switch bob
Bob again: thanks, and host memory?
/switch alice
Alice once more.
Alice right away again.
/cache
/cache alice
/stats
/new
A fresh conversation.
/end
/help
/quit
This line comes after /quit and is never sent.
EOF
turns=9

# The status line after each answer (chat-view.c); fields 2..6 of the
# split are session, device, host, recomputed, new, generated.
status_re='^\[[^]]*\] reused [0-9]* device \+ [0-9]* host \| recomputed [0-9]* \| new [0-9]* \| prefill [0-9.]* ms \| decode [0-9.-]* tokens/s \([0-9]* tokens, [a-z]*'
statuses() {
    grep -aE "$status_re" "$1" |
        sed -E 's/^\[([^]]*)\] reused ([0-9]*) device \+ ([0-9]*) host \| recomputed ([0-9]*) \| new ([0-9]*) .*\(([0-9]*) tokens.*/\1 \2 \3 \4 \5 \6/'
}

"$chat" $common --script "$tmp/chat.txt" >"$tmp/out" 2>"$tmp/err"
rc=$?
ok $rc "a scripted chat over four conversations exits 0"
[ $rc -eq 0 ] || diag "$tmp/err"

statuses "$tmp/out" >"$tmp/status"
got=$(wc -l <"$tmp/status")
[ "$got" -eq $turns ]
ok $? "a status line per turn ($got of $turns)"
[ "$got" -eq $turns ] || diag "$tmp/out"

awk '$6 == 0 { bad = 1 } END { exit bad }' "$tmp/status"
ok $? "every turn generated an answer"

# Chained decode steps (the host reads each token one step behind) say
# the same: answers and accounting, everything but the timings.
untimed() {
    sed -E 's/(prefill|decode) [0-9.-]+ (ms|tokens\/s)/\1 T/g; s/[0-9.]+ (ms|s)\b/T/g; s/[0-9.]+%/P/g;
            s/\([0-9]+ chained, [0-9]+ rows discarded\)/(chained)/' "$1"
}
"$chat" $common --decode-steps 4 --script "$tmp/chat.txt" >"$tmp/out4" 2>"$tmp/err4"
rc=$?
untimed "$tmp/out" >"$tmp/out.u"
untimed "$tmp/out4" >"$tmp/out4.u"
[ $rc -eq 0 ] && cmp -s "$tmp/out.u" "$tmp/out4.u"
ok $? "--decode-steps 4 gives the same chat, answers and accounting, as 1"
grep -q 'iterations [0-9]* (0 chained, 0 rows discarded)' "$tmp/out" &&
    grep -Eq 'iterations [0-9]+ \([1-9][0-9]* chained, [0-9]+ rows discarded\)' "$tmp/out4"
ok $? "the chains ran with --decode-steps 4, none with the CPU backend's default"
[ $rc -eq 0 ] || diag "$tmp/err4"
cmp -s "$tmp/out.u" "$tmp/out4.u" || diff "$tmp/out.u" "$tmp/out4.u" | head -20 | sed 's/^/# /'

# A conversation's first turn has no history; every later one reuses or
# recomputes it, and the turn right after its own previous one finds it.
awk '{ if (seen[$1]++) { if ($2 + $3 + $4 == 0) bad = 1 } else if ($2 + $3 + $4 != 0) bad = 1 }
     END { exit bad }' "$tmp/status"
ok $? "first turns start empty, later turns account for their history"
awk '$1 == "alice" { last = $2 + $3 } END { exit !(last > 0) }' "$tmp/status"
ok $? "alice's back-to-back turn reuses KV from device or host"
awk '$1 == "alice" && ++k > 1 && $2 + $3 > 0 { r = 1 } $1 == "bob" && ++b > 1 && $2 + $3 + $4 > 0 { s = 1 }
     END { exit !(r && s) }' "$tmp/status"
ok $? "returning conversations (alice, bob) find their history again"

grep -q '^legend: .*device.*host.*dropped' "$tmp/out" &&
    grep -Eq '^> alice: [0-9]+ tokens, [0-9]+ chunks' "$tmp/out" &&
    grep -Eq '^  layer  1 [#*+. ]+$' "$tmp/out"
ok $? "/cache alice draws a legend and a row of tiers per layer"
# /cache: one line per session (the four that had turns), each with its
# tokens, chunks, records per tier adding up to chunks x layers, and a bar
# of 20 cells whose shares follow the records.
layers=$(grep -Ec '^  layer +[0-9]+ ' "$tmp/out")
sed -n '/^alice> \/cache$/,/^alice> /p' "$tmp/out" >"$tmp/summary"
rows=$(grep -Ec '^[> ] [a-z]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+  \[[#*+. ]{20}\]$' "$tmp/summary")
[ "$rows" -eq 4 ] && grep -q '^> alice ' "$tmp/summary" && [ "$(wc -l <"$tmp/summary")" -le 10 ] &&
    grep -q '^/cache NAME draws' "$tmp/summary"
ok $? "/cache is a line per session ($rows of 4 rows; $layers layers)"
[ "$rows" -eq 4 ] || diag "$tmp/summary"
awk -v L="$layers" '/ \[[#*+. ]*\]$/ {
         rows++
         sub(/^> /, ""); n = split($0, f, " "); if (n < 7) bad = 1
         c = f[3]; d = f[4]; h = f[5]; x = f[6]; t = d + h + x
         if (t != c * L || t == 0) bad = 1
         bar = $0; sub(/.*\[/, "", bar); sub(/\].*/, "", bar)
         nd = gsub(/#/, "", bar); nh = gsub(/[*+]/, "", bar); nx = gsub(/\./, "", bar)
         if (nd + nh + nx != 20) bad = 1
         if (nd - d * 20 / t >= 1 || d * 20 / t - nd >= 1.5) bad = 1
         if (nh - h * 20 / t >= 1 || h * 20 / t - nh >= 1.5) bad = 1
         if (nx - x * 20 / t >= 1 || x * 20 / t - nx >= 1.5) bad = 1 }
     END { exit bad || rows != 4 }' "$tmp/summary"
ok $? "each session's records add up to chunks x layers and its bar follows them"
awk '/^alice> \/cache alice$/ { g = 1; next } /^alice> / { g = 0 } g && /^  layer/ { n++ }
     g && /^[> ] [a-z]+ +[0-9]+ +[0-9]+ / { other = 1 } END { exit !(n > 0 && !other) }' "$tmp/out"
ok $? "/cache NAME draws that session alone"
# Every session's picture agrees with its record counts: rows of one cell
# per chunk, '#' device, '+' and '*' host ('*' with a device copy), '.' dropped.
awk 'function check() { if (name != "" && (d != D || h + s != H || s != S || x != X)) bad = 1 }
     /^(> )?[^ ]+: [0-9]+ tokens, [0-9]+ chunks \(0 shared\); / {
         check(); seen++; name = $0; sub(/^> /, "", name); sub(/:.*/, "", name)
         C = $0; sub(/ chunks \(.*/, "", C); sub(/.* /, "", C)
         D = $0; sub(/ device,.*/, "", D); sub(/.* /, "", D)
         H = $0; sub(/ host .*/, "", H); sub(/.* /, "", H)
         S = $0; sub(/ with a device copy.*/, "", S); sub(/.*\(/, "", S)
         X = $0; sub(/ dropped$/, "", X); sub(/.* /, "", X)
         d = h = s = x = 0; next }
     name != "" && /^  layer +[0-9]+ / {
         row = $0; sub(/^  layer +[0-9]+ /, "", row)
         if (length(row) != C) bad = 1
         d += gsub(/#/, "", row); s += gsub(/\*/, "", row); h += gsub(/\+/, "", row); x += gsub(/\./, "", row)
         next }
     /^  layer|^ +chunk/ { next }
     { check(); name = "" }
     END { check(); exit bad || !seen }' "$tmp/out"
ok $? "/cache's cells agree with each session's record counts"
grep -q '\[' "$tmp/out" && ! grep -q "$(printf '\033')" "$tmp/out"
ok $? "no colour codes when stdout is not a terminal"

grep -q '^engine (pensieve mode)' "$tmp/out" && grep -q '^cache (pensieve policy)' "$tmp/out"
ok $? "/stats prints the engine and the cache"
moved=$(sed -nE 's/.*swapped in [0-9]+, swapped out ([0-9]+), dropped ([0-9]+).*/\1 \2/p' "$tmp/out")
echo "${moved:-0 0}" | awk '{ exit !($1 > 0 && $2 > 0) }' &&
    awk '$4 > 0 { r = 1 } END { exit !r }' "$tmp/status"
ok $? "the small budgets swap out and drop chunks (${moved:-none}), and a turn recovers them"
grep -q '^ended chat-' "$tmp/out" && grep -q '^/switch NAME\|  /switch NAME' "$tmp/out"
ok $? "/end ends the conversation; /help lists the commands"
! grep -q 'never sent' "$tmp/status" && [ "$(grep -c '^chat-[0-9]*> This line' "$tmp/out")" -eq 0 ]
ok $? "/quit stops the script"

# The same conversations in stateless mode: the same answers (greedy), every
# later turn recomputed instead of reused.
grep -v '^/\(cache\|stats\|help\|end\|new\|quit\)' "$tmp/chat.txt" | grep -v 'never sent' >"$tmp/turns.txt"
"$chat" $common --script "$tmp/turns.txt" >"$tmp/pensieve" 2>&1 &&
    "$chat" --synthetic -n 8 --mode stateless --script "$tmp/turns.txt" >"$tmp/stateless" 2>&1
ok $? "the turns run in pensieve and stateless modes"
grep -aEv "$status_re" "$tmp/pensieve" >"$tmp/a"
grep -aEv "$status_re" "$tmp/stateless" >"$tmp/b"
cmp -s "$tmp/a" "$tmp/b"
ok $? "stateless mode gives the same answers"
cmp -s "$tmp/a" "$tmp/b" || diff "$tmp/a" "$tmp/b" | diag
statuses "$tmp/stateless" | awk 'seen[$1]++ && ($2 + $3 > 0 || $4 == 0) { bad = 1 } END { exit bad }'
ok $? "stateless mode recomputes every later turn's history"
# Prefix sharing (on by default): every conversation starts with the chat
# template's default system turn, so later conversations' first turns
# read its full chunks from the first one's instead of computing them; the
# answers stay the same and /cache marks the shared chunks.
"$chat" --synthetic -n 8 $budget --script "$tmp/turns.txt" >"$tmp/shared" 2>&1
ok $? "the turns run with prefix sharing"
grep -aEv "$status_re" "$tmp/shared" >"$tmp/c"
cmp -s "$tmp/a" "$tmp/c"
ok $? "prefix sharing gives the same answers"
cmp -s "$tmp/a" "$tmp/c" || diff "$tmp/a" "$tmp/c" | diag
statuses "$tmp/shared" | awk '!seen[$1]++ { if (n++ == 0) first = $2 + $3 + $4; else if ($2 > 0) later++ }
                              END { exit !(first == 0 && later == n - 1) }'
ok $? "the first conversation's first turn reads nothing, the others' read the shared system turn"
printf 'Hello.\n/new\nHi.\n/cache\n/cache chat-2\n' >"$tmp/sh.txt"
"$chat" --synthetic -n 4 --script "$tmp/sh.txt" >"$tmp/out" 2>"$tmp/err" &&
    grep -Eq '^shared prefixes: [1-9][0-9]* chunks held once for [0-9]+ session links, .* saved$' "$tmp/out" &&
    grep -Eq '^  shared   =+  \(chunks 0-[0-9]+ held once' "$tmp/out" &&
    grep -Eq '^> chat-2: [0-9]+ tokens, [0-9]+ chunks \([1-9][0-9]* shared\)' "$tmp/out"
ok $? "/cache sums the shared chunks and /cache NAME marks them"
# /cache in stateless mode: nothing is kept between turns, and it says so
# instead of failing the script.
printf 'Hello.\n/cache\n/cache chat-1\n' >"$tmp/sl.txt"
"$chat" --synthetic -n 4 --mode stateless --script "$tmp/sl.txt" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && grep -q '^stateless mode keeps no KV between turns' "$tmp/out" &&
    grep -Eq '^> chat-1 +[0-9]+ +0 +0 +0 +0  \[ {20}\] no KV kept$' "$tmp/out" &&
    grep -Eq '^> chat-1: [0-9]+ tokens, no KV kept' "$tmp/out" && ! grep -q 'not found' "$tmp/err"
ok $? "/cache in stateless mode shows an empty cache and says why (exit $rc)"
[ $rc -eq 0 ] || diag "$tmp/err"

# gpu-only mode under the small device budget: no host tier, so evicted
# chunks are dropped and recomputed, and the answers are still the same.
"$chat" --synthetic -n 8 --mode gpu-only --device-mem 192K --no-prefix-sharing --script "$tmp/turns.txt" >"$tmp/gpu-only" 2>&1
ok $? "the turns run in gpu-only mode"
grep -aEv "$status_re" "$tmp/gpu-only" >"$tmp/c"
cmp -s "$tmp/c" "$tmp/b"
ok $? "gpu-only mode gives the same answers"
cmp -s "$tmp/c" "$tmp/b" || diff "$tmp/c" "$tmp/b" | diag
statuses "$tmp/gpu-only" | awk '$3 > 0 { bad = 1 } $4 > 0 { r = 1 } END { exit bad || !r }'
ok $? "gpu-only mode reuses nothing from a host tier and recomputes dropped history"

# A conversation that outgrows the device pool: 96K holds 12 synthetic
# slots, 6 chunks of 32 tokens in each of the 2 layers. The second turn's
# history, prompt and 60 tokens to generate cannot fit: it is refused
# before anything is generated, naming the budget that would fit, and the
# chat goes on; with that budget both turns run.
printf 'Hello, tell me a long story about the sea.\nAnd then what happened next?\n/stats\n' >"$tmp/grow.txt"
"$chat" --synthetic -n 60 --device-mem 96K --script "$tmp/grow.txt" >"$tmp/out" 2>"$tmp/err"
rc=$?
fit=$(sed -n 's/.*(--device-mem \([0-9]*M\)) would fit it.*/\1/p' "$tmp/err")
[ $rc -eq 1 ] && [ "$(statuses "$tmp/out" | wc -l)" -eq 1 ] &&
    grep -q 'the device pool cannot hold this turn (.*): it needs 8 chunks of 32 tokens in each of 2 layers (16 slots), the pool holds 12 slots' "$tmp/err" &&
    sed -n '/^chat-1> And then/{n;p;}' "$tmp/out" | grep -q '^chat-1> /stats' && [ -n "$fit" ]
ok $? "a turn that outgrows the device pool is refused before it answers, naming --device-mem ${fit:-?} (exit $rc)"
[ $rc -eq 1 ] || diag "$tmp/err"
"$chat" --synthetic -n 60 --device-mem "${fit:-1M}" --script "$tmp/grow.txt" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && [ "$(statuses "$tmp/out" | wc -l)" -eq 2 ]
ok $? "with --device-mem ${fit:-?} both turns run (exit $rc)"

# The device profile: with none, one short line says so and points at
# /tune. /tune fits one in process (quickly on the synthetic model), saves
# it where the engine looks ($PV_PROFILE here) and uses it at once while no
# conversation has started; later it says a restart uses it. The next
# start finds it.
export PV_PROFILE="$tmp/tuned.ini"
printf '/tune\nHello.\n/tune\n/help\n' >"$tmp/tune.txt"
start=$(date +%s)
"$chat" --synthetic -n 4 --script "$tmp/tune.txt" >"$tmp/out" 2>"$tmp/err"
rc=$?
secs=$(($(date +%s) - start))
[ $rc -eq 0 ] && [ "$(sed -n 1p "$tmp/err")" = \
    "pensieve-chat: no tuned profile for this cpu device: default cost model (/tune fits one)" ]
ok $? "with no profile, one short line points at /tune (exit $rc)"
[ $rc -eq 0 ] || diag "$tmp/err"
grep -Eq "^alpha [0-9.e+-]+ s/token, beta [0-9.e+-]+ s, c [0-9.e+-]+ s .*; profile \[cpu: .*\] saved to $tmp/tuned.ini\$" "$tmp/out" &&
    grep -q '^shape = 4,2,16,2$' "$tmp/tuned.ini" && grep -q '^alpha = ' "$tmp/tuned.ini" && [ "$secs" -le 10 ]
ok $? "/tune fits and saves the device's profile ($secs s)"
sed -n '/^chat-1> \/tune$/,/^chat-1> Hello/p' "$tmp/out" | grep -q '^in use now' &&
    [ "$(grep -c "^pensieve-chat: profile $tmp/tuned.ini \[cpu: " "$tmp/err")" -eq 1 ] &&
    [ "$(statuses "$tmp/out" | wc -l)" -eq 1 ]
ok $? "before any conversation, /tune puts the profile in use and the chat goes on"
sed -n '/^chat-1> Hello/,$p' "$tmp/out" | grep -q '^the conversations here keep the cost model they started with: restart'
ok $? "with a conversation, /tune says a restart uses the profile"
grep -q '^  /tune ' "$tmp/out"
ok $? "/help lists /tune"
"$chat" --synthetic --script /dev/null >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "^pensieve-chat: profile $tmp/tuned.ini \[cpu: " "$tmp/err"
ok $? "the next start uses the saved profile, in one line (exit $rc)"
[ $rc -eq 0 ] || diag "$tmp/err"
# On a backend with tuned kernels (OpenCL; PoCL here), /tune keeps the
# kernel sets a pensieve-tune run left in the device's section.
export PV_PROFILE="$tmp/opencl.ini"
ocl="--synthetic --backend opencl --device-mem 1M --host-mem 1M"
printf '/tune\n' >"$tmp/tune1.txt"
if "$chat" $ocl --script "$tmp/tune1.txt" >"$tmp/out" 2>"$tmp/err"; then
    printf 'kernel.gather = PV_WG=128 PV_ITEM_ELEMS=1\n' >>"$tmp/opencl.ini"
    "$chat" $ocl --script "$tmp/tune1.txt" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 0 ] && grep -q '^kernel.gather = PV_WG=128 PV_ITEM_ELEMS=1$' "$tmp/opencl.ini" &&
        [ "$(grep -c '; 1 tuned kernel sets$' "$tmp/err")" -eq 2 ]
    ok $? "/tune keeps the device's tuned kernel sets (exit $rc)"
    [ $rc -eq 0 ] || diag "$tmp/err"
else
    n=$((n + 1))
    echo "ok $n - # SKIP no OpenCL device: $(tail -n 1 "$tmp/err")"
fi
unset PV_PROFILE

# Errors inside a script: reported, the script goes on, the exit status is 1.
printf '/bogus\nhello\n/switch\n' >"$tmp/bad.txt"
"$chat" --synthetic -n 2 --script "$tmp/bad.txt" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "unknown command '/bogus'" "$tmp/err" && grep -q '/switch needs' "$tmp/err" &&
    [ "$(statuses "$tmp/out" | wc -l)" -eq 1 ]
ok $? "a bad command in a script is reported and fails the run (exit $rc)"

# Bad options: nonzero exit and a message naming the option.
refuse() { # refuse WORD-EXPECTED ARGS...
    expect=$1
    shift
    "$chat" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    rc=$?
    [ $rc -ne 0 ] && grep -q -e "$expect" "$tmp/err"
    ok $? "refused: $* (exit $rc)"
    [ $rc -ne 0 ] && grep -q -e "$expect" "$tmp/err" || diag "$tmp/err"
}
refuse '-n/--max-tokens' --synthetic -n ''
refuse '-n/--max-tokens' --synthetic -n abc
refuse '-n/--max-tokens' --synthetic --max-tokens -1
refuse '--device-mem' --synthetic --device-mem ''
refuse '--device-mem' --synthetic --device-mem 12Q
refuse '--host-mem' --synthetic --host-mem 0
refuse '--temperature' --synthetic --temperature ''
refuse '--top-p' --synthetic --top-p 2
refuse '--seed' --synthetic --seed x
refuse '--mode' --synthetic --mode bogus
refuse '--policy' --synthetic --policy bogus
refuse '--kv' --synthetic --kv f8
refuse '--script' --synthetic --script "$tmp/no-such-file"
refuse '--config' --synthetic --config "$tmp/no-such-file"
refuse 'nosuchbackend' --synthetic --backend nosuchbackend
refuse 'unrecognized option' --synthetic --frobnicate
refuse 'engine' --synthetic --device-mem 1K --script /dev/null

echo "1..$n"
exit $failed
