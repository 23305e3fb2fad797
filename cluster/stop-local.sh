#!/usr/bin/env bash
# Stop the processes started by cluster/start-local.sh.
set -u
[ -f dl1-cluster.pids ] || exit 0
while read -r pid; do kill "$pid" 2>/dev/null || true; done < dl1-cluster.pids
rm -f dl1-cluster.pids
