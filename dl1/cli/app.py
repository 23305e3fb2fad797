"""The ``dl1`` command line: ``dl1 demo``, ``dl1 generate``, ``dl1 convert``, ``dl1 info``,
``dl1 fit``, ``dl1 path``.

Every command checks its options and its store (manifest, targets, column statistics)
before it starts or joins a cluster. An error ends the command with one line on stderr,
``dl1: error: <message>``, and exit status 2 for a usage or validation error (the input is
wrong), 1 for any other; ``--debug`` prints the traceback as well.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import click
import numpy as np

from dl1.errors import Dl1Error, ValidationError
from dl1.params import (
    COMMON,
    CONSTRAINED_PATH,
    PATH,
    PENALISED,
    POSITIVE,
    validate_params,
)
from dl1.store import Store, open_store


def summary(store: Store) -> str:
    """Human-readable summary of a store: shape, nnz, density, blocks, column frequencies."""
    lines = [f"store   {store.path}"]
    for key in ("preset", "source", "task", "seed", "row_multiplier", "snr"):
        if key in store.attrs:
            lines.append(f"{key:<7} {store.attrs[key]}")
    for split in store.splits:
        n, p = store.shape(split)
        nnz = store.nnz(split)
        bn = store.block_nnz(split)
        e = store.entry(split)
        col_nnz = store.read("stats/col_nnz", split)
        lines += [
            f"[{split}]",
            f"  shape          {n:,} x {p:,}   dtype {np.dtype(e['dtype']).name}",
            f"  nnz            {nnz:,}   density {nnz / max(1, n * p):.4%}"
            f"   nnz/row {nnz / max(1, n):,.1f}",
            f"  blocks         {bn.shape[0]} row x {bn.shape[1]} feature blocks "
            f"({', '.join(e['formats'])}); nnz per block min {bn.min():,} / "
            f"median {int(np.median(bn)):,} / max {bn.max():,}",
        ]
        if p and nnz:
            srt = np.sort(col_nnz)[::-1]
            top = max(1, p // 100)
            q = np.percentile(col_nnz, [50, 90, 99, 100])
            lines += [
                "  column frequency (rows per column): "
                f"median {q[0]:g}, p90 {q[1]:g}, p99 {q[2]:g}, max {q[3]:g}",
                f"  empty columns  {int((col_nnz == 0).sum()):,}"
                f"   columns in <= 2 rows {(col_nnz <= 2).mean():.1%}"
                f"   top 1% of columns hold {srt[:top].sum() / nnz:.1%} of nonzeros",
            ]
    return "\n".join(lines)


#: Exit status of a usage or validation error (the input is wrong; click's own usage
#: errors exit with 2 too) and of any other error.
EXIT_USAGE, EXIT_ERROR = 2, 1


def exit_status(error: BaseException) -> int:
    """:data:`EXIT_USAGE` for invalid input (options, data, files), else :data:`EXIT_ERROR`."""
    return EXIT_USAGE if isinstance(error, ValidationError) else EXIT_ERROR


def one_line(error: BaseException) -> str:
    """``dl1: error: <message>``: dl1's own errors say what and where already; others
    (a connection refused, a bug) are prefixed with their type."""
    text = " ".join(str(error).split()) or repr(error)
    if not isinstance(error, (Dl1Error, OSError)):
        text = f"{type(error).__name__}: {text}"
    return f"dl1: error: {text}"


class Dl1Group(click.Group):
    """The command group: an exception of a command becomes :func:`one_line` on stderr and
    :func:`exit_status`, with the traceback only under ``--debug``."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - every error of a command ends here
            if ctx.meta.get("dl1.debug"):
                import traceback

                traceback.print_exc()
            click.echo(one_line(e), err=True)
            ctx.exit(exit_status(e))


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta["dl1.debug"] = True  # meta is shared by the group's and commands' contexts


def debug_option(f):
    """``--debug``: print the traceback of an error (accepted before or after the command)."""
    return click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_debug,
        help="Print the full traceback of an error.",
    )(f)


def dashboard_option(f):
    """``--dashboard``: serve Dask's HTTP endpoints of the LocalCluster on 127.0.0.1."""
    return click.option(
        "--dashboard",
        is_flag=True,
        help="Serve the LocalCluster's Dask dashboard (and its workers' /health, /metrics) "
        "on 127.0.0.1; none without it (no authentication, any local user reaches loopback).",
    )(f)


@click.group(cls=Dl1Group)
@click.version_option(package_name="dl1")
@debug_option
def cli() -> None:
    """dl1: L1 / elastic-net models on sparse data larger than memory, on Dask."""


def _check(constraints: dict, where: str, **values) -> None:
    """The options' values checked against the entry point's declared constraints
    (:mod:`dl1.params`) before a cluster starts: a bad value is a usage error
    (:class:`~dl1.params.InvalidParameterError`, exit status 2)."""
    validate_params(constraints, values, where)


def _check_memory_limit(memory_limit: str | None) -> None:
    """A LocalCluster's ``--memory-limit`` parsed before the cluster starts."""
    if memory_limit is None or memory_limit == "auto":
        return
    from dask.utils import parse_bytes

    try:
        ok = parse_bytes(memory_limit) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ValidationError(
            f"--memory-limit must be a positive size such as '4GiB' or 'auto'; got "
            f"{memory_limit!r}"
        )


def _check_store(path: str, loss: str) -> Store:
    """The store opened and its fit inputs validated (manifest, ``y`` for ``loss``, column
    statistics) before a cluster starts."""
    from dl1.loading import read_inputs

    store = open_store(path)
    read_inputs(store, None, None, loss, "train")
    return store


def _client(
    scheduler: str | None, workers: int, memory_limit: str | None, dashboard: bool = False
):
    """A client of ``scheduler``, or of a new LocalCluster of ``workers`` processes serving
    HTTP (on 127.0.0.1) only with ``dashboard``."""
    from contextlib import ExitStack

    from distributed import Client

    from dl1.runtime.exposure import check_scheduler_address
    from dl1.runtime.localcluster import local_cluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    if dashboard and scheduler:
        raise click.UsageError(
            "--dashboard is for the LocalCluster dl1 starts; a running scheduler (--scheduler) "
            "serves its own dashboard, or none"
        )
    stack = ExitStack()
    if scheduler:
        check_scheduler_address(scheduler)
        client = stack.enter_context(Client(scheduler))
    else:
        cluster = stack.enter_context(
            local_cluster(
                silence_logs=logging.WARNING,
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard=dashboard,
                dashboard_address="127.0.0.1:8787",  # never Dask's all-interfaces default
                memory_limit=memory_limit or "auto",
            )
        )
        client = stack.enter_context(Client(cluster))
        if dashboard:
            click.echo(f"dashboard: {client.dashboard_link}")
    return stack, client


def _fit_and_report(
    path: Path,
    *,
    alpha: float | None,
    alpha_ratio: float,
    l1_ratio: float,
    loss: str,
    tol: float,
    client,
) -> None:
    import dl1
    from dl1.predict import decision_function

    store = open_store(path)
    t0 = time.perf_counter()
    amax = dl1.alpha_max(store, l1_ratio=l1_ratio, loss=loss, client=client)
    a = alpha if alpha is not None else amax / alpha_ratio
    res = dl1.fit(store, alpha=a, l1_ratio=l1_ratio, loss=loss, tol=tol, client=client)
    dt = time.perf_counter() - t0
    click.echo(
        f"fit ({loss}, alpha={a:.6g} = alpha_max/{amax / a:.4g}, l1_ratio={l1_ratio}) "
        f"in {dt:.2f} s, {res.n_rounds_} rounds"
    )
    click.echo(
        f"certificate: duality gap {res.dual_gap_:.3e} = {res.gap_:.3e} x P(0) "
        f"({'certified' if res.converged_ else 'NOT certified'} at tol {tol:g}); "
        f"objective {res.primal_:.8g}, dual {res.dual_:.8g}"
    )
    click.echo(
        f"model: {int(np.count_nonzero(res.coef_)):,} nonzero coefficients of "
        f"{res.coef_.shape[0]:,}, intercept {res.intercept_:.6g}"
    )
    if "test" in store.splits:
        pred = client.compute(decision_function(store, res.coef_, res.intercept_, split="test"))
        pred = pred.result()
        y_test = store.read("y", "test")
        if loss == "squared":
            mse = float(np.mean((y_test - pred) ** 2))
            click.echo(f"test: MSE {mse:.6g} (variance of y_test {np.var(y_test):.6g})")
        else:
            acc = float(np.mean(np.where(pred >= 0, 1.0, -1.0) == y_test))
            click.echo(f"test: accuracy {acc:.4f}")


@cli.command()
@debug_option
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to write the store (default: a temporary directory, removed after).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Worker processes of the LocalCluster.",
)
@dashboard_option
def demo(out: str | None, seed: int, workers: int, dashboard: bool) -> None:
    """The main job on its embedded default: generate the 'small' E2006-like preset, fit a
    Lasso at alpha_max / 20 on a LocalCluster and print its certificate."""
    from dl1.datasets import make_e2006_like

    _check(COMMON, "dl1 demo", seed=seed)

    with tempfile.TemporaryDirectory(prefix="dl1-demo-") as tmp:
        path = Path(out) if out else Path(tmp) / "small.zarr"
        t0 = time.perf_counter()
        store = make_e2006_like(path, preset="small", seed=seed, overwrite=out is not None)
        click.echo(f"generated in {time.perf_counter() - t0:.1f} s")
        click.echo(summary(store))
        stack, client = _client(None, workers, None, dashboard)
        with stack:
            _fit_and_report(
                path,
                alpha=None,
                alpha_ratio=20.0,
                l1_ratio=1.0,
                loss="squared",
                tol=1e-6,
                client=client,
            )


@cli.command()
@debug_option
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--alpha", type=float, default=None, help="Penalty (default: alpha_max / ratio).")
@click.option(
    "--alpha-ratio",
    type=float,
    default=20.0,
    show_default=True,
    help="alpha = alpha_max / ratio when --alpha is not given.",
)
@click.option("--l1-ratio", type=click.FloatRange(0, 1), default=1.0, show_default=True)
@click.option(
    "--loss",
    type=click.Choice(["squared", "logistic", "hinge", "smooth_hinge", "squared_hinge"]),
    default="squared",
    show_default=True,
)
@click.option(
    "--tol", type=float, default=1e-6, show_default=True, help="Stop at duality gap <= tol * P(0)."
)
@click.option("--scheduler", default=None, help="Address of a running scheduler (tcp://...).")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Worker processes of a LocalCluster when no --scheduler is given.",
)
@click.option("--memory-limit", default=None, help="Per-worker memory limit of the LocalCluster.")
@dashboard_option
def fit(
    store: str,
    alpha: float | None,
    alpha_ratio: float,
    l1_ratio: float,
    loss: str,
    tol: float,
    scheduler: str | None,
    workers: int,
    memory_limit: str | None,
    dashboard: bool,
) -> None:
    """Fit a certified L1 / elastic-net model on STORE and print its certificate."""
    _check(PENALISED, "dl1 fit", l1_ratio=l1_ratio, loss=loss, tol=tol,
           **({} if alpha is None else {"alpha": alpha}))  # fmt: skip
    _check({"alpha_ratio": [POSITIVE]}, "dl1 fit", alpha_ratio=alpha_ratio)
    _check_memory_limit(memory_limit)
    _check_store(store, loss)  # a missing, incomplete or invalid store, before a cluster
    stack, client = _client(scheduler, workers, memory_limit, dashboard)
    with stack:
        _fit_and_report(
            Path(store),
            alpha=alpha,
            alpha_ratio=alpha_ratio,
            l1_ratio=l1_ratio,
            loss=loss,
            tol=tol,
            client=client,
        )


@cli.command()
@debug_option
@click.argument("dst", type=click.Path(file_okay=False))
@click.option(
    "--preset", type=click.Choice(["small", "tfidf", "log1p"]), default="small", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--row-multiplier", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--task",
    type=click.Choice(["regression", "classification"]),
    default="regression",
    show_default=True,
)
@click.option("--overwrite", is_flag=True, help="Replace an existing dl1 store at DST.")
def generate(
    dst: str, preset: str, seed: int, row_multiplier: int, task: str, overwrite: bool
) -> None:
    """Generate an E2006-like synthetic store at DST (out-of-core)."""
    from dl1.datasets import make_e2006_like

    _check(COMMON, "dl1 generate", seed=seed)

    t0 = time.perf_counter()
    store = make_e2006_like(
        dst, preset=preset, seed=seed, row_multiplier=row_multiplier, task=task, overwrite=overwrite
    )
    click.echo(f"generated in {time.perf_counter() - t0:.1f} s")
    click.echo(summary(store))


@cli.command()
@debug_option
@click.argument("src", type=click.Path(exists=True))
@click.argument("dst", type=click.Path(file_okay=False), required=False)
@click.option(
    "--add-csr",
    is_flag=True,
    help="SRC is a store: add CSR copies of its blocks (for the sample-wise solvers), out "
    "of core; no DST.",
)
@click.option(
    "--zero-based",
    type=click.Choice(["auto", "true", "false"]),
    default="auto",
    show_default=True,
    help="Index base of the svmlight file.",
)
@click.option(
    "--n-features",
    type=click.IntRange(min=1),
    default=None,
    help="Number of features (default: largest index seen).",
)
@click.option(
    "--dtype", type=click.Choice(["float64", "float32"]), default="float64", show_default=True
)
@click.option(
    "--formats",
    default="csc",
    show_default=True,
    help="Comma-separated block formats to store: csc, csr or csc,csr.",
)
@click.option(
    "--block-nnz", type=click.IntRange(min=1), default=None, help="Target nonzeros per block."
)
@click.option("--overwrite", is_flag=True, help="Replace an existing dl1 store at DST.")
def convert(
    src: str,
    dst: str | None,
    add_csr: bool,
    zero_based: str,
    n_features: int | None,
    dtype: str,
    formats: str,
    block_nnz: int | None,
    overwrite: bool,
) -> None:
    """Convert an svmlight/libsvm file (plain, .gz or .bz2) SRC into a store at DST, or
    (--add-csr) add CSR blocks to the store SRC."""
    from dl1.io.svmlight import from_svmlight

    if add_csr:
        _add_csr(src, dst)
        return
    if dst is None or Path(src).is_dir():
        raise click.UsageError("convert needs an svmlight file SRC and a DST (or --add-csr)")

    zb: bool | str = {"auto": "auto", "true": True, "false": False}[zero_based]
    kw = {} if block_nnz is None else {"block_nnz": block_nnz}
    t0 = time.perf_counter()
    store = from_svmlight(
        src,
        dst,
        zero_based=zb,
        n_features=n_features,
        dtype=np.dtype(dtype),
        formats=tuple(f.strip() for f in formats.split(",")),
        overwrite=overwrite,
        **kw,
    )
    dt = time.perf_counter() - t0
    size = Path(src).stat().st_size
    click.echo(f"converted {size / 1e6:,.1f} MB in {dt:.1f} s ({size / 1e6 / dt:,.1f} MB/s)")
    click.echo(summary(store))


def _add_csr(src: str, dst: str | None) -> None:
    from dl1.store.csr import add_csr

    if dst is not None or not Path(src).is_dir():
        raise click.UsageError("--add-csr takes one argument: the store SRC")
    t0 = time.perf_counter()
    store = add_csr(src)
    click.echo(f"CSR blocks added in {time.perf_counter() - t0:.1f} s")
    click.echo(summary(store))


@cli.command()
@debug_option
@click.argument("store", type=click.Path(exists=True, file_okay=False))
def info(store: str) -> None:
    """Shape, nnz, density, blocks and column-frequency summary of STORE."""
    click.echo(summary(open_store(store)))


def main() -> None:
    """Entry point: errors become one line and an exit status (see :class:`Dl1Group`)."""
    cli(standalone_mode=True)


@cli.command("path")
@debug_option
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--n-alphas", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "--eps",
    type=float,
    default=1e-2,
    show_default=True,
    help="Smallest alpha as a fraction of alpha_max.",
)
@click.option("--l1-ratio", type=click.FloatRange(0, 1), default=1.0, show_default=True)
@click.option(
    "--loss",
    type=click.Choice(["squared", "logistic", "hinge", "smooth_hinge", "squared_hinge"]),
    default="squared",
    show_default=True,
)
@click.option(
    "--tol",
    type=float,
    default=1e-6,
    show_default=True,
    help="Certify each alpha at duality gap <= tol * P(0).",
)
@click.option("--scheduler", default=None, help="Address of a running scheduler (tcp://...).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--memory-limit", default=None, help="Per-worker memory limit of the LocalCluster.")
@click.option(
    "--checkpoint",
    type=click.Path(file_okay=False),
    default=None,
    help="Zarr group for incremental results; an interrupted path resumes there.",
)
@click.option(
    "--plots",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the PNG figures (default: STORE-path-plots).",
)
@click.option(
    "--constrained",
    is_flag=True,
    help="The constrained path in delta (||w||_1 <= delta) by randomized Frank-Wolfe "
    "(dl1.path_constrained) instead of the penalised path.",
)
@click.option(
    "--sample",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.01,
    show_default=True,
    help="--constrained: fraction of the features scored per iteration.",
)
@dashboard_option
def path_cmd(
    store: str,
    n_alphas: int,
    eps: float,
    l1_ratio: float,
    loss: str,
    tol: float,
    scheduler: str | None,
    workers: int,
    memory_limit: str | None,
    checkpoint: str | None,
    plots: str | None,
    constrained: bool,
    sample: float,
    dashboard: bool,
) -> None:
    """Regularisation path on STORE: every alpha certified; validation error on its test
    split when it has one; figures written as PNG.

    With --constrained, the constrained Lasso path instead: n-alphas radii from eps *
    delta_max up to the paper's delta_max, each certified by its exact FW gap at --tol
    (--loss squared or logistic; no --checkpoint, --l1-ratio 1 only)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    import dl1

    if constrained and (checkpoint is not None or l1_ratio != 1.0):
        raise click.UsageError("--constrained takes neither --checkpoint nor --l1-ratio")
    _check_memory_limit(memory_limit)
    if constrained:
        _check(CONSTRAINED_PATH, "dl1 path --constrained", n_deltas=n_alphas, eps=eps,
               loss=loss, tol=tol, sample=sample)  # fmt: skip
    else:
        _check(PATH, "dl1 path", n_alphas=n_alphas, eps=eps, l1_ratio=l1_ratio, loss=loss,
               tol=tol)  # fmt: skip
    st = _check_store(store, loss)  # a missing, incomplete or invalid store, before a cluster
    stack, client = _client(scheduler, workers, memory_limit, dashboard)
    with (
        stack,
        Progress(
            TextColumn("[bold]path"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
        ) as progress,
    ):
        task = progress.add_task("path", total=n_alphas, info="")

        def on_alpha(k, alpha, res):
            nnz = int(np.count_nonzero(res.coef_))
            info = (
                f"delta {alpha:.3e}  nnz {nnz}  fw gap {res.gap_:.1e}  iterations {res.n_iter_}"
                if constrained
                else f"alpha {alpha:.3e}  nnz {nnz}  gap {res.gap_:.1e}  passes {res.passes_:.2f}"
            )
            progress.update(task, advance=1, info=info)

        common = dict(
            eps=eps,
            loss=loss,
            tol=tol,
            client=client,
            X_test="test" if "test" in st.splits else None,
            callback=on_alpha,
        )
        if constrained:
            result = dl1.path_constrained(st, n_deltas=n_alphas, sample=sample, **common)
        else:
            result = dl1.path(
                st, n_alphas=n_alphas, l1_ratio=l1_ratio, checkpoint=checkpoint, **common
            )
    click.echo(result.summary())
    out = Path(plots) if plots else Path(str(st.path) + "-path-plots")
    for f in result.plot(out):
        click.echo(f"wrote {f}")
