#!/usr/bin/env bash
# Start a Dask scheduler and N single-threaded workers on 127.0.0.1 (default N=2).
# The scheduler's address is written to dl1-scheduler.json; stop with cluster/stop-local.sh.
set -euo pipefail
n="${1:-2}"
file="${DL1_SCHEDULER_FILE:-dl1-scheduler.json}"
rm -f "$file"
# dl1 places its tasks next to their data itself: no work stealing (see dl1/runtime/localcluster.py)
DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING="${DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING:-False}" \
    dask scheduler --host 127.0.0.1 --port 0 --no-dashboard --scheduler-file "$file" \
    > dl1-scheduler.log 2>&1 &
echo $! > dl1-cluster.pids
for _ in $(seq 600); do [ -s "$file" ] && break; sleep 0.1; done
[ -s "$file" ] || { echo "scheduler did not start; see dl1-scheduler.log" >&2; exit 1; }
# large freed arrays go back to the system (see dl1/runtime/localcluster.py); glibc reads it at start
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-65536}"
# no statistical profiler: its 1,000 s of call trees grow a busy worker's memory (ibid.)
export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED="${DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED:-False}"
for i in $(seq "$n"); do
    # --preload dl1.runtime.worker: freed heap memory goes back to the system (see dl1/runtime/worker.py)
    dask worker --scheduler-file "$file" --nthreads 1 --no-dashboard --name "w$i" \
        --preload dl1.runtime.worker \
        > "dl1-worker-$i.log" 2>&1 &
    echo $! >> dl1-cluster.pids
done
echo "scheduler: $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['address'])" "$file")"
