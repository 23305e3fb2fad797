"""Any two labels of a classification loss, as the entry points take them.

The classification datafits read labels -1 and +1
(:func:`dl1.objective.datafits.quadratic.validate_labels`). :func:`dl1.fit`,
:func:`dl1.path`, :func:`dl1.alpha_max` and :func:`dl1.fit_cv` take any two numbers:
:func:`entry_labels` maps them to -1 / +1 before any work (the smaller to -1, the larger
to +1: the order of ``np.unique`` and of scikit-learn's ``classes_``), the mapped labels go
on explicitly (so a solve shipped to a worker gets them as they are), and the results
record the two numbers as ``classes_``, by which they predict and score. Labels that are
-1 / +1 already go on as they are, with ``classes_ = [-1.0, 1.0]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from dl1.errors import ValidationError
from dl1.objective.datafits import datafit_class

#: The labels the classification datafits read, as ``classes_``.
PM1 = np.array([-1.0, 1.0])
#: Distinct values a refusal shows at most.
SHOWN = 5


class EncodedLabels(NamedTuple):
    """Labels as -1.0 / +1.0 and the two values they were (sorted, float64)."""

    y: np.ndarray
    classes: np.ndarray


@dataclasses.dataclass(frozen=True)
class EntryLabels:
    """An entry point's data with its labels as the datafits read them: ``X`` (a
    :class:`~dl1.dataset.Dataset` whose own labels were mapped: a view of it holding the
    mapped ones), ``y`` (None: X's own labels, already -1 / +1) and the original two values
    (None: no labels to map, a regression loss or no labels at all)."""

    X: Any
    y: Any
    classes: np.ndarray | None

    @property
    def mapped(self) -> bool:
        """Whether the labels were other than -1 / +1."""
        return self.classes is not None and not np.array_equal(self.classes, PM1)


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


def stored_labels(X: Any, split: str) -> np.ndarray | None:
    """The labels ``X`` carries: a store's (or store path's) ``y`` of ``split``, a
    Dataset's (its view's rows); None for other data."""
    from dl1.dataset import Dataset
    from dl1.store import Store, open_store
    from dl1.store.location import is_store_source

    if isinstance(X, Dataset):
        return X.y
    if is_store_source(X):
        X = open_store(X)
    if isinstance(X, Store):
        return np.asarray(X.read("y", split))
    return None


def entry_labels(X: Any, y: Any, loss: Any, split: str) -> EntryLabels:
    """An entry point's ``X`` and ``y`` with the labels of a classification ``loss`` mapped
    to -1 / +1 (:func:`encode_labels`; ``y`` None: those stored with X), before any work.

    Labels given are passed on mapped; labels stored with X are passed on as ``y`` when they
    were mapped (a :class:`~dl1.dataset.Dataset`: a view holding them, :func:`relabelled`),
    else left to be read as before. Other losses, and no labels at all (refused by the entry
    point), leave ``X`` and ``y`` as they are.
    """
    if not datafit_class(loss).classifies:
        return EntryLabels(X, y, None)
    given = y if y is not None else stored_labels(X, split)
    if given is None:
        return EntryLabels(X, y, None)
    if hasattr(given, "compute"):  # a dask array: computed where a solve here computes
        from dl1.loading import computed

        (given,) = computed(given, what="y")
    enc = encode_labels(given, datafit_class(loss).name)
    if y is not None:
        return EntryLabels(X, enc.y, enc.classes)
    if np.array_equal(enc.classes, PM1):
        return EntryLabels(X, None, enc.classes)
    from dl1.dataset import Dataset

    if isinstance(X, Dataset):
        return EntryLabels(relabelled(X, enc.classes), None, enc.classes)
    return EntryLabels(X, enc.y, enc.classes)


def relabelled(ds: Any, classes: np.ndarray) -> Any:
    """The :class:`~dl1.dataset.Dataset` ``ds`` (a view of the same rows, sharing its blocks
    and its lifetime, as ``ds[rows]`` does) with its labels mapped by ``classes``; a view's
    other rows (weighed 0 by its fits) get -1."""
    from dl1.dataset import Dataset

    held = ds._inputs
    if ds.rows is None:
        y = as_pm1(held.y, classes)
    else:
        y = np.full(ds.n_total, -1.0)
        y[ds.rows] = as_pm1(held.y[ds.rows], classes)
    view = Dataset(dataclasses.replace(held, y=y), ds._blocks, ds.col_bounds, ds.client,
                   ds.n_partitions, ds.rows)  # fmt: skip
    view._shared = ds._shared
    return view


def held_out(X: Any, X_test: Any, y_test: Any, labels: EntryLabels) -> tuple[Any, Any]:
    """A path's held-out data ``(X_test, y_test)``, its labels mapped as the training
    labels were (a store's split named by ``X_test``: read here, as the path reads it);
    unchanged when they were not mapped. A label of neither class is refused."""
    if X_test is None or not labels.mapped:
        return X_test, y_test
    from dl1.paths.evaluation import test_data

    if hasattr(y_test, "compute"):  # a dask array: computed where a solve here computes
        from dl1.loading import computed

        (y_test,) = computed(y_test, what="y_test")
    X_test, y_test = test_data(X, X_test, y_test)
    return X_test, as_pm1(y_test, labels.classes, "y_test")


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
    "EntryLabels",
    "as_pm1",
    "checked_classes",
    "encode_labels",
    "entry_labels",
    "held_out",
    "relabelled",
    "stored_labels",
    "with_classes",
]
