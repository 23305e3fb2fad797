"""dl1's fits, paths and 5-fold CV over a network that is not loopback (issue 48, item 2).

Opt-in, root only. The Dask scheduler and each worker run in a Linux network namespace of
their own (``dl1n-<pid>-s``, ``-w0``, ``-w1``), each joined to the root namespace by a veth
pair; every link gets a one-way latency and a rate:

- rate: ``tc qdisc ... tbf`` on both ends of each veth (the component's upload and download);
- latency: ``tc netem`` is missing from this kernel (``Specified qdisc kind is unknown``), so a
  user-space relay (:mod:`netrelay`, in its own process in the root namespace) listens on the
  root end of each component's veth and forwards every connection to the component, holding
  each chunk for the link's one-way latency. The components listen on their own namespace's
  address and advertise the relay's (``dask worker --listen-address tcp://<own ip>:9000
  --contact-address tcp://<relay ip>:9000``; workers and the client connect to the relay's
  scheduler address), so every Dask connection (client to scheduler or worker, worker to
  scheduler, worker to worker) crosses one relay hop: ``latency`` each way. IP forwarding is
  left as it is (off), so no component can reach another but through the relay.

Before the workload, the emulation is calibrated: the round trip of a one-byte echo through
the relay (from the root namespace to worker 0's namespace) and the throughput of 64 MiB sent
the same way, against the configured figures.

The baseline ``loopback`` runs the same ``dask scheduler`` / ``dask worker`` processes on
127.0.0.1, no namespaces, no relay. Workers: ``--nthreads 1 --no-nanny``; dl1 is told to
solve distributed (``dl1.one-piece: False``: a solve small enough for one worker would
otherwise run there in one piece, and cross no network).

Workloads per preset (each a zarr store on disk the workers read, as users run it; the
preset's features and row lengths, ``ROWS`` rows, or ``--rows``), all at ``--tol`` (1e-6):
``fit`` (``dl1.fit`` at ``alpha_max / --ratio``, 20), ``path`` (``dl1.path``, ``--n-alphas``
(10) alphas down to ``--eps * alpha_max``, 0.05: the fit's alpha) and ``cv`` (``dl1.fit_cv``,
5 folds on the same grid, refit at the chosen alpha). The clusters of every profile are up
at once; each task has one untimed warm-up on each, then ``--repeat`` rounds in which every
cluster runs it once, interleaved (the order rotated from one round to the next, so that
the machine's changing load falls on every profile alike); medians reported. Per run:

- seconds; rounds (``n_rounds_``; a path's ``rounds_`` summed; a CV's fold rounds are not
  exposed by dl1, so its rounds are the refit's only, and its folds are checked certified by
  the absence of dl1's ConvergenceWarning);
- the certified relative duality gap (a fit's ``gap_``, a path's largest ``gaps_``, the CV
  refit's ``gap_``);
- bytes each worker sent and received: the kernel's counters of its veth (all of Dask's
  traffic, with TCP/IP headers), per round; and Dask's own task-data counter
  (``Worker.transfer_outgoing_bytes_total``), which only sees task results fetched by
  peers: dl1's direct calls travel as Dask rpc messages, which distributed does not count;
- the client's round trips: request -> response turns on the client's connections, counted
  by the relay (this includes Dask's own background traffic on them: heartbeats, ...);
- the busiest worker's bytes sent a round: the subproblem's server, whose link carries the
  dual point to the peers.

``--solvers ws row-newton`` runs each workload with both solvers, interleaved: the
working-set solver's column blocks hold every row, so its rounds move vectors as long as
the rows; row-newton's row partitions keep their predictions and send vectors as long as
the features or the working set (no CV: it keeps the predictions on the workers);
``row-newton-tasks`` is row-newton with its calls as Dask tasks (``dl1.direct-calls:
False``) instead of direct calls to the partition servers.

``--workers`` (2) and ``--partitions`` (one a worker) size the cluster and dl1's
``n_partitions``; ``--scan-tree both`` runs every task with the servers forwarding a pass's
dual point along a binomial tree of the peers and with the first sending it to each peer
(``dl1.scan-tree``), interleaved like the profiles. ``--profiles`` may add ``1ms-100Mbit``:
on this host's two cores the workers' scans share the CPU with the relay, so only a link
slow against the pass shows what the tree saves in time (its bytes show on every link).
``--wmem-kib`` caps the namespaces' TCP send buffers: the presets' vectors (1.6 MB at
200,000 rows) fit in the kernel's 4 MB buffer, so requests written one after the other
still share the link, where a 100M-row problem's 0.8 GB vectors would not.

    python benchmarks/bench_network.py --json bench-out/network.json
    python benchmarks/bench_network.py --quick   # tiny data, one profile + loopback

Exit code 2 (with a message) when not root or ``ip netns`` does not work; 3 when a run
exceeds ``--run-timeout``. Everything is torn down in ``finally`` and on SIGTERM / SIGINT /
SIGHUP (the handler tears down and exits: the main thread may be blocked in dl1's threads).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netrelay  # noqa: E402

#: name -> (one-way latency seconds, rate bits/s); None: loopback, no emulation.
PROFILES: dict[str, tuple[float, float] | None] = {
    "loopback": None,
    "0.2ms-10Gbit": (0.0002, 10e9),
    "1ms-1Gbit": (0.001, 1e9),
    # opt-in: transfer of a length-n vector against a pass as a tall problem's on 10 Gbit/s
    # links (the 2-core host's scans are not the workers' own cores)
    "1ms-100Mbit": (0.001, 1e8),
}
#: The profiles run unless --profiles names others.
DEFAULT_PROFILES = ["loopback", "0.2ms-10Gbit", "1ms-1Gbit"]
SCHED_PORT, WORKER_PORT, CAL_PORT = 8786, 9000, 7000
#: Row counts of the default run (the presets' own features and row lengths): the whole run
#: within ~15 minutes on two busy cores.
ROWS = {"tfidf": 8_000, "log1p": 1_500, "short": 200_000, "shortclf": 200_000, "small": 2_000}
WAIT = 120.0  # seconds any one start-up step may take
#: --scan-tree -> the ways a pass's dual point reaches the peers, each run in turn
BROADCASTS = {"on": ("tree",), "off": ("direct",), "both": ("tree", "direct")}
DASK = str(Path(sys.executable).with_name("dask"))


class NetError(RuntimeError):
    """The emulated network could not be set up (not root, ``ip netns`` failing, ...)."""


@dataclasses.dataclass(frozen=True)
class Component:
    """A namespace and its veth: ``host_if``/``host_ip`` in the root namespace (where the
    relay listens), ``ip`` inside (where the component listens)."""

    ns: str
    host_if: str
    host_ip: str
    ip: str


def sh(*cmd: str, timeout: float = 30.0) -> str:
    """Run ``cmd``; its stdout, or :class:`NetError` naming the command and its stderr."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetError(f"`{' '.join(cmd)}` failed: {e}") from e
    if p.returncode != 0:
        raise NetError(f"`{' '.join(cmd)}` failed: {p.stderr.strip() or p.returncode}")
    return p.stdout


def _subnet() -> int:
    """A second octet of ``10.B.0.0/16`` no address of this host is in."""
    used = sh("ip", "-o", "-4", "addr")
    for k in range(200):
        b = 100 + (os.getpid() + k) % 150
        if f" 10.{b}." not in used:
            return b
    raise NetError("no free 10.B.0.0/16 subnet for the emulated network")


def _tbf(rate: float, dev: str, ns: str | None) -> None:
    """Cap ``dev``'s egress at ``rate`` bits/s: a token bucket of 4 ms of the rate."""
    burst = max(int(rate / 8 * 0.004), 64 * 1024)
    pre = ("tc", "-n", ns) if ns else ("tc",)
    sh(*pre, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{int(rate)}bit",
       "burst", str(burst), "latency", "20ms")  # fmt: skip


class Network:
    """The namespaces and veth pairs of one run; :meth:`teardown` removes them all."""

    def __init__(
        self, n_workers: int, rate: float, tag: str = "", wmem: int | None = None
    ) -> None:
        b, pid = _subnet(), os.getpid()
        names = [f"{tag}s"] + [f"{tag}w{k}" for k in range(n_workers)]
        self.components = [
            Component(f"dl1n-{pid}-{nm}", f"dl1n{pid}{nm}", f"10.{b}.{k}.1", f"10.{b}.{k}.2")
            for k, nm in enumerate(names)
        ]  # fmt: skip
        self.rate = rate
        #: largest TCP send buffer in the namespaces, bytes (None: the kernel's)
        self.wmem = wmem

    def setup(self) -> None:
        """Create each namespace, its veth pair, addresses, default route and tbf caps."""
        for c in self.components:
            sh("ip", "netns", "add", c.ns)
            sh("ip", "link", "add", c.host_if, "type", "veth", "peer", "name", "eth0",
               "netns", c.ns)  # fmt: skip
            sh("ip", "addr", "add", f"{c.host_ip}/24", "dev", c.host_if)
            sh("ip", "link", "set", c.host_if, "up")
            sh("ip", "-n", c.ns, "addr", "add", f"{c.ip}/24", "dev", "eth0")
            sh("ip", "-n", c.ns, "link", "set", "lo", "up")
            sh("ip", "-n", c.ns, "link", "set", "eth0", "up")
            sh("ip", "-n", c.ns, "route", "add", "default", "via", c.host_ip)
            _tbf(self.rate, c.host_if, None)
            _tbf(self.rate, "eth0", c.ns)
            if self.wmem is not None:
                sh("ip", "netns", "exec", c.ns, "sysctl", "-q", "-w",
                   f"net.ipv4.tcp_wmem=4096 16384 {self.wmem}")  # fmt: skip

    def teardown(self) -> None:
        """Delete every namespace (its veth end goes with it) and any host end left."""
        for c in self.components:
            for cmd in (("ip", "netns", "del", c.ns), ("ip", "link", "del", c.host_if)):
                with contextlib.suppress(NetError):
                    sh(*cmd)

    def counters(self) -> list[tuple[int, int]]:
        """(bytes sent, bytes received) by each worker: its veth's root end's rx / tx."""
        out = []
        for c in self.components[1:]:
            base = Path("/sys/class/net") / c.host_if / "statistics"
            out.append((int((base / "rx_bytes").read_text()),
                        int((base / "tx_bytes").read_text())))  # fmt: skip
        return out


def _kill(p: subprocess.Popen) -> None:
    """Stop a process this script started (its own session): TERM, then KILL."""
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


class Cluster:
    """A ``dask scheduler`` and workers, on loopback (``profile`` None) or in namespaces
    behind the relay; everything started is stopped by :meth:`close`."""

    def __init__(self, profile: tuple[float, float] | None, args: argparse.Namespace,
                 tag: str = "") -> None:  # fmt: skip
        self.profile, self.args, self.tag = profile, args, tag
        self.procs: list[subprocess.Popen] = []
        self.net: Network | None = None
        self.relay: Any = None  # (process, pipe)
        self.tmp = tempfile.mkdtemp(prefix="dl1n-")
        self.address = ""
        self.scheduler_listens = ("", 0)

    def _start(self, cmd: list[str], ns: str | None, name: str) -> subprocess.Popen:
        full = (["ip", "netns", "exec", ns] if ns else []) + cmd
        with open(Path(self.tmp) / f"{name}.log", "wb") as log:  # the child keeps its copy
            p = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # fmt: skip
        self.procs.append(p)
        return p

    def start(self) -> None:
        """Start everything; return once the scheduler accepts connections (the relay
        would otherwise close a client's connection it cannot forward yet)."""
        if self.profile is None:
            self._start_loopback()
        else:
            self._start_namespaced()
        host, port = self.scheduler_listens
        end = time.monotonic() + WAIT
        while time.monotonic() < end:
            if self.procs[0].poll() is not None:
                raise NetError(f"the scheduler exited\n{self.logs()}")
            with contextlib.suppress(OSError), socket.create_connection((host, port), 1):
                return
            time.sleep(0.1)
        raise NetError(f"the scheduler did not listen on {host}:{port} within {WAIT} s")

    def _worker_cmd(self, k: int, scheduler: str) -> list[str]:
        return [DASK, "worker", scheduler, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                "--memory-limit", self.args.memory_limit, "--name", f"w{k}",
                "--local-directory", self.tmp, "--death-timeout", "60"]  # fmt: skip

    def _start_loopback(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        self.scheduler_listens = ("127.0.0.1", port)
        self._start([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                     "--no-dashboard", "--no-jupyter"], None, "scheduler")  # fmt: skip
        for k in range(self.args.workers):
            self._start(self._worker_cmd(k, self.address) + ["--host", "127.0.0.1"], None,
                        f"w{k}")  # fmt: skip

    def _start_namespaced(self) -> None:
        latency, rate = self.profile
        wmem = self.args.wmem_kib * 1024 if self.args.wmem_kib else None
        self.net = Network(self.args.workers, rate, self.tag, wmem)
        self.net.setup()
        sched, workers = self.net.components[0], self.net.components[1:]
        routes = [netrelay.Route((sched.host_ip, SCHED_PORT), (sched.ip, SCHED_PORT))]
        routes += [netrelay.Route((c.host_ip, p), (c.ip, p))
                   for c in workers for p in (WORKER_PORT, CAL_PORT)]  # fmt: skip
        clients = [c.host_ip for c in self.net.components]
        here, there = mp.get_context("spawn").Pipe()
        proc = mp.get_context("spawn").Process(
            target=netrelay.serve, args=(routes, latency, clients, there), daemon=True
        )
        proc.start()
        self.relay = (proc, here)
        if not here.poll(WAIT) or here.recv() != "ready":
            raise NetError("the relay did not start")
        self.address = f"tcp://{sched.host_ip}:{SCHED_PORT}"
        self.scheduler_listens = (sched.ip, SCHED_PORT)
        self._start([DASK, "scheduler", "--host", sched.ip, "--port", str(SCHED_PORT),
                     "--no-dashboard", "--no-jupyter"], sched.ns, "scheduler")  # fmt: skip
        for k, c in enumerate(workers):
            self._start(
                self._worker_cmd(k, self.address)
                + [
                    "--listen-address",
                    f"tcp://{c.ip}:{WORKER_PORT}",
                    "--contact-address",
                    f"tcp://{c.host_ip}:{WORKER_PORT}",
                ],
                c.ns,
                f"w{k}",
            )

    def relay_stats(self) -> dict[str, int]:
        """The relay's summed :class:`netrelay.RouteStats` (zeros on loopback)."""
        if self.relay is None:
            return dataclasses.asdict(netrelay.RouteStats())
        _, pipe = self.relay
        pipe.send("stats")
        if not pipe.poll(30):
            raise NetError("the relay did not answer")
        return pipe.recv()

    def close(self, kill: bool = False) -> None:
        """Stop the processes (``kill``: SIGKILL at once), the relay, the namespaces."""
        for p in reversed(self.procs):
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            _kill(p)
        if self.relay is not None:
            proc, pipe = self.relay
            with contextlib.suppress(OSError, EOFError):
                pipe.send("stop")
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        if self.net is not None:
            self.net.teardown()
        subprocess.run(["rm", "-rf", self.tmp], timeout=60, check=False)

    def logs(self) -> str:
        """The tail of every process's log (for an error message)."""
        return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
                         for f in sorted(Path(self.tmp).glob("*.log")))  # fmt: skip


# ------------------------------------------------------------------- calibration
def calibrate(cl: Cluster, nbytes: int) -> dict[str, float]:
    """The emulated link's round trip and throughput, measured from the root namespace to
    worker 0's namespace through the relay (the links the workload sees), and directly to
    its address (tbf alone, no relay); on loopback to 127.0.0.1."""
    if cl.net is None:
        host, port, ns = "127.0.0.1", _free_port(), None
    else:
        c = cl.net.components[1]
        host, port, ns = c.ip, CAL_PORT, c.ns
    srv = cl._start([sys.executable, "-c", netrelay.CAL_SERVER, host, str(port)], ns, "calibration")
    try:
        _wait_ready(Path(cl.tmp) / "calibration.log", srv)
        rtts, bps = netrelay.probe((c.host_ip if ns else host, port), nbytes)
        direct_rtts, direct_bps = netrelay.probe((host, port), nbytes) if ns else (rtts, bps)
    finally:
        _kill(srv)
    latency, rate = cl.profile or (0.0, float("nan"))
    return {"latency_s": latency, "rate_bps": rate, "rtt_s": statistics.median(rtts),
            "rtt_min_s": min(rtts), "throughput_bps": bps,
            "direct_rtt_s": statistics.median(direct_rtts), "direct_throughput_bps": direct_bps,
            "probe_bytes": nbytes}  # fmt: skip


#: Bytes of the task results :func:`message_probe` moves: a length-p vector of the presets
#: (2 MiB: 260,941 features in float64), the size of what dl1's calls send up the tree.
MESSAGE_BYTES = 2 * 2**20


def _vector(nbytes: int) -> Any:
    import numpy as np

    return np.ones(nbytes // 8)


def message_probe(client: Any, nbytes: int = MESSAGE_BYTES, repeat: int = 7) -> dict[str, float]:
    """What a task result of ``nbytes`` costs between two workers and to the client, as
    Dask moves it (the relay's bulk probe measures a 64 MiB stream, whose slow start and
    losses are amortised; a few-MiB message's are not): the median throughput of the
    fetches in the receiving worker's ``transfer_incoming_log``, and the median seconds of
    the client's gather of such a result already in memory."""
    a, b = sorted(client.scheduler_info()["workers"])[:2]
    fetch_bps, gather_s = [], []
    for _ in range(repeat):
        made = client.submit(_vector, nbytes, workers=[a], pure=False)
        used = client.submit(len, made, workers=[b], allow_other_workers=False, pure=False)
        used.result(timeout=WAIT)
        log = client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log)[-1],
                         workers=[b])[b]  # fmt: skip
        fetch_bps.append(8 * log["total"] / max(log["duration"], 1e-9))
        t0 = time.perf_counter()
        client.gather(made)
        gather_s.append(time.perf_counter() - t0)
        del made, used
    return {"message_bytes": nbytes, "message_bps": statistics.median(fetch_bps),
            "gather_s": statistics.median(gather_s)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(log: Path, p: subprocess.Popen) -> None:
    end = time.monotonic() + WAIT
    while time.monotonic() < end:
        if log.exists() and "ready" in log.read_text(errors="replace"):
            return
        if p.poll() is not None:
            raise NetError(f"calibration server exited: {log.read_text(errors='replace')}")
        time.sleep(0.05)
    raise NetError("calibration server did not start")


# ---------------------------------------------------------------------- workloads
def store_for(name: str, loss: str, data_dir: Path, quick: bool) -> str:
    """The store of preset ``name`` (``ROWS`` rows; ``--quick``: 300 rows, at most 3,000
    features), generated once into ``data_dir``."""
    from dl1.datasets import PRESETS, make_e2006_like

    pr = PRESETS[name]
    if quick:
        pr = dataclasses.replace(pr, name=f"{name}-quick", n_train=300, n_test=0,
                                 n_features=min(pr.n_features, 3000),
                                 row_nnz=min(pr.row_nnz, 30.0), batch_rows=128,
                                 pilot_rows=512)  # fmt: skip
    elif ROWS.get(name, pr.n_train) != pr.n_train:
        pr = dataclasses.replace(pr, name=f"{name}-{ROWS[name]}", n_train=ROWS[name], n_test=0)
    task = "classification" if loss == "logistic" else "regression"
    path = data_dir / f"{pr.name}-{task[:3]}.zarr"
    if not (path / "dl1-manifest.json").exists():
        print(f"generating {path}", file=sys.stderr, flush=True)
        make_e2006_like(path, preset=pr, seed=0, task=task, overwrite=True)
    return str(path)


def _solve(task: str, store: str, amax: float, args: argparse.Namespace,
           client: Any, solver: str) -> tuple[int, float]:  # fmt: skip
    """Run ``task`` with ``solver``; its rounds and certified relative gap."""
    import dask

    import dl1

    # row-newton-tasks: row-newton's calls as Dask tasks, not calls to the servers
    direct = solver != "row-newton-tasks"
    kw = {"tol": args.tol, "loss": args.loss, "client": client,
          "solver": solver.removesuffix("-tasks"),
          "n_partitions": args.partitions or args.workers}  # fmt: skip
    grid = {"n_alphas": args.n_alphas, "eps": args.eps}
    with dask.config.set({"dl1.direct-calls": direct}):
        if task == "fit":
            res = dl1.fit(store, alpha=amax / args.ratio, **kw)
            return res.n_rounds_, res.gap_
        if task == "path":
            res = dl1.path(store, **grid, **kw)
            return int(res.rounds_.sum()), float(res.gaps_.max())
        res = dl1.fit_cv(store, cv=args.folds, **grid, **kw)
        return res.fit.n_rounds_, res.fit.gap_


def run_task(task: str, store: str, amax: float, args: argparse.Namespace,
             client: Any, solver: str = "ws") -> dict[str, Any]:  # fmt: skip
    """One timed run of ``task``: seconds, rounds, certified gap (and any ConvergenceWarning
    dl1 gave, e.g. a CV fold's alpha not certified); SIGALRM after ``--run-timeout``."""
    from dl1 import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        signal.alarm(max(1, math.ceil(args.run_timeout)))
        try:
            t0 = time.perf_counter()
            rounds, gap = _solve(task, store, amax, args, client, solver)
            seconds = time.perf_counter() - t0
        finally:
            signal.alarm(0)
    unconverged = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    return {
        "seconds": seconds,
        "rounds": int(rounds),
        "gap": float(gap),
        "certified": gap <= args.tol and not unconverged,
        "warnings": unconverged,
    }


def _dask_bytes(client: Any) -> list[int]:
    """Each worker's ``transfer_outgoing_bytes_total`` (Dask's task-data counter)."""
    got = client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total)
    return [got[k] for k in sorted(got)]


def measured(cl: Cluster, client: Any, fn: Any) -> dict[str, Any]:
    """``fn()``'s record with the traffic it caused: per worker bytes sent / received (veth
    counters; None on loopback), Dask's task-data bytes, the client's round trips."""
    net0 = cl.net.counters() if cl.net else None
    dask0, relay0 = _dask_bytes(client), cl.relay_stats()
    rec = fn()
    net1 = cl.net.counters() if cl.net else None
    dask1, relay1 = _dask_bytes(client), cl.relay_stats()
    if net0 is not None:
        rec["sent"] = [b[0] - a[0] for a, b in zip(net0, net1, strict=True)]
        rec["received"] = [b[1] - a[1] for a, b in zip(net0, net1, strict=True)]
    rec["dask_transfer"] = [b - a for a, b in zip(dask0, dask1, strict=True)]
    rec["client_round_trips"] = relay1["client_turns"] - relay0["client_turns"]
    rec["round_trips"] = relay1["turns"] - relay0["turns"]
    rec["connections"] = relay1["connections"] - relay0["connections"]
    return rec


def _run_and_print(cl: Cluster, client: Any, run: functools.partial, where: dict) -> dict:
    rec = measured(cl, client, run)
    rec.update(where)
    print(f"{where['preset']} {where['task']} {where['profile']} {where['broadcast']} "
          f"{where['solver']} "
          f"#{where['repeat']}: "
          f"{rec['seconds']:.3f} s, {rec['rounds']} rounds, gap {rec['gap']:.2e}",
          flush=True)  # fmt: skip
    return rec


def run_all(clusters: dict[str, Cluster], stores: dict[str, str], args: argparse.Namespace,
            calib: dict[str, dict]) -> list[dict[str, Any]]:  # fmt: skip
    """Every preset's tasks on every cluster: a warm-up on each, then ``--repeat`` rounds
    in which each cluster runs once, interleaved (the order rotated from one repeat to the
    next) so that the machine's changing load falls on every profile alike. Each
    profile's ``calib`` gains :func:`message_probe`'s figures."""
    import dask
    from distributed import Client

    import dl1

    out = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(dask.config.set({"dl1.one-piece": False}))
        stack.enter_context(warnings.catch_warnings())
        # plain TCP between namespaces of one host: dl1's warning about it is not news here
        warnings.simplefilter("ignore", dl1.InsecureClusterWarning)
        clients = {name: stack.enter_context(Client(cl.address, timeout=WAIT,
                                                    set_as_default=False))
                   for name, cl in clusters.items()}  # fmt: skip
        for name, c in clients.items():
            c.wait_for_workers(args.workers, timeout=WAIT)
            if args.workers >= 2:
                calib[name].update(message_probe(c))
                print(f"{name}: messages {calib[name]}", flush=True)
        # every cluster with each way of sending a pass's dual point to the peers, and
        # each solver
        names = [(name, b, sv) for name in clusters for b in BROADCASTS[args.scan_tree]
                 for sv in args.solvers]  # fmt: skip
        for preset, store in stores.items():
            amax = dl1.alpha_max(store, loss=args.loss, client=clients[names[0][0]])
            for task in args.tasks:
                # a data handle's CV needs the predictions, which row-newton keeps
                runs = [x for x in names if not (task == "cv" and x[2].startswith("row-newton"))]
                for name, b, sv in runs:  # warm-up
                    _run_with(b, task, store, amax, args, clients[name], sv)
                for k in range(args.repeat):
                    for name, b, sv in runs[k % len(runs) :] + runs[: k % len(runs)]:
                        run = functools.partial(_run_with, b, task, store, amax, args,
                                                clients[name], sv)  # fmt: skip
                        where = {"preset": preset, "task": task, "profile": name,
                                 "broadcast": b, "solver": sv, "repeat": k}  # fmt: skip
                        out.append(_run_and_print(clusters[name], clients[name], run, where))
    return out


def _run_with(broadcast: str, *args: Any) -> dict[str, Any]:
    """:func:`run_task` with dl1's servers sending the dual point ``broadcast``: along a
    tree, or straight to each peer (``dl1.scan-tree``)."""
    import dask

    with dask.config.set({"dl1.scan-tree": broadcast == "tree"}):
        return run_task(*args)


# ---------------------------------------------------------------------- the report
def _median(rs: list[dict], f: Any) -> float:
    return statistics.median(f(r) for r in rs)


def _row(rs: list[dict], calib: dict[str, dict], tol: float) -> dict[str, Any]:
    """The summary of one (preset, task, profile)'s runs ``rs``."""
    r0 = rs[0]
    row = {"preset": r0["preset"], "task": r0["task"], "profile": r0["profile"], "tol": tol,
           "broadcast": r0.get("broadcast", "tree"), "solver": r0.get("solver", "ws"),
           "seconds": _median(rs, lambda r: r["seconds"]),
           "rounds": _median(rs, lambda r: r["rounds"]),
           "gap": max(r["gap"] for r in rs), "certified": all(r["certified"] for r in rs),
           "client_round_trips": _median(rs, lambda r: r["client_round_trips"]),
           "round_trips": _median(rs, lambda r: r["round_trips"]),
           "dask_transfer_per_worker": _median(rs, lambda r: statistics.mean(r["dask_transfer"])),
           "latency_s": calib[r0["profile"]]["latency_s"], "rtt_s": calib[r0["profile"]]["rtt_s"],
           "seconds_all": [r["seconds"] for r in rs]}  # fmt: skip
    if "sent" in r0:
        row["bytes_per_run_per_worker"] = _median(rs, lambda r: statistics.mean(r["sent"]))
        row["received_per_run_per_worker"] = _median(rs, lambda r: statistics.mean(r["received"]))
        # a CV's rounds are its refit's only (dl1 does not expose the folds'): no per round
        if r0["task"] != "cv":
            row["bytes_per_round_per_worker"] = _median(
                rs, lambda r: statistics.mean(r["sent"]) / r["rounds"]
            )
            row["received_per_round_per_worker"] = _median(
                rs, lambda r: statistics.mean(r["received"]) / r["rounds"]
            )
            # the subproblem's server's link: what a tree of peers relieves
            row["bytes_per_round_busiest"] = _median(rs, lambda r: max(r["sent"]) / r["rounds"])
    return row


def summarise(runs: list[dict], calib: dict[str, dict], args: argparse.Namespace) -> list[dict]:
    """One row per (preset, task, profile, broadcast): medians over the repeats, the
    largest gap, and the ratio of the median to loopback's (with the same broadcast)."""

    def key(r: dict) -> tuple:
        return (r["preset"], r["task"], r["profile"], r.get("broadcast", "tree"),
                r.get("solver", "ws"))  # fmt: skip

    keys = dict.fromkeys(key(r) for r in runs)
    rows = [_row([r for r in runs if key(r) == k], calib, args.tol) for k in keys]
    base = {(r["preset"], r["task"], r["broadcast"], r["solver"]): r["seconds"] for r in rows
            if r["profile"] == "loopback"}  # fmt: skip
    for r in rows:
        b = base.get((r["preset"], r["task"], r["broadcast"], r["solver"]))
        r["vs_loopback"] = r["seconds"] / b if b else None
    return rows


def _mb(x: float | None) -> str:
    return "—" if x is None else f"{x / 1e6:.3f} MB"


def table(rows: list[dict]) -> str:
    """The markdown table of :func:`summarise`'s rows."""
    out = ["| preset | task | profile | broadcast | solver | median s | vs loopback | rounds "
           "| gap "
           "| sent / round / worker | sent / round, busiest worker | received / round / worker "
           "| sent / run / worker | round trips: client / all | RTT measured |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        ratio = "—" if r["vs_loopback"] is None else f"{r['vs_loopback']:.2f}x"
        rt = ("—" if r["profile"] == "loopback"
              else f"{r['client_round_trips']:.0f} / {r['round_trips']:.0f}")  # fmt: skip
        out.append(
            f"| {r['preset']} | {r['task']} | {r['profile']} | {r['broadcast']} "
            f"| {r['solver']} | {r['seconds']:.3f} | {ratio} "
            f"| {r['rounds']:.0f} | {r['gap']:.1e} | {_mb(r.get('bytes_per_round_per_worker'))} "
            f"| {_mb(r.get('bytes_per_round_busiest'))} "
            f"| {_mb(r.get('received_per_round_per_worker'))} "
            f"| {_mb(r.get('bytes_per_run_per_worker'))} | {rt} | {r['rtt_s'] * 1e3:.3f} ms |"
        )
    return "\n".join(out)


def _gbit(bps: float | None) -> str:
    return "—" if bps is None else f"{bps / 1e9:.2f} Gbit/s"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.1f} ms"


def calibration_table(calib: dict[str, dict]) -> str:
    out = ["| profile | configured RTT | RTT through the relay (median / min) | RTT direct "
           "| configured rate | throughput through the relay | throughput direct (tbf alone) "
           "| 2 MiB result, worker to worker | 2 MiB result's gather |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, c in calib.items():
        rate = "—" if c["rate_bps"] != c["rate_bps"] else f"{c['rate_bps'] / 1e9:.1f} Gbit/s"
        out.append(f"| {name} | {2 * c['latency_s'] * 1e3:.3f} ms | {c['rtt_s'] * 1e3:.3f} / "
                   f"{c['rtt_min_s'] * 1e3:.3f} ms | {c['direct_rtt_s'] * 1e3:.3f} ms | {rate} "
                   f"| {c['throughput_bps'] / 1e9:.2f} Gbit/s "
                   f"| {c['direct_throughput_bps'] / 1e9:.2f} Gbit/s "
                   f"| {_gbit(c.get('message_bps'))} | {_ms(c.get('gather_s'))} |")  # fmt: skip
    return "\n".join(out)


# ---------------------------------------------------------------------- main
#: The cluster being run, for the signal handler's teardown.
_ACTIVE: list[Cluster] = []


def _on_signal(signum: int, frame: object) -> None:
    """Tear down and exit at once: the main thread may be waiting on dl1's threads, which
    wait on the workers, so unwinding (``finally``) cannot be relied on to come. SIGALRM:
    a run took longer than ``--run-timeout`` (exit code 3)."""
    if signum == signal.SIGALRM:
        print("bench_network.py: a run exceeded --run-timeout; tearing down", file=sys.stderr)
    for cl in _ACTIVE:
        cl.close(kill=True)
    sys.stderr.flush()
    os._exit(3 if signum == signal.SIGALRM else 128 + signum)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tfidf", "log1p", "short"])
    ap.add_argument("--tasks", nargs="+", default=["fit", "path", "cv"],
                    choices=["fit", "path", "cv"])  # fmt: skip
    ap.add_argument("--profiles", nargs="+", default=list(DEFAULT_PROFILES), choices=list(PROFILES))
    ap.add_argument("--data-dir", default="bench-out")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--wmem-kib", type=int, default=0,
                    help="cap the namespaces' TCP send buffers (net.ipv4.tcp_wmem), KiB: a "
                    "length-n vector then leaves a worker's link before the next is sent, "
                    "as vectors far larger than the buffers do (default: the kernel's)",
                    )  # fmt: skip
    ap.add_argument("--partitions", type=int, default=0,
                    help="dl1's n_partitions (default: one a worker)")
    ap.add_argument("--scan-tree", default="on", choices=list(BROADCASTS),
                    help="dl1.scan-tree: the dual point along a tree of peers (on), straight "
                    "to each (off), or each run both ways (both)")  # fmt: skip
    ap.add_argument("--solvers", nargs="+", default=["ws"],
                    choices=["ws", "row-newton", "row-newton-tasks"],
                    help="dl1's solvers, each run interleaved (row-newton: row partitions "
                    "keeping their predictions, called directly; row-newton-tasks: the same "
                    "by Dask tasks; no CV)")  # fmt: skip
    ap.add_argument("--memory-limit", default="3GiB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ratio", type=float, default=20.0)
    ap.add_argument("--n-alphas", type=int, default=10)
    ap.add_argument("--eps", type=float, default=0.05)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--loss", default="squared", choices=["squared", "logistic"])
    ap.add_argument("--probe-mib", type=int, default=64, help="calibration throughput probe")
    ap.add_argument(
        "--rows",
        nargs="*",
        default=[],
        metavar="PRESET=N",
        help="rows of a preset's store (default: ROWS)",
    )
    ap.add_argument(
        "--run-timeout",
        type=float,
        default=900.0,
        help="seconds one run (fit, path or CV) may take before everything is "
        "torn down and the benchmark exits with code 3",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny data, loopback and 1ms-1Gbit, one repeat (a smoke test)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.presets, args.profiles, args.repeat = ["tfidf"], ["loopback", "1ms-1Gbit"], 1
        args.probe_mib = 8
    try:
        ROWS.update({k: int(v) for k, v in (x.split("=") for x in args.rows)})
    except ValueError:
        ap.error(f"--rows takes PRESET=N pairs, got {args.rows}")
    if args.workers < 1 or args.repeat < 1:
        ap.error("--workers and --repeat must be at least 1")
    if "loopback" not in args.profiles:
        args.profiles.insert(0, "loopback")  # every ratio needs its baseline
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if any(PROFILES[p] for p in args.profiles) and os.geteuid() != 0:
        print("bench_network.py: network namespaces need root (run as root, or "
              "--profiles loopback only)", file=sys.stderr)  # fmt: skip
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGALRM):
        signal.signal(sig, _on_signal)
    data_dir = Path(args.data_dir)
    stores = {p: store_for(p, args.loss, data_dir, args.quick) for p in args.presets}
    clusters = {name: Cluster(PROFILES[name], args, tag=str(k))
                for k, name in enumerate(args.profiles)}  # fmt: skip
    _ACTIVE[:] = list(clusters.values())
    calib: dict[str, dict] = {}
    try:
        for name, cl in clusters.items():
            cl.start()
            calib[name] = calibrate(cl, args.probe_mib * 2**20)
            print(f"{name}: calibration {calib[name]}", flush=True)
        runs = run_all(clusters, stores, args, calib)
    except NetError as e:
        print(f"bench_network.py: {e}\n" + "\n".join(c.logs() for c in clusters.values()),
              file=sys.stderr)  # fmt: skip
        return 2
    finally:
        _ACTIVE.clear()
        for cl in clusters.values():
            cl.close()
    rows = summarise(runs, calib, args)
    load = os.getloadavg()
    print(f"\nload average: {' '.join(f'{x:.2f}' for x in load)}\n")
    print(calibration_table(calib) + "\n\n" + table(rows))
    if args.json:
        doc = {"calibration": [{"profile": k, **v} for k, v in calib.items()], "runs": rows,
               "raw": runs, "load": load, "args": vars(args)}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
