"""Parameter constraints, declared once and checked in one place.

Each public entry point declares its parameters as scikit-learn's estimators do
(``_parameter_constraints``): a dict from name to the list of constraints any one of which
the value must meet. :func:`validate_params` checks a call's values against it before any
work starts; the functions (:func:`dl1.fit`, :func:`dl1.path`, ...), the estimators and the
command line share the same declarations, so a value is refused with the same message
wherever it comes from.

A constraint is one of:

- :class:`Interval` (numbers in a range, of a type),
- :class:`Options` (one of a set of values),
- ``None`` (the value may be None),
- ``"boolean"`` (True or False, NumPy's included),
- ``"array-like"`` (anything; checked where the data is read),
- a callable returning whether the value is acceptable, with a ``description`` attribute.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dl1.errors import ValidationError
from dl1.objective.datafits import DATAFITS, LOSSES
from dl1.solvers.registry import SOLVERS


class InvalidParameterError(ValidationError, TypeError):
    """A parameter of a public function has a value outside its declared constraints."""


@dataclass(frozen=True)
class Interval:
    """Numbers of ``kind`` (``numbers.Integral`` or ``numbers.Real``) between ``left`` and
    ``right`` (None: unbounded), ``closed`` on ``"left"``, ``"right"``, ``"both"`` or
    ``"neither"``; NaN never is, infinities only with ``finite=False``."""

    kind: type
    left: float | None
    right: float | None
    closed: str = "both"
    finite: bool = True

    def __call__(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, self.kind):
            return False
        v = float(value)
        if math.isnan(v) or (self.finite and math.isinf(v)):
            return False
        lo_ok = self.left is None or (
            v >= self.left if self.closed in ("left", "both") else v > self.left
        )
        hi_ok = self.right is None or (
            v <= self.right if self.closed in ("right", "both") else v < self.right
        )
        return lo_ok and hi_ok

    def __str__(self) -> str:
        name = "an int" if self.kind is numbers.Integral else "a finite number"
        lo = "-inf" if self.left is None else repr(self.left)
        hi = "inf" if self.right is None else repr(self.right)
        left = "[" if self.closed in ("left", "both") and self.left is not None else "("
        right = "]" if self.closed in ("right", "both") and self.right is not None else ")"
        return f"{name} in {left}{lo}, {hi}{right}"


@dataclass(frozen=True)
class Options:
    """One of ``values``."""

    values: tuple[Any, ...]

    def __call__(self, value: Any) -> bool:
        try:
            return any(value == v and type(value) is type(v) for v in self.values)
        except Exception:  # an array compared with a string
            return False

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)


def _is_boolean(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"


def _describe(constraint: Any) -> str:
    if constraint is None:
        return "None"
    if constraint == "boolean":
        return "a boolean"
    if constraint == "array-like":
        return "array-like"
    return getattr(constraint, "description", None) or str(constraint)


def _meets(value: Any, constraint: Any) -> bool:
    if constraint is None:
        return value is None
    if constraint == "boolean":
        return _is_boolean(value)
    if constraint == "array-like":
        return True
    return bool(constraint(value))


def check_value(name: str, value: Any, constraints: Iterable[Any], where: str) -> None:
    """Raise :class:`InvalidParameterError` unless ``value`` meets one of ``constraints``."""
    constraints = list(constraints)
    if any(_meets(value, c) for c in constraints):
        return
    wanted = [_describe(c) for c in constraints]
    text = wanted[0] if len(wanted) == 1 else ", ".join(wanted[:-1]) + " or " + wanted[-1]
    raise InvalidParameterError(
        f"the {name!r} parameter of {where} must be {text}; got {value!r}"
    )


def validate_params(
    constraints: Mapping[str, list[Any]], params: Mapping[str, Any], where: str
) -> None:
    """Check every value of ``params`` that ``constraints`` declares (see the module)."""
    for name, value in params.items():
        if name in constraints:
            check_value(name, value, constraints[name], where)


def validated(
    constraints: Mapping[str, list[Any]], where: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator (scikit-learn's ``validate_params``): the function's arguments, bound to
    its signature with their defaults, checked against ``constraints`` before its body
    runs, so that an entry point's keywords are validated once, where it is called (below
    :func:`~dl1.runtime.executor.coordinating`, which first warns of an exposed
    scheduler and connects to an address given as ``client``)."""

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:  # as Python says it, naming the function
                raise TypeError(f"{func.__name__}() {exc}") from None
            bound.apply_defaults()
            validate_params(constraints, bound.arguments, where)
            return func(*args, **kwargs)

        return checked

    return wrap


def predicate(description: str) -> Callable[[Callable[[Any], bool]], Callable[[Any], bool]]:
    """Decorator naming a predicate constraint in error messages."""

    def wrap(fn: Callable[[Any], bool]) -> Callable[[Any], bool]:
        fn.description = description  # type: ignore[attr-defined]
        return fn

    return wrap


@predicate("a distributed.Client or its scheduler's address ('tcp://host:8786')")
def is_client(value: Any) -> bool:
    """A ``distributed.Client`` (by duck type: its ``submit`` and ``scheduler_info``), or
    the address of a scheduler, connected to for the call (:mod:`dl1.runtime.connection`)."""
    if isinstance(value, str):
        return "://" in value
    return hasattr(value, "submit") and hasattr(value, "scheduler_info")


@predicate("a string")
def is_str(value: Any) -> bool:
    return isinstance(value, str)


@predicate(
    "the name of a solver in dl1.solvers.registry.SOLVERS ('ws', 'cd', ...), 'auto', or a "
    "solver object"
)
def is_solver_name(value: Any) -> bool:
    """A registered solver's name (looked up when checked: the registry is the one list),
    ``"auto"``, or a configured solver object (with ``solve``, ``layout`` and ``name``)."""
    if isinstance(value, str):
        return value in SOLVERS or value == "auto"
    return all(hasattr(value, a) for a in ("solve", "layout", "name", "restore", "release"))


@predicate("a callable")
def is_callable(value: Any) -> bool:
    return callable(value)


class IsDatafit:
    """A datafit of a registered loss, with its own parameters (``Huber(epsilon=2.0)``)."""

    def __call__(self, value: Any) -> bool:
        return type(value) in DATAFITS.values()

    def __str__(self) -> str:
        return "a datafit of dl1.objective.datafits (such as Huber(epsilon=2.0))"


POSITIVE = Interval(numbers.Real, 0, None, closed="neither")
NON_NEGATIVE = Interval(numbers.Real, 0, None, closed="left")
UNIT = Interval(numbers.Real, 0, 1, closed="both")
POSITIVE_INT = Interval(numbers.Integral, 1, None, closed="left")
NON_NEGATIVE_INT = Interval(numbers.Integral, 0, None, closed="left")

#: Parameters shared by every fitting entry point (the penalised and the constrained ones).
COMMON = {
    "loss": [Options(LOSSES), IsDatafit()],
    "fit_intercept": ["boolean"],
    "standardize": ["boolean"],
    "n_partitions": [POSITIVE_INT],
    "seed": [NON_NEGATIVE_INT],
    "stream": ["boolean", None],
    "client": [is_client, None],
    "split": [is_str],
    "verbose": ["boolean"],
    "callback": [is_callable, None],
}

#: ``tol`` of the penalised problem, a relative duality gap ``gap / P(0)``: in (0, 1), since
#: the gap of ``w = 0`` is at most ``P(0)`` (the dual objective of its dual point is not
#: negative), so ``tol >= 1`` would certify ``w = 0`` whatever the data; NaN and infinities
#: are refused like any non-finite number.
RELATIVE_TOL = Interval(numbers.Real, 0, 1, closed="neither")

#: Parameters of the penalised problem (:func:`dl1.fit`, :func:`dl1.path`, the estimators).
PENALISED = {
    **COMMON,
    "alpha": [POSITIVE],
    "l1_ratio": [UNIT],
    "tol": [RELATIVE_TOL],
    # 0: certify the start point only (a path's uncertified alphas are then named)
    "max_rounds": [NON_NEGATIVE_INT, None],
    "max_epochs": [NON_NEGATIVE_INT, None],
    "n_epochs": [POSITIVE_INT],
    "random_order": ["boolean"],
    "solver": [is_solver_name],
    "screen": ["boolean"],
    "spread": ["boolean", Options(("cocoa",)), None],
    "coef_init": ["array-like", None],
    "penalty_factor": ["array-like", None],
    "positive": ["boolean"],
    "bounds": ["array-like", None],
    "intercept_init": [Interval(numbers.Real, None, None), None],
}

#: Parameters of the regularisation path (:func:`dl1.path`) beyond :data:`PENALISED`.
@predicate("a scikit-learn splitter or an iterable of (train, test) index arrays")
def is_cv_splitter(value: Any) -> bool:
    return hasattr(value, "split") or (isinstance(value, Iterable) and not isinstance(value, str))


PATH = {
    **PENALISED,
    "n_alphas": [POSITIVE_INT],
    "eps": [Interval(numbers.Real, 0, 1, closed="neither")],
    "cv": [Interval(numbers.Integral, 2, None, closed="left"), is_cv_splitter, None],
    "scoring": [Options(("mse", "accuracy", "neg_log_loss")), None],
}


@predicate("a fraction in (0, 1] or a pair (rho, s) with rho in (0, 1) and an int s >= 1")
def is_sample(value: Any) -> bool:
    """A sample size of the constrained solver: a fraction of the features, or Frandi et al.'s
    ``(rho, s)`` (confidence of catching one of ``s`` relevant features; ``s <= p`` is checked
    once ``p`` is known)."""
    if isinstance(value, tuple):
        return (
            len(value) == 2
            and Interval(numbers.Real, 0, 1, closed="neither")(value[0])
            and POSITIVE_INT(value[1])
        )
    return Interval(numbers.Real, 0, 1, closed="right")(value)


#: Parameters of the multinomial model (:func:`dl1.fit_multiclass`).
MULTICLASS = {
    **{k: v for k, v in COMMON.items() if k not in ("loss", "seed")},
    "alpha": [POSITIVE],
    "l1_ratio": [UNIT],
    "penalty": [Options(("l1", "grouped"))],
    "multi_class": [Options(("multinomial", "ovr"))],
    # one-vs-rest's binary loss (the multinomial model is logistic)
    "loss": [Options(("logistic", "hinge", "squared_hinge"))],
    "sample_weight": ["array-like", None],
    "tol": [RELATIVE_TOL],
    "max_rounds": [POSITIVE_INT],
    "max_epochs": [POSITIVE_INT],
    "coef_init": ["array-like", "sparse matrix", None],
    "intercept_init": ["array-like", None],
}

#: Parameters of the multinomial path (:func:`dl1.path_multiclass`).
MULTICLASS_PATH = {
    **{k: v for k, v in MULTICLASS.items()
       if k not in ("alpha", "multi_class", "loss", "coef_init", "intercept_init")},
    "alphas": ["array-like", None],
    "n_alphas": [POSITIVE_INT],
    "eps": PATH["eps"],
}

#: Parameters of the cross-validation (:func:`dl1.fit_cv`): :data:`PATH`'s but ``l1_ratio``
#: (one value or several, checked there), and the multinomial model's ``penalty``.
FIT_CV = {
    **{k: v for k, v in PATH.items() if k != "l1_ratio"},
    "penalty": MULTICLASS["penalty"],
}

#: Parameters of the constrained problem (:func:`dl1.fit_constrained`).
CONSTRAINED = {
    **COMMON,
    "delta": [POSITIVE],
    "l2": [NON_NEGATIVE],
    "sample": [is_sample],
    "stop": [Options(("gap", "paper"))],
    "tol": [POSITIVE],
    "step_tol": [POSITIVE],
    "max_iter": [NON_NEGATIVE_INT],
    "certify": ["boolean"],
}

#: Parameters of the constrained path (:func:`dl1.path_constrained`) beyond the radius.
CONSTRAINED_PATH = {
    **{k: v for k, v in CONSTRAINED.items() if k != "delta"},
    "n_deltas": [POSITIVE_INT],
    "eps": [Interval(numbers.Real, 0, 1, closed="neither")],
    "deltas": ["array-like", None],
    "delta_max": [POSITIVE, None],
}
