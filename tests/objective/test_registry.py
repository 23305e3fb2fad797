"""The registry of losses (dl1.objective.datafits): every loss is one datafit class whose
declarations feed validation, scoring, path metrics, the kernels and scikit-learn; its
kernel code names the same loss in every kernel; an unknown loss is refused everywhere."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import dl1
from dl1.errors import ValidationError
from dl1.kernels.lazy import loss_value
from dl1.objective.datafits import (
    DATAFITS,
    LOSSES,
    Datafit,
    datafit_class,
    make_datafit,
)
from dl1.paths.evaluation import METRIC_FUNCTIONS, metrics
from dl1.paths.result import METRIC_FIELDS


@pytest.mark.parametrize("name", LOSSES)
def test_each_loss_declares_itself_under_its_name(name):
    cls = DATAFITS[name]
    datafit = make_datafit(name)
    assert cls.name == name and isinstance(datafit, Datafit)
    labels = np.array([1.0, -1.0, 0.5])
    if cls.classifies:  # a classifier's labels are -1 or +1, and nothing else
        with pytest.raises(ValidationError, match=r"y\[2\] = 0.5"):
            datafit.validate_y(labels)
    elif name == "poisson":  # counts are >= 0
        with pytest.raises(ValidationError, match=r"y\[1\] = -1.0"):
            datafit.validate_y(labels)
    else:
        np.testing.assert_array_equal(datafit.validate_y(labels), labels)
    assert cls.metrics and set(cls.metrics) <= set(METRIC_FUNCTIONS) & set(METRIC_FIELDS)
    assert ("logloss" in cls.metrics) == cls.log_odds  # a log-loss needs log-odds


def test_kernel_codes_are_one_per_loss():
    codes = [cls.code for cls in DATAFITS.values()]
    assert len(set(codes)) == len(codes)


@pytest.mark.parametrize("name", [n for n, c in DATAFITS.items() if c.row_steps])
def test_the_row_kernels_and_the_margin_kernels_agree_on_each_code(name):
    """The sample-wise kernels' loss (by the datafit's code) is the datafit's own value
    (the margin kernels, or NumPy for the squared loss), sample by sample."""
    datafit = make_datafit(name)
    rng = np.random.default_rng(7)
    y = np.where(rng.random(40) < 0.5, -1.0, 1.0) if datafit.classifies else rng.normal(size=40)
    z = 2.0 * rng.normal(size=40)
    gamma = getattr(datafit, "gamma", 0.0)
    for yi, zi in zip(y, z, strict=True):
        want = datafit.value(np.array([yi]), np.array([zi]))
        assert loss_value(datafit.code, yi, zi, gamma) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_metrics_are_the_losses_own():
    y = np.array([1.0, -1.0, 1.0, 1.0])
    pred = np.array([0.5, 0.2, -1.0, 2.0])
    assert metrics("squared", y, pred) == {"mse": pytest.approx(np.mean((y - pred) ** 2))}
    got = metrics("logistic", y, pred)
    assert got["accuracy"] == 0.5
    assert got["logloss"] == pytest.approx(np.mean(np.log1p(np.exp(-y * pred))))
    assert set(metrics("hinge", y, pred)) == {"accuracy"}


def test_an_unknown_loss_is_refused_everywhere(tmp_path):
    from dl1.predict import predict, score

    X = np.eye(3)
    y = np.array([1.0, -1.0, 1.0])
    with pytest.raises(ValidationError, match="loss must be one of 'squared', 'logistic'"):
        datafit_class("tweedie")
    with pytest.raises(ValidationError, match="loss"):
        dl1.fit(X, y, alpha=0.1, loss="tweedie", client=None)
    with pytest.raises(ValidationError, match="loss must be one of"):
        predict(X, np.ones(3), 0.0, "tweedie")
    with pytest.raises(ValidationError, match="loss must be one of"):
        score(X, y, np.ones(3), 0.0, "tweedie")
    res = dl1.fit(X, y, alpha=0.1, loss="logistic", client=None)
    res.loss = "tweedie"
    with pytest.raises(ValidationError, match="loss must be one of"):
        res.to_sklearn()
    out = subprocess.run([sys.executable, "-m", "dl1", "fit", str(tmp_path), "--loss", "tweedie"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "'tweedie' is not one of 'squared'" in out.stderr
