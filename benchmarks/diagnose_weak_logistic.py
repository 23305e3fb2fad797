"""Why a weakly regularised L1-logistic fit certifies slowly: its dual point, step by step.

One in-process ``dl1.fit`` on Debian's package descriptions (``debian_text.py``, label
``libs``) at ``C`` (``alpha = 1 / (C n)``), recording the margins ``z = X w + b`` the
working-set solver certifies at each round and those of every Newton step of the chosen
subproblems (by wrapping dl1's own functions in this process). Then, with the full matrix
in NumPy, relative to ``P(0)`` and to the answer's objective ``P``:

- the dual suboptimality ``P - D`` of the round's dual point and of its extrapolation from
  the last ``K`` rounds (Anderson / dual extrapolation: Massias, Salmon & Gramfort, ICML
  2018; Massias, Vaiter, Gramfort & Salmon, JMLR 2020);
- the same along the Newton steps of the chosen subproblems;
- the dual point's infeasibility ``max_j |x_j^T theta| / (n alpha) - 1``, and ``P`` minus the
  dual objective before the rescaling that makes the point feasible;
- the features that violate their constraint most at the last recorded step.

``python benchmarks/diagnose_weak_logistic.py --C 10000 --tol 1e-6 --subproblems 9,15``
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import dl1
import dl1.solvers.ws as ws_module
import dl1.tasks.prox_newton as pn_module
import dl1.tasks.subproblem as subproblem_module
from dl1.objective.datafits import Logistic
from dl1.objective.gap import duality_gap
from dl1.objective.penalties.elastic_net import ElasticNet


class Recorder:
    """The margins of each round and of each Newton step of the chosen subproblems."""

    def __init__(self, keep: set[int]) -> None:
        self.keep, self.rounds, self.steps = keep, [], {}
        self._calls, self._current = 0, None

    def install(self) -> None:
        dual_point, newton, move = (ws_module.pass_dual_point, pn_module.prox_newton,
                                    pn_module.move_along)  # fmt: skip

        def recorded_dual_point(datafit, y, z, s, fit_intercept):
            out = dual_point(datafit, y, z, s, fit_intercept)
            self.rounds.append(z.copy())
            return out

        def recorded_newton(*args, **kwargs):
            self._current = [] if self._calls in self.keep else None
            if self._current is not None:
                self.steps[self._calls] = self._current
            self._calls += 1
            return newton(*args, **kwargs)

        def recorded_move(z, u, e, t):
            move(z, u, e, t)
            if self._current is not None:
                self._current.append(z.copy())

        ws_module.pass_dual_point = recorded_dual_point
        pn_module.move_along = recorded_move
        for name in dir(subproblem_module):
            if getattr(subproblem_module, name) is newton:
                setattr(subproblem_module, name, recorded_newton)


def extrapolated(zs: list[np.ndarray]) -> np.ndarray | None:
    """Anderson extrapolation of the sequence ``zs`` (K + 1 points), None if singular."""
    Z = np.array(zs)
    U = np.diff(Z, axis=0)
    try:
        c = np.linalg.solve(U @ U.T, np.ones(U.shape[0]))
    except np.linalg.LinAlgError:
        return None
    return (c / c.sum()) @ Z[1:] if np.isfinite(c).all() and c.sum() != 0 else None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--C", type=float, default=1e4)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--subproblems", default="9,15", help="Newton solves to record (0-based)")
    ap.add_argument("--K", type=int, default=5)
    args = ap.parse_args(argv)
    from debian_text import binary_label, load

    d = load()
    X, y = d.X.tocsc(), binary_label(d, "libs")
    n = X.shape[0]
    alpha = 1.0 / (args.C * n)
    rec = Recorder({int(k) for k in args.subproblems.split(",")})
    rec.install()
    t0 = time.perf_counter()
    res = dl1.fit(X, y, alpha=alpha, loss="logistic", tol=args.tol)
    print(f"fit {time.perf_counter() - t0:.1f} s, {len(res.history_)} rounds, "
          f"gap {res.dual_gap_:.2e}")  # fmt: skip
    df, pen = Logistic(), ElasticNet(alpha)
    z_end = X @ res.coef_ + res.intercept_
    p0 = df.value(y, np.full(n, df.initial_intercept(y)))

    def dual(z: np.ndarray) -> float:
        theta = df.dual_point(y, z, None, True)
        return duality_gap(df, pen, y, z_end, res.coef_, X.T @ theta, theta=theta)[1]

    P = duality_gap(df, pen, y, z_end, res.coef_, X.T @ df.dual_point(y, z_end, None, True),
                    theta=df.dual_point(y, z_end, None, True))[0]  # fmt: skip

    def show(label: str, zs: list[np.ndarray], every: int) -> None:
        for k in range(len(zs)):
            if k % every and k != len(zs) - 1:
                continue
            line = f"{label} {k:3d}  P-D {(P - dual(zs[k])) / p0:.2e}"
            acc = extrapolated(zs[k - args.K:k + 1]) if k >= args.K else None
            if acc is not None:
                line += f"  extrapolated {(P - dual(acc)) / p0:.2e}"
            print(line)

    show("round", rec.rounds, 1)
    for i, zs in sorted(rec.steps.items()):
        print(f"subproblem {i}: {len(zs)} Newton steps")
        show("  step", zs, 10)
        for k in (0, len(zs) // 2, len(zs) - 1):
            theta = df.dual_point(y, zs[k], None, True)
            excess = np.abs(X.T @ theta).max() / (n * alpha) - 1
            print(f"  step {k:3d}  infeasibility {excess:.2e}  P - D before rescaling "
                  f"{(P + df.conjugate(y, theta)) / p0:.2e}")  # fmt: skip
    last = rec.steps[max(rec.steps)][-1] if rec.steps else z_end
    theta = df.dual_point(y, last, None, True)
    excess = np.abs(X.T @ theta) / (n * alpha) - 1
    print("most violated constraints at the last recorded step:")
    for j in np.argsort(-excess)[:8]:
        rows = X.indices[X.indptr[j]:X.indptr[j + 1]]
        prob = 1 / (1 + np.exp(-last[rows]))
        print(f"  feature {j}: excess {excess[j]:.2e}, coef {res.coef_[j]:.3g}, {rows.size} rows, "
              f"p in [{prob.min():.1e}, {prob.max():.1e}]")  # fmt: skip
    print(f"features with excess > 1e-3: {(excess > 1e-3).sum()}, > 1e-4: {(excess > 1e-4).sum()}"
          f"; support {np.count_nonzero(res.coef_)}")  # fmt: skip


if __name__ == "__main__":
    main()
