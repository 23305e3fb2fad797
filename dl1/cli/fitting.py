"""``dl1 demo``, ``dl1 fit`` and ``dl1 path``: certified fits on a cluster.

Options and the store are checked before a cluster starts or is joined. Progress goes to
stderr (see :mod:`dl1.cli.progress`): a line per round of a fit (``--progress-every``), per
alpha of a path.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

import dl1
from dl1.cli.app import Output, cli, command_options, output
from dl1.cli.cluster import (
    DASHBOARD_OPTION,
    WORKERS_OPTION,
    ClusterSpec,
    cluster_options,
    connected,
)
from dl1.cli.multiclass import (
    MULTINOMIAL,
    MulticlassChoice,
    check_multiclass,
    fit_multiclass_and_report,
    implied_loss,
    multiclass_choice,
)
from dl1.cli.multiclass_path import PathOptions, path_multiclass_and_report, refuse_binary_only
from dl1.cli.progress import Progress
from dl1.cli.stores import (
    describe,
    is_url,
    located,
    open_input,
    storage_options_option,
    summary,
    where,
)
from dl1.datasets import make_e2006_like
from dl1.entry_labels import entry_labels
from dl1.errors import ValidationError
from dl1.inputs import read_inputs
from dl1.objective.datafits import LOSSES, datafit_class
from dl1.params import (
    COMMON,
    CONSTRAINED_PATH,
    PATH,
    PENALISED,
    POSITIVE,
    validate_params,
)
from dl1.predict import decision_function

if TYPE_CHECKING:
    from dl1.store import Store


def _check_store(
    path: str,
    loss: str,
    storage_options: dict[str, Any] | None = None,
    *,
    any_labels: bool = True,
) -> Store:
    """The store opened and its fit inputs validated (manifest, ``y`` for ``loss``: with
    ``any_labels``, any two labels of a classification loss, as :func:`dl1.fit` maps them;
    column statistics) before a cluster starts."""
    return _checked(open_input(path, storage_options), loss, any_labels=any_labels)


def _checked(store: Store, loss: str, *, any_labels: bool = True) -> Store:
    """:func:`_check_store`'s checks of an opened store."""
    y = entry_labels(store, None, loss, "train").y if any_labels else None
    read_inputs(store, y, None, loss, "train")
    return store


def _round_reporter(progress: Progress, every: int) -> Any:
    """A solver callback writing every ``every``-th round's gap and support (None: 0)."""
    if every <= 0:
        return None

    def on_round(entry: dict[str, Any]) -> None:
        r = int(entry.get("round", 0))
        if r % every == 0:
            progress.step(r, f"round {r}  gap {entry['gap']:.3e}  nnz {entry.get('nnz', '?')}")

    return on_round


def _test_metric(store: Store, res: Any, loss: str, client: Any) -> dict[str, float]:
    pred = client.compute(decision_function(store, res.coef_, res.intercept_, split="test"))
    pred = pred.result()
    y_test = store.read("y", "test")
    if not datafit_class(loss).classifies:
        return {
            "test_mse": float(np.mean((y_test - pred) ** 2)),
            "test_y_variance": float(np.var(y_test)),
        }
    classes = np.array([-1.0, 1.0]) if res.classes_ is None else res.classes_
    return {"test_accuracy": float(np.mean(np.where(pred >= 0, classes[1], classes[0]) == y_test))}


def _fit_and_report(
    store: Store,
    *,
    alpha: float | None,
    alpha_ratio: float,
    l1_ratio: float,
    loss: str,
    tol: float,
    client: Any,
    out: Output,
    progress_every: int = 1,
) -> Any:
    t0 = time.perf_counter()
    with Progress("fit") as progress:
        amax = dl1.alpha_max(store, l1_ratio=l1_ratio, loss=loss, client=client)
        a = alpha if alpha is not None else amax / alpha_ratio
        progress.note(f"alpha_max {amax:.6g}; fitting at alpha {a:.6g}")
        res = dl1.fit(
            store,
            alpha=a,
            l1_ratio=l1_ratio,
            loss=loss,
            tol=tol,
            client=client,
            callback=_round_reporter(progress, progress_every),
        )
    dt = time.perf_counter() - t0
    nnz = int(np.count_nonzero(res.coef_))
    out.say(
        f"fit ({loss}, alpha={a:.6g} = alpha_max/{amax / a:.4g}, l1_ratio={l1_ratio}) "
        f"in {dt:.2f} s, {res.n_rounds_} rounds"
    )
    out.say(
        f"certificate: duality gap {res.dual_gap_:.3e} = {res.gap_:.3e} x P(0) "
        f"({'certified' if res.converged_ else 'NOT certified'} at tol {tol:g}); "
        f"objective {res.primal_:.8g}, dual {res.dual_:.8g}"
    )
    out.say(
        f"model: {nnz:,} nonzero coefficients of {res.coef_.shape[0]:,}, "
        f"intercept {res.intercept_:.6g}"
    )
    out.result.update(
        store=where(store),
        loss=loss,
        alpha=a,
        alpha_max=amax,
        l1_ratio=l1_ratio,
        tol=tol,
        certified=bool(res.converged_),
        relative_gap=res.gap_,
        duality_gap=res.dual_gap_,
        primal=res.primal_,
        dual=res.dual_,
        n_rounds=res.n_rounds_,
        passes=res.passes_,
        seconds=dt,
        n_features=int(res.coef_.shape[0]),
        n_nonzero=nnz,
        intercept=res.intercept_,
    )
    if "test" in store.splits:
        metric = _test_metric(store, res, loss, client)
        out.result.update(metric)
        if not datafit_class(loss).classifies:
            out.say(
                f"test: MSE {metric['test_mse']:.6g} "
                f"(variance of y_test {metric['test_y_variance']:.6g})"
            )
        else:
            out.say(f"test: accuracy {metric['test_accuracy']:.4f}")
    return res


def _save(model: Any, path: str | None, overwrite: bool, out: Output) -> None:
    if path is None:
        return
    written = model.save(path, overwrite=overwrite)
    out.say(f"model saved to {written}")
    out.result["model"] = str(written)


def problem_options(f: Any, losses: tuple[str, ...] = LOSSES, help: str | None = None) -> Any:
    """``--l1-ratio`` and ``--loss`` (one of ``losses``), the problem of ``dl1 fit`` and
    ``dl1 path``."""
    f = click.option("--loss", type=click.Choice(losses), default="squared", show_default=True,
                     help=help)(f)  # fmt: skip
    return click.option("--l1-ratio", type=click.FloatRange(0, 1), default=1.0,
                        show_default=True)(f)  # fmt: skip


def fit_problem_options(f: Any) -> Any:
    """``dl1 fit``'s problem: :func:`problem_options` with the multinomial loss, and
    ``--multi-class`` and ``--penalty`` (:mod:`dl1.cli.multiclass`)."""
    f = click.option(
        "--multi-class", "multi_class", type=click.Choice(["multinomial", "ovr"]), default=None,
        help="On a store of class labels: one multinomial (softmax) model, or K one-vs-rest "
        "binary classifiers of --loss logistic, squared_hinge or hinge sharing each pass "
        "(dl1.fit_multiclass; without --loss, ovr is logistic). Default: multinomial for --loss "
        "multinomial, --penalty grouped or logistic on more than two classes.",
    )(f)  # fmt: skip
    return multiclass_problem_options(
        f, "multinomial (or logistic on labels of more than two classes): the multinomial "
        "logistic model of every class (dl1.fit_multiclass), saved for dl1 predict / score.",
    )  # fmt: skip


def multiclass_problem_options(f: Any, loss_help: str) -> Any:
    """:func:`problem_options` with the multinomial loss, and ``--penalty``."""
    f = click.option(
        "--penalty", type=click.Choice(["l1", "grouped"]), default="l1", show_default=True,
        help="l1: the elastic net of --l1-ratio; grouped (multinomial only): the l1/l2 norm of "
        "each feature's K coefficients (glmnet's type.multinomial='grouped'), a feature in or "
        "out for every class at once (without --loss: the multinomial model).",
    )(f)  # fmt: skip
    return problem_options(f, (*LOSSES, MULTINOMIAL), help=loss_help)


def path_problem_options(f: Any) -> Any:
    """``dl1 path``'s problem: :func:`problem_options` with the multinomial loss."""
    return problem_options(
        f, (*LOSSES, MULTINOMIAL),
        help="multinomial (or logistic on labels of more than two classes): the multinomial "
        "path (dl1.path_multiclass).",
    )  # fmt: skip


def tol_option(help: str) -> Any:
    """``--tol``, the relative duality gap certified (default 1e-6)."""
    return click.option("--tol", type=float, default=1e-6, show_default=True, help=help)


def model_output_options(saved: str) -> Any:
    """``--output`` (received as ``model_out``: where to save ``saved``, in dl1's
    saved-model format) and ``--overwrite``."""

    def add(f: Any) -> Any:
        f = click.option("--overwrite", is_flag=True, help="Replace a saved model at --output.")(f)
        return click.option(
            "--output", "model_out", default=None,
            help=f"Save {saved} in this directory (dl1's saved-model format: JSON and .npy; "
            "read by dl1 predict / score and dl1.load_model).",
        )(f)  # fmt: skip

    return add


def _check_output(path: str | None, overwrite: bool) -> None:
    """An ``--output`` that exists is refused before any work (unless ``--overwrite``), and
    so is one that cannot be written (:func:`check_writable`)."""
    if path is not None and not overwrite and Path(path).exists():
        raise FileExistsError(f"--output {path} exists; pass --overwrite to replace a saved model")
    check_writable(path, "--output")


def check_writable(path: str | os.PathLike | None, option: str) -> None:
    """Refuse before any work a local ``path`` given to ``option`` that cannot be written:
    a file is created and removed in the directory that would hold it (its nearest existing
    ancestor), as permissions alone do not tell (root, read-only mounts). URLs are not
    checked here (their writes are checked as they happen)."""
    if path is None or is_url(str(path)):
        return
    p = Path(path).absolute()
    base = p if p.is_dir() else next((a for a in p.parents if a.exists()), Path("/"))
    if not base.is_dir():
        raise ValidationError(f"{option} {path}: {base} is not a directory (nothing is written)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dl1-write-check-", dir=base)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ValidationError(
            f"{option} {path}: {base} cannot be written ({e.strerror}); nothing was solved"
        ) from None


@cli.command()
@command_options
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to write the store (default: a temporary directory, removed after).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@WORKERS_OPTION
@DASHBOARD_OPTION
def demo(out: str | None, seed: int, workers: int, dashboard: bool) -> None:
    """The main job on its embedded default: generate the 'small' E2006-like preset, fit a
    Lasso at alpha_max / 20 on a LocalCluster and print its certificate."""
    validate_params(COMMON, {"seed": seed}, "dl1 demo")
    o = output()
    with tempfile.TemporaryDirectory(prefix="dl1-demo-") as tmp:
        path = Path(out) if out else Path(tmp) / "small.zarr"
        t0 = time.perf_counter()
        store = make_e2006_like(path, preset="small", seed=seed, overwrite=out is not None)
        o.say(f"generated in {time.perf_counter() - t0:.1f} s")
        o.say(summary(store))
        o.result["data"] = describe(store)
        with connected(ClusterSpec(workers=workers, dashboard=dashboard), o.say) as client:
            _fit_and_report(
                store,
                alpha=None,
                alpha_ratio=20.0,
                l1_ratio=1.0,
                loss="squared",
                tol=1e-6,
                client=client,
                out=o,
            )


@cli.command()
@command_options
@click.argument("store")
@click.option("--alpha", type=float, default=None, help="Penalty (default: alpha_max / ratio).")
@click.option(
    "--alpha-ratio",
    type=float,
    default=20.0,
    show_default=True,
    help="alpha = alpha_max / ratio when --alpha is not given.",
)
@fit_problem_options
@tol_option("Stop at duality gap <= tol * P(0).")
@model_output_options("the fitted model")
@click.option(
    "--progress-every",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="A progress line every N rounds (0: none).",
)
@cluster_options
@storage_options_option
def fit(
    store: str,
    alpha: float | None,
    alpha_ratio: float,
    l1_ratio: float,
    loss: str,
    penalty: str,
    multi_class: str | None,
    tol: float,
    model_out: str | None,
    overwrite: bool,
    progress_every: int,
    cluster: ClusterSpec,
    storage_options: dict[str, Any] | None,
) -> None:
    """Fit a certified L1 / elastic-net model on STORE (a path or URL) and print its
    certificate. On class labels: --loss multinomial (or logistic on more than two
    classes), --penalty grouped, or --multi-class ovr with --loss logistic, squared_hinge or
    hinge fit a multiclass model (dl1.fit_multiclass)."""
    problem = {"l1_ratio": l1_ratio, "tol": tol, **({} if alpha is None else {"alpha": alpha})}
    loss = implied_loss(loss, multi_class, penalty)
    if multi_class is None and penalty == "l1" and loss != MULTINOMIAL:  # dl1.fit's loss
        validate_params(PENALISED, {**problem, "loss": loss}, "dl1 fit")
    validate_params({"alpha_ratio": [POSITIVE]}, {"alpha_ratio": alpha_ratio}, "dl1 fit")
    cluster.check()
    _check_output(model_out, overwrite)
    st = open_input(store, storage_options)  # checked before a cluster
    out = output()
    choice = multiclass_choice(st, loss, multi_class, penalty)
    if choice is not None:
        check_multiclass(st, choice, problem, "dl1 fit")
        with connected(cluster, out.say) as client:
            model = fit_multiclass_and_report(st, choice, alpha=alpha, alpha_ratio=alpha_ratio,
                                              l1_ratio=l1_ratio, tol=tol, client=client,
                                              out=out, progress_every=progress_every)  # fmt: skip
        _save(model, model_out, overwrite, out)
        return
    _checked(st, loss)
    with connected(cluster, out.say) as client:
        res = _fit_and_report(
            st,
            alpha=alpha,
            alpha_ratio=alpha_ratio,
            l1_ratio=l1_ratio,
            loss=loss,
            tol=tol,
            client=client,
            out=out,
            progress_every=progress_every,
        )
    _save(res, model_out, overwrite, out)


@cli.command("path")
@command_options
@click.argument("store")
@click.option("--n-alphas", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "--eps",
    type=float,
    default=1e-2,
    show_default=True,
    help="Smallest alpha as a fraction of alpha_max.",
)
@click.option(
    "--penalty",
    type=click.Choice(["l1", "grouped"]),
    default="l1",
    show_default=True,
    help="grouped: the multinomial path of the l1/l2 penalty of each feature's K coefficients "
    "(a feature in or out for every class at once).",
)
@path_problem_options
@tol_option("Certify each alpha at duality gap <= tol * P(0).")
@click.option(
    "--checkpoint",
    default=None,
    help="Zarr group (path or URL) for incremental results; an interrupted path resumes there.",
)
@click.option(
    "--plots",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the PNG figures (default: STORE-path-plots for a local STORE; none "
    "for a URL).",
)
@model_output_options("the path (every alpha's model)")
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
@cluster_options
@storage_options_option
def path_cmd(
    store: str,
    n_alphas: int,
    eps: float,
    l1_ratio: float,
    loss: str,
    penalty: str,
    tol: float,
    checkpoint: str | None,
    plots: str | None,
    model_out: str | None,
    overwrite: bool,
    constrained: bool,
    sample: float,
    cluster: ClusterSpec,
    storage_options: dict[str, Any] | None,
) -> None:
    """Regularisation path on STORE (a path or URL): every alpha certified; validation error
    on its test split when it has one; figures written as PNG.

    With --constrained, the constrained Lasso path instead: n-alphas radii from eps *
    delta_max up to the paper's delta_max, each certified by its exact FW gap at --tol
    (--loss squared or logistic; no --checkpoint, --l1-ratio 1 only).

    On class labels, --loss multinomial (or logistic on more than two classes) or --penalty
    grouped: the multinomial path (dl1.path_multiclass), its test accuracy per alpha, and
    with --output the most accurate model on the test split (no figures or checkpoints)."""
    loss = implied_loss(loss, None, penalty)
    if loss == MULTINOMIAL or penalty == "grouped" or loss == "logistic":
        cluster.check()
        _check_output(model_out, overwrite)
        st = open_input(store, storage_options)
        choice = multiclass_choice(st, loss, None, penalty)
        if choice is not None:
            refuse_binary_only(st, checkpoint=checkpoint, plots=plots, constrained=constrained,
                               saves=model_out is not None)  # fmt: skip
            _multiclass_path(st, choice, PathOptions(n_alphas, eps, l1_ratio, tol), cluster,
                             model_out, overwrite)  # fmt: skip
            return
    if constrained and (checkpoint is not None or l1_ratio != 1.0):
        raise click.UsageError("--constrained takes neither --checkpoint nor --l1-ratio")
    cluster.check()
    if constrained:
        validate_params(
            CONSTRAINED_PATH,
            dict(n_deltas=n_alphas, eps=eps, loss=loss, tol=tol, sample=sample),
            "dl1 path --constrained",
        )
    else:
        validate_params(
            PATH,
            dict(n_alphas=n_alphas, eps=eps, l1_ratio=l1_ratio, loss=loss, tol=tol),
            "dl1 path",
        )
    _check_output(model_out, overwrite)
    # before a cluster (the constrained path reads labels -1 / +1 only)
    st = _check_store(store, loss, storage_options, any_labels=not constrained)
    check_writable(checkpoint, "--checkpoint")
    check_writable(_plots_dir(plots, store, st), "--plots")
    out = output()
    with connected(cluster, out.say) as client, Progress("path", n_alphas) as progress:

        def on_alpha(k: int, alpha: float, res: Any) -> None:
            nnz = int(np.count_nonzero(res.coef_))
            info = (
                f"delta {alpha:.3e}  nnz {nnz}  fw gap {res.gap_:.1e}  iterations {res.n_iter_}"
                if constrained
                else f"alpha {alpha:.3e}  nnz {nnz}  gap {res.gap_:.1e}  passes {res.passes_:.2f}"
            )
            progress.step(k + 1, info)

        common = dict(
            eps=eps,
            loss=loss,
            tol=tol,
            client=client,
            callback=on_alpha,
            X_test="test" if "test" in st.splits else None,
        )
        t0 = time.perf_counter()
        if constrained:
            result = dl1.path_constrained(st, n_deltas=n_alphas, sample=sample, **common)
        else:
            result = dl1.path(
                st,
                n_alphas=n_alphas,
                l1_ratio=l1_ratio,
                checkpoint=None if checkpoint is None else located(checkpoint, storage_options),
                **common,
            )
        seconds = time.perf_counter() - t0
    out.say(result.summary())
    out.result.update(_path_json(st, result, seconds))
    target = _plots_dir(plots, store, st)
    if target is not None:
        written = [str(f) for f in result.plot(target)]
        for f in written:
            out.say(f"wrote {f}")
        out.result["plots"] = written
    _save(result, model_out, overwrite, out)


def _multiclass_path(st: Store, choice: MulticlassChoice, opts: PathOptions, cluster: ClusterSpec,
                     model_out: str | None, overwrite: bool) -> None:  # fmt: skip
    """``dl1 path`` on class labels (:mod:`dl1.cli.multiclass_path`), checked before a
    cluster; the chosen model saved at ``model_out``."""
    check_multiclass(st, choice, {"l1_ratio": opts.l1_ratio, "tol": opts.tol}, "dl1 path")
    validate_params(PATH, {"n_alphas": opts.n_alphas, "eps": opts.eps}, "dl1 path")
    out = output()
    with connected(cluster, out.say) as client:
        model = path_multiclass_and_report(st, choice, opts, client=client, out=out)
    if model is not None:
        _save(model, model_out, overwrite, out)


def _plots_dir(plots: str | None, store: str, st: Store) -> Path | None:
    """Where ``dl1 path`` draws its figures: ``--plots``, else beside a local store."""
    if plots:
        return Path(plots)
    return None if is_url(store) else Path(str(st.path) + "-path-plots")


def _path_json(store: Store, result: Any, seconds: float) -> dict[str, Any]:
    best = result.best_index_
    doc = {
        "store": where(store),
        "loss": result.loss,
        "l1_ratio": result.l1_ratio,
        "tol": result.tol,
        "n_alphas": result.n_alphas,
        "alphas": result.alphas_,
        "n_nonzero": result.n_active_,
        "relative_gaps": result.gaps_,
        "certified": result.converged_,
        "passes": result.passes_,
        "seconds_per_alpha": result.seconds_,
        "seconds": seconds,
        "best_index": best,
        "best_alpha": None if best is None else float(result.alphas_[best]),
    }
    for name in ("deltas_", "test_mse_", "test_logloss_", "test_accuracy_"):
        v = getattr(result, name, None)
        if v is not None:
            doc[name.rstrip("_")] = v
    return doc
