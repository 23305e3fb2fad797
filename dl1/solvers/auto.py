"""``solver="auto"``: the solver for a problem, by a documented rule.

The rule, and the measurements behind it (``benchmarks/RESULTS.md``, "Choosing a
solver"): on this project's tall and short text presets (200,000 x 230,000 with 16
nonzeros per row; 400,000 x 260,941 with 88), for the squared loss, l1_ratio 0.5 and 1,
alpha_max/20 and alpha_max/1000 and tolerances 1e-2 to 1e-6, the working-set solver was
faster than every sample-wise solver in every case, by 1.3x (Prox-SDCA at tol 1e-2) to 21x
(Prox-SDCA at alpha_max/1000): its passes certify and select at once, and its subproblems
are solved on the few columns that matter. So:

* a loss that is not smooth (the hinge): ``"smoothing"``, exact LP working sets (pure L1)
  or the working-set solver on smoothed hinges with continuation (elastic net)
  (:mod:`dl1.solvers.smoothing`), certified by the hinge's gap (Prox-SDCA and the online
  solvers stopped at relative gaps 0.4-0.9 on a 300 x 100 L1 problem);
* every other problem: ``"ws"``, whatever its shape, row length, sparsity, tolerance or
  cluster size, until a measurement says otherwise.
"""

from __future__ import annotations

from typing import Any


def choose_solver(datafit: Any) -> str:
    """The registered solver name ``solver="auto"`` means for a problem with ``datafit``."""
    return "ws" if datafit.smooth else "smoothing"
