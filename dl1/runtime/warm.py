"""Every kernel the solvers use compiled (or loaded from numba's cache) once per process,
before the first solve needs it: on the workers (:mod:`dl1.runtime.memory` measures their
baseline after it) and in the coordinating process."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dl1.kernels.gram import gram_matvec, take_submatrix
from dl1.objective.datafits import Logistic, Quadratic
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.tasks.blocks import assemble_block
from dl1.tasks.columns import extract_task
from dl1.tasks.gram import GRAM_DTYPE
from dl1.tasks.passes import matvec_task, round_task, scan_task
from dl1.tasks.subproblem import SubproblemSettings, subproblem_task

#: Whether this process has run :func:`warm_up` (a worker serves many fits).
_WARM = False


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel the solver uses, for both dtypes;
    once per process."""
    global _WARM
    if _WARM:
        return
    import sklearn.exceptions  # noqa: F401  (dl1.ConvergenceWarning's base)

    # local: loading zarr and its codecs is this warm-up's purpose, not import dl1.runtime.warm's
    import dl1.store.reader  # noqa: F401  (zarr and the codecs: every task reading a store)

    for dtype in (np.float64, np.float32):
        m = sp.csc_matrix(np.array([[1.0, 0.0], [2.0, 3.0]], dtype=dtype))
        blk = assemble_block(0, 0, np.zeros(0), False, True, m)
        g = np.array([0.1, -0.1])
        round_task(
            [blk],
            [(np.zeros(0, np.int64), np.zeros(0))],
            g,
            g,
            np.zeros(0),
            1.0,
            1.0,
            0.1,
            0.0,
            1,
            False,
            0,
            0.2,
            True,
        )
        round_task(
            [blk],
            [(np.zeros(0, np.int64), np.zeros(0))],
            g,
            g,
            np.ones(2),
            1.0,
            1.0,
            0.1,
            0.0,
            1,
            True,
            0,
            0.2,
            True,
        )
        matvec_task([blk], [(np.array([0]), np.array([1.0]))], 2)
        # working-set solver: scan (with screening), gathering, both subproblem paths
        none = [(np.zeros(0, np.int64), np.zeros(0))]
        scan_task([blk], g, 0.2, none, 1, [None], (g, 1.0, 0.1))
        ext = extract_task(blk, np.array([0, 1]))
        y = np.array([1.0, -1.0])
        for datafit, gram_max in ((Quadratic(), 4096), (Quadratic(), 0), (Logistic(), 4096)):
            subproblem_task(
                [ext],
                [np.array([0, 1])],
                [True],
                np.array([0, 1]),
                np.zeros(2),
                y,
                np.zeros(2),
                np.zeros(0),
                SubproblemSettings(datafit, ElasticNet(0.01), True, 0.0, 12, gram_max=gram_max),
            )
    # kernels the tiny subproblems above do not reach: a cached float32 Gram matrix reused
    # by the next working set, and its products (one Gram dtype: once, not per data dtype)
    Q = np.eye(2, dtype=GRAM_DTYPE)
    gram_matvec(Q, np.ones(2), np.zeros(2))
    take_submatrix(Q, np.arange(2), np.zeros_like(Q), np.arange(2))
    _WARM = True


def warm_coordinator() -> None:
    """Load the kernels the coordinating process runs itself (the datafit's reductions,
    :mod:`dl1.kernels.vectors`): numba's first load in a process takes ~0.3 s, paid here
    with the workers' warm-up rather than inside a fit's first round."""
    one = np.ones(2)
    Quadratic().value(one, one)
