#!/usr/bin/env bash
# Start a Dask scheduler and N single-threaded workers on 127.0.0.1 (default N=2); every
# process listens on 127.0.0.1 only. With DL1_TLS_DIR set (certificates from
# cluster/make-certs.sh) they talk tls://.
# No HTTP is served: Dask's HTTP servers (dashboard, /json/identity.json, /info/logs,
# /metrics...), which start even with --no-dashboard and answer any local user without
# authentication or TLS, get no routes and are closed as they start (dl1.runtime.nohttp).
# DL1_DASHBOARD=PORT serves them on 127.0.0.1 (the dashboard on PORT; 0: any free port).
# dl1's kernels are compiled into numba's cache first (dl1 warm; DL1_WARM=0 skips it).
# The scheduler's address is written to dl1-scheduler.json; stop with cluster/stop-local.sh.
set -euo pipefail
n="${1:-2}"
file="${DL1_SCHEDULER_FILE:-dl1-scheduler.json}"
rm -f "$file"
tls=()
protocol=tcp
if [ -n "${DL1_TLS_DIR:-}" ]; then
    protocol=tls
    tls=(--tls-ca-file "$DL1_TLS_DIR/ca.pem" --tls-cert "$DL1_TLS_DIR/node.pem"
         --tls-key "$DL1_TLS_DIR/node.key")
fi
dashboard="${DL1_DASHBOARD:-}"
if [ -z "$dashboard" ]; then
    export DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES='[]' DASK_DISTRIBUTED__WORKER__HTTP__ROUTES='[]'
    http_scheduler=(--no-dashboard --dashboard-address 127.0.0.1:0 --preload dl1.runtime.nohttp)
    http_worker=(--no-dashboard --dashboard-address 127.0.0.1:0 --preload dl1.runtime.nohttp)
elif [[ "$dashboard" =~ ^[0-9]{1,5}$ ]] && [ "$dashboard" -le 65535 ]; then
    http_scheduler=(--dashboard --dashboard-address "127.0.0.1:$dashboard")
    http_worker=(--no-dashboard --dashboard-address 127.0.0.1:0)
else
    echo "DL1_DASHBOARD must be a port number (0-65535); got '$dashboard'" >&2
    exit 2
fi
# dl1 places its tasks next to their data itself: no work stealing (see dl1/runtime/localcluster.py)
DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING="${DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING:-False}" \
    dask scheduler --protocol "$protocol" --host 127.0.0.1 --port 0 "${http_scheduler[@]}" \
    --scheduler-file "$file" "${tls[@]}" > dl1-scheduler.log 2>&1 &
echo $! > dl1-cluster.pids
for _ in $(seq 600); do [ -s "$file" ] && break; sleep 0.1; done
[ -s "$file" ] || { echo "scheduler did not start; see dl1-scheduler.log" >&2; exit 1; }
# every kernel into numba's cache (once per installation: later runs load it in seconds), so
# that the workers' first fit does not compile; DL1_WARM=0 skips it
if [ "${DL1_WARM:-1}" != 0 ]; then
    dl1 warm > dl1-warm.log 2>&1 || echo "dl1 warm failed (see dl1-warm.log); the workers compile their kernels at first use" >&2
fi
# large freed arrays go back to the system (see dl1/runtime/localcluster.py); glibc reads it at start
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-65536}"
# no statistical profiler: its 1,000 s of call trees grow a busy worker's memory (ibid.)
export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED="${DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED:-False}"
for i in $(seq "$n"); do
    # --preload dl1.runtime.worker: freed heap memory goes back to the system (see dl1/runtime/worker.py)
    dask worker --scheduler-file "$file" --host 127.0.0.1 --nthreads 1 "${http_worker[@]}" \
        --name "w$i" --preload dl1.runtime.worker "${tls[@]}" \
        > "dl1-worker-$i.log" 2>&1 &
    echo $! >> dl1-cluster.pids
done
echo "scheduler: $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['address'])" "$file")"
if [ -n "$dashboard" ]; then
    echo "dashboard: http://127.0.0.1:$(python3 -c "import json,sys
print(json.load(open(sys.argv[1]))['services']['dashboard'])" "$file")/status"
fi
