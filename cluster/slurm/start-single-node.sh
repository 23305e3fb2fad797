#!/usr/bin/env bash
# Start a single-node SLURM on 127.0.0.1 (munged, slurmctld, slurmd) for dl1's SLURM test and
# examples/slurm_job.py; root, Debian or Ubuntu. Installs slurm-wlm and munge if missing,
# writes /etc/slurm/slurm.conf from cluster/slurm/slurm.conf.in (never over a configuration
# it did not write), starts the daemons and waits until the node is idle in partition
# `debug`. Idempotent: nothing is restarted when the node already answers. Stop with
# cluster/slurm/stop-single-node.sh. Exit 0 when SLURM is up, 1 (with the reason) if not.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
conf=/etc/slurm/slurm.conf
state="${DL1_SLURM_STATE:-/var/lib/dl1-slurm}"
marker="dl1-single-node"
node="$(hostname -s)"
fail() { echo "SLURM not started: $*" >&2; exit 1; }

node_state() { timeout 10 sinfo -h -n "$node" -o %T 2>/dev/null | head -n 1 || true; }

[ "$(id -u)" -eq 0 ] || fail "needs root (apt-get, munged, slurmd)"
if command -v sinfo > /dev/null && [ "$(node_state)" = idle ]; then
    echo "SLURM already up: node $node idle"
    exit 0
fi
if ! command -v slurmd > /dev/null || ! command -v munged > /dev/null; then
    command -v apt-get > /dev/null || fail "slurm-wlm and munge are missing and there is no apt-get"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -qq > /dev/null || fail "apt-get update failed"
    timeout 900 apt-get install -y -qq slurm-wlm munge > /dev/null || fail "apt-get install failed"
fi
if [ -e "$conf" ] && ! grep -q "$marker" "$conf"; then
    fail "$conf exists and was not written by this script; not touching it"
fi

# munge: a key readable by munged only, then the daemon (as its user)
if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey > /dev/null; then mungekey --create --force; else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
if ! munge -n 2> /dev/null | unmunge > /dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged || fail "munged did not start"
    for _ in $(seq 50); do munge -n 2> /dev/null | unmunge > /dev/null 2>&1 && break; sleep 0.2; done
    munge -n | unmunge > /dev/null 2>&1 || fail "munge does not answer"
fi

# slurm.conf: this node on 127.0.0.1, its CPUs, 90% of its memory
cpus="$(nproc)"
memory="$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)"
install -d -m 0755 /etc/slurm "$state" "$state/slurmctld" "$state/slurmd"
sed -e "s|@NODE@|$node|g" -e "s|@CPUS@|$cpus|g" -e "s|@MEMORY@|$memory|g" \
    -e "s|@STATE@|$state|g" -e "s|@MARKER@|$marker|g" "$here/slurm.conf.in" > "$conf.tmp"
mv "$conf.tmp" "$conf"

# daemons: started here unless running already (their pid files name them)
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2> /dev/null; }
running "$state/slurmctld.pid" || /usr/sbin/slurmctld -i || fail "slurmctld did not start; see $state/slurmctld.log"
running "$state/slurmd.pid" || /usr/sbin/slurmd -N "$node" || fail "slurmd did not start; see $state/slurmd.log"
for _ in $(seq 60); do
    s="$(node_state)"
    case "$s" in
        idle) echo "SLURM up: node $node idle in partition debug ($cpus CPUs, ${memory} MiB)"; exit 0 ;;
        down*|drain*) scontrol update nodename="$node" state=resume > /dev/null 2>&1 || true ;;
    esac
    sleep 1
done
fail "node $node is '${s:-not listed}' after 60 s; see $state/slurmctld.log and $state/slurmd.log"
