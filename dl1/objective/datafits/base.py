"""What a datafit declares about its loss: one object per loss, one file each.

Everything dl1 needs to know about a loss is on its datafit class: the name users pass
(``loss=``), the kernels' code (:mod:`dl1.kernels.codes`), whether it classifies, how a
model of it is scored and validated, whether the sample-wise kernels have its steps, and
its scikit-learn equivalent. The registry (:mod:`dl1.objective.datafits`) is built from
these classes; nothing else names a loss.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray


@runtime_checkable
class Datafit(Protocol):
    """A datafit ``F(z) = (1/n) sum_i s_i loss(y_i, z_i)`` and its loss's declarations.

    Class attributes
    ----------------
    name : the ``loss=`` string.
    code : the kernels' loss code (:mod:`dl1.kernels.codes`).
    classifies : labels in {-1, +1}; predictions are the decision function's sign; scored
        by accuracy (else by R^2 and regressed on real targets).
    log_odds : the decision function is a log-odds (``predict_proba``, log-loss).
    metrics : validation metrics of a path's test data, the first minimised to choose the
        best alpha (:data:`dl1.paths.evaluation.METRIC_FUNCTIONS`).
    row_steps : the sample-wise kernels (SGD, FoBoS, RDA, SMIDAS, Prox-SDCA) have its steps.
    beta : a bound on ``loss''`` (inf for a non-smooth loss, or a smooth one whose
        curvature has no bound, as Poisson's).
    smooth : differentiable (proximal Newton fits it; a finite ``beta`` is what the
        solvers taking fixed steps need besides).
    newton_reach : the margin change a coordinate of a proximal Newton step may make at
        first (:mod:`dl1.tasks.trust`; inf for no bound).
    """

    name: ClassVar[str]
    code: ClassVar[int]
    classifies: ClassVar[bool]
    log_odds: ClassVar[bool]
    metrics: ClassVar[tuple[str, ...]]
    row_steps: ClassVar[bool]
    beta: float
    smooth: bool
    newton_reach: float

    def validate_y(self, y: ArrayLike) -> NDArray[np.float64]: ...
    def value(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> float: ...
    def initial_intercept(self, y: ArrayLike, s: ArrayLike | None = None) -> float: ...
    def sklearn_estimator(self, res: Any) -> Any: ...
    def params(self) -> dict[str, float]:
        """The loss's own parameters, as its constructor takes them (saved with a model)."""
        ...

    def response(self, z: Any) -> Any:
        """The prediction at decision values ``z`` (the inverse link)."""
        ...


def sgd_classifier(loss: str, res: Any) -> Any:
    """scikit-learn's ``SGDClassifier`` with ``loss`` and ``res``'s elastic-net penalty:
    the objective of a dl1 hinge-type fit (``t_`` set: it is fitted)."""
    # local: scikit-learn (~1 s, ~120 MiB) only to compare with it; workers import datafits
    from sklearn.linear_model import SGDClassifier

    est = SGDClassifier(loss=loss, penalty="elasticnet", alpha=res.alpha, l1_ratio=res.l1_ratio,
                        fit_intercept=bool(res.fit_intercept), tol=res.tol)  # fmt: skip
    est.t_ = 1.0
    return est
