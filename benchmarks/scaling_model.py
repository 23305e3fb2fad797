"""A model of a working-set fit's time on 8 to 256 workers (issue 48, item 3).

One round of ``solver="ws"`` (``dl1/solvers/ws.py``; docs/design.md, "One round's data
flow") is: a pass of every worker over its blocks (``X_k^T theta``), the coordinator's
reductions (gap, working set), the subproblem on one worker (A, the subproblem's server),
and the length-n vectors that travel: ``z`` client -> A, ``theta`` from A along a binomial
tree of the peers (``ceil(log2 workers)`` sends from A), ``dz`` A -> client (8 bytes a row
each, float64), plus the working set's new columns peer -> A (12 bytes a nonzero, float64
store). The model of a fit is::

    T = setup_solve + setup_col * p / workers                      # blocks load in parallel
        + (rounds + 1) * (max_k nnz_k * nnz_s + max_k cols_k * col_s) # the slowest pass
        + rounds * (subproblem + overhead)                            # one worker; client
        + rounds * (rt_round * RTT + bytes_round / bandwidth)          # the network

    subproblem = sub_fixed + sub_row * n + sub_gram * m^2 * epochs    # Gram mode (design.md)
    overhead   = ovh_fixed + ovh_worker * msgs + ovh_row * n          # messages, length-n work
    msgs       = ceil(log2 workers) + 1                               # A's tree children + client
    bytes_round = 8 n (1 + ceil(log2 workers) + 1) + 12 * new column nonzeros  # A's link

``passes = rounds + 1``: a fit's final pass certifies it; along a path the pass that
certifies one alpha is the next one's first (timed paths: ``passes_`` summed = rounds + 1).
Calibration (this machine):

- pass, subproblem, overhead and set-up parameters: least squares on timed 2-worker loopback
  fits and paths (the ``time`` subcommand, on item 2's stores and kind of cluster: ``dask
  worker --nthreads 1 --no-nanny``): per round ``scan_kernel_s``, ``inner_s``, the rest of
  the round's wall seconds; a fit's seconds outside its rounds (set-up);
- ``ovh_worker``: measured, the median no-op message to a worker and back
  (:func:`rpc_seconds`), not fitted (two workers cannot separate it from ``ovh_fixed``);
- round trips per solve / alpha / round: least squares on item 2's counts (the relay's);
- RTT and bandwidth of each link: item 2's calibration (through the relay).

The calibration table compares the model with every fit and path of item 2's JSON
(``benchmarks/bench_network.py --json``); CV runs are left out (their folds' rounds are not
exposed by dl1).

    python benchmarks/scaling_model.py time --scheduler tcp://127.0.0.1:8786 \
        --store tfidf=STORE log1p=STORE short=STORE --json timed.json
    python benchmarks/scaling_model.py calibrate --net network.json --timed timed.json \
        --params params.json
    python benchmarks/scaling_model.py predict --params params.json --json pred.json

Pure Python/NumPy for ``calibrate`` and ``predict``; ``time`` needs a Dask cluster (a
LocalCluster without ``--scheduler``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dl1.datasets.e2006_model import PRESETS

#: Bytes per row of a length-n float64 vector, per nonzero of a float64 column (8 + 4 index).
VEC_BYTES, COL_BYTES = 8, 12
#: The prediction's links: 10 Gbit/s, 0.2 ms one way (0.4 ms round trip).
LINK_RTT_S, LINK_BPS = 0.4e-3, 10e9
WORKERS = (8, 64, 256)


@dataclasses.dataclass(frozen=True)
class Params:
    """The model's parameters (seconds, per unit named).

    nnz_s, col_s : a pass's kernel seconds per nonzero / per column of a worker's blocks.
    sub_fixed, sub_row, sub_gram : a subproblem's seconds: fixed, per row (length-n work on
        A: ``dz``, ``theta``), per ``m^2 * epochs`` (covariance updates on the Gram matrix).
    ovh_fixed, ovh_worker, ovh_row : a round's seconds outside kernels and the subproblem:
        fixed, per worker (a message handled by the coordinator / A), per row (the
        coordinator's length-n arithmetic, serialisation).
    setup_solve, setup_col : seconds of a solve's set-up (before its first pass, after its
        last), fixed and per feature of the slowest worker's share: the set-up is mostly
        the wait for the workers to load their blocks, in parallel (profiled: 0.46 s of a
        ``log1p`` fit's 0.48 s set-up on 2 workers).
    rt_solve, rt_alpha, rt_round : round trips (request -> response turns) per solve, per
        alpha, per round.
    """

    nnz_s: float
    col_s: float
    sub_fixed: float
    sub_row: float
    sub_gram: float
    ovh_fixed: float
    ovh_worker: float
    ovh_row: float
    setup_solve: float = 0.0
    setup_col: float = 0.0
    rt_solve: float = 0.0
    rt_alpha: float = 0.0
    rt_round: float = 0.0


@dataclasses.dataclass(frozen=True)
class Link:
    """A network link: round-trip time (s) and bandwidth (bytes/s)."""

    rtt_s: float
    bytes_per_s: float


@dataclasses.dataclass(frozen=True)
class Problem:
    """A fit's shape and work: rows, features, nonzeros; rounds and alphas; the mean working
    set ``m``, inner epochs and new column nonzeros a round (measured on a smaller problem)."""

    name: str
    n: float
    p: float
    nnz: float
    rounds: float
    alphas: float = 1.0
    ws_size: float = 128.0
    epochs: float = 10.0
    new_col_nnz: float = 0.0


class RoundTerms(NamedTuple):
    """One round's seconds by term: the slowest pass, the subproblem, the coordinator's
    overhead, round trips x RTT, bytes / bandwidth."""

    pass_s: float
    sub_s: float
    overhead_s: float
    latency_s: float
    bytes_s: float

    @property
    def total(self) -> float:
        """The round's seconds."""
        return sum(self)


def theta_sends(workers: int, tree: bool = True) -> int:
    """Times ``theta`` leaves the subproblem's worker a round: ``ceil(log2 workers)`` along
    the binomial tree its server forwards it on (``dl1.scan-tree``, the default), else once
    a peer."""
    if tree and workers > 1:
        return math.ceil(math.log2(workers))
    return max(workers - 1, 0)


def round_bytes(
    n: float, workers: int, new_col_nnz: float = 0.0, tree: bool = True, vec: int = VEC_BYTES
) -> float:
    """Bytes through the subproblem worker's link in one round (design.md, "One round's data
    flow"): ``z`` in from the client, ``theta`` out :func:`theta_sends` times, ``dz`` out to
    the client (``vec`` bytes a row each: 8, float64), and the new working-set columns in
    from peers."""
    return vec * n * (theta_sends(workers, tree) + 2) + COL_BYTES * new_col_nnz


def pass_seconds(nnz_w: float, cols_w: float, prm: Params) -> float:
    """Kernel seconds of the slowest worker's pass over ``nnz_w`` nonzeros, ``cols_w``
    columns."""
    return nnz_w * prm.nnz_s + cols_w * prm.col_s


def sub_seconds(n: float, ws_size: float, epochs: float, prm: Params) -> float:
    """Seconds of one subproblem (Gram mode): fixed + length-n work + m^2 per epoch."""
    return prm.sub_fixed + prm.sub_row * n + prm.sub_gram * ws_size**2 * epochs


def overhead_seconds(n: float, workers: int, prm: Params) -> float:
    """A round's coordinator / message seconds: fixed + per worker + length-n work."""
    return prm.ovh_fixed + prm.ovh_worker * workers + prm.ovh_row * n


def round_terms(
    pb: Problem, workers: int, prm: Params, link: Link, tree: bool = True, vec: int = VEC_BYTES
) -> RoundTerms:
    """One round of ``pb`` on ``workers`` workers holding equal shares of the nonzeros and
    columns; one pass a round (a fit's certifying passes per alpha are in :func:`fit_time`).
    Along the tree, the pass's results come back the way ``theta`` went, so the subproblem's
    worker and the coordinator handle ``theta_sends + 1`` messages, not one a worker."""
    msgs = theta_sends(workers, tree) + 1 if tree and workers > 1 else workers
    return RoundTerms(
        pass_seconds(pb.nnz / workers, pb.p / workers, prm),
        sub_seconds(pb.n, pb.ws_size, pb.epochs, prm),
        overhead_seconds(pb.n, msgs, prm),
        prm.rt_round * link.rtt_s,
        round_bytes(pb.n, workers, pb.new_col_nnz, tree, vec) / link.bytes_per_s,
    )


def fit_time(pb: Problem, workers: int, prm: Params, link: Link) -> float:
    """Seconds of the fit (or path): set-up, ``rounds`` rounds and the final certifying
    pass (a path's alphas share their passes: ``passes_`` = rounds + 1, measured), and the
    set-up round trips."""
    rt = round_terms(pb, workers, prm, link)
    setup = prm.setup_solve + prm.setup_col * pb.p / workers
    extra = rt.pass_s + (prm.rt_solve + prm.rt_alpha * pb.alphas) * link.rtt_s
    return setup + extra + pb.rounds * rt.total


def efficiency(pb: Problem, workers: int, base: int, prm: Params, link: Link) -> float:
    """Parallel efficiency of ``workers`` against ``base`` workers: ``T_base * base /
    (T * workers)`` (1 is ideal strong scaling)."""
    return fit_time(pb, base, prm, link) * base / (fit_time(pb, workers, prm, link) * workers)


# -- calibration -----------------------------------------------------------------------------
def nonneg_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares ``a x ~ b`` with ``x >= 0`` (a parameter is a cost): columns whose
    coefficient comes out negative are dropped (set to 0) and the rest refitted."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.ndim != 2 or a.shape[0] != b.shape[0]:
        raise ValueError(f"nonneg_lstsq: design {a.shape} does not match targets {b.shape}")
    keep = np.ones(a.shape[1], bool)
    x = np.zeros(a.shape[1])
    while keep.any():
        sol = np.linalg.lstsq(a[:, keep], b, rcond=None)[0]
        if (sol >= 0).all():
            x[keep] = sol
            return x
        keep[np.flatnonzero(keep)[np.argmin(sol)]] = False
    return x


@dataclasses.dataclass(frozen=True)
class Layout:
    """A store's shape and the largest share of nonzeros and columns one of ``workers``
    workers holds (dl1's partitions: contiguous runs of blocks, ``np.array_split``)."""

    n: int
    p: int
    nnz: int
    nnz_w: int
    cols_w: int


def layout(manifest: dict[str, Any], workers: int) -> Layout:
    """The :class:`Layout` of a dl1 store's train split from its ``dl1-manifest.json``."""
    tr = manifest["splits"]["train"]
    nnz = [int(b["nnz"]) for b in tr["blocks"]["csc"][0]]
    cols = np.diff(np.asarray(tr["col_bounds"]))
    parts = np.array_split(np.arange(len(nnz)), max(1, min(workers, len(nnz))))
    n, p = (int(x) for x in tr["shape"])
    return Layout(n, p, int(tr["nnz"]), max(sum(nnz[j] for j in q) for q in parts),
                  max(int(cols[q].sum()) for q in parts))  # fmt: skip


def _round_rows(timed: list[dict], layouts: dict[tuple[str, int], Layout]) -> list[dict]:
    """Per-round figures of timed fits: the round's layout, pass kernel seconds, subproblem
    seconds, m, epochs and the rest of the round's wall seconds (``overhead``)."""
    rows = []
    for run in timed:
        lay, hist = layouts[run["preset"], run["workers"]], run["history"]
        for h, nxt in zip(hist[:-1], hist[1:], strict=True):
            wall = nxt["seconds"] - h["seconds"]
            rows.append({"lay": lay, "w": run["workers"], "kernel": nxt["scan_kernel_s"],
                         "sub": h["inner_s"], "m": h["ws_size"], "ep": h["inner_epochs"],
                         "overhead": wall - nxt["scan_kernel_s"] - h["inner_s"]})  # fmt: skip
    return rows


def fit_compute(timed: list[dict], layouts: dict[tuple[str, int], Layout]) -> Params:
    """Pass, subproblem and overhead parameters from timed fits' per-round figures; set-up
    (a fit's seconds before its first pass and after its last: ``seconds`` less the last
    history entry's) against the slowest worker's features (its blocks' loading)."""
    timed = [r for r in timed if r["workers"] == 2]  # item 2's clusters: two workers
    if not timed:
        raise ValueError("fit_compute: no timed runs on 2 workers (`time --workers 2`)")
    rows = _round_rows(timed, layouts)
    col = np.array
    nnz_s, col_s = nonneg_lstsq(col([[r["lay"].nnz_w, r["lay"].cols_w] for r in rows]),
                                col([r["kernel"] for r in rows]))  # fmt: skip
    sub = nonneg_lstsq(col([[1.0, r["lay"].n, r["m"] ** 2 * r["ep"]] for r in rows]),
                       col([r["sub"] for r in rows]))  # fmt: skip
    rpc = float(np.median([r["rpc_s"] for r in timed]))  # measured, not fitted
    ovh = nonneg_lstsq(
        col([[1.0, r["lay"].n] for r in rows]),
        col([max(r["overhead"] - rpc * r["w"], 0.0) for r in rows]),
    )
    setup = nonneg_lstsq(
        col([[1.0, layouts[r["preset"], r["workers"]].cols_w] for r in timed]),
        col([r["seconds"] - r["history"][-1]["seconds"] for r in timed]),
    )
    return Params(nnz_s, col_s, *sub, ovh[0], rpc, ovh[1], *setup)


@dataclasses.dataclass(frozen=True)
class Point:
    """A measured run of item 2 (median seconds) with what the model needs of it."""

    preset: str
    task: str
    profile: str
    seconds: float
    rounds: int
    alphas: int
    lay: Layout
    rtt_s: float
    bytes_per_s: float
    round_trips: float  # measured on the emulated links (NaN on loopback: not counted)
    bytes_busiest: float  # the busiest worker's max(sent, received), NaN on loopback
    sub_round: float  # subproblem seconds a round, from the timed runs of the same task


def point_seconds(pt: Point, prm: Params, loop: Link) -> float:
    """The model's seconds for a measured point: compute and overhead as on loopback (where
    they were fitted), the extra latency and transfer time of the point's link."""
    rt = prm.rt_solve + prm.rt_alpha * pt.alphas + prm.rt_round * pt.rounds
    rt = rt if math.isnan(pt.round_trips) else pt.round_trips
    net = rt * max(pt.rtt_s - loop.rtt_s, 0.0)
    if not math.isnan(pt.bytes_busiest):
        net += pt.bytes_busiest * max(1 / pt.bytes_per_s - 1 / loop.bytes_per_s, 0.0)
    return (prm.setup_solve + prm.setup_col * pt.lay.cols_w
            + (pt.rounds + 1) * pass_seconds(pt.lay.nnz_w, pt.lay.cols_w, prm)
            + pt.rounds * (pt.sub_round + overhead_seconds(pt.lay.n, 2, prm)) + net)  # fmt: skip


def path_sub_round(path: dict, lay: Layout, prm: Params) -> float:
    """A timed path's subproblem seconds a round: what its seconds leave after set-up,
    ``rounds + 1`` passes and the rounds' overhead (warm starts and the Gram matrix kept
    across alphas make a path's subproblems cheaper than a fit's)."""
    rest = (path["seconds"] - prm.setup_solve - prm.setup_col * lay.cols_w
            - (path["rounds"] + 1) * pass_seconds(lay.nnz_w, lay.cols_w, prm)
            - path["rounds"] * overhead_seconds(lay.n, 2, prm))  # fmt: skip
    return max(rest, 0.0) / max(path["rounds"], 1)


def fit_round_trips(points: list[Point], prm: Params) -> Params:
    """Round trips per solve / alpha / round: least squares on the emulated runs' counts."""
    em = [pt for pt in points if not math.isnan(pt.round_trips)]
    rts = nonneg_lstsq(np.array([[1.0, pt.alphas, pt.rounds] for pt in em]),
                       np.array([pt.round_trips for pt in em]))  # fmt: skip
    return dataclasses.replace(prm, rt_solve=rts[0], rt_alpha=rts[1], rt_round=rts[2])


# -- inputs ------------------------------------------------------------------------------------
def load_layouts(timed: list[dict], workers: tuple[int, ...] = (1, 2)) -> dict:
    """``(preset, workers) -> Layout`` from the stores the timed runs name."""
    out = {}
    for run in timed:
        man = json.loads((Path(run["store"]) / "dl1-manifest.json").read_text())
        for w in {*workers, run["workers"]}:
            out[run["preset"], w] = layout(man, w)
    return out


def _busiest(raw: list[dict]) -> float:
    """Median over repeats of the busiest worker's max(bytes sent, bytes received)."""
    vals = [max(max(r["sent"]), max(r["received"])) for r in raw if "sent" in r]
    return float(np.median(vals)) if vals else math.nan


def _sub_rounds(timed: list[dict], layouts: dict, prm: Params) -> dict[tuple[str, str], float]:
    """``(preset, task) -> subproblem seconds a round`` over the timed 2-worker runs: a fit's
    mean ``inner_s``, a path's mean of :func:`path_sub_round`."""
    got: dict[tuple[str, str], list[float]] = {}
    for r in (r for r in timed if r["workers"] == 2):
        fit = got.setdefault((r["preset"], "fit"), [])
        fit += [h["inner_s"] for h in r["history"] if "inner_s" in h]
        if "path" in r:
            got.setdefault((r["preset"], "path"), []).append(
                path_sub_round(r["path"], layouts[r["preset"], 2], prm))  # fmt: skip
    return {k: float(np.mean(v)) for k, v in got.items()}


def load_points(net: dict, timed: list[dict], layouts: dict, prm: Params) -> list[Point]:
    """Item 2's fits and paths as :class:`Point`\\ s (CV left out: its folds' rounds are
    unknown), with the subproblem seconds a round of the timed runs of the same task."""
    calib = {c["profile"]: c for c in net["calibration"]}
    subs, n_alphas = _sub_rounds(timed, layouts, prm), int(net["args"]["n_alphas"])
    pts = []
    for r in net["runs"]:
        key = (r["preset"], r["task"], r["profile"])
        # the model's transfer term is the tree's (the default); straight sends left out
        if (r["preset"], r["task"]) not in subs or r.get("broadcast", "tree") != "tree":
            continue
        raw = [x for x in net["raw"] if (x["preset"], x["task"], x["profile"]) == key
               and x.get("broadcast", "tree") == "tree"]  # fmt: skip
        c, em = calib[r["profile"]], r["profile"] != "loopback"
        pts.append(
            Point(
                *key,
                r["seconds"],
                r["rounds"],
                n_alphas if r["task"] == "path" else 1,
                layouts[r["preset"], net["args"]["workers"]],
                c["rtt_s"],
                c["throughput_bps"] / 8,
                float(np.median([x["round_trips"] for x in raw])) if em else math.nan,
                _busiest(raw) if em else math.nan,
                subs[r["preset"], r["task"]],
            )
        )
    return pts


def work_of(run: dict, col_nnz: float) -> dict[str, float]:
    """A timed fit's work (rounds, mean working set ``m``, mean inner epochs, and the mean
    new columns a round times ``col_nnz``, the target problem's nonzeros a column) for a
    :class:`Problem` of another size: the working set and the rounds are assumed not to
    grow with the rows."""
    hs = [h for h in run["history"] if "ws_size" in h]
    m = np.array([h["ws_size"] for h in hs], float)
    new = np.maximum(np.diff(np.concatenate([[0.0], m])), 0.0)
    return {"rounds": float(run["rounds"]), "ws_size": float(m.mean()),
            "epochs": float(np.mean([h["inner_epochs"] for h in hs])),
            "new_col_nnz": float(new.mean() * col_nnz)}  # fmt: skip


def problems(timed: list[dict]) -> list[Problem]:
    """E2006-log1p x100 (the ``log1p`` preset's shape, 100 times its rows and nonzeros;
    work of the timed ``log1p`` fit) and the tall problem (100M x 1M, 20 nonzeros a row;
    work of the timed ``short`` fit, the nearest preset in shape)."""
    runs = {r["preset"]: r for r in timed if r["workers"] == 2}
    lg = PRESETS["log1p"]
    n_big, nnz_big = 100 * lg.n_train, 100 * lg.expected_nnz
    big = Problem("E2006-log1p x100", n_big, lg.n_features, nnz_big,
                  **work_of(runs["log1p"], nnz_big / lg.n_features))  # fmt: skip
    tall = Problem("tall 100M x 1M", 1e8, 1e6, 2e9, **work_of(runs["short"], 2e9 / 1e6))
    return [big, tall]


# -- tables ------------------------------------------------------------------------------------
def calibration_rows(points: list[Point], prm: Params, loop: Link, net: dict) -> list[dict]:
    """Measured vs predicted seconds of every point, error %, and whether it is claimed: a
    (preset, task) is not when one of its medians is noise rather than a target (repeats
    spread by 1.5x or more, or an emulated link faster than loopback by over 10%, which
    latency and a rate cap cannot cause)."""
    spread = {(r["preset"], r["task"], r["profile"]): max(r["seconds_all"]) / min(r["seconds_all"])
              for r in net["runs"]}  # fmt: skip
    loop_s = {(pt.preset, pt.task): pt.seconds for pt in points if pt.profile == "loopback"}
    noisy = {(pt.preset, pt.task) for pt in points
             if spread.get((pt.preset, pt.task, pt.profile), 1.0) >= 1.5
             or pt.seconds < 0.9 * loop_s.get((pt.preset, pt.task), 0.0)}  # fmt: skip
    rows = []
    for pt in points:
        pred = point_seconds(pt, prm, loop)
        base = next(q for q in points if (q.preset, q.task, q.profile)
                    == (pt.preset, pt.task, "loopback"))  # fmt: skip
        rows.append({"preset": pt.preset, "task": pt.task, "profile": pt.profile,
                     "rounds": pt.rounds, "measured_s": pt.seconds, "predicted_s": pred,
                     "error_pct": 100 * (pred - pt.seconds) / pt.seconds,
                     "net_measured_s": pt.seconds - base.seconds,
                     "net_predicted_s": pred - point_seconds(base, prm, loop),
                     "spread": spread.get((pt.preset, pt.task, pt.profile), 1.0),
                     "claimed": (pt.preset, pt.task) not in noisy})  # fmt: skip
    return rows


class Remedy(NamedTuple):
    """A way of running the rounds: bytes a row of the length-n vectors, whether ``theta``
    travels along the tree, and the factor on the rounds."""

    vec_bytes: int
    tree: bool
    rounds_factor: float
    built: bool


#: The ways compared: dl1 as built (the tree), its straight sends (``dl1.scan-tree: False``),
#: and remedies not built (the model's figures only).
REMEDIES: dict[str, Remedy] = {
    "as built (tree broadcast)": Remedy(8, True, 1.0, True),
    "straight sends (dl1.scan-tree off)": Remedy(8, False, 1.0, True),
    "tree + float32 transport": Remedy(4, True, 1.0, False),
    "tree + half the rounds": Remedy(8, True, 0.5, False),
}


def remedy_terms(pb: Problem, w: int, prm: Params, link: Link, rem: str) -> RoundTerms:
    """A round's terms run the way ``rem`` names (:data:`REMEDIES`)."""
    r = REMEDIES[rem]
    return round_terms(pb, w, prm, link, r.tree, r.vec_bytes)


def remedy_time(pb: Problem, w: int, prm: Params, link: Link, rem: str) -> float:
    """:func:`fit_time` run the way ``rem`` names (its rounds scaled by its factor)."""
    rt, rounds = remedy_terms(pb, w, prm, link, rem), pb.rounds * REMEDIES[rem].rounds_factor
    base = fit_time(dataclasses.replace(pb, rounds=0.0), w, prm, link)
    return base + rounds * rt.total


def prediction_rows(pbs: list[Problem], prm: Params, link: Link) -> list[dict]:
    """Per problem, remedy and worker count: a round's terms, seconds, and efficiency
    against 8 workers."""
    rows = []
    for pb in pbs:
        for rem in REMEDIES:
            t8 = remedy_time(pb, WORKERS[0], prm, link, rem)
            for w in WORKERS:
                rt, t = remedy_terms(pb, w, prm, link, rem), remedy_time(pb, w, prm, link, rem)
                rows.append({"problem": pb.name, "remedy": rem, "workers": w,
                             "rounds": pb.rounds * REMEDIES[rem].rounds_factor,
                             "built": REMEDIES[rem].built, "round_s": rt.total,
                             **{k: v for k, v in rt._asdict().items()}, "fit_s": t,
                             "efficiency": t8 * WORKERS[0] / (t * w)})  # fmt: skip
    return rows


def _md(rows: list[dict], cols: list[str]) -> str:
    """A markdown table of ``rows``' ``cols``."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"
        return str(v)

    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(out + ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows])


# -- timed runs (needs a cluster) ----------------------------------------------------------------
def time_fits(stores: dict[str, str], workers: int, repeat: int = 3,
              scheduler: str | None = None) -> list[dict]:  # fmt: skip
    """Per preset, ``repeat`` timed fits at ``alpha_max / 20``, tol 1e-6 (after a warm-up),
    solving distributed, on the cluster at ``scheduler`` (item 2's loopback baseline:
    ``dask scheduler`` and ``dask worker --nthreads 1 --no-nanny`` on 127.0.0.1) or on a
    ``workers``-process LocalCluster; the median run's seconds, rounds, gap and per-round
    ``history_``, and one timed path (:func:`time_path`)."""
    import dask  # local: the model itself needs no Dask
    from distributed import Client

    import dl1
    from dl1.runtime.localcluster import local_cluster

    out = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(dask.config.set({"dl1.one-piece": False}))
        if scheduler is None:
            scheduler = stack.enter_context(local_cluster(
                n_workers=workers, threads_per_worker=1, memory_limit="3GiB"))  # fmt: skip
        client = stack.enter_context(Client(scheduler, set_as_default=False))
        workers = len(client.scheduler_info()["workers"])
        rpc = rpc_seconds(client)
        for name, store in stores.items():
            alpha = dl1.alpha_max(store, client=client) / 20
            dl1.fit(store, alpha=alpha, tol=1e-6, client=client)
            runs = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                r = dl1.fit(store, alpha=alpha, tol=1e-6, client=client)
                runs.append((time.perf_counter() - t0, r))
            runs.sort(key=lambda x: x[0])
            sec, res = runs[len(runs) // 2]
            hist = [{k: v for k, v in h.items() if isinstance(v, int | float)}
                    for h in res.history_]  # fmt: skip
            out.append({"preset": name, "store": store, "workers": workers, "seconds": sec,
                        "rounds": int(res.n_rounds_), "gap": float(res.gap_),
                        "seconds_all": [x[0] for x in runs], "history": hist,
                        "path": time_path(store, client), "rpc_s": rpc})  # fmt: skip
    return out


def _noop() -> None:
    """Nothing: the body of :func:`rpc_seconds`' messages."""


def rpc_seconds(client: Any, count: int = 200) -> float:
    """Median seconds of a no-op message to one worker and its reply (``client.run``:
    client -> scheduler -> worker and back), the per-message cost of a round's fan-out."""
    addr = sorted(client.scheduler_info()["workers"])[0]
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        client.run(_noop, workers=[addr])
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def time_path(store: str, client: Any, n_alphas: int = 10, eps: float = 0.05) -> dict:
    """One timed path as item 2 runs it (after a warm-up): seconds, rounds, passes (full-pass
    equivalents: screening shortens a path's passes), largest gap."""
    import dl1

    dl1.path(store, n_alphas=n_alphas, eps=eps, tol=1e-6, client=client)
    t0 = time.perf_counter()
    res = dl1.path(store, n_alphas=n_alphas, eps=eps, tol=1e-6, client=client)
    return {"seconds": time.perf_counter() - t0, "rounds": int(res.rounds_.sum()),
            "passes": float(res.passes_.sum()), "gap": float(res.gaps_.max()),
            "alphas": n_alphas}  # fmt: skip


# -- command line --------------------------------------------------------------------------------
def calibrate(net: dict, timed: list[dict]) -> dict[str, Any]:
    """Fit every parameter; the calibration rows and the problems to predict."""
    presets = {r["preset"] for r in net["runs"]}  # item 2's stores only
    timed = [r for r in timed if r["preset"] in presets]
    layouts = load_layouts(timed)
    prm = fit_compute(timed, layouts)
    loop = next(Link(c["rtt_s"], c["throughput_bps"] / 8)
                for c in net["calibration"] if c["profile"] == "loopback")  # fmt: skip
    pts = load_points(net, timed, layouts, prm)
    prm = fit_round_trips(pts, prm)
    return {
        "params": dataclasses.asdict(prm),
        "calibration": calibration_rows(pts, prm, loop, net),
        "problems": [dataclasses.asdict(p) for p in problems(timed)],
    }


def report(doc: dict[str, Any], link: Link) -> dict[str, Any]:
    """Add the predictions on ``link`` to a calibration document; print both tables."""
    prm = Params(**doc["params"])
    pbs = [Problem(**p) for p in doc["problems"]]
    doc = {**doc, "link": dataclasses.asdict(link), "predictions": prediction_rows(pbs, prm, link)}
    cal = doc.get("calibration") or []
    if cal:
        claimed = [abs(r["error_pct"]) for r in cal if r["claimed"]]
        print(_md(cal, ["preset", "task", "profile", "rounds", "measured_s", "predicted_s",
                        "error_pct", "net_measured_s", "net_predicted_s", "spread",
                        "claimed"]))  # fmt: skip
        print(f"\nlargest |error| on claimed points: {max(claimed, default=math.nan):.1f}%\n")
    print(_md(doc["predictions"], ["problem", "remedy", "workers", "rounds", "round_s", "pass_s",
                                   "sub_s", "overhead_s", "latency_s", "bytes_s", "fit_s",
                                   "efficiency"]))  # fmt: skip
    return doc


# -- row partitions (solver="row-newton") -------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RowParams:
    """The cost of ``solver="row-newton"``'s calls (``bench_row_calls.py`` on loopback; the
    latency hops on one emulated profile of ``bench_network.py --solvers row-newton``).

    task_s : the scheduler's seconds a task (a call on ``P`` partitions is ``3 P - 1``
        tasks: one a partition, one taking out its small result, the tree's sums).
    level_s : seconds a level of the tree of sums adds on loopback (a sum waits for the
        two below it: the scheduler's dispatch and completion messages, in turn).
    call_s : a call's fixed seconds (client -> scheduler -> workers -> client).
    row_s : a call's seconds per row of the largest partition (its length-n work).
    nnz_s : a pass's seconds per nonzero of the largest partition (``X_q^T theta``), the
        working-set solver's calibrated kernel figure.
    setup_nnz_s : the set-up's seconds per nonzero of the largest partition (loading).
    hops : one-way link latencies a call waits for on 2 workers (tree depth 1); each
        further level of the tree adds :data:`HOPS_A_LEVEL` (:data:`DIRECT_HOPS_A_LEVEL`
        by direct calls).
    part_s : by direct calls, a call's seconds per partition a server holds (it runs
        them in turn; 0 by tasks, where ``task_s`` counts them).
    direct : whether the calls are direct calls to the partition servers (the default;
        ``dl1.direct-calls: False``: tasks). A direct call has no tasks; ``level_s`` is
        then a further level of the servers' tree (a server's forward and sum: the
        working-set calibration's ``ovh_worker``), which 2 workers cannot show.
    """

    task_s: float
    level_s: float
    call_s: float
    row_s: float
    nnz_s: float
    setup_nnz_s: float
    hops: float = 0.0
    part_s: float = 0.0
    direct: bool = False


#: One-way latencies a level of the sums' tree adds to a call by tasks: the scheduler's
#: dispatch of the sum, the transfer's request and reply, the sum's completion (an
#: assumption: two workers have one level only, so it is not calibrated).
HOPS_A_LEVEL = 4

#: The same by direct calls: the call forwarded to the subtree's head, its sum back.
DIRECT_HOPS_A_LEVEL = 2


def tree_depth(workers: int) -> int:
    """Levels of the binomial tree of sums over ``workers`` partitions."""
    return math.ceil(math.log2(workers)) if workers > 1 else 0


def row_call_seconds(rp: RowParams, workers: int, rows_w: float, link: Link,
                     partitions: int | None = None) -> float:  # fmt: skip
    """One call on ``partitions`` partitions (default: one a worker) of ``workers``
    workers, ``rows_w`` rows a worker, without its bytes: fixed + the scheduler's tasks
    (by tasks) or the servers' partitions in turn (direct) + length-n work + the tree's
    further levels + latency hops."""
    parts = workers if partitions is None else partitions
    depth = tree_depth(workers)
    extra = max(depth - 1, 0)
    if rp.direct:
        hops = rp.hops + DIRECT_HOPS_A_LEVEL * extra
        fixed = rp.call_s + rp.part_s * parts / workers + rp.level_s * extra
    else:
        hops = rp.hops + HOPS_A_LEVEL * extra
        fixed = rp.call_s + rp.task_s * (3 * parts - 1) + rp.level_s * depth
    return fixed + rp.row_s * rows_w + hops * link.rtt_s / 2


def row_bytes(pb: Problem, workers: int, model_calls: float, direct: bool = False) -> float:
    """Bytes on a row-newton fit's critical path, each sent over one link: the labels
    from the client to the workers (by tasks through the scheduler: in and out of its
    link; direct: straight; once a fit: a path's alphas keep them); the loading's column
    statistics (9 bytes a feature: a float64 sum of squares and a nonzero flag) and each
    certificate's ``X^T theta`` (float64) up the ``depth`` levels of the tree and to the
    client; each model call's packed float32 ``m x m`` Hessian the same way."""
    hops = tree_depth(workers) + 1
    passes, m = pb.rounds + 1, pb.ws_size
    labels = (1 if direct else 2) * VEC_BYTES * pb.n
    return labels + hops * (9 * pb.p + passes * VEC_BYTES * pb.p + model_calls * 2 * m * (m + 1))


def row_fit_time(pb: Problem, workers: int, rp: RowParams, link: Link, calls: float,
                 model_calls: float) -> float:  # fmt: skip
    """A row-newton fit of ``pb``: set-up (loading, parallel), ``calls`` calls, a pass for
    each round's certificate and the final one, and :func:`row_bytes` at the link's rate."""
    rows_w, nnz_w = pb.n / workers, pb.nnz / workers
    passes = pb.rounds + 1
    return (rp.setup_nnz_s * nnz_w + calls * row_call_seconds(rp, workers, rows_w, link)
            + passes * rp.nnz_s * nnz_w
            + row_bytes(pb, workers, model_calls, rp.direct) / link.bytes_per_s)  # fmt: skip


def fit_row_params(timed: list[dict], nnz_s: float, direct: bool = False,
                   message_s: float = 0.0) -> RowParams:  # fmt: skip
    """:class:`RowParams` of one transport from ``bench_row_calls.py``'s runs, by least
    squares on every run's solve seconds less its passes' kernel time. By tasks, against
    ``calls``, ``calls x rows a partition``, ``calls x (3 P - 1)`` and ``calls x depth``
    (the partitions series separates the scheduler's cost a task and a tree level from
    the rest); direct, against ``calls``, ``calls x rows a worker`` and ``calls x
    partitions a worker`` (``level_s``: ``message_s``). The set-up from the stores'
    seconds outside the solve."""
    col = np.array
    mine = [r for r in timed if (r.get("transport", "tasks") == "direct") == direct]
    if direct:
        design = col([[r["calls"], r["calls"] * r["n"] / r.get("workers", 2),
                       r["calls"] * r["partitions"] / r.get("workers", 2)] for r in mine])
    else:
        design = col([[r["calls"], r["calls"] * r["n"] / r["partitions"],
                       r["calls"] * (3 * r["partitions"] - 1),
                       r["calls"] * tree_depth(r["partitions"])] for r in mine])  # fmt: skip
    rest = col([r["fit_seconds"] - (r["rounds"] + 1) * nnz_s * r["nnz"] / r["partitions"]
                for r in mine])  # fmt: skip
    got = nonneg_lstsq(design, rest)
    two = [r for r in mine if r["series"] == "rows"]
    setup = nonneg_lstsq(col([[r["nnz"] / r["partitions"]] for r in two]),
                         col([r["seconds"] - r["fit_seconds"] for r in two]))[0]  # fmt: skip
    if direct:
        call_s, row_s, part_s = (float(x) for x in got)
        return RowParams(0.0, message_s, call_s, row_s, nnz_s, float(setup), part_s=part_s,
                         direct=True)  # fmt: skip
    call_s, row_s, task_s, level_s = (float(x) for x in got)
    return RowParams(task_s, level_s, call_s, row_s, nnz_s, float(setup))


#: bench_network.py's solver name of each transport's row-newton fits.
NET_SOLVER = {True: "row-newton", False: "row-newton-tasks"}


def row_points(net: dict, timed: list[dict], direct: bool = False) -> list[dict]:
    """The row-newton fits of one transport in ``bench_network.py``'s JSON (median seconds
    per profile), with the solve's calls, Newton steps and working set from the timed run
    of the same store's shape and transport (same data, same calls)."""
    by_rows = {r["n"]: r for r in timed if r["series"] == "rows"
               and (r.get("transport", "tasks") == "direct") == direct}  # fmt: skip
    rows_of = dict(x.split("=", 1) for x in net["args"]["rows"])  # bench_network's --rows
    cal = {c["profile"]: c for c in net["calibration"]}
    out = []
    for row in net["runs"]:
        if row.get("solver") != NET_SOLVER[direct] or row["task"] != "fit":
            continue
        work = by_rows.get(int(rows_of.get(row["preset"], -1)))
        if work is None:
            continue
        c = cal[row["profile"]]
        # a few-MiB result's measured rate (bench_network's message probe) when recorded
        bps = c.get("message_bps", c["throughput_bps"])
        out.append({"profile": row["profile"], "seconds": row["seconds"],
                    "rtt_s": c["rtt_s"], "bytes_per_s": bps / 8, "work": work})  # fmt: skip
    return out


def _row_problem(work: dict) -> Problem:
    return Problem("timed", work["n"], work["p"], work["nnz"], float(work["rounds"]),
                   ws_size=float(np.mean(work["ws_sizes"] or [0])))  # fmt: skip


def row_calibration(points: list[dict], rp: RowParams, fit_on: str) -> tuple[RowParams, list]:
    """``hops`` from the ``fit_on`` profile's point (what its seconds leave beyond
    loopback's, its bytes' time taken out, per call and one-way latency); the model against
    every point."""
    loop = next(p for p in points if p["profile"] == "loopback")
    on = next(p for p in points if p["profile"] == fit_on)
    w = on["work"]
    pb, steps = _row_problem(w), w["newton_steps"]
    link = Link(on["rtt_s"], on["bytes_per_s"])
    no_hops = row_fit_time(pb, 2, rp, link, w["calls"], steps)
    base = row_fit_time(pb, 2, rp, Link(0.0, loop["bytes_per_s"]), w["calls"], steps)
    extra = (on["seconds"] - loop["seconds"]) - (no_hops - base)
    rp = dataclasses.replace(rp, hops=max(extra, 0.0) / (w["calls"] * on["rtt_s"] / 2))
    rows = []
    for pt in points:
        w = pt["work"]
        pred_loop = row_fit_time(_row_problem(w), 2, rp, Link(0.0, loop["bytes_per_s"]),
                                 w["calls"], w["newton_steps"])  # fmt: skip
        pred = row_fit_time(_row_problem(w), 2, rp, Link(pt["rtt_s"], pt["bytes_per_s"]),
                            w["calls"], w["newton_steps"])  # fmt: skip
        # loopback's measured seconds carry what the model leaves out (e.g. the client's
        # own work); the emulated points are predicted as loopback plus the network's part
        pred = loop["seconds"] + pred - pred_loop
        rows.append({"profile": pt["profile"], "measured_s": pt["seconds"], "predicted_s": pred,
                     "error_pct": 100 * (pred - pt["seconds"]) / pt["seconds"],
                     "fitted_on": pt["profile"] == fit_on})  # fmt: skip
    return rp, rows


def row_predictions(pb: Problem, made: dict[str, RowParams], link: Link, calls_per_round: float,
                    model_calls_per_round: float) -> list[dict]:  # fmt: skip
    """Row-newton's seconds and efficiency on :data:`WORKERS` (against 8), one partition
    a worker, with each transport's parameters (``made``, by name)."""
    calls, steps = calls_per_round * pb.rounds, model_calls_per_round * pb.rounds
    rows = []
    for how, rp in made.items():
        t8 = row_fit_time(pb, WORKERS[0], rp, link, calls, steps)
        for w in WORKERS:
            t = row_fit_time(pb, w, rp, link, calls, steps)
            rows.append({"problem": pb.name, "calls": how, "workers": w, "fit_s": t,
                         "call_s": row_call_seconds(rp, w, pb.n / w, link),
                         "pass_s": rp.nnz_s * pb.nnz / w,
                         "efficiency": t8 * WORKERS[0] / (t * w)})  # fmt: skip
    return rows


def rows_report(net: dict, timed: list[dict], params: dict, link: Link, fit_on: str) -> dict:
    """Fit :class:`RowParams` of each transport, check them on its emulated points,
    predict the tall problem (its rounds, calls and working set those of the largest
    timed store, by direct calls)."""
    prm = Params(**params["params"])
    made, cal = {}, []
    for direct, how in ((False, "tasks"), (True, "direct calls")):
        rp = fit_row_params(timed, prm.nnz_s, direct, prm.ovh_worker)
        made[how], rows = row_calibration(row_points(net, timed, direct), rp, fit_on)
        cal += [{"calls": how, **r} for r in rows]
    big = max((r for r in timed if r["series"] == "rows" and r.get("transport") == "direct"),
              key=lambda r: r["n"])  # fmt: skip
    per_round = max(big["rounds"], 1)
    tall = Problem("tall 100M x 1M", 1e8, 1e6, 2e9, float(big["rounds"]),
                   ws_size=float(np.mean(big["ws_sizes"] or [0])))  # fmt: skip
    pred = row_predictions(tall, made, link, big["calls"] / per_round,
                           big["newton_steps"] / per_round)  # fmt: skip
    print(_md(cal, ["calls", "profile", "measured_s", "predicted_s", "error_pct", "fitted_on"]))
    print()
    print(_md(pred, ["problem", "calls", "workers", "fit_s", "call_s", "pass_s", "efficiency"]))
    return {"row_params": {k: dataclasses.asdict(v) for k, v in made.items()},
            "calibration": cal, "predictions": pred}


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time", help="timed loopback fits with per-round history (cluster)")
    t.add_argument("--store", nargs="+", required=True, metavar="PRESET=PATH")
    t.add_argument("--workers", type=int, default=2)
    t.add_argument("--repeat", type=int, default=3)
    t.add_argument("--scheduler", help="an existing cluster's address (default: a LocalCluster)")
    c = sub.add_parser("calibrate", help="fit the model; print calibration and predictions")
    c.add_argument("--net", required=True, help="bench_network.py --json output")
    c.add_argument("--timed", nargs="+", required=True, help="`time` outputs (1 and 2 workers)")
    c.add_argument("--params", help="write the fitted parameters and problems here")
    p = sub.add_parser("predict", help="predictions from a `calibrate --params` file")
    p.add_argument("--params", required=True)
    r = sub.add_parser("rows", help="solver='row-newton': fit, check and predict")
    r.add_argument("--net", required=True,
                   help="bench_network.py --solvers row-newton row-newton-tasks JSON")
    r.add_argument("--timed", required=True, help="bench_row_calls.py --json output")
    r.add_argument("--params", required=True, help="a `calibrate --params` file (nnz_s)")
    r.add_argument("--fit-on", default="1ms-1Gbit", help="the profile the hops are fitted on")
    for q in (t, c, p, r):
        q.add_argument("--json", help="write the output document here")
    for q in (c, p, r):
        q.add_argument("--rtt-ms", type=float, default=LINK_RTT_S * 1e3)
        q.add_argument("--gbit", type=float, default=LINK_BPS / 1e9)
    return ap.parse_args(argv)


def _stores(pairs: list[str]) -> dict[str, str]:
    """``PRESET=PATH`` pairs; a clear error for anything else."""
    bad = [x for x in pairs if "=" not in x]
    if bad:
        raise SystemExit(f"--store takes PRESET=PATH pairs, got {bad}")
    return dict(x.split("=", 1) for x in pairs)


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; write ``--json`` if given."""
    args = parse(argv)
    if args.cmd == "time":
        doc: Any = time_fits(_stores(args.store), args.workers, args.repeat, args.scheduler)
        print(json.dumps([{k: r[k] for k in ("preset", "seconds", "rounds")} for r in doc]))
    elif args.cmd == "rows":
        doc = rows_report(json.loads(Path(args.net).read_text()),
                          json.loads(Path(args.timed).read_text()),
                          json.loads(Path(args.params).read_text()),
                          Link(args.rtt_ms * 1e-3, args.gbit * 1e9 / 8), args.fit_on)  # fmt: skip
    else:
        link = Link(args.rtt_ms * 1e-3, args.gbit * 1e9 / 8)
        if args.cmd == "calibrate":
            timed = [r for f in args.timed for r in json.loads(Path(f).read_text())]
            doc = calibrate(json.loads(Path(args.net).read_text()), timed)
            if args.params:
                Path(args.params).write_text(json.dumps(doc, indent=1))
        else:
            doc = json.loads(Path(args.params).read_text())
            missing = {"params", "problems"} - set(doc)
            if missing:
                raise SystemExit(f"{args.params}: not a `calibrate --params` file "
                                 f"(no {sorted(missing)})")  # fmt: skip
        doc = report(doc, link)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
