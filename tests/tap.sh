# TAP for the shell tests: source it, call check STATUS MESSAGE per test
# (STATUS 0 is a pass) or skip MESSAGE WHY, and end with `tap_done`, whose
# status is the script's. need_program PATH skips the whole script where
# PATH is not built.
n=0
fails=0
check() { # check COND-STATUS MESSAGE
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fails=$((fails + 1)); fi
}
skip() { # skip MESSAGE WHY
    n=$((n + 1))
    echo "ok $n - $1 # SKIP $2"
}
need_program() { # need_program PATH: the whole script skips unless PATH is built
    [ -x "$1" ] && return 0
    echo "1..0 # SKIP $1 not built"
    exit 0
}
tap_done() {
    echo "1..$n"
    [ $fails -eq 0 ]
}
