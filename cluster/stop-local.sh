#!/usr/bin/env bash
# Stop the processes started by cluster/start-local.sh, cleanly: the workers first, one at
# a time (SIGTERM: its nanny closes the worker, which says goodbye to the still running
# scheduler; the scheduler then tells the other workers that it left, so none of them may
# be closing meanwhile), then the scheduler. Each step waits at most DL1_STOP_TIMEOUT
# seconds (default 30) for its process to exit; whatever is still alive after that is
# killed (SIGKILL), and named.
# No CommClosedError tracebacks or "still alive ... killing" warnings in the logs.
set -u
pids=dl1-cluster.pids
[ -f "$pids" ] || exit 0
timeout="${DL1_STOP_TIMEOUT:-30}"
[[ "$timeout" =~ ^[0-9]{1,4}$ ]] || { echo "DL1_STOP_TIMEOUT must be seconds; got '$timeout'" >&2; exit 2; }
scheduler=$(head -n 1 "$pids")
workers=$(tail -n +2 "$pids")

alive() {  # the given pids still running
    for p in "$@"; do kill -0 "$p" 2>/dev/null && echo "$p"; done
}

stop() {  # SIGTERM the pids, wait (bounded) for them to exit, SIGKILL the rest
    [ $# -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null
    for _ in $(seq $((timeout * 10))); do
        [ -z "$(alive "$@")" ] && return 0
        sleep 0.1
    done
    left=$(alive "$@")
    if [ -n "$left" ]; then
        echo "still running after ${timeout} s, killed: $left" >&2
        kill -KILL $left 2>/dev/null
    fi
}

for worker in $workers; do
    stop "$worker"
done
stop "$scheduler"
rm -f "$pids"
