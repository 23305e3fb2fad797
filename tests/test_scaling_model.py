"""benchmarks/scaling_model.py: the model's arithmetic against hand-computed cases, its
calibration recovering known parameters from synthetic points, and its command line.
Fast, no cluster."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scaling_model as sm  # noqa: E402

from dl1.runtime.partition_server import broadcast_tree  # noqa: E402

PRM = sm.Params(nnz_s=2e-9, col_s=3e-8, sub_fixed=0.05, sub_row=1e-8, sub_gram=4e-10,
                ovh_fixed=0.01, ovh_worker=1e-3, ovh_row=2e-9, setup_solve=0.2,
                setup_col=5e-8, rt_solve=30.0, rt_alpha=2.0, rt_round=4.0)  # fmt: skip
LINK = sm.Link(rtt_s=1e-3, bytes_per_s=1e9)
PB = sm.Problem("p", n=1e6, p=1e5, nnz=1e8, rounds=1, ws_size=200, epochs=20, new_col_nnz=1e5)


def test_one_round_one_worker_is_pass_plus_overheads():
    pass_s = 1e8 * 2e-9 + 1e5 * 3e-8  # every nonzero and column on the one worker
    sub_s = 0.05 + 1e6 * 1e-8 + 4e-10 * 200**2 * 20
    ovh_s = 0.01 + 1e-3 * 1 + 2e-9 * 1e6
    net_s = 4.0 * 1e-3 + (8 * 1e6 * 2 + 12 * 1e5) / 1e9  # z in, dz out; no peers
    setup = 0.2 + 5e-8 * 1e5 + (30.0 + 2.0) * 1e-3  # one worker loads every block
    expect = setup + pass_s + (pass_s + sub_s + ovh_s + net_s)  # final certifying pass
    assert sm.fit_time(PB, 1, PRM, LINK) == pytest.approx(expect, rel=1e-12)
    rt = sm.round_terms(PB, 1, PRM, LINK)
    assert rt.total == pytest.approx(pass_s + sub_s + ovh_s + net_s, rel=1e-12)


def test_doubling_workers_halves_the_pass_term_and_adds_a_hop():
    a, b = sm.round_terms(PB, 8, PRM, LINK), sm.round_terms(PB, 16, PRM, LINK)
    assert b.pass_s == pytest.approx(a.pass_s / 2, rel=1e-12)
    assert b.sub_s == a.sub_s  # one worker solves the subproblem, whatever the cluster
    # along the tree: one more send of theta from A, one more reply to handle
    assert b.overhead_s - a.overhead_s == pytest.approx(PRM.ovh_worker, rel=1e-12)
    assert (b.bytes_s - a.bytes_s) * LINK.bytes_per_s == pytest.approx(8 * 1e6, rel=1e-12)
    # straight sends: a vector and a message more for each of the 8 workers added
    a, b = (sm.round_terms(PB, w, PRM, LINK, tree=False) for w in (8, 16))
    assert b.overhead_s - a.overhead_s == pytest.approx(8 * PRM.ovh_worker, rel=1e-12)
    assert (b.bytes_s - a.bytes_s) * LINK.bytes_per_s == pytest.approx(8 * 8 * 1e6, rel=1e-12)


@pytest.mark.parametrize("w, sends", [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (64, 6), (256, 8)])
def test_bytes_term_is_bytes_over_bandwidth(w, sends):
    for tree, out in ((True, sends), (False, w - 1)):
        nbytes = 8 * PB.n * (out + 2) + 12 * PB.new_col_nnz  # theta out, z in, dz out
        assert sm.round_bytes(PB.n, w, PB.new_col_nnz, tree) == nbytes
        got = sm.round_terms(PB, w, PRM, LINK, tree).bytes_s
        assert got == pytest.approx(nbytes / 1e9, rel=1e-12)
    # the brief's bottleneck, straight: 64 workers x 8 bytes x 100M rows, about 51 GB a round
    assert sm.round_bytes(1e8, 64, tree=False) == pytest.approx(64 * 8 * 1e8, rel=0.02)


def test_the_model_sends_theta_as_dl1s_servers_do():
    """The model's sends from A are those of the servers' tree (broadcast_tree)."""
    for w in (2, 3, 8, 64, 256):
        assert len(broadcast_tree([f"w{i}" for i in range(w - 1)])) == sm.theta_sends(w)


def test_remedies_tree_float32_and_rounds():
    w = 64
    built = sm.remedy_terms(PB, w, PRM, LINK, "as built (tree broadcast)")
    nbytes = 8 * PB.n * (6 + 2) + 12 * PB.new_col_nnz  # ceil(log2 64) sends, z in, dz out
    assert built.bytes_s * LINK.bytes_per_s == pytest.approx(nbytes, rel=1e-12)
    assert built.overhead_s == pytest.approx(sm.overhead_seconds(PB.n, 7, PRM), rel=1e-12)
    straight = sm.remedy_terms(PB, w, PRM, LINK, "straight sends (dl1.scan-tree off)")
    assert straight.bytes_s * LINK.bytes_per_s == pytest.approx(
        8 * PB.n * (w + 1) + 12 * PB.new_col_nnz, rel=1e-12
    )
    assert straight.overhead_s == pytest.approx(sm.overhead_seconds(PB.n, w, PRM), rel=1e-12)
    f32 = sm.remedy_terms(PB, w, PRM, LINK, "tree + float32 transport").bytes_s
    assert f32 * LINK.bytes_per_s == pytest.approx(4 * PB.n * 8 + 12 * PB.new_col_nnz, rel=1e-12)
    same = sm.remedy_time(PB, w, PRM, LINK, "as built (tree broadcast)")
    assert same == pytest.approx(sm.fit_time(PB, w, PRM, LINK), rel=1e-12)
    pb = dataclasses.replace(PB, rounds=4)
    half = sm.remedy_time(pb, w, PRM, LINK, "tree + half the rounds")
    rt = sm.round_terms(pb, w, PRM, LINK).total
    assert sm.fit_time(pb, w, PRM, LINK) - half == pytest.approx(2 * rt, rel=1e-9)


def test_efficiency_is_one_for_ideal_scaling():
    ideal = dataclasses.replace(PRM, **{f: 0.0 for f in ("sub_fixed", "sub_row", "sub_gram",
                                "ovh_fixed", "ovh_worker", "ovh_row", "setup_solve",
                                "setup_col", "rt_solve", "rt_alpha", "rt_round")})  # fmt: skip
    no_net = sm.Link(0.0, math.inf)
    assert sm.efficiency(PB, 64, 8, ideal, no_net) == pytest.approx(1.0, rel=1e-12)
    assert sm.efficiency(PB, 64, 8, PRM, LINK) < 1.0


def test_nonneg_lstsq_recovers_and_clips():
    rng = np.random.default_rng(0)
    a = rng.uniform(1, 10, size=(30, 3))
    x = np.array([2.0, 0.5, 3.0])
    assert sm.nonneg_lstsq(a, a @ x) == pytest.approx(x, rel=1e-10)
    b = a[:, :2] @ np.array([1.0, 2.0]) - 0.5 * rng.uniform(0, 1, 30)
    got = sm.nonneg_lstsq(np.column_stack([a[:, :2], rng.uniform(0, 1, 30)]), b)
    assert (got >= 0).all()
    with pytest.raises(ValueError, match="does not match"):
        sm.nonneg_lstsq(a, np.ones(5))


def _synthetic_run(preset, lay, prm, rpc, rounds, rng):
    """A timed 2-worker fit whose figures follow the model exactly."""
    t, hist = 0.0, []
    for r in range(rounds + 1):
        kernel = sm.pass_seconds(lay.nnz_w, lay.cols_w, prm)
        h = {"seconds": t + kernel, "scan_kernel_s": kernel}
        if r < rounds:
            m, ep = float(rng.integers(100, 2000)), float(rng.integers(5, 100))
            h |= {"ws_size": m, "inner_epochs": ep, "inner_s": sm.sub_seconds(lay.n, m, ep, prm)}
            t = h["seconds"] + h["inner_s"] + sm.overhead_seconds(lay.n, 2, prm)
        hist.append(h)
    setup = prm.setup_solve + prm.setup_col * lay.cols_w
    return {"preset": preset, "workers": 2, "rpc_s": rpc, "rounds": rounds,
            "seconds": hist[-1]["seconds"] + setup, "history": hist}  # fmt: skip


def test_fit_compute_recovers_known_parameters():
    rng = np.random.default_rng(1)
    true = dataclasses.replace(PRM, ovh_worker=1.5e-3, rt_solve=0, rt_alpha=0, rt_round=0)
    lays = {(f"s{k}", 2): sm.Layout(int(n), int(p), 0, int(z), int(c)) for k, (n, p, z, c) in
            enumerate(rng.uniform([1e3, 1e4, 1e6, 5e3], [1e6, 5e6, 2e7, 3e6], (6, 4)))}  # fmt: skip
    timed = [_synthetic_run(k[0], lay, true, 1.5e-3, 4, rng) for k, lay in lays.items()]
    got = sm.fit_compute(timed, lays)
    for f in dataclasses.fields(sm.Params):
        assert getattr(got, f.name) == pytest.approx(getattr(true, f.name), rel=1e-6, abs=1e-15)


def test_fit_round_trips_recovers_counts():
    lay = sm.Layout(100, 10, 1000, 600, 6)
    pts = [sm.Point("x", "fit", "l", 1.0, r, a, lay, 1e-3, 1e9, 20 + 3 * a + 4 * r, 0.0, 0.0)
           for r, a in [(1, 1), (4, 1), (9, 10), (15, 10), (5, 1)]]  # fmt: skip
    got = sm.fit_round_trips(pts, PRM)
    assert (got.rt_solve, got.rt_alpha, got.rt_round) == pytest.approx((20, 3, 4), rel=1e-9)


def test_layout_splits_blocks_like_dl1():
    man = {
        "splits": {
            "train": {
                "shape": [50, 100],
                "nnz": 60,
                "col_bounds": [0, 30, 70, 100],
                "blocks": {"csc": [[{"nnz": 10}, {"nnz": 30}, {"nnz": 20}]]},
            }
        }
    }
    lay = sm.layout(man, 2)  # np.array_split: blocks [0, 1] and [2]
    assert (lay.n, lay.p, lay.nnz, lay.nnz_w, lay.cols_w) == (50, 100, 60, 40, 70)
    assert sm.layout(man, 8).nnz_w == 30  # more workers than blocks: one block each


def _params_file(tmp_path):
    doc = {
        "params": dataclasses.asdict(PRM),
        "problems": [dataclasses.asdict(dataclasses.replace(PB, name="q", rounds=3))],
    }
    path = tmp_path / "params.json"
    path.write_text(json.dumps(doc))
    return path


def test_cli_help_and_predict_json(tmp_path):
    script = str(ROOT / "benchmarks" / "scaling_model.py")
    out = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "calibrate" in out.stdout and "predict" in out.stdout
    dest = tmp_path / "pred.json"
    run = subprocess.run([sys.executable, script, "predict", "--params",
                          str(_params_file(tmp_path)), "--json", str(dest)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = json.loads(dest.read_text())["predictions"]
    assert {r["workers"] for r in rows} == set(sm.WORKERS)
    link = sm.Link(sm.LINK_RTT_S, sm.LINK_BPS / 8)
    pb = dataclasses.replace(PB, name="q", rounds=3)
    r64 = next(r for r in rows if r["workers"] == 64 and r["remedy"] == "as built (tree broadcast)")
    assert r64["fit_s"] == pytest.approx(sm.fit_time(pb, 64, PRM, link), rel=1e-12)
    assert r64["efficiency"] == pytest.approx(sm.efficiency(pb, 64, 8, PRM, link), rel=1e-12)


def test_cli_rejects_a_file_without_parameters(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"problems": []}))
    with pytest.raises(SystemExit, match="not a `calibrate --params` file"):
        sm.main(["predict", "--params", str(bad)])
    with pytest.raises(SystemExit, match="PRESET=PATH"):
        sm.main(["time", "--store", "nopath"])


def test_set_up_is_shared_by_the_workers_that_load_the_blocks():
    no_round = dataclasses.replace(PB, rounds=0)
    one, four = (sm.fit_time(no_round, w, PRM, LINK) for w in (1, 4))
    pass_gain = sm.round_terms(PB, 1, PRM, LINK).pass_s * 0.75  # the certifying pass
    assert one - four == pytest.approx(PRM.setup_col * PB.p * 0.75 + pass_gain, rel=1e-12)


ROWS = sm.RowParams(task_s=2e-4, level_s=1e-3, call_s=3e-3, row_s=5e-9, nnz_s=2e-9,
                    setup_nnz_s=1e-8, hops=6)  # fmt: skip


def test_a_row_call_pays_its_tasks_rows_and_hops():
    """A call on 8 partitions: 23 tasks, the rows of one partition, 6 hops and two more
    tree levels' worth."""
    link = sm.Link(rtt_s=2e-3, bytes_per_s=1e9)
    got = sm.row_call_seconds(ROWS, 8, 1e6, link)
    hops = 6 + sm.HOPS_A_LEVEL * 2
    assert got == pytest.approx(3e-3 + 2e-4 * 23 + 1e-3 * 3 + 5e-9 * 1e6 + hops * 1e-3)
    assert [sm.tree_depth(w) for w in (1, 2, 3, 8, 64)] == [0, 1, 2, 3, 6]


def test_a_direct_row_call_pays_its_partitions_rows_levels_and_hops():
    """A direct call on 8 workers holding 16 partitions: no task, two partitions a server
    in turn, a worker's rows, two further levels of the servers' tree (a forward and a
    sum each), and their hops."""
    direct = dataclasses.replace(ROWS, part_s=4e-4, direct=True)
    link = sm.Link(rtt_s=2e-3, bytes_per_s=1e9)
    got = sm.row_call_seconds(direct, 8, 1e6, link, partitions=16)
    hops = 6 + sm.DIRECT_HOPS_A_LEVEL * 2
    assert got == pytest.approx(3e-3 + 4e-4 * 2 + 1e-3 * 2 + 5e-9 * 1e6 + hops * 1e-3)


@pytest.mark.parametrize("direct", [False, True])
def test_row_fit_time_counts_the_bytes_on_its_critical_path(direct):
    """Bytes each over one link: the labels (8 bytes a row) into and out of the scheduler
    by tasks, straight to the workers by direct calls; and up the tree's 2 levels and to
    the client (3 hops): the column statistics (9 bytes a feature), a length-p float64
    vector a pass (rounds + 1 passes) and a packed float32 m x m matrix a model call
    (m (m + 1) / 2 entries)."""
    rp = dataclasses.replace(ROWS, direct=direct)
    pb = sm.Problem("t", n=1e6, p=1e5, nnz=1e8, rounds=2, ws_size=100)
    slow, fast = sm.Link(0.0, 1e6), sm.Link(0.0, 1e12)
    extra = sm.row_fit_time(pb, 4, rp, slow, 10, 3) - sm.row_fit_time(pb, 4, rp, fast, 10, 3)
    labels = (8 if direct else 16) * 1e6
    bytes_ = labels + 3 * (9 * 1e5 + 3 * 8 * 1e5 + 3 * 4 * 100 * 101 / 2)
    assert sm.row_bytes(pb, 4, 3, direct) == pytest.approx(bytes_, rel=1e-12)
    assert extra == pytest.approx(bytes_ / 1e6 - bytes_ / 1e12)


def test_fit_row_params_recovers_known_parameters():
    """Runs made by the model from known parameters give them back: the scheduler's cost a
    task from the partitions series, a call's fixed and per-row costs from the rows."""
    true = dataclasses.replace(ROWS, hops=0.0)
    rng = np.random.default_rng(0)
    runs = []
    for series, n, parts in [("rows", 1e5, 2), ("rows", 3e5, 2), ("rows", 1e6, 2)] + [
        ("partitions", 2e4, q) for q in (2, 4, 8, 16)
    ]:
        calls, rounds, nnz = int(rng.integers(20, 40)), 2, n * 90
        fit_s = (calls * (true.call_s + true.task_s * (3 * parts - 1) + true.row_s * n / parts
                          + true.level_s * sm.tree_depth(parts))
                 + (rounds + 1) * true.nnz_s * nnz / parts)  # fmt: skip
        runs.append({"series": series, "partitions": parts, "calls": calls, "rounds": rounds,
                     "n": n, "nnz": nnz, "fit_seconds": fit_s,
                     "seconds": fit_s + true.setup_nnz_s * nnz / 2})  # fmt: skip
    got = sm.fit_row_params(runs, true.nnz_s)
    assert got.task_s == pytest.approx(true.task_s, rel=1e-6)
    assert got.level_s == pytest.approx(true.level_s, rel=1e-6)
    assert got.call_s == pytest.approx(true.call_s, rel=1e-6)
    assert got.row_s == pytest.approx(true.row_s, rel=1e-6)
    assert got.setup_nnz_s == pytest.approx(true.setup_nnz_s, rel=1e-6)


def test_fit_row_params_recovers_direct_parameters():
    """Direct calls' runs made by the model give back a call's fixed cost, a worker's rows'
    and a partition's; the tree's further level is the message cost given (2 workers do
    not show it); runs by tasks in the same file are left out."""
    true = dataclasses.replace(ROWS, task_s=0.0, level_s=7e-4, hops=0.0, part_s=4e-4,
                               direct=True)  # fmt: skip
    rng = np.random.default_rng(1)
    runs = []
    for series, n, parts in [("rows", 1e5, 2), ("rows", 3e5, 2), ("rows", 1e6, 2)] + [
        ("partitions", 2e4, q) for q in (2, 4, 8, 16)
    ]:
        calls, rounds, nnz = int(rng.integers(20, 40)), 2, n * 90
        link = sm.Link(0.0, 1e9)
        fit_s = (calls * sm.row_call_seconds(true, 2, n / 2, link, partitions=parts)
                 + (rounds + 1) * true.nnz_s * nnz / parts)  # fmt: skip
        for transport, scale in (("direct", 1.0), ("tasks", 3.0)):
            runs.append({"series": series, "partitions": parts, "calls": calls,
                         "rounds": rounds, "n": n, "nnz": nnz, "fit_seconds": fit_s * scale,
                         "seconds": fit_s * scale + true.setup_nnz_s * nnz / 2,
                         "transport": transport, "workers": 2})  # fmt: skip
    got = sm.fit_row_params(runs, true.nnz_s, direct=True, message_s=7e-4)
    assert got.direct and got.task_s == 0.0 and got.level_s == 7e-4
    for field in ("call_s", "row_s", "part_s", "setup_nnz_s"):
        assert getattr(got, field) == pytest.approx(getattr(true, field), rel=1e-6), field
