#!/bin/sh
# pensieve-serve against a hostile or careless client (issue 29, items
# 1-8): bodies refused at their headers and spooled to disk, --max-sessions
# for imports, keyed namespaces, NUL in ids, stalled and departed clients,
# content types and Host names, a FIFO in --state-dir, half-closed clients.
# On the synthetic model over loopback; the checks are in
# serve-attack-client.py. Prints TAP.
set -u
top_builddir=${top_builddir:-.}
serve=$top_builddir/apps/pensieve-serve
if [ ! -x "$serve" ]; then
    echo "1..0 # SKIP $serve not built"
    exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP no python3"
    exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pv-test-serve-attack.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
export OMP_NUM_THREADS=1
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY
# The client stops every server it starts, also when a check raises.
python3 "$(dirname "$0")/serve-attack-client.py" "$serve" "$tmp"
