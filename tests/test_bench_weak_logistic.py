"""benchmarks/bench_weak_logistic.py's equal-gap rows (its fits need Debian's apt lists;
the rows' logic is tested with the child processes replaced)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
