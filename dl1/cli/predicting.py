"""``dl1 predict`` and ``dl1 score``: a saved model applied to a store, out of core.

Predictions are computed on the workers one row block at a time (a few in flight) and
written, as each arrives, into a float64 ``.npy`` file (:func:`numpy.lib.format.open_memmap`)
made beside ``--output`` and renamed into place when complete: the client holds a few
blocks' predictions at a time, and never the data.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
from numpy.lib.format import open_memmap

from dl1.cli.app import cli, command_options, output
from dl1.cli.cluster import ClusterSpec, cluster_options, connected
from dl1.cli.progress import Progress
from dl1.cli.stores import check_split, open_input, storage_options_option, where
from dl1.errors import ValidationError
from dl1.models import MulticlassModel, load_model
from dl1.objective.datafits import datafit_class
from dl1.paths.result import PathResult
from dl1.predict import check_n_features, decision_function

#: Row blocks of predictions computed at once per worker.
BLOCKS_IN_FLIGHT_PER_WORKER = 2


def load(model_path: str, alpha: float | None) -> Any:
    """The saved model at ``model_path`` (a :class:`dl1.FitResult` or a multinomial
    :class:`~dl1.models.MulticlassModel`; of a saved path, the model of grid alpha
    ``alpha``, or of its chosen alpha)."""
    model = load_model(model_path)
    if isinstance(model, PathResult):
        try:
            return model.model(alpha)
        except ValueError as e:
            raise ValidationError(f"{model_path}: {e} (--alpha)") from None
    if alpha is not None and alpha != model.alpha:
        raise ValidationError(
            f"{model_path} is a fit at alpha {model.alpha!r}; --alpha is for a saved path"
        )
    return model


def model_and_data(
    model: str,
    alpha: float | None,
    data: str,
    split: str | None,
    storage_options: dict[str, Any] | None,
) -> tuple[Any, Any, str]:
    """``(fitted, store, split)``: the saved model (:func:`load`), the store DATA opened
    and its split chosen (:func:`check_split`), checked to have the model's features,
    before a cluster starts."""
    fitted = load(model, alpha)
    store = open_input(data, storage_options)
    split = check_split(store, split)
    check_n_features(store.to_dask(split), fitted.n_features_in_)
    return fitted, store, split


def classifies(fitted: Any) -> bool:
    """A classifier (its score is an accuracy): a multinomial model, or a classification
    loss's fit."""
    return isinstance(fitted, MulticlassModel) or datafit_class(fitted.loss).classifies


def predictions(fitted: Any, store: Any, split: str, decision: bool) -> Any:
    """The lazy predictions written by ``dl1 predict``: decision values (a multinomial
    model's: ``(n, K)``, a class a column) or labels (the model's)."""
    if not isinstance(fitted, MulticlassModel):
        if decision:
            return decision_function(store, fitted.coef_, fitted.intercept_, split=split)
        return fitted.predict(store, split=split)  # in the model's labels (classes_)
    if decision:
        return fitted.decision_function(store, split=split)
    return fitted.predict(store, split=split)


def check_float_labels(fitted: Any, decision: bool) -> None:
    """Refuse (before a cluster) to write a multinomial model's labels that are not
    numbers: the ``.npy`` file holds float64 values."""
    if decision or not isinstance(fitted, MulticlassModel):
        return  # a binary FitResult's labels are numbers
    if fitted.classes_.dtype.kind not in "biuf":
        raise ValidationError(
            f"the model's classes are {fitted.classes_.dtype} labels, not numbers: --output "
            "holds float64 values (use --decision-function, or dl1.load_model in Python)"
        )


def write_blockwise(pred: Any, dst: Path, client: Any, progress: Progress) -> int:
    """Compute the dask vector ``pred`` (or matrix, one chunk across its columns) block of
    rows by block of rows on ``client`` (a few blocks in flight) into the ``.npy`` file
    ``dst`` (written beside it, renamed when complete); returns the number of rows."""
    # local: distributed (~0.3 s to import) only once predictions are computed on a cluster
    from distributed import as_completed

    n, tail = int(pred.shape[0]), tuple(int(d) for d in pred.shape[1:])
    starts = np.concatenate([[0], np.cumsum(pred.chunks[0])]).astype(np.int64)
    todo = iter(enumerate(pred.to_delayed().ravel()))
    window = BLOCKS_IN_FLIGHT_PER_WORKER * max(1, len(client.scheduler_info()["workers"]))
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    index: dict[str, int] = {}
    running = as_completed()

    def submit() -> None:
        for i, block in todo:  # one block, if any is left
            fut = client.compute(block)
            index[fut.key] = i
            running.add(fut)
            return

    try:
        mm = open_memmap(tmp, mode="w+", dtype="<f8", shape=(n, *tail))
        for _ in range(window):
            submit()
        for done, fut in enumerate(running, start=1):  # ends when every block is written
            i = index.pop(fut.key)
            values = np.asarray(fut.result(), dtype=np.float64)
            lo, hi = int(starts[i]), int(starts[i + 1])
            if values.shape != (hi - lo, *tail):
                raise ValidationError(
                    f"row block {i} gave {values.shape} predictions, expected "
                    f"{(hi - lo, *tail)}"
                )
            mm[lo:hi] = values
            del fut, values
            progress.step(done, f"row block {i} written (rows {lo}-{hi - 1})")
            submit()
        mm.flush()
        del mm
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return n


@cli.command()
@command_options
@click.argument("model", type=click.Path())
@click.argument("data")
@click.option(
    "--output",
    "pred_out",
    required=True,
    help="The predictions: a float64 .npy file, one value per row of DATA's split (a "
    "multinomial model's decision values: n x K, a class a column).",
)
@click.option("--split", default=None, help="Split of DATA (default: test if any, else train).")
@click.option(
    "--decision-function",
    "decision",
    is_flag=True,
    help="Write decision values X w + b (a multinomial model's: X W^T + b, n x K) instead "
    "of predictions (for classifiers, the model's labels: those it was fitted on).",
)
@click.option("--alpha", type=float, default=None, help="Saved path: the grid alpha to use.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output file.")
@cluster_options
@storage_options_option
def predict(
    model: str,
    data: str,
    pred_out: str,
    split: str | None,
    decision: bool,
    alpha: float | None,
    overwrite: bool,
    cluster: ClusterSpec,
    storage_options: dict[str, Any] | None,
) -> None:
    """Predict with the saved MODEL on the store DATA (a path or URL), out of core: row
    block by row block, on the workers, into the .npy file --output."""
    cluster.check()
    dst = Path(pred_out)
    if dst.suffix != ".npy":
        raise click.BadParameter("must name a .npy file", param_hint="--output")
    if dst.exists() and not overwrite:
        raise FileExistsError(f"--output {dst} exists; pass --overwrite to replace it")
    fitted, store, split = model_and_data(model, alpha, data, split, storage_options)
    check_float_labels(fitted, decision)
    out = output()
    t0 = time.perf_counter()
    with connected(cluster, out.say) as client:
        pred = predictions(fitted, store, split, decision)
        with Progress("predict", len(pred.chunks[0])) as progress:
            n = write_blockwise(pred, dst, client, progress)
    dt = time.perf_counter() - t0
    kind = "decision values" if decision else "predictions"
    out.say(f"{n:,} {kind} of {where(store)} [{split}] written to {dst} in {dt:.2f} s")
    out.result.update(
        output=str(dst),
        n_samples=n,
        split=split,
        kind=kind.split()[0],
        loss=fitted.loss,
        alpha=fitted.alpha,
        store=where(store),
        seconds=dt,
    )


@cli.command()
@command_options
@click.argument("model", type=click.Path())
@click.argument("data")
@click.option("--split", default=None, help="Split of DATA (default: test if any, else train).")
@click.option("--alpha", type=float, default=None, help="Saved path: the grid alpha to use.")
@cluster_options
@storage_options_option
def score(
    model: str,
    data: str,
    split: str | None,
    alpha: float | None,
    cluster: ClusterSpec,
    storage_options: dict[str, Any] | None,
) -> None:
    """Score the saved MODEL on the store DATA (a path or URL) and its targets: R^2 for the
    squared loss, accuracy otherwise (as the estimators' score; a multinomial model's too)."""
    cluster.check()
    fitted, store, split = model_and_data(model, alpha, data, split, storage_options)
    out = output()
    t0 = time.perf_counter()
    with connected(cluster, out.say):
        value = fitted.score(store, split=split)  # a classifier's labels: its classes_
    dt = time.perf_counter() - t0
    metric = "accuracy" if classifies(fitted) else "r2"
    out.say(f"{metric} {value:.6g} on {where(store)} [{split}] ({store.shape(split)[0]:,} rows)")
    out.result.update(
        metric=metric,
        score=value,
        split=split,
        n_samples=store.shape(split)[0],
        loss=fitted.loss,
        alpha=fitted.alpha,
        store=where(store),
        seconds=dt,
    )
