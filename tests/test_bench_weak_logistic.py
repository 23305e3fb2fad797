"""benchmarks/bench_weak_logistic.py's equal-gap rows (its fits need Debian's apt lists;
the rows' logic is tested with the child processes replaced)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
bw = pytest.importorskip("bench_weak_logistic")


def test_dl1_is_timed_again_at_a_looser_peers_gap(monkeypatch):
    asked = []

    def child(target, name, C, tol, label, workers, limit):
        asked.append(tol)
        return {"seconds": 0.5, "gap": tol / 3, "nnz": 7, "peak_mb": 1.0}

    monkeypatch.setattr(bw, "child", child)
    args = argparse.Namespace(equal_gap=True, tol=1e-6, repeat=3, label="libs", limit=10.0)
    peer = {"solver": "liblinear", "gap": "1.1e-03", "seconds": "2.00"}
    (row,) = bw.at_peer_gap(peer, 100.0, args)
    assert asked == [1.1e-3] * 3
    assert row["solver"] == "dl1 at liblinear's gap" and row["seconds"] == "0.50"
    assert row["notes"].startswith("tol 1.1e-03: 0.25 x liblinear")
    # a peer at dl1's gap or tighter, a failed peer, or --no-equal-gap: no row
    assert bw.at_peer_gap(peer | {"gap": "1.0e-07"}, 100.0, args) == []
    assert bw.at_peer_gap(peer | {"gap": "-"}, 100.0, args) == []
    off = argparse.Namespace(**vars(args) | {"equal_gap": False})
    assert bw.at_peer_gap(peer, 100.0, off) == []


def test_the_grid_table_counts_looser_fits_and_chooses_by_mean_score(capsys):
    """Per C and code: seconds summed over folds, the largest gap, and for dl1's the fits
    looser than liblinear's on their fold; the last row the totals, looser fits and each
    grid's best C by mean held-out score."""
    cells = {  # (fold, C, [seconds, gap, held-out score])
        "liblinear": [[[1.0, 1e-3, 0.5], [2.0, 1e-2, 0.9]], [[1.5, 2e-3, 0.6], [2.5, 3e-2, 0.8]]],
        "path 0.0001": [[[0.1, 1e-5, 0.8], [0.2, 2e-5, 0.6]],
                        [[0.1, 3e-5, 0.8], [0.3, 1e-5, 0.6]]],  # fmt: skip
        "at_gap": [[[0.2, 2e-3, 0.7], [0.3, 1e-2, 0.6]], [[0.2, 1e-3, 0.7], [0.4, 2e-2, 0.6]]],
    }
    bw.print_grid({"Cs": [1.0, 100.0], "names": list(cells), **cells})
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ")]
    first, second, total = ([c.strip() for c in r.strip("|").split("|")] for r in rows[-3:])
    # fold 0's 2e-3 at C = 1 is looser than liblinear's 1e-3 there
    assert first == ["1", "2.50, 2.0e-03", "0.20, 3.0e-05, 0", "0.40, 2.0e-03, 1"]
    assert second == ["100", "4.50, 3.0e-02", "0.50, 2.0e-05, 0", "0.70, 2.0e-02, 0"]
    assert total == ["all (looser fits of 50, chosen C)", "**7.00**, C 100", "**0.70**, 0, C 1",
                     "**1.10**, 1, C 1"]  # fmt: skip


def test_held_out_accuracy_maps_the_larger_label_to_positive_margins():
    X = np.array([[1.0], [-1.0], [2.0]])
    assert bw.held_out(X, np.array([3, 0, 0]), np.array([1.0]), 0.0) == 2 / 3
    assert bw.held_out(X, np.array([1, -1, 1]), np.array([1.0]), 0.0) == 1.0
