"""``dl1 fit`` on a store of more than two classes (:func:`dl1.fit_multiclass`): the
multinomial model (L1 / elastic-net or grouped penalty) or ``K`` one-vs-rest binary
classifiers, certified by their duality gaps, saved as a :class:`dl1.models.MulticlassModel`
(read by ``dl1 predict`` and ``dl1 score``).

The multinomial model is taken with ``--loss multinomial``, ``--loss logistic`` on labels of
more than two classes (as ``dl1.LogisticRegression`` does), ``--penalty grouped`` or
``--multi-class multinomial``; one-vs-rest with ``--multi-class ovr`` and ``--loss logistic``,
``squared_hinge`` or ``hinge``. The default alpha is ``alpha_max / --alpha-ratio``, with
``alpha_max`` found by one pass over the data (:func:`multiclass_alpha_max`), on the blocks
the fit then uses (loaded once).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import click
import numpy as np
from click.core import ParameterSource

from dl1.cli.app import Output
from dl1.cli.progress import Progress
from dl1.cli.stores import where
from dl1.errors import ValidationError
from dl1.inputs import read_inputs
from dl1.models import MulticlassModel
from dl1.multiclass import LabelledBlocks, fit_labelled, load_labelled, multinomial_penalty
from dl1.objective.datafits import make_datafit
from dl1.objective.datafits.multinomial import Multinomial
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.params import MULTICLASS, validate_params
from dl1.runtime.executor import coordinating
from dl1.solvers.multiclass import MulticlassWorkingSetSolver
from dl1.solvers.ovr import OvrProblem
from dl1.store import Store
from dl1.tasks.ovr import ovr_scan_task

#: The ``--loss`` of the multinomial model (not one of dl1.fit's losses).
MULTINOMIAL = "multinomial"
#: The one-vs-rest binary losses (``--multi-class ovr``).
OVR_LOSSES = ("logistic", "squared_hinge", "hinge")


class MulticlassChoice(NamedTuple):
    """The multiclass problem the options name: the scheme (``"multinomial"`` or
    ``"ovr"``), the model's loss (``"multinomial"``, or one-vs-rest's binary loss) and the
    penalty (``"l1"``: the elastic net of ``l1_ratio``; ``"grouped"``: multinomial only)."""

    multi_class: str
    loss: str
    penalty: str

    @property
    def binary_loss(self) -> str:
        """The loss :func:`dl1.fit_multiclass` takes (the multinomial model's: logistic)."""
        return "logistic" if self.loss == MULTINOMIAL else self.loss


def implied_loss(loss: str, multi_class: str | None, penalty: str) -> str:
    """``--loss``, or when it is not given (its default is the squared loss) the one the
    multiclass options imply: ``logistic`` for ``--multi-class ovr``, ``multinomial`` for
    ``--multi-class multinomial`` or ``--penalty grouped``."""
    if click.get_current_context().get_parameter_source("loss") is not ParameterSource.DEFAULT:
        return loss
    if multi_class == "ovr":
        return "logistic"
    return MULTINOMIAL if multi_class == "multinomial" or penalty == "grouped" else loss


def multiclass_choice(
    store: Store, loss: str, multi_class: str | None, penalty: str
) -> MulticlassChoice | None:
    """The multiclass problem ``dl1 fit`` / ``dl1 path`` solve on ``store``, or None for a
    binary (or regression) fit: ``--loss multinomial``, ``--penalty grouped``,
    ``--multi-class``, or ``--loss logistic`` on more than two classes.

    Raises
    ------
    ValidationError
        A combination no model has (a multinomial hinge, a grouped one-vs-rest, ...).
    """
    if multi_class is None:
        many = loss == "logistic" and _many_classes(store.read("y", "train"))
        if loss != MULTINOMIAL and penalty != "grouped" and not many:
            return None
        multi_class = "multinomial"
    if multi_class == "multinomial":
        if loss not in (MULTINOMIAL, "logistic"):
            raise ValidationError(
                f"--loss {loss} with the multinomial model: it is logistic (--loss multinomial "
                "or logistic); pass --multi-class ovr for one-vs-rest " + loss
            )
        return MulticlassChoice("multinomial", MULTINOMIAL, penalty)
    if loss not in OVR_LOSSES:
        raise ValidationError(f"--multi-class ovr takes --loss one of {', '.join(OVR_LOSSES)}; "
                              f"got --loss {loss}")  # fmt: skip
    if penalty == "grouped":
        raise ValidationError("--penalty grouped is multinomial only; one-vs-rest takes --penalty "
                              "l1 (with --l1-ratio for the elastic net)")  # fmt: skip
    return MulticlassChoice("ovr", loss, penalty)


def _many_classes(y: np.ndarray) -> bool:
    """Labels of more than two classes: more than two values, and not continuous targets
    (floats that are not all whole numbers: scikit-learn's ``type_of_target`` calls them
    ``"continuous"`` and its classifiers refuse them; the binary logistic fit's check
    names the problem)."""
    values = np.unique(y)
    continuous = values.dtype.kind == "f" and not np.array_equal(values, np.round(values))
    return values.shape[0] > 2 and not continuous


def check_multiclass(store: Store, choice: MulticlassChoice, params: dict[str, Any],
                     command: str) -> np.ndarray:  # fmt: skip
    """The options (``params``: ``l1_ratio``, ``tol``, maybe ``alpha``) checked as
    :func:`dl1.fit_multiclass` checks them, and the store's training labels as it reads
    them (two classes at least, finite; the data and its weights as a fit's), before a
    cluster starts; returns the classes."""
    validate_params(MULTICLASS, {**params, "multi_class": choice.multi_class,
                                 "loss": choice.binary_loss, "penalty": choice.penalty},
                    command)  # fmt: skip
    if choice.loss == "hinge" and params["l1_ratio"] != 1.0:
        raise ValidationError(
            f"the one-vs-rest hinge takes the pure L1 penalty (--l1-ratio 1); got --l1-ratio "
            f"{params['l1_ratio']}: use --loss squared_hinge or logistic for the elastic net"
        )
    classes, codes = Multinomial.encode(store.read("y", "train"))
    read_inputs(store, codes.astype(np.float64), None, "squared", "train")
    return classes


class AlphaMax(NamedTuple):
    """``alpha_max`` of a multiclass problem, and one-vs-rest's per class (None for a
    multinomial model: one problem)."""

    value: float
    per_class: np.ndarray | None


def multiclass_alpha_max(data: LabelledBlocks, choice: MulticlassChoice,
                         l1_ratio: float) -> AlphaMax:  # fmt: skip
    """The smallest alpha whose solution is ``W = 0``, by one pass over the loaded data.

    Multinomial: at ``W = 0`` with the intercepts optimal the probabilities are the classes'
    (weighted) frequencies ``pi``, and ``alpha_max`` is the penalty's dual norm of ``X^T
    (Y - 1 pi^T) / n`` over ``l1_ratio`` (the largest entry for the l1 penalty, the largest
    row norm for the grouped one; glmnet's ``lambda_max``),
    :meth:`~dl1.solvers.multiclass.MulticlassWorkingSetSolver.alpha_max`.

    One-vs-rest: the largest of the classes' binary ``alpha_max`` (:func:`dl1.alpha_max` of
    labels ``+1`` on class ``k``, ``-1`` elsewhere), all ``K`` from one pass:
    :func:`ovr_alpha_max`. Above it every class's answer is ``w_k = 0``.
    """
    if choice.multi_class == "ovr":
        per_class = ovr_alpha_max(data, choice.loss, l1_ratio)
        return AlphaMax(float(per_class.max()), per_class)
    prob = data.problem(multinomial_penalty(choice.penalty, 1.0, l1_ratio), True)
    return AlphaMax(MulticlassWorkingSetSolver().alpha_max(prob, l1_ratio), None)


def ovr_alpha_max(data: LabelledBlocks, loss: str, l1_ratio: float) -> np.ndarray:
    """Each class's binary ``alpha_max`` (with an intercept), from one pass over ``X``.

    Class ``k``'s is ``||X^T theta_k||_inf / (n l1_ratio)`` with ``theta_k`` the binary
    datafit's dual point at ``w = 0`` and its optimal intercept
    (:func:`dl1.solvers.alpha_max.problem_alpha_max`, Fercoq, Gramfort & Salmon 2015,
    eq. 3); the ``K`` dual points side by side make one ``n x K`` matrix ``Theta`` and one
    :func:`~dl1.tasks.ovr.ovr_scan_task` per partition computes ``X^T Theta`` (the
    one-vs-rest solver's own pass), with each class's largest ``|x_j^T theta_k|``.
    """
    prob = OvrProblem(data.ex, data.blocks, data.col_bounds, data.codes, data.n_classes,
                      make_datafit(loss), ElasticNet(1.0, l1_ratio), True, 1.0,
                      data.n_partitions, data.sample_weight)  # fmt: skip
    thetas = []
    for k in range(data.n_classes):
        pb = prob.binary(k)
        z0 = np.full(pb.n, pb.initial_intercept())
        thetas.append(pb.datafit.dual_point(pb.y, z0, pb.weights, pb.fit_intercept))
    theta, K, ex, cb = np.column_stack(thetas), data.n_classes, data.ex, data.col_bounds
    parts = np.array_split(np.arange(len(data.blocks)), max(1, min(2, len(data.blocks))))
    scans = ex.gather([
        ex.submit(ovr_scan_task, [data.blocks[j] for j in part], [int(cb[j]) for j in part],
                  theta, 0.0, [np.zeros(0, np.int64)] * K, [0] * K)
        for part in parts if part.shape[0]
    ])  # fmt: skip
    absmax = np.array([max((blk[k].stats.absmax for scan in scans for blk in scan.blocks),
                           default=0.0) for k in range(K)])  # fmt: skip
    n = data.codes.shape[0]
    return np.array([ElasticNet.alpha_max(a / n, l1_ratio) for a in absmax])


def _reporter(progress: Progress, every: int) -> Any:
    """The solvers' callback: every ``every``-th round's gap (one-vs-rest: the largest,
    with the classes still active and the support; multinomial: with the support) (None:
    0)."""
    if every <= 0:
        return None

    def on_round(entry: dict[str, Any]) -> None:
        r = int(entry["round"])
        if r % every:
            return
        if "active" in entry:  # one-vs-rest
            progress.step(r, f"round {r}  largest gap {entry['gap']:.3e}  active classes "
                             f"{entry['active']}  nnz {int(np.sum(entry['nnz']))}")  # fmt: skip
        else:
            progress.step(r, f"round {r}  gap {entry['gap']:.3e}  support {entry['support']}")

    return on_round


def _describe(choice: MulticlassChoice, l1_ratio: float) -> str:
    """``multinomial`` / ``multinomial, grouped`` / ``one-vs-rest hinge`` and the penalty."""
    if choice.multi_class == "ovr":
        return f"one-vs-rest {choice.loss}, l1_ratio={l1_ratio}"
    grouped = ", grouped" if choice.penalty == "grouped" else ""
    return f"multinomial{grouped}, l1_ratio={l1_ratio}"


def fit_multiclass_and_report(
    store: Store,
    choice: MulticlassChoice,
    *,
    alpha: float | None,
    alpha_ratio: float,
    l1_ratio: float,
    tol: float,
    client: Any,
    out: Output,
    progress_every: int = 1,
) -> MulticlassModel:
    """Fit the multiclass model ``choice`` at ``alpha`` (None: ``alpha_max /
    alpha_ratio``), print its certificate and the test split's accuracy, and fill the JSON
    result. ``progress_every``: a line every that many rounds."""
    t0 = time.perf_counter()
    with Progress("fit") as progress:
        fitted = _fit_loaded_once(store, choice, _Asked(alpha, alpha_ratio, l1_ratio, tol),
                                  progress, progress_every, client=client)  # fmt: skip
    res, amax, a = fitted.result, fitted.alpha_max, fitted.alpha
    dt = time.perf_counter() - t0
    model = MulticlassModel.from_result(res, alpha=a, l1_ratio=l1_ratio, penalty=choice.penalty,
                                        n_samples=store.shape("train")[0])  # fmt: skip
    _report(store, model, amax, dt, choice, out)
    if "test" in store.splits:
        pred = client.compute(model.predict(store, split="test")).result()
        accuracy = float(np.mean(pred == store.read("y", "test")))
        out.result["test_accuracy"] = accuracy
        out.say(f"test: accuracy {accuracy:.4f}")
    return model


class _Asked(NamedTuple):
    """The fit's options: ``alpha`` (None: ``alpha_max / alpha_ratio``), ``l1_ratio``, ``tol``."""

    alpha: float | None
    alpha_ratio: float
    l1_ratio: float
    tol: float


class _Fitted(NamedTuple):
    result: Any
    alpha_max: AlphaMax
    alpha: float


@coordinating
def _fit_loaded_once(store: Store, choice: MulticlassChoice, asked: _Asked,
                     progress: Progress, every: int, *, client: Any) -> _Fitted:  # fmt: skip
    """The store's blocks loaded (or located, streamed) once: ``alpha_max`` by one pass
    over them, then the fit on them (:func:`dl1.multiclass.fit_labelled`)."""
    data = load_labelled(store, None, None, "train", client, 2, None)
    amax = multiclass_alpha_max(data, choice, asked.l1_ratio)
    a = asked.alpha if asked.alpha is not None else amax.value / asked.alpha_ratio
    progress.note(f"alpha_max {amax.value:.6g}; fitting the "
                  f"{_describe(choice, asked.l1_ratio)} model at alpha {a:.6g}")  # fmt: skip
    res = fit_labelled(data, alpha=a, l1_ratio=asked.l1_ratio, penalty=choice.penalty,
                       multi_class=choice.multi_class, loss=choice.binary_loss, tol=asked.tol,
                       callback=_reporter(progress, every))  # fmt: skip
    return _Fitted(res, amax, a)


def _report(store: Store, model: MulticlassModel, amax: AlphaMax, dt: float,
            choice: MulticlassChoice, out: Output) -> None:  # fmt: skip
    """The fit's lines and JSON fields (a one-vs-rest fit's per-class figures too)."""
    K, p = model.coef_.shape
    a, used = model.alpha, int(np.unique(model.coef_.indices).shape[0])
    out.say(f"fit ({_describe(choice, model.l1_ratio)}, {K} classes, alpha={a:.6g} = "
            f"alpha_max/{amax.value / a:.4g}) in {dt:.2f} s, {model.n_rounds_} rounds")  # fmt: skip
    largest = "largest class's " if choice.multi_class == "ovr" else ""
    out.say(
        f"certificate: {largest}relative duality gap {model.gap_:.3e} "
        f"({'certified' if model.converged_ else 'NOT certified'} at tol {model.tol:g}); "
        f"objective {model.primal_:.8g}, dual {model.dual_:.8g}"
    )
    out.say(f"model: {model.coef_.nnz:,} nonzero coefficients of {K} x {p:,} "
            f"({used:,} features used)")  # fmt: skip
    out.result.update(
        store=where(store), loss=model.loss, multi_class=model.multi_class,
        penalty=model.penalty, n_classes=K, classes=model.classes_, alpha=a,
        alpha_max=amax.value, l1_ratio=model.l1_ratio, tol=model.tol,
        certified=model.converged_, relative_gap=model.gap_, primal=model.primal_,
        dual=model.dual_, n_rounds=model.n_rounds_, seconds=dt, n_features=p,
        n_nonzero=int(model.coef_.nnz), n_features_used=used, intercept=model.intercept_,
    )  # fmt: skip
    if model.gaps_ is not None:
        out.result.update(relative_gaps=model.gaps_, alpha_max_per_class=amax.per_class)
