"""Any two labels of a classification loss as the -1 / +1 the datafits read, and back.

The classification datafits read labels -1 and +1
(:func:`dl1.objective.datafits.quadratic.validate_labels`). The entry points take any two
numbers: :func:`dl1.entry_labels.entry_labels` maps them (:func:`encode_labels`: the
smaller to -1, the larger to +1, the order of ``np.unique`` and of scikit-learn's
``classes_``) before any work, and the results record the two numbers as ``classes_``, by
which they predict and score (:func:`as_pm1`). Labels -1 / +1 go on as they are, with
``classes_ = [-1.0, 1.0]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dl1.errors import ValidationError

#: The labels the classification datafits read, as ``classes_``.
PM1 = np.array([-1.0, 1.0])
#: Distinct values a refusal shows at most.
SHOWN = 5


class EncodedLabels(NamedTuple):
    """Labels as -1.0 / +1.0 and the two values they were (sorted, float64)."""

    y: np.ndarray
    classes: np.ndarray


def as_pm1(y: Any, classes: np.ndarray, what: str = "y") -> np.ndarray:
    """Labels ``y`` mapped by ``classes``: ``classes[1]`` to +1.0, ``classes[0]`` to -1.0.

    Parameters
    ----------
    y : array_like (n,)
    classes : ndarray (2,)
        The two labels, sorted.
    what : str
        The name of ``y`` in the refusal.

    Returns
    -------
    ndarray of float64 (n,)

    Raises
    ------
    ValidationError
        A value of ``y`` is neither class (the first one named, with its index).
    """
    y = np.asarray(y).ravel()
    pos, neg = y == classes[1], y == classes[0]
    bad = np.flatnonzero(~(pos | neg))
    if bad.size:
        i = int(bad[0])
        raise ValidationError(
            f"{what}[{i}] = {y[i].item()!r} is neither class of the model "
            f"({classes[0].item()!r}, {classes[1].item()!r})"
        )
    return np.where(pos, 1.0, -1.0)


def encode_labels(y: Any, loss: str = "logistic") -> EncodedLabels:
    """The labels of a classification loss as -1.0 / +1.0, and the two values they were.

    Parameters
    ----------
    y : array_like (n,)
        Finite numbers taking two distinct values (or only -1 and +1).
    loss : str
        The loss, named in refusals.

    Returns
    -------
    EncodedLabels
        ``y`` mapped by :func:`as_pm1` (the larger value to +1) and the two values, sorted
        as ``np.unique`` sorts them; labels in {-1, +1} as they are (even one of them only:
        whether a fit takes that is the datafit's call), with classes ``[-1.0, 1.0]``.

    Raises
    ------
    ValidationError
        ``y`` is not 1-D numbers, has a non-finite value, or has one distinct value (not
        -1 or +1) or more than two (the count and the first values named).
    """
    y = _numbers(y, loss)
    if ((y == 1.0) | (y == -1.0)).all():  # linear passes: no sort in the common case
        return EncodedLabels(y, PM1.copy())
    lo, hi = float(y.min()), float(y.max())
    if lo == hi or not ((y == lo) | (y == hi)).all():
        raise ValidationError(_count_refusal(np.unique(y), loss))
    classes = np.array([lo, hi])
    return EncodedLabels(as_pm1(y, classes), classes)


def _numbers(y: Any, loss: str) -> np.ndarray:
    """``y`` as a 1-D finite float64 array (a single column taken as 1-D)."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.ravel()
    if y.ndim != 1:
        raise ValidationError(f"y must be 1-D; got an array of shape {y.shape}")
    try:
        if y.dtype.kind not in "biufO":
            raise TypeError
        y = y.astype(np.float64)
    except (TypeError, ValueError):
        raise ValidationError(
            f"y has dtype {y.dtype}: {loss} labels must be numbers (dl1's estimators, such "
            "as dl1.LogisticRegression, take labels of any kind)"
        ) from None
    bad = np.flatnonzero(~np.isfinite(y))
    if bad.size:
        i = int(bad[0])
        raise ValidationError(f"y[{i}] is {y[i]} (not finite)")
    return y


def _count_refusal(classes: np.ndarray, loss: str) -> str:
    shown = ", ".join(repr(c) for c in classes[:SHOWN].tolist())
    shown += ", ..." if classes.shape[0] > SHOWN else ""
    if classes.shape[0] < 2:
        return (
            f"y has {classes.shape[0]} distinct value ({shown}): a {loss} fit needs two "
            "classes (labels -1 and +1, or two other numbers, mapped to them)"
        )
    return (
        f"y has {classes.shape[0]} distinct values ({shown}): {loss} labels must be exactly "
        "-1 or +1, or two other numbers (mapped to -1 and +1, the larger to +1); dl1's "
        "classifiers are binary"
    )


def checked_classes(classes: Any) -> np.ndarray | None:
    """A result's ``classes_`` as float64 of shape (2,) (a copy), or None."""
    if classes is None:
        return None
    c = np.array(classes, dtype=np.float64)
    if c.shape != (2,):
        raise ValueError(f"classes_ must hold two labels, got shape {c.shape}")
    return c


def with_classes(result: Any, classes: np.ndarray | None) -> Any:
    """``result`` (a FitResult or PathResult; None: none) with ``classes_`` set to
    ``classes`` (a copy) when the labels were a classification loss's."""
    if result is not None and classes is not None:
        result.classes_ = checked_classes(classes)
    return result


__all__ = [
    "PM1",
    "EncodedLabels",
    "as_pm1",
    "checked_classes",
    "encode_labels",
    "with_classes",
]
