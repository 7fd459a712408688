#!/bin/sh
# pensieve-serve against the official openai Python client
# (tests/serve-openai-client.py): the synthetic model served on an ephemeral
# port, once without an API key and once with one. Skips when the server is
# not built or the openai package is absent; PV_OPENAI_VENV names a
# virtualenv that has it (.ci/run makes one). Prints TAP.
set -u

serve=${PV_SERVE:-./apps/pensieve-serve}
client="$(dirname "$0")/serve-openai-client.py"

if [ ! -x "$serve" ]; then
    echo "1..0 # SKIP $serve not built"
    exit 0
fi
if [ -n "${PV_OPENAI_VENV:-}" ]; then
    # Named on purpose (CI): a venv without the package is an error, not a skip.
    py="$PV_OPENAI_VENV/bin/python"
    if ! "$py" -c 'import openai' 2>/dev/null; then
        echo "Bail out! PV_OPENAI_VENV=$PV_OPENAI_VENV: $py cannot import openai"
        exit 1
    fi
elif python3 -c 'import openai' 2>/dev/null; then
    py=python3
else
    echo "1..0 # SKIP the openai Python package is not installed (set PV_OPENAI_VENV; .ci/run creates one)"
    exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-serve-openai.XXXXXX") || exit 99
pid=

. "$(dirname "$0")/serve-start.sh"
trap 'stop_server; rm -rf "$tmp"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
# Piped into a reader that quits (head): the EXIT trap still stops the server.
trap 'exit 141' PIPE

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

# One thread: the synthetic model is tiny, and OpenMP threads spinning on
# shared cores only slow the test down.
export OMP_NUM_THREADS=1


# run LABEL [API-KEY]: the server and the client once.
run() {
    label=$1
    key=${2:-}
    if [ -n "$key" ]; then
        start_server --api-key "$key"
    else
        start_server
    fi
    ok $? "pensieve-serve ($label) listens on an ephemeral port (${port:-none})"
    if [ -z "$port" ]; then
        diag "$tmp/server.log"
        stop_server
        return
    fi
    if [ -n "$key" ]; then
        "$py" "$client" --port "$port" --label "$label" --first $((n + 1)) --api-key "$key" \
            >"$tmp/client.out" 2>"$tmp/client.err"
    else
        "$py" "$client" --port "$port" --label "$label" --first $((n + 1)) \
            >"$tmp/client.out" 2>"$tmp/client.err"
    fi
    crc=$?
    # Its checks are numbered from n + 1 on: pass them through and count them.
    cat "$tmp/client.out"
    diag "$tmp/client.err"
    checks=$(grep -c -E '^(not )?ok [0-9]+ ' "$tmp/client.out")
    n=$((n + checks))
    [ "$crc" -eq 0 ] || failed=1
    ok $((checks > 0 ? crc : 1)) "the openai client's checks pass ($label, exit $crc)"
    stop_server
    ok $rc "pensieve-serve ($label) stops on SIGTERM with status 0 (status $rc)"
    if [ "$crc" -ne 0 ] || [ "$rc" -ne 0 ]; then
        diag "$tmp/server.log"
    fi
}

run "no API key"
run "API key" "pv-test-key-$$"

echo "1..$n"
exit $failed
