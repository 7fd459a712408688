#!/bin/sh
# pensieve-gguf synth, the command that writes the real-shape models on a
# machine where nothing can be downloaded: no options is the tiny model;
# --shape, --layers, --type and --seed reach the file and --threads does
# not change it; bad options are refused with status 2 naming them.
# Prints TAP.
set -u

tool=${PV_GGUF_TOOL:-./models/pensieve-gguf}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-synth-cli.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
. "$(dirname "$0")/tap.sh"

need_program "$tool"

"$tool" synth "$tmp/default.gguf" > "$tmp/out" 2>&1
st=$?
"$tool" synth "$tmp/tiny.gguf" --shape tiny --type mixed --seed 42 --layers 2 > /dev/null 2>&1
cmp -s "$tmp/default.gguf" "$tmp/tiny.gguf" && [ $st -eq 0 ] &&
    [ "$(wc -c < "$tmp/default.gguf")" -eq 104928 ] && grep -q "104928 bytes" "$tmp/out"
check $? "no options: the tiny model (104928 bytes), as --shape tiny --type mixed --seed 42 --layers 2"

"$tool" synth "$tmp/a.gguf" --shape smollm2-135m --layers 1 --type q8_0 --seed 7 --threads 1 \
    > /dev/null 2>&1 &&
    "$tool" synth "$tmp/b.gguf" --threads 3 --seed 7 --type q8_0 --layers 1 --shape smollm2-135m \
        > /dev/null 2>&1 &&
    cmp -s "$tmp/a.gguf" "$tmp/b.gguf"
check $? "smollm2-135m, 1 layer, Q8_0, seed 7: the same bytes with 1 and 3 threads, options in any order"

"$tool" info "$tmp/a.gguf" > "$tmp/info" 2>&1
grep -q "vocab 49152, ctx 8192, embd 576, layers 1, heads 9, kv heads 3, ffn 1536" "$tmp/info" &&
    grep -Eq "^  Q8_0 +8 " "$tmp/info" && grep -Eq "^  F32 +3 " "$tmp/info"
check $? "info reads it back: SmolLM2's widths, 1 layer, 8 Q8_0 matrices and 3 F32 norms"

"$tool" synth "$tmp/c.gguf" --shape smollm2-135m --layers 1 --type q8_0 --seed 8 > /dev/null 2>&1 &&
    ! cmp -s "$tmp/a.gguf" "$tmp/c.gguf"
check $? "--seed 8 gives another file"

for bad in "--type q5_0" "--layers 0" "--threads" "--seed -1" "--bogus 1" "--shape llama3-80b"; do
    # shellcheck disable=SC2086 # the option and its value are two words
    "$tool" synth "$tmp/bad.gguf" $bad > "$tmp/err" 2>&1
    st=$?
    [ $st -eq 2 ] && grep -q -- "${bad#* }" "$tmp/err" && [ ! -e "$tmp/bad.gguf" ]
    check $? "'$bad' refused with status 2, named ($(head -c 100 "$tmp/err" | tr '\n' ' '))"
done

tap_done
