"""The working set's growth from round to round (:func:`next_ws_size`): the coordinator's
choice (:mod:`dl1.solvers.ws`) and the per-block quota of candidates a partition server's
pass returns after a subproblem (:mod:`dl1.runtime.partition_server`), the same function
on the same values."""

from __future__ import annotations

#: Working-set size of the first round (later: :func:`next_ws_size`).
WS_START = 128

#: A working set whose solution's support fills at least this fraction of it was too
#: small (:func:`next_ws_size`).
WS_FILLED = 0.9
#: The growth of a working set that was too small, in multiples of the support.
WS_FAST_GROWTH = 4
#: A round whose gap fell to more than this fraction of the last made little use of its
#: working set (:func:`next_ws_size`).
WS_SLOW_GAP = 0.5


def next_ws_size(support: int, last_ws: int, ws_start: int, slow: bool = False) -> int:
    """The next working set's size: twice the support (celer's rule; Massias, Gramfort &
    Salmon, ICML 2018), at least ``ws_start``; :data:`WS_FAST_GROWTH` times the support
    when the last working set's solution filled it (``support >= WS_FILLED last_ws``), and
    its square when besides the gap fell little (``slow``: the last round's gap above
    :data:`WS_SLOW_GAP` of the one before).

    A full working set says the features that belong in the solution do not fit in it:
    at weak regularisation, where most violators enter, every round's support fills its
    set, and doubling from ``ws_start`` takes ``log2(p / ws_start)`` rounds, each solving
    a subproblem that the next round enlarges, before the set holds the solution's
    support. Growing faster there halves those rounds; a set not filled grows as before.
    A full set whose solution barely moved the gap holds a small part of what the gap
    measures (``shortclf`` at C = 100: sets of 512 to 32,764 features each cut it by 1-6%;
    benchmarks/RESULTS.md, "grow faster where the gap stalls").
    """
    filled = last_ws > 0 and support >= WS_FILLED * last_ws
    growth = 2 if not filled else WS_FAST_GROWTH**2 if slow else WS_FAST_GROWTH
    return max(ws_start, growth * support, 1)
