"""Working-set solver: full distributed passes certify, small gathered subproblems solve.

Each outer iteration makes one pass over the data on the workers (per partition
:func:`dl1.solvers._tasks.scan_task`): it yields the duality gap of the current point (the
certificate, from block-reduced statistics of ``X^T theta``) and each block's most
violating features. The coordinator keeps the support and adds the worst violators, up to
``max(ws_start, 2 |support|)`` features (the growth rule of skglm / celer); the chosen
columns are extracted on the workers that hold them and gathered by one worker task, which
solves the restricted problem by coordinate descent to a gap of ``inner_ratio`` times the
current one. Only ``theta`` (length n), index lists, and the restricted solution travel
through the coordinator; the columns move worker to worker.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dl1.gap import duality_gap_from_stats
from dl1.solvers import _tasks as T
from dl1.solvers.cd import FitResult, _sparse_parts, finish

#: Working-set size of the first outer iteration (later: ``max(WS_START, 2 |support|)``).
WS_START = 128

#: Violators added per outer iteration at least, when a column budget (out of core) binds:
#: the larger of this number and :data:`WS_MIN_GROWTH` times the support's size.
WS_MIN_NEW = 16

#: ... (a support that fills the budget alone gains little per pass otherwise: at the dense
#: end of the out-of-core benchmark, 16 new features per pass made 6-11 passes per alpha,
#: against 1-1.3 before the budget bound; what exceeds the budget is spilled to disk by the
#: workers, see :func:`dl1.worker.managed_target`).
WS_MIN_GROWTH = 0.125


def solve_ws(
    ex: Any,
    blocks: list[Any],
    col_bounds: np.ndarray,
    y: np.ndarray,
    sw: np.ndarray,
    datafit: Any,
    penalty: Any,
    *,
    fit_intercept: bool,
    tol: float,
    max_rounds: int,
    n_partitions: int,
    ws_start: int = WS_START,
    inner_ratio: float = 0.3,
    max_epochs: int = 50_000,
    random_order: bool = False,
    seed: int = 0,
    loss_name: str = "",
    verbose: bool = False,
    callback: Any = None,
    w0: np.ndarray | None = None,
    b0: float | None = None,
    handles: tuple[Any, Any] | None = None,
    screen: bool = False,
    dense_max: int = T.GRAM_DENSE_MAX,
    gram_max: int = T.GRAM_MAX,
    gram_key: str | None = None,
    z0: np.ndarray | None = None,
    reuse: LastScan | None = None,
    groups0: list | None = None,
    seq: tuple[np.ndarray, float] | None = None,
    tight_inner: bool = False,
    spread: bool | str | None = None,
    gather_max: float = np.inf,
    spread_gram0: tuple[Any, np.ndarray] | None = None,
    col_bytes: np.ndarray | None = None,
    cache_max: float = np.inf,
) -> tuple[FitResult, np.ndarray, LastScan]:
    """Run outer iterations until ``gap <= tol * P(0)``; see the module docstring.

    ``w0, b0`` warm-start the solve; ``X w0 + b0`` is recomputed on the workers unless
    ``z0`` gives it. ``reuse``, the :class:`LastScan` of the previous solve of a path (same
    ``w0, b0, z0``), replaces the first pass (Lasso and L1-logistic without screening):
    ``X^T theta`` does not depend on alpha, only the thresholds do, so the certifying pass of
    one alpha is also the first pass of the next. Returned: the result, ``X w + b`` and the
    :class:`LastScan` of the last pass (whose ``groups``, the gathered columns, can be
    passed as ``groups0`` to the next solve). ``handles`` are task handles of
    ``y`` and ``sw`` shared between solves of a path. With ``screen`` (Lasso and
    L1-logistic), each pass also applies the gap-safe sphere test of the previous point and
    later passes skip the screened columns; the certificate is then the gap of the screened
    problem, whose optimum is the same (Ndiaye et al., JMLR 2017). ``dense_max`` bounds the
    working set densified for its Gram matrix and ``gram_max`` the largest working set solved
    on its Gram matrix (see :func:`~dl1.solvers._tasks.subproblem_task`), which the worker
    keeps between rounds under ``gram_key`` (default: a key drawn for this solve; a path
    passes one key to share the Gram matrix across its alphas). ``seq``, the ``(theta,
    xt_bound)`` of the previous solve's :class:`LastScan` at this very point (``w0, z0``),
    makes the first pass apply the sequential gap-safe rule: the sphere of the previous
    solution at this alpha (see :func:`sequential_sphere`). With ``tight_inner`` the
    subproblem's target is ``inner_ratio`` times the final one (``tol * P(0)``) rather than
    times the current gap. ``spread`` solves the subproblem where its columns were
    extracted instead of gathering them on one worker: for the squared loss on a Gram matrix
    formed across the partitions (:func:`spread_gram_subproblem`; ``spread_gram0``, a previous
    solve's :attr:`LastScan.spread_gram`, seeds its entries) when it fits the gather budget,
    else (or with ``"cocoa"``) by CoCoA+ rounds over the partitions
    (:func:`spread_subproblem`); default (None): out
    of core, when the working set's columns could exceed ``gather_max`` bytes (12 bytes per
    row and column, the worst case of dense columns). ``col_bytes`` (bytes of each column
    when extracted, from the store's column counts) bounds the growth of the working set:
    violators join it while its columns fit ``cache_max`` bytes (out of core, what the
    workers can hold), at least :data:`WS_MIN_NEW` of them or :data:`WS_MIN_GROWTH` times
    the support's size; the support always stays.
    """
    n = y.shape[0]
    p = int(col_bounds[-1])
    K = len(blocks)
    own_key = gram_key is None
    if own_key:
        gram_key = uuid.uuid4().hex
    n_partitions = max(1, min(n_partitions, K))
    parts = [list(a) for a in np.array_split(np.arange(K), n_partitions)]
    part_of_block = np.zeros(K, dtype=np.int64)
    for q, part in enumerate(parts):
        part_of_block[part] = q
    streamed = K > 0 and isinstance(blocks[0], T.BlockSource)
    s_arg = None if sw.shape[0] == 0 else sw
    threshold = n * penalty.alpha_l1
    b_zero = datafit.initial_intercept(y, s_arg) if fit_intercept else 0.0
    p0 = datafit.value(y, np.full(n, b_zero), s_arg)
    w = np.zeros(p) if w0 is None else np.asarray(w0, dtype=np.float64).copy()
    b = (b_zero if b0 is None else float(b0)) if fit_intercept else 0.0
    z = np.full(n, b)
    if z0 is not None:
        z = np.asarray(z0, dtype=np.float64).copy()
    elif w.any():
        for u in ex.gather(
            [
                ex.submit(
                    T.matvec_task, [blocks[j] for j in part], _sparse_parts(w, col_bounds, part), n
                )
                for part in parts
            ]
        ):
            z += u
    passes = 0.0
    if z0 is None and w.any() and isinstance(blocks[0], T.BlockSource):  # out of core: reads
        nz = np.searchsorted(col_bounds, np.flatnonzero(w), side="right") - 1
        total = sum(blk.nnz for blk in blocks)
        passes = sum(blocks[j].nnz for j in np.unique(nz)) / max(1, total)
    history: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    converged = False
    primal = dual = gap = np.inf
    rounds = 0
    ws_size = ws_start
    screen = screen and penalty.alpha_l2 == 0.0 and penalty.alpha_l1 > 0.0
    alive: list[np.ndarray | None] = [None] * K
    prev: tuple[np.ndarray, float, float] | None = None
    block_nnz = np.full(K, -1, dtype=np.int64)
    max_s = 1.0 if sw.shape[0] == 0 else float(sw.max())
    if screen and seq is not None and z0 is not None and np.isfinite(seq[1]):
        prev = sequential_sphere(datafit, penalty, y, z, w, s_arg, max_s, *seq)
    col_norm_max = -1.0  # largest column norm, from the first pass (which reads every block)
    # gathered columns (task handle, feature ids, made for this round), cached across rounds
    # and, in a path, across alphas (the working sets of neighbouring alphas share most columns)
    groups: list[tuple[Any, np.ndarray, bool]] = list(groups0 or [])
    # constant inputs of the subproblem travel once (held by tasks, hence recomputable)
    if handles is None:
        handles = (ex.submit(T.identity, y), ex.submit(T.identity, sw))
    y_h, sw_h = handles
    can_reuse = not screen and penalty.alpha_l2 == 0.0 and reuse is not None
    spread_gram = spread_gram0
    # the next pass, run by the subproblem's server right after it (direct calls, in memory)
    then_scan = getattr(ex, "submit_then_scan", None) if not screen else None
    # ... and a pass the coordinator asks for, by that server too: it fetches the first
    # working set's columns while the coordinator chooses them
    then_pass = getattr(ex, "submit_pass", None) if not screen else None
    part_blocks = [[blocks[j] for j in part] for part in parts]
    part_bounds = [[(int(col_bounds[j]), int(col_bounds[j + 1])) for j in part] for part in parts]

    def pass_plan() -> tuple:  # a pass's partitions, for the subproblem's server
        alive_parts = [[alive[j] for j in part] for part in parts]
        return part_blocks, part_bounds, alive_parts, threshold, ws_start

    pending: tuple[list[Any], float] | None = None
    for r in range(max_rounds + 1):
        support = np.flatnonzero(w)
        ws_size = max(ws_start, 2 * support.shape[0])
        t0 = time.perf_counter()
        server_s = 0.0  # seconds of a pass the server ran after a subproblem (timed there)
        scans = None
        if r == 0 and can_reuse and reuse.ws_size == ws_size:
            # the previous alpha's last pass, at this very point: scores shift with the
            # threshold (|c_j| - n alpha_l1), the order and ||X^T theta||_inf do not
            theta = reuse.theta
            shift = reuse.threshold - threshold
            per_block = [
                (st, cand, score + shift, a, 0, nm) for st, cand, score, a, _, nm in reuse.per_block
            ]
            block_nnz = reuse.block_nnz.copy()
            scan_kernel = 0.0
        else:
            db, theta = T.pass_dual_point(datafit, y, z, s_arg, fit_intercept)
            b += db
            if pending is not None:  # the server ran this pass, at this very theta
                scans, server_s = pending
            elif then_pass is not None:  # the server runs it now (timed here, whole)
                by_pass = then_pass(
                    *pass_plan(),
                    theta,
                    [_sparse_parts(w, col_bounds, part) for part in parts],
                    ws_size,
                    support,
                    [ids for _, ids, _ in groups],
                )
                scans = None if by_pass is None else by_pass.result()
            if scans is not None:
                per_block = [blk for res, _ in scans for blk in res]
                scan_kernel = max(dt for _, dt in scans)
            else:
                per_block, scan_kernel = scan_pass(
                    ex,
                    blocks,
                    parts,
                    col_bounds,
                    theta,
                    threshold,
                    w,
                    ws_size,
                    alive,
                    prev,
                    norms=screen and r == 0,
                )
            if screen and r == 0:
                col_norm_max = max((blk[5] for blk in per_block), default=-1.0)
        by_server, pending = scans is not None, None
        t_scan = time.perf_counter() - t0 + server_s
        last = LastScan(per_block, theta, threshold, ws_size, block_nnz)
        for j, blk in enumerate(per_block):
            alive[j] = blk[3]
            if block_nnz[j] < 0:  # the first scan visits every column of the block
                block_nnz[j] = blk[4]
        passes += sum(blk[4] for blk in per_block) / max(1, int(block_nnz.sum()))
        absmax = max((s[0][0] for s in per_block), default=0.0)
        excess = float(sum(s[0][1] for s in per_block))
        primal, dual, gap = duality_gap_from_stats(
            datafit,
            penalty,
            y,
            z,
            w[support],  # the penalty of the nonzeros (p can be millions)
            absmax,
            excess,
            s=s_arg,
            intercept=fit_intercept,
            theta=theta,
        )
        if screen:
            # gap-safe sphere of this point, applied during the next pass
            radius = float(np.sqrt(max(gap, 0.0) * 2.0 * n * max_s * datafit.beta))
            prev = (theta, penalty.dual_feasible_scale(absmax, n), radius)
        rel = gap / p0 if p0 > 0 else gap
        entry = {
            "round": r,
            "objective": primal,
            "gap": rel,
            "nnz": int(support.shape[0]),
            "seconds": time.perf_counter() - t_start,
            "scan_s": t_scan,
            "scan_kernel_s": scan_kernel,
            "alive": int(
                sum(
                    col_bounds[j + 1] - col_bounds[j]
                    if a is None
                    else int(np.unpackbits(a, count=int(col_bounds[j + 1] - col_bounds[j])).sum())
                    for j, a in enumerate(alive)
                )
            ),
            "passes": passes,
            "transport": ex.transport,
            "scan_by_server": by_server,
        }
        history.append(entry)
        rounds = r
        if verbose:
            print(f"outer {r:3d}  objective {primal:.10g}  gap {rel:.3e}  nnz {entry['nnz']}")
        if callback is not None:
            callback(entry)
        if rel <= tol:
            converged = True
            break
        if r == max_rounds:
            break
        ws = choose_working_set(support, per_block, col_bounds, ws_size, col_bytes, cache_max)
        # columns are gathered once and cached where the subproblem runs: only new ones move
        # a group mostly stale is compacted where it lives: the cache never holds more than
        # twice the working set's columns
        kept = []
        lives = []
        if groups:
            flags = np.isin(np.concatenate([ids for _, ids, _ in groups]), ws)
            lives = np.split(flags, np.cumsum([ids.shape[0] for _, ids, _ in groups])[:-1])
        for (h, ids, _), live in zip(groups, lives, strict=True):
            if 2 * live.sum() >= ids.shape[0]:
                kept.append((h, ids, False))
            elif live.any():
                # made for this round's subproblem (True): its compaction is kernel time
                kept.append((ex.submit(T.compact_task, h, np.flatnonzero(live)), ids[live], True))
        groups = kept
        cached = np.concatenate([ids for _, ids, _ in groups] or [np.zeros(0, np.int64)])
        new = np.setdiff1d(ws, cached)
        owner = np.searchsorted(col_bounds, new, side="right") - 1
        for j in np.unique(owner):
            ids = new[owner == j]
            local = ids - col_bounds[j]
            if streamed:  # read where its partition's subproblem share would run
                h = ex.submit_to(int(part_of_block[j]), T.extract_task, blocks[j], local)
            else:
                h = ex.submit(T.extract_task, blocks[j], local)
            groups.append((h, ids, True))
            if streamed:  # out of core, gathering reads the block
                passes += blocks[j].nnz / max(1, int(block_nnz.sum()))
        t1 = time.perf_counter()
        use_spread = bool(spread)
        if spread is None:
            use_spread = streamed and 12.0 * n * ws.shape[0] > gather_max
        # out of core, passes cost most: a spread subproblem goes to the final target at once
        tight = tight_inner or use_spread
        target = inner_ratio * (min(gap, tol * p0) if tight else gap)
        # on its Gram matrix the subproblem's epochs are cheap: solved to the final target
        gram_target = inner_ratio * min(gap, tol * p0)
        inner: dict[str, Any] = {}
        # a spread Gram matrix (float32), the one being merged and the new columns' products
        # (float64) on one worker: about 16 m^2 bytes, within the gather budget
        spread_q = (
            use_spread
            and spread != "cocoa"
            and datafit.beta == 1.0
            and ws.shape[0] <= min(gram_max, np.sqrt(gather_max / 16.0))
        )
        if spread_q:
            b, n_checks, epochs, kern, spread_gram = spread_gram_subproblem(
                ex,
                groups,
                ws,
                part_of_block,
                col_bounds,
                w,
                b,
                z,
                y,
                sw,
                datafit,
                penalty,
                fit_intercept,
                gram_target,
                spread_gram,
                min(gather_max / 8.0, float(SPREAD_PIECE_BYTES)),
                dense_max,
                max_epochs,
                col_bytes=col_bytes,
                share_bytes=gather_max * SHARE_FRACTION,
            )
            inner["inner_checks"] = n_checks
        elif use_spread:
            b, n_rounds, kern = spread_subproblem(
                ex,
                groups,
                ws,
                part_of_block,
                col_bounds,
                w,
                b,
                z,
                y,
                sw,
                datafit,
                penalty,
                fit_intercept,
                target,
                col_bytes=col_bytes,
                share_bytes=gather_max * SHARE_FRACTION,
            )
            epochs = n_rounds * SPREAD_EPOCHS
            inner["inner_rounds"] = n_rounds
        else:
            sub_args = (
                [h for h, _, _ in groups],
                [ids for _, ids, _ in groups],
                [fresh for _, _, fresh in groups],
                ws,
                w[ws],
                y_h,
                z,
                sw_h,
                datafit,
                penalty,
                fit_intercept,
                target,
                max_epochs,
                10,
                random_order,
                seed * 7919 + r,
                5,
                gram_max,
                dense_max,
                gram_key,
                gram_target,
            )
            fused = None
            if then_scan is not None:  # the subproblem, then the next pass, in one call
                fused = then_scan(
                    *pass_plan(),
                    T.subproblem_task,
                    *sub_args,
                )
            if fused is not None:
                res, scans, scan_s = fused.result()
                if scans is not None:
                    pending = (scans, scan_s)
            else:
                (res,) = ex.gather([ex.submit(T.subproblem_task, *sub_args)])
            w_ws, dz, db, info = res
            epochs, kern = info["epochs"], info["kernel_s"]
            w[ws] = w_ws
            z += dz
            b += db
        if col_bytes is not None:
            entry["ws_bytes"] = float(col_bytes[ws].sum())
        entry.update(
            {
                "ws_size": int(ws.shape[0]),
                "inner_epochs": epochs,
                **inner,
                # the pass the server ran after the subproblem is the next round's
                "inner_s": time.perf_counter() - t1 - (pending[1] if pending else 0.0),
                "inner_kernel_s": kern,
            }
        )
        entry["transport"] = ex.transport  # "tasks" from the round a direct call failed
        entry["wall_s"] = wall = entry["scan_s"] + entry["inner_s"]
        entry["busy_s"] = busy = entry["scan_kernel_s"] + entry["inner_kernel_s"]
        entry["overhead_fraction"] = max(0.0, 1.0 - busy / wall) if wall > 0 else 0.0
    if own_key:  # the workers' cached Gram matrix dies with this solve
        ex.broadcast(T.drop_gram, gram_key)
    screened = np.zeros(p, dtype=bool)
    for j, a in enumerate(alive):
        if a is not None:
            width = int(col_bounds[j + 1] - col_bounds[j])
            screened[col_bounds[j] : col_bounds[j + 1]] = np.unpackbits(a, count=width) == 0
    res_ = finish(
        w,
        b,
        gap,
        primal,
        dual,
        p0,
        converged,
        rounds,
        penalty,
        loss_name,
        tol,
        n_partitions,
        history,
        passes_=passes,
        screened_=screened,
    )
    last.block_nnz = block_nnz
    last.groups = groups
    last.spread_gram = spread_gram
    if screen and prev is not None and col_norm_max >= 0:
        if any(a is not None for a in alive):
            # screened columns were not visited: bound them (see sequential_sphere)
            _, scale_k, radius_k = prev
            last.xt_bound = (threshold + col_norm_max * radius_k) / scale_k
        else:
            last.xt_bound = absmax
    return res_, z, last


#: A task of a spread subproblem takes at most this fraction of the gather budget (a quarter
#: of a worker's memory beyond its baseline) of cached columns (:func:`_spread_plan`).
SHARE_FRACTION = 0.25

#: Worst-case bytes (12 per row and column) of a row piece of new columns sent from one
#: partition to another while a spread Gram matrix is formed (:func:`_spread_gram`).
SPREAD_PIECE_BYTES = 16 << 20


def choose_working_set(
    support: np.ndarray,
    per_block: list[tuple],
    starts: Any,
    ws_size: int,
    col_bytes: np.ndarray | None = None,
    cache_max: float = np.inf,
) -> np.ndarray:
    """The next working set (sorted feature ids): the support plus the worst violators.

    ``per_block`` holds each block's :func:`~dl1.solvers._tasks.scan_task` result, whose
    candidates (local ids, scores) ``starts[j]`` shifts to feature ids; the ``ws_size -
    |support|`` best scores over all blocks join (at least one, ties to the lower block and
    rank). With ``col_bytes``, the violators join while their columns' bytes fit
    ``cache_max`` (see :func:`solve_ws`). The coordinator chooses with it, and the server of
    a subproblem repeats the choice to fetch the next round's columns in advance
    (:meth:`dl1.solvers.rpc.PartitionServer.call`): the same function on the same values.
    """
    cand = np.concatenate(
        [starts[j] + s[1] for j, s in enumerate(per_block)] or [np.zeros(0, np.int64)]
    )
    score = np.concatenate([s[2] for s in per_block] or [np.zeros(0)])
    n_new = max(ws_size - support.shape[0], 1)
    order = np.argsort(-score, kind="stable")
    if cand.shape[0] > n_new:
        order = order[:n_new]
    cand = cand[order]  # best violators first
    if col_bytes is not None:
        # out of core the workers hold the working set's columns: the violators join
        # while their bytes fit ``cache_max``, at least max(WS_MIN_NEW, WS_MIN_GROWTH
        # |support|) of them (a support that fills the budget alone would otherwise gain
        # one feature per pass)
        cand = cand[~np.isin(cand, support)]
        room = cache_max - float(col_bytes[support].sum())
        fits = int(np.searchsorted(np.cumsum(col_bytes[cand]), room, side="right"))
        cand = cand[: max(fits, WS_MIN_NEW, int(WS_MIN_GROWTH * support.shape[0]))]
    return np.union1d(support, cand).astype(np.int64)


#: Local epochs per round of :func:`spread_subproblem` (more: fewer round trips, each
#: partition further from the others' changes).
SPREAD_EPOCHS = 5


def spread_subproblem(
    ex,
    groups,
    ws,
    part_of_block,
    col_bounds,
    w,
    b,
    z,
    y,
    sw,
    datafit,
    penalty,
    fit_intercept,
    target_gap,
    max_rounds=2000,
    col_bytes=None,
    share_bytes=np.inf,
):
    """The working-set subproblem by CoCoA+ rounds over the partitions holding its columns
    (each task one share of a partition's groups, :func:`_spread_plan`).

    Each partition's worker runs :func:`dl1.solvers._tasks.ws_round_task` on the cached column
    groups it extracted (``sigma'`` = the number of partitions taking part: their updates
    are added, as in CoCoA+), so no worker holds more than its share of the working set. The
    restricted gap, from the same tasks' statistics at the start of a round, stops the rounds
    at ``target_gap``. ``w`` and ``z`` (``X w + b``) are updated in place; returned: the
    intercept, the rounds made and the slowest partition's kernel seconds, summed.
    """
    n = y.shape[0]
    s = None if sw.shape[0] == 0 else sw
    plan = _spread_plan(groups, ws, part_of_block, col_bounds, col_bytes, share_bytes)
    sigma = float(len(plan))
    profile = fit_intercept and datafit.beta == 1.0
    threshold = n * penalty.alpha_l1
    # per-column sums for the profiled intercept: computed once, kept where the groups are
    sums = [
        ex.submit_to(q, T.group_col_sums, [h for h, _, _ in grp], sw) if profile else None
        for q, grp in plan
    ]
    kern = 0.0
    r = 0
    for r in range(max_rounds + 1):
        if fit_intercept:
            db = datafit.intercept_update(y, z, s, max_iter=20)
            b += db
            z += db
        theta = datafit.dual_point(y, z, s, fit_intercept)
        g = datafit.gradient(y, z, s)
        results = ex.gather(
            [
                ex.submit_to(
                    q,
                    T.ws_round_task,
                    [h for h, _, _ in grp],
                    [keep for _, _, keep in grp],
                    [w[ids[keep]] for _, ids, keep in grp],
                    g,
                    theta,
                    sw,
                    sigma,
                    datafit.beta,
                    penalty.alpha_l1,
                    penalty.alpha_l2,
                    SPREAD_EPOCHS if r < max_rounds else 0,
                    threshold,
                    sums[i],
                )
                for i, (q, grp) in enumerate(plan)
            ]
        )
        kern += max(res[4]["kernel_s"] for res in results)
        absmax = max(res[3][0] for res in results)
        excess = float(sum(res[3][1] for res in results))
        _, _, gap = duality_gap_from_stats(
            datafit,
            penalty,
            y,
            z,
            w[ws],
            absmax,
            excess,
            s=s,
            intercept=fit_intercept,
            theta=theta,
        )
        if gap <= target_gap or r == max_rounds:
            break
        for (_, grp), (w_new, u, shift, _, _) in zip(plan, results, strict=True):
            for (_, ids, keep), wn in zip(grp, w_new, strict=True):
                w[ids[keep]] = wn
            z += u
            z += shift
            b += shift
    return b, r, kern


def _spread_plan(groups, ws, part_of_block, col_bounds, col_bytes=None, share_bytes=np.inf):
    """The cached groups holding live columns of ``ws`` in shares: ``[(q, [(handle, ids,
    keep), ...]), ...]``, ``q`` the partition whose worker holds the share's groups (sorted),
    ``keep`` the positions of the live columns in a group.

    A partition's groups are cut into consecutive shares of at most ``share_bytes`` (by
    ``col_bytes``, the bytes of each cached column; a larger group is a share of its own),
    and every task takes one share: a worker then needs only one share's groups in memory at
    a time, and Dask may keep its other cached groups spilled to disk (at the dense end of
    the out-of-core benchmark a partition's groups reached 250 MiB, which a task taking
    them all had to hold at once, on top of the worker's baseline and its own scratch).
    """
    by_part: dict[int, list[tuple[Any, np.ndarray, np.ndarray]]] = {}
    ids_all = np.concatenate([ids for _, ids, _ in groups])
    live = np.isin(ids_all, ws)
    offs = np.cumsum([0] + [ids.shape[0] for _, ids, _ in groups])
    for g_i, (h, ids, _) in enumerate(groups):
        keep = np.flatnonzero(live[offs[g_i] : offs[g_i + 1]])
        if keep.shape[0]:  # a group holds columns of one block
            q = int(part_of_block[np.searchsorted(col_bounds, ids[0], side="right") - 1])
            by_part.setdefault(q, []).append((h, ids, keep))
    plan: list[tuple[int, list[tuple[Any, np.ndarray, np.ndarray]]]] = []
    for q, grp in sorted(by_part.items()):
        share: list[tuple[Any, np.ndarray, np.ndarray]] = []
        size = 0.0
        for g in grp:
            nbytes = float(col_bytes[g[1]].sum()) if col_bytes is not None else 0.0
            if share and size + nbytes > share_bytes:
                plan.append((q, share))
                share, size = [], 0.0
            share.append(g)
            size += nbytes
        plan.append((q, share))
    return plan


def _spread_gram(ex, plan, ids, prev, c, n, sw, piece_bytes, scratch_max):
    """The task holding ``(ids, Q)`` of a spread working set (:func:`T.merge_gram_task`):
    only the products with columns new since ``prev`` (the previous ``(task, ids)``) are
    formed, by each partition against each partition's new columns (sent in row pieces of
    at most ``piece_bytes`` worst-case bytes); assembled on the first partition's worker."""
    prev_task, prev_ids = prev if prev is not None else (None, np.zeros(0, np.int64))
    if prev_task is not None and np.array_equal(prev_ids, ids):
        return prev
    is_new = ~np.isin(ids, prev_ids)
    if not (~is_new).any():
        prev_task = None
    pos, blocks, k = [], [], 0
    for _, grp in plan:
        m_q = sum(keep.shape[0] for _, _, keep in grp)
        pos.append(np.arange(k, k + m_q))
        k += m_q
    for i_r, (r, grp_r) in enumerate(plan):
        new_r = is_new[pos[i_r]]
        if not new_r.any():
            continue
        cols_r, k0 = [], 0
        for _, _, keep in grp_r:  # each group's new columns (local positions)
            cols_r.append(keep[new_r[k0 : k0 + keep.shape[0]]])
            k0 += keep.shape[0]
        k_r = int(new_r.sum())
        step = int(max(1, min(n, piece_bytes // (12 * k_r))))
        ranges = [(r0, min(n, r0 + step)) for r0 in range(0, n, step)]
        hs_r = [h for h, _, _ in grp_r]
        for i_q, (q, grp_q) in enumerate(plan):
            hs_q, keeps_q = [h for h, _, _ in grp_q], [keep for _, _, keep in grp_q]
            if i_q == i_r:
                acc = ex.submit_to(
                    q, T.cross_gram_task, None, hs_q, keeps_q, None, cols_r, ranges, sw,
                    scratch_max,
                )  # fmt: skip
            else:
                acc = None
                for a, b in ranges:  # each piece made once the previous one has been used
                    piece = ex.submit_to(r, T.row_piece_task, hs_r, cols_r, a, b, acc)
                    acc = ex.submit_to(
                        q, T.cross_gram_task, acc, hs_q, keeps_q, piece, None, [(a, b)], sw,
                        scratch_max,
                    )  # fmt: skip
            blocks.append((pos[i_q], pos[i_r][new_r], acc))
    task = ex.submit_to(
        plan[0][0], T.merge_gram_task, prev_task, ids, np.flatnonzero(is_new), blocks, c, 1.0 / n
    )
    return task, ids


def spread_gram_subproblem(
    ex,
    groups,
    ws,
    part_of_block,
    col_bounds,
    w,
    b,
    z,
    y,
    sw,
    datafit,
    penalty,
    fit_intercept,
    target_gap,
    gram,
    piece_bytes,
    scratch_max,
    max_epochs,
    check_every=10,
    anderson=5,
    max_checks=200,
    col_bytes=None,
    share_bytes=np.inf,
):
    """The squared-loss working-set subproblem on a Gram matrix formed across the partitions
    holding its columns (out of core, when they are too many to gather on one worker); each
    task takes one share of a partition's groups (:func:`_spread_plan`).

    ``Q = X_W^T (S - s s^T / sum(s)) X_W / n`` (the intercept profiled out, as in
    :func:`dl1.solvers._tasks._solve_gram`) is formed where the columns are cached, only the
    entries of new columns at each call (``gram``, the previous ``(task, ids)``), and held by
    one worker, which runs the covariance updates until the O(m) gap estimate falls within
    the target. Each exact check is partition reductions: ``X_q (w_q - w_q^0)`` moves the
    residual, ``X_q^T theta`` gives the restricted gap and the next epochs' exact gradient
    (so Q's float32 rounding does not accumulate, and the certificate never uses Q). ``w``
    and ``z`` are updated in place. Returned: the intercept, the exact checks made, the
    epochs, the kernel seconds of the epochs, and the new ``gram``.
    """
    n = y.shape[0]
    s = None if sw.shape[0] == 0 else sw
    plan = _spread_plan(groups, ws, part_of_block, col_bounds, col_bytes, share_bytes)
    ids = np.concatenate([gids[keep] for _, grp in plan for _, gids, keep in grp])
    hs = [[h for h, _, _ in grp] for _, grp in plan]
    keeps = [[keep for _, _, keep in grp] for _, grp in plan]
    sizes = np.cumsum([0] + [sum(k.shape[0] for k in ks) for ks in keeps])
    yc = y - (datafit.initial_intercept(y, s) if fit_intercept else 0.0)
    w_ids = w[ids]
    kern, epochs, checks = 0.0, 0, 0
    g_y = c = None
    estimate_ok, min_between = False, 1
    while True:
        if fit_intercept:
            db = datafit.intercept_update(y, z, s, max_iter=20)
            b += db
            z += db
        theta = datafit.dual_point(y, z, s, fit_intercept)
        vecs = [theta]
        if g_y is None:  # once: X^T S (y - mean_s y) for the estimate, X^T s for the profile
            vecs.append(yc if s is None else s * yc)
            if fit_intercept:
                vecs.append(np.ones(n) if s is None else s)
        outs = ex.gather(
            [
                ex.submit_to(q, T.partition_rmatvec_task, hs[i], keeps[i], vecs)
                for i, (q, _) in enumerate(plan)
            ]
        )
        h = np.concatenate([o[0] for o in outs])
        if g_y is None:
            g_y = np.concatenate([o[1] for o in outs])
            if fit_intercept:
                c = np.concatenate([o[2] for o in outs])
                c /= np.sqrt(n * (n if s is None else float(s.sum())))
        _, _, gap = duality_gap_from_stats(
            datafit,
            penalty,
            y,
            z,
            w_ids,
            *penalty.xt_theta_stats(h, n),
            s=s,
            intercept=fit_intercept,
            theta=theta,
        )
        if gap <= target_gap or epochs >= max_epochs or checks >= max_checks:
            break
        gram = _spread_gram(ex, plan, ids, gram, c, n, sw, piece_bytes, scratch_max)
        if estimate_ok:  # the estimate said "within the target", the exact gap did not
            min_between = check_every
        est = T._GramGapEstimate(datafit, penalty, y, z, theta, h, w_ids, s, g_y)
        (w_new, done, estimate_ok, k), = ex.gather(
            [
                ex.submit_to(
                    plan[0][0], T.spread_gram_epochs_task, gram[0], w_ids, h / n, est, penalty,
                    target_gap, min_between, 10 * check_every, max_epochs - epochs, anderson,
                )
            ]
        )  # fmt: skip
        epochs += done
        kern += k
        checks += 1
        d = w_new - w_ids
        for u in ex.gather(
            [
                ex.submit_to(q, T.partition_matvec_task, hs[i], keeps[i], d[a:b_], n)
                for i, ((q, _), a, b_) in enumerate(zip(plan, sizes[:-1], sizes[1:], strict=True))
            ]
        ):
            z += u
        w_ids = w_new
        w[ids] = w_new
    return b, checks, epochs, kern, gram


@dataclass
class LastScan:
    """A pass's per-block results (``scan_task`` output), with its ``theta``, threshold and
    candidate count, and the blocks' nonzeros (for counting passes)."""

    per_block: list[tuple]
    theta: np.ndarray
    threshold: float
    ws_size: int
    block_nnz: np.ndarray
    groups: list = field(default_factory=list)
    #: an upper bound on ``||X^T theta||_inf`` over all columns, screened ones included
    #: (nan: none known); with ``theta`` it seeds the next alpha's sequential screening
    xt_bound: float = np.nan
    #: ``(task, ids)`` of the last spread Gram matrix (:func:`spread_gram_subproblem`)
    spread_gram: tuple[Any, np.ndarray] | None = None


def sequential_sphere(datafit, penalty, y, z, w, s, max_s, theta, xt_bound):
    """Gap-safe sphere ``(theta, scale, radius)`` of a previous solution at a new penalty.

    Sequential rule (Ndiaye et al., JMLR 2017, Sec. 4.1 and Thm. 6): the previous alpha's
    final point ``(w, z)`` and dual direction ``theta`` are still a primal and a (rescaled)
    dual feasible point at the new alpha; their gap there gives the safe radius, so the first
    pass of the new alpha screens without a pass of its own. ``xt_bound >= ||X^T theta||_inf``
    is all the rescaling needs: any larger value keeps ``scale * theta`` feasible and the gap
    an upper bound (a safe, larger sphere). When the previous pass skipped screened columns,
    the bound comes from the previous sphere ``(scale_k, r_k)``, which holds the optimal dual
    point ``theta*`` (``||x_j^T theta*|| <= T_k`` for every column): ``|x_j^T theta| <=
    (T_k + ||x_j|| r_k) / scale_k``.
    """
    n = y.shape[0]
    primal = datafit.value(y, z, s) + penalty.value(w[np.flatnonzero(w)])
    scale = penalty.dual_feasible_scale(xt_bound, n)
    gap = primal + datafit.conjugate(y, scale * theta, s)
    radius = float(np.sqrt(max(gap, 0.0) * 2.0 * n * max_s * datafit.beta))
    return theta, scale, radius


def scan_pass(
    ex, blocks, parts, col_bounds, theta, threshold, w, ws_size, alive, prev, norms=False
):
    """One pass (:func:`dl1.solvers._tasks.scan_task` per partition): per-block results and
    the slowest partition's kernel seconds."""
    scans = ex.gather(
        [
            ex.submit(
                T.scan_task,
                [blocks[j] for j in part],
                theta,
                threshold,
                _sparse_parts(w, col_bounds, part),
                ws_size,
                [alive[j] for j in part],
                prev,
                norms,
            )
            for part in parts
        ]
    )
    return [blk for res, _ in scans for blk in res], max(dt for _, dt in scans)


def rescan(
    ex,
    blocks,
    col_bounds,
    n_partitions,
    y,
    sw,
    datafit,
    fit_intercept,
    threshold,
    w,
    z,
    ws_start=WS_START,
):
    """The :class:`LastScan` a solve ending at ``(w, z)`` made (for resuming a path): the
    same pass, bit for bit, since ``theta`` depends on ``z`` only."""
    K = len(blocks)
    parts = [list(a) for a in np.array_split(np.arange(K), max(1, min(n_partitions, K)))]
    theta = datafit.dual_point(y, z, None if sw.shape[0] == 0 else sw, fit_intercept)
    ws_size = max(ws_start, 2 * int(np.count_nonzero(w)))
    per_block, _ = scan_pass(
        ex, blocks, parts, col_bounds, theta, threshold, w, ws_size, [None] * K, None
    )
    block_nnz = np.array([blk[4] for blk in per_block], dtype=np.int64)
    return LastScan(per_block, theta, threshold, ws_size, block_nnz)
