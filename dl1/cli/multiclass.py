"""``dl1 fit`` on a store of more than two classes: the multinomial model
(:func:`dl1.fit_multiclass`), certified by its duality gap, saved as a
:class:`dl1.models.MulticlassModel` (read by ``dl1 predict`` and ``dl1 score``).

It is taken with ``--loss multinomial``, or with ``--loss logistic`` on labels of more than
two classes (as ``dl1.LogisticRegression`` does).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

import dl1
from dl1.cli.app import Output
from dl1.cli.progress import Progress
from dl1.cli.stores import where
from dl1.inputs import read_inputs
from dl1.models import MulticlassModel
from dl1.objective.datafits.multinomial import Multinomial

if TYPE_CHECKING:
    from dl1.store import Store

#: The ``--loss`` of the multinomial model (not one of dl1.fit's losses).
MULTINOMIAL = "multinomial"


def wants_multinomial(store: Store, loss: str) -> bool:
    """``--loss multinomial``, or ``--loss logistic`` on a store whose training labels hold
    more than two classes."""
    if loss == MULTINOMIAL:
        return True
    return loss == "logistic" and np.unique(store.read("y", "train")).shape[0] > 2


def check_multiclass_store(store: Store) -> np.ndarray:
    """The store's training labels checked as :func:`dl1.fit_multiclass` reads them (two
    classes at least, finite; the data and its weights as a fit's), before a cluster
    starts; returns the classes."""
    classes, codes = Multinomial.encode(store.read("y", "train"))
    read_inputs(store, codes.astype(np.float64), None, "squared", "train")
    return classes


def multiclass_alpha_max(store: Store, l1_ratio: float, client: Any) -> float:
    """The smallest alpha whose multinomial (L1 / elastic-net) solution is ``W = 0``.

    At ``W = 0`` with the intercepts optimal, the predicted probabilities are the classes'
    (weighted) frequencies ``pi``, so the dual point's column ``k`` is ``S (1[y = k] -
    pi_k)``: the residual of the squared loss with an intercept fitted to the indicator of
    class ``k``. Hence ``alpha_max = max_k alpha_max_squared(X, 1[y = k])`` (the l1 part's
    dual norm, ``max |X^T Theta| / (n l1_ratio)``, :mod:`dl1.objective.datafits.
    multinomial`); one pass over the data per class.
    """
    y = store.read("y", "train")
    return max(
        dl1.alpha_max(store, (y == c).astype(np.float64), l1_ratio=l1_ratio, loss="squared",
                      client=client)  # fmt: skip
        for c in np.unique(y)
    )


def fit_multiclass_and_report(
    store: Store,
    *,
    alpha: float | None,
    alpha_ratio: float,
    l1_ratio: float,
    tol: float,
    client: Any,
    out: Output,
) -> MulticlassModel:
    """Fit the multinomial model at ``alpha`` (None: ``alpha_max / alpha_ratio``), print
    its certificate and the test split's accuracy, and fill the JSON result."""
    t0 = time.perf_counter()
    with Progress("fit") as progress:
        amax = multiclass_alpha_max(store, l1_ratio, client)
        a = alpha if alpha is not None else amax / alpha_ratio
        progress.note(f"alpha_max {amax:.6g}; fitting the multinomial model at alpha {a:.6g}")
        res = dl1.fit_multiclass(store, alpha=a, l1_ratio=l1_ratio, tol=tol, client=client)
    dt = time.perf_counter() - t0
    model = MulticlassModel.from_result(res, alpha=a, l1_ratio=l1_ratio,
                                        n_samples=store.shape("train")[0])  # fmt: skip
    K, p = model.coef_.shape
    used = int(np.unique(model.coef_.indices).shape[0])
    out.say(
        f"fit (multinomial, {K} classes, alpha={a:.6g} = alpha_max/{amax / a:.4g}, "
        f"l1_ratio={l1_ratio}) in {dt:.2f} s, {model.n_rounds_} rounds"
    )
    out.say(
        f"certificate: relative duality gap {model.gap_:.3e} "
        f"({'certified' if model.converged_ else 'NOT certified'} at tol {tol:g}); "
        f"objective {model.primal_:.8g}, dual {model.dual_:.8g}"
    )
    out.say(f"model: {model.coef_.nnz:,} nonzero coefficients of {K} x {p:,} "
            f"({used:,} features used)")  # fmt: skip
    out.result.update(
        store=where(store), loss=MULTINOMIAL, n_classes=K, classes=model.classes_, alpha=a,
        alpha_max=amax, l1_ratio=l1_ratio, tol=tol, certified=model.converged_,
        relative_gap=model.gap_, primal=model.primal_, dual=model.dual_,
        n_rounds=model.n_rounds_, seconds=dt, n_features=p, n_nonzero=int(model.coef_.nnz),
        n_features_used=used, intercept=model.intercept_,
    )  # fmt: skip
    if "test" in store.splits:
        pred = client.compute(model.predict(store, split="test")).result()
        accuracy = float(np.mean(pred == store.read("y", "test")))
        out.result["test_accuracy"] = accuracy
        out.say(f"test: accuracy {accuracy:.4f}")
    return model
