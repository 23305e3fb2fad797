#!/usr/bin/env bash
# Stop the single-node SLURM of cluster/slurm/start-single-node.sh: cancel the jobs left, then
# stop slurmd and slurmctld (by their pid files), then the munged it started. Bounded waits.
set -uo pipefail
state="${DL1_SLURM_STATE:-/var/lib/dl1-slurm}"
command -v scancel > /dev/null && timeout 10 scancel --full --partition debug 2> /dev/null
stop() {  # pid file, name
    [ -s "$1" ] || return 0
    pid="$(cat "$1")"
    kill "$pid" 2> /dev/null || return 0
    for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || return 0; sleep 0.1; done
    echo "$2 (pid $pid) still running after 10 s" >&2
}
stop "$state/slurmd.pid" slurmd
stop "$state/slurmctld.pid" slurmctld
stop /run/munge/munged.pid munged
