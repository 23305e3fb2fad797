"""Results combined along a binomial tree of tasks: every partition's result once, in
partition order, on the first one's worker, and the row statistics' combination against
one pass over all rows."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dl1.runtime.executor import LocalExecutor
from dl1.runtime.tree import tree_reduce
from dl1.tasks.rows import add_row_stats, assemble_rows, rows_stats_task


class WhereExecutor(LocalExecutor):
    """In process, recording the partition each combination was sent to."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_to: list[int] = []

    def submit_to(self, part, fn, *args):
        self.sent_to.append(part)
        return super().submit_to(part, fn, *args)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 9])
def test_every_result_once_in_order_with_log2_levels(n):
    """Pass: a non-commutative combination (concatenation) gives the partitions' results in
    order; ``n - 1`` combinations, none sent to a partition that is not the first of its
    pair, and no partition combining more than ``ceil(log2 n)`` times."""
    ex = WhereExecutor()
    got = tree_reduce(ex, [(q, f"<{q}>") for q in range(n)], lambda a, b: a + b)
    assert got == "".join(f"<{q}>" for q in range(n))
    assert len(ex.sent_to) == n - 1
    levels = int(np.ceil(np.log2(n))) if n > 1 else 0
    assert max(np.bincount(ex.sent_to, minlength=1), default=0) <= levels


def test_nothing_to_reduce_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        tree_reduce(LocalExecutor(), [], lambda a, b: a + b)


def test_row_stats_combined_equal_one_pass_over_all_rows():
    """Pass: three partitions' statistics (one without rows, one with an overflowing row)
    combined along the tree equal the statistics of all rows at once: sums of squares,
    weighted sums, counts, the largest row norm and the first bad row."""
    rng = np.random.default_rng(0)
    X = sp.random(60, 9, density=0.3, format="csr", random_state=rng)
    X = sp.csr_matrix(X.multiply(np.arange(9) != 4))  # column 4 without a nonzero value
    X.data[X.indptr[41]] = 1e200  # row 41 (third partition): its square overflows
    X.data[X.indptr[45]] = 1e200  # a later bad row: not the one reported
    sw = rng.uniform(0.5, 2.0, 60)
    cuts = [0, 25, 25, 60]
    parts = [[assemble_rows(k, a, X[a:b])] if b > a else [] for k, (a, b) in
             enumerate(zip(cuts[:-1], cuts[1:], strict=True))]  # fmt: skip
    each = [(q, rows_stats_task(blocks, sw[cuts[q]:cuts[q + 1]], cuts[q]))
            for q, blocks in enumerate(parts)]  # fmt: skip
    got = tree_reduce(LocalExecutor(), each, add_row_stats)
    whole = rows_stats_task([assemble_rows(0, 0, X)], sw, 0)
    np.testing.assert_array_equal(np.isinf(got.col_sq), np.isinf(whole.col_sq))
    fin = np.isfinite(whole.col_sq)
    np.testing.assert_allclose(got.col_sq[fin], whole.col_sq[fin], rtol=1e-12)
    np.testing.assert_allclose(got.col_wsq[fin], whole.col_wsq[fin], rtol=1e-12)
    np.testing.assert_array_equal(got.col_any, whole.col_any)
    assert got.col_any.any() and not got.col_any.all()
    assert got.row_sqnorm_max == whole.row_sqnorm_max
    assert got.bad_row == whole.bad_row == (41, 1e200)
