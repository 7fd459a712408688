# The server a test starts and stops: source this, with $serve and $tmp set.

# start_server ARGS...: starts $serve --synthetic on an ephemeral loopback
# port with ARGS, its log in $tmp/server.log; waits up to 20 s for the port
# file (a whole line, written once the server listens); sets pid and port.
# Returns 1, the log shown as TAP comments, when the server did not start.
start_server() {
    rm -f "$tmp/port"
    "$serve" --synthetic --port 0 --port-file "$tmp/port" "$@" >"$tmp/server.log" 2>&1 &
    pid=$!
    port=
    i=0
    while [ $i -lt 200 ]; do
        if [ -s "$tmp/port" ] && [ "$(wc -l <"$tmp/port")" -ge 1 ]; then
            port=$(head -n 1 "$tmp/port")
            break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
        i=$((i + 1))
    done
    case $port in
    '' | *[!0-9]*) port= ; sed 's/^/# /' "$tmp/server.log"; return 1 ;;
    esac
}

# stop_server: SIGTERM, then SIGKILL if it is still up after 15 s; sets rc
# to its exit status.
stop_server() {
    rc=0
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 150 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    pid=
}
