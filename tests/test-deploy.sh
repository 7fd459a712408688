#!/bin/sh
# deploy/run-replicas end to end on the loopback: three pensieve-serve
# replicas of the synthetic model behind nginx with consistent hashing on
# X-Session-Id. The checks are tests/deploy-client.py's: sessions stick to
# one replica and find their history cached; one replica is killed with
# SIGKILL mid-run and only the requests in flight on it fail, with a 502 a
# client can retry; its sessions move to the others, the rest stay; a second
# replica killed while idle costs no request; every answer equals that of a
# single pensieve-serve that never died (greedy, token ids). Then:
# run-replicas stops everything on SIGTERM, and by itself after --lifetime.
# Skips without nginx or python3. Prints TAP.
set -u
top_builddir=${top_builddir:-.}
serve=${PV_SERVE:-$top_builddir/apps/pensieve-serve}
here=$(dirname "$0")
run_replicas=$here/../deploy/run-replicas
client=$here/deploy-client.py
. "$here/tap.sh"

need_program "$serve"
nginx=${PV_NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
if [ ! -x "$nginx" ]; then
    echo "1..0 # SKIP nginx is not installed (Debian: apt-get install nginx; scripts/install-deps)"
    exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP python3 is not installed"
    exit 0
fi
export PV_NGINX="$nginx"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/pv-test-deploy.XXXXXX") || exit 99
pid=
rr=

# If this script dies where no trap runs (SIGKILL), a watchdog stops the
# reference server and run-replicas (which stops its own) within seconds.
(
    s=
    trap '[ -n "$s" ] && kill "$s" 2>/dev/null && wait "$s"; exit 0' TERM
    while kill -0 $$ 2>/dev/null; do
        sleep 1 &
        s=$!
        wait $s
    done
    for f in "$tmp/rr.pid" "$tmp/ref.pid"; do
        [ -s "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null
    done
    sleep 12
    rm -rf "$tmp"
) </dev/null >/dev/null 2>&1 &
watchdog=$!

. "$here/serve-start.sh"

# stop_rr: SIGTERM to run-replicas, SIGKILL after 15 s; sets rr_rc.
stop_rr() {
    rr_rc=0
    [ -n "$rr" ] || return 0
    kill -TERM "$rr" 2>/dev/null
    i=0
    while kill -0 "$rr" 2>/dev/null && [ $i -lt 150 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -KILL "$rr" 2>/dev/null
    wait "$rr"
    rr_rc=$?
    rr=
}

# leftovers DIR: the processes of a run-replicas run (pid files in DIR)
# still alive, as "name:pid ..."; empty when none.
leftovers() {
    for f in "$1"/replica-*.pid "$1"/nginx/nginx.pid; do
        [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && printf '%s:%s ' "$(basename "$f" .pid)" "$(cat "$f")"
    done
}

# Last resort (a failed check, a signal): stop what the pid files name;
# SIGTERM first, so that nginx's master takes its worker with it.
cleanup() {
    kill "$watchdog" 2>/dev/null && wait "$watchdog" 2>/dev/null
    stop_rr
    stop_server
    left=$(leftovers "$tmp/dep")$(leftovers "$tmp/life")
    if [ -n "$left" ]; then
        for p in $left; do kill -TERM "${p#*:}" 2>/dev/null; done
        sleep 2
        for p in $left; do kill -KILL "${p#*:}" 2>/dev/null; done
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 141' PIPE
trap 'exit 130' INT
trap 'exit 143' TERM

# One thread a server: four of them share the machine's cores. Nothing of
# the test goes through a proxy the environment names.
export OMP_NUM_THREADS=1
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY

# wait_url FILE PID: up to 20 s for run-replicas (PID) to print its URL.
wait_url() {
    i=0
    while [ $i -lt 200 ]; do
        grep -q '^http://127\.0\.0\.1:[0-9]*$' "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# The reference: one server that never dies.
start_server
check $? "the reference pensieve-serve listens (${port:-none})"
echo "$pid" >"$tmp/ref.pid"

# The deployment: 3 replicas, consistent hashing. The lifetime is a safety
# net: the test stops it long before.
"$run_replicas" -n 3 --dir "$tmp/dep" --lifetime 60 --serve "$serve" --synthetic \
    >"$tmp/rr.out" 2>"$tmp/rr.err" &
rr=$!
echo "$rr" >"$tmp/rr.pid"
wait_url "$tmp/rr.out" "$rr"
check $? "run-replicas starts 3 replicas and nginx, and prints the balancer's URL ($(head -n 1 "$tmp/rr.out"))"
if [ -n "$port" ] && [ -s "$tmp/dep/url" ]; then
    timeout 45 python3 "$client" --dir "$tmp/dep" --ref-port "$port" --first $((n + 1)) \
        >"$tmp/client.out" 2>"$tmp/client.err"
    crc=$?
    cat "$tmp/client.out"
    sed 's/^/# /' "$tmp/client.err"
    checks=$(grep -c -E '^(not )?ok [0-9]+ ' "$tmp/client.out")
    n=$((n + checks))
    [ "$crc" -eq 0 ] || fails=$((fails + 1))
    check $((checks > 0 ? crc : 1)) "the client's checks pass (exit $crc)"
    if [ "$crc" -ne 0 ]; then
        echo "# run-replicas:"
        sed 's/^/#   /' "$tmp/rr.err"
        echo "# nginx's access log:"
        sed 's/^/#   /' "$tmp/dep/nginx/access.log"
    fi
else
    sed 's/^/# /' "$tmp/rr.err"
    skip "the deployment checks" "run-replicas or the reference did not start"
fi

# SIGTERM stops nginx and the replicas (the killed one is already gone).
stop_rr
left=$(leftovers "$tmp/dep")
[ "$rr_rc" -eq 143 ] && [ -z "$left" ]
check $? "run-replicas stops on SIGTERM (status $rr_rc), nothing of it left running (${left:-none})"
grep -q "replica [0-9] (port [0-9]*) exited with status 137" "$tmp/rr.err"
check $? "run-replicas reported the killed replica"

# --lifetime: one replica, gone by itself after 1 s.
"$run_replicas" -n 1 --dir "$tmp/life" --lifetime 1 --serve "$serve" --synthetic \
    >"$tmp/life.out" 2>"$tmp/life.err" &
rr=$!
echo "$rr" >"$tmp/rr.pid"
wait_url "$tmp/life.out" "$rr"
up=$?
i=0
while kill -0 "$rr" 2>/dev/null && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
if kill -0 "$rr" 2>/dev/null; then
    life_rc=running
    stop_rr
else
    wait "$rr"
    life_rc=$?
    rr=
fi
left=$(leftovers "$tmp/life")
[ $up -eq 0 ] && [ "$life_rc" = 0 ] && [ -z "$left" ]
check $? "run-replicas --lifetime 1 stops by itself with status 0 ($life_rc), nothing left running (${left:-none})"

stop_server
tap_done
