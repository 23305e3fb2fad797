"""The commands on stores of more than two classes, against the session's cluster:
``dl1 generate --task multiclass`` writes the labels of a planted multinomial model;
``dl1 fit --loss multinomial`` (or ``logistic`` on more than two classes) fits, certifies
and saves the multinomial model; ``dl1 predict`` and ``dl1 score`` apply it. Results are
checked against NumPy and scikit-learn."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score

import dl1
import dl1.multiclass as multiclass
from dl1.models import MulticlassModel
from tests.cli.test_commands import document, invoke
from tests.helpers import random_csr

LABELS = np.array([1.0, 4.0, 7.0])


@pytest.fixture(scope="module")
def mc(tmp_path_factory):
    """A 3-class store: 180 x 40 train (4 row blocks, 2 feature blocks), 70 x 40 test."""
    rng = np.random.default_rng(5)
    X, Xt = random_csr(180, 40, 0.2, seed=31), random_csr(70, 40, 0.2, seed=32)
    W = rng.standard_normal((40, 3)) * (rng.random((40, 1)) < 0.3) * 4
    y = LABELS[np.argmax(X @ W + rng.gumbel(size=(180, 3)), axis=1)]
    yt = LABELS[np.argmax(Xt @ W + rng.gumbel(size=(70, 3)), axis=1)]
    path = tmp_path_factory.mktemp("cli-mc") / "mc.zarr"
    dl1.from_scipy(X, y, path, X_test=Xt, y_test=yt, n_feature_blocks=2, row_block_rows=45)
    return path, X, y, Xt, yt


@pytest.fixture(scope="module")
def fitted(mc, scheduler, tmp_path_factory):
    """``dl1 fit --loss multinomial --json --output``: the model's directory and document."""
    out = tmp_path_factory.mktemp("cli-mc-model") / "m"
    result = invoke("fit", mc[0], "--loss", "multinomial", "--alpha-ratio", "6", "--tol",
                    "1e-8", "--output", out, "--json", "--scheduler", scheduler)  # fmt: skip
    assert "certificate: relative duality gap" in result.stderr
    return out, document(result)


def _objective(X, y, W, b, alpha):
    """The mean cross-entropy plus alpha ||W||_1, written independently (NumPy)."""
    Z = X @ W.T + b
    codes = np.searchsorted(LABELS, y)
    return (logsumexp(Z, axis=1) - Z[np.arange(X.shape[0]), codes]).mean() + alpha * np.abs(
        W).sum()  # fmt: skip


def test_fit_certifies_the_multinomial_model_as_sklearn_and_numpy_see_it(mc, fitted):
    _, X, y, Xt, yt = mc
    out, doc = fitted
    model = dl1.load_model(out)
    assert isinstance(model, MulticlassModel) and doc["model"] == str(out)
    assert doc["ok"] and doc["certified"] and doc["loss"] == "multinomial"
    assert doc["n_classes"] == 3 and doc["classes"] == LABELS.tolist()
    assert model.classes_.tolist() == LABELS.tolist() and model.coef_.shape == (3, 40)
    assert doc["n_nonzero"] == model.coef_.nnz > 0 and doc["relative_gap"] <= 1e-8
    # alpha_max: the largest |X^T (Y - pi)| / n, pi the class frequencies
    Y = (y[:, None] == LABELS).astype(float)
    amax = np.abs(X.T @ (Y - Y.mean(axis=0))).max() / X.shape[0]
    assert doc["alpha_max"] == pytest.approx(amax, rel=1e-10)
    assert doc["alpha"] == pytest.approx(amax / 6, rel=1e-12) == model.alpha
    ours = _objective(X, y, model.coef_.toarray(), model.intercept_, model.alpha)
    assert ours == pytest.approx(doc["primal"], rel=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saga's own warning at max_iter
        sk = LogisticRegression(C=1 / (X.shape[0] * model.alpha), l1_ratio=1.0, solver="saga",
                                tol=1e-12, max_iter=100_000).fit(X, y)  # fmt: skip
    theirs = _objective(X, y, sk.coef_, sk.intercept_, model.alpha)
    # the dual bounds every objective value from below, scikit-learn's included
    assert doc["dual"] <= theirs and ours - theirs <= doc["primal"] - doc["dual"]
    expected = LABELS[np.argmax(Xt @ model.coef_.toarray().T + model.intercept_, axis=1)]
    assert doc["test_accuracy"] == accuracy_score(yt, expected)


def test_logistic_on_more_than_two_classes_fits_the_multinomial_model(mc, fitted, scheduler):
    _, doc = fitted
    result = invoke("fit", mc[0], "--loss", "logistic", "--alpha-ratio", "6", "--tol", "1e-8",
                    "--json", "--scheduler", scheduler)  # fmt: skip
    other = document(result)
    assert other["loss"] == "multinomial" and other["n_classes"] == 3
    assert other["alpha"] == doc["alpha"] and other["primal"] == pytest.approx(doc["primal"])


def test_predict_and_score_apply_the_saved_model(mc, fitted, scheduler, tmp_path):
    _, X, y, Xt, yt = mc
    out, _ = fitted
    model = dl1.load_model(out)
    Z = Xt @ model.coef_.toarray().T + model.intercept_
    labels = LABELS[np.argmax(Z, axis=1)]
    doc = document(invoke("predict", out, mc[0], "--output", tmp_path / "p.npy", "--json",
                          "--scheduler", scheduler))  # fmt: skip
    assert doc["n_samples"] == 70 and doc["loss"] == "multinomial"
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), labels)
    invoke("predict", out, mc[0], "--decision-function", "--split", "train", "--output",
           tmp_path / "d.npy", "--scheduler", scheduler)  # fmt: skip
    d = np.load(tmp_path / "d.npy")
    assert d.shape == (180, 3)
    np.testing.assert_allclose(d, X @ model.coef_.toarray().T + model.intercept_, rtol=1e-12,
                               atol=1e-14)  # fmt: skip
    doc = document(invoke("score", out, mc[0], "--json", "--scheduler", scheduler))
    assert doc["metric"] == "accuracy" and doc["score"] == accuracy_score(yt, labels)
    doc = document(invoke("score", out, mc[0], "--split", "train", "--json", "--scheduler",
                          scheduler))  # fmt: skip
    assert doc["score"] == accuracy_score(y, LABELS[np.argmax(d, axis=1)])


def test_an_estimator_saved_with_string_labels_predicts_decision_values_only(
    mc, scheduler, tmp_path
):
    _, X, y, _, _ = mc
    names = np.array(["a", "b", "c"])[np.searchsorted(LABELS, y)]
    est = dl1.LogisticRegression(C=5.0).fit(X, names)
    est.save(tmp_path / "m")
    result = invoke("predict", tmp_path / "m", mc[0], "--output", tmp_path / "p.npy",
                    "--scheduler", scheduler, ok=False)  # fmt: skip
    assert result.exit_code == 2 and "not numbers" in result.stderr
    assert not (tmp_path / "p.npy").exists()
    invoke("predict", tmp_path / "m", mc[0], "--decision-function", "--output",
           tmp_path / "d.npy", "--scheduler", scheduler)  # fmt: skip
    np.testing.assert_allclose(np.load(tmp_path / "d.npy"), est.decision_function(mc[3]),
                               rtol=1e-12, atol=1e-14)  # fmt: skip


def test_generate_multiclass_then_fit_it(scheduler, tmp_path):
    doc = document(invoke("generate", tmp_path / "g.zarr", "--task", "multiclass",
                          "--n-classes", "4", "--json"))  # fmt: skip
    assert doc["attrs"]["task"] == "multiclass" and doc["attrs"]["n_classes"] == 4
    store = dl1.open_store(tmp_path / "g.zarr")
    assert set(np.unique(store.read("y")).tolist()) == {0.0, 1.0, 2.0, 3.0}
    fit = document(invoke("fit", tmp_path / "g.zarr", "--loss", "multinomial", "--alpha-ratio",
                          "4", "--json", "--scheduler", scheduler))  # fmt: skip
    assert fit["certified"] and fit["n_classes"] == 4 and fit["classes"] == [0.0, 1.0, 2.0, 3.0]
    # the planted model is learned: better than the largest class's frequency on test
    y_test = store.read("y", "test")
    assert fit["test_accuracy"] > max(np.mean(y_test == k) for k in range(4)) + 0.1


@pytest.mark.parametrize(("args", "named"), [
    (["generate", "{t}/x.zarr", "--n-classes", "3"], "--n-classes is for --task multiclass"),
    (["fit", "{s}", "--multi-class", "ovr", "--loss", "hinge", "--l1-ratio", "0.5"],
     "the one-vs-rest hinge takes the pure L1 penalty"),
    (["fit", "{s}", "--multi-class", "ovr", "--loss", "logistic", "--penalty", "grouped"],
     "--penalty grouped is multinomial only"),
    (["fit", "{s}", "--multi-class", "multinomial", "--loss", "hinge"],
     "--loss hinge with the multinomial model"),
    (["fit", "{s}", "--multi-class", "ovr", "--loss", "squared"],
     "--multi-class ovr takes --loss one of"),
    (["fit", "{s}", "--penalty", "grouped", "--loss", "squared"],
     "--loss squared with the multinomial model"),
    (["path", "{s}", "--loss", "multinomial", "--checkpoint", "{t}/c.zarr"],
     "--checkpoint: not for a multiclass path"),
    (["path", "{s}", "--loss", "multinomial", "--tol", "0"], "'tol' parameter of dl1 path"),
    (["path", "{s}", "--loss", "multinomial", "--eps", "2"], "'eps' parameter of dl1 path"),
    (["generate", "{t}/x.zarr", "--task", "multiclass", "--n-classes", "1"], "--n-classes"),
    (["fit", "{s}", "--loss", "multinomial", "--tol", "0"], "'tol' parameter of dl1 fit"),
    (["fit", "{s}", "--loss", "hinge"], "y has 3 distinct values"),
])  # fmt: skip
def test_bad_multiclass_input_exits_2_naming_the_problem(mc, tmp_path, args, named):
    args = [a.format(s=mc[0], t=tmp_path) for a in args]
    result = invoke(*args, ok=False)
    assert result.exit_code == 2, result.stderr
    assert named in result.stderr


def _indicators(y):
    """``Y`` (n x K), the classes' indicators, and ``Y - 1 pi^T`` (pi: class frequencies)."""
    Y = (y[:, None] == LABELS).astype(float)
    return Y, Y - Y.mean(axis=0)


def test_grouped_fit_takes_alpha_max_of_the_row_norms_and_keeps_features_whole(
    mc, scheduler, tmp_path
):
    """``--penalty grouped``: alpha_max is the largest row norm of ``X^T (Y - 1 pi^T) / n``
    over l1_ratio (glmnet's grouped lambda_max), the objective NumPy's, every feature in or
    out for all classes, and the saved model is the grouped one ``dl1 score`` applies."""
    _, X, y, Xt, yt = mc
    doc = document(invoke("fit", mc[0], "--penalty", "grouped", "--l1-ratio", "0.5",
                          "--alpha-ratio", "4", "--tol", "1e-8", "--output", tmp_path / "g",
                          "--json", "--scheduler", scheduler))  # fmt: skip
    n = X.shape[0]
    amax = np.linalg.norm(X.T @ _indicators(y)[1], axis=1).max() / (n * 0.5)
    assert doc["alpha_max"] == pytest.approx(amax, rel=1e-10)
    assert doc["alpha"] == pytest.approx(amax / 4, rel=1e-12)
    assert doc["penalty"] == "grouped" and doc["multi_class"] == "multinomial"
    assert doc["certified"] and doc["relative_gap"] <= 1e-8
    model = dl1.load_model(tmp_path / "g")
    assert model.penalty == "grouped"
    W = model.coef_.toarray()
    per_feature = np.count_nonzero(W, axis=0)
    assert set(per_feature.tolist()) <= {0, 3} and 0 < doc["n_features_used"] < 40
    a = model.alpha
    Z = X @ W.T + model.intercept_
    ce = (logsumexp(Z, axis=1) - Z[np.arange(n), np.searchsorted(LABELS, y)]).mean()
    pen = a * (0.5 * np.linalg.norm(W, axis=0).sum() + 0.25 * (W**2).sum())
    assert ce + pen == pytest.approx(doc["primal"], rel=1e-10)
    score = document(invoke("score", tmp_path / "g", mc[0], "--json", "--scheduler", scheduler))
    expected = LABELS[np.argmax(Xt @ W.T + model.intercept_, axis=1)]
    assert score["score"] == accuracy_score(yt, expected) == doc["test_accuracy"]


OVR_LOSS = {
    "logistic": lambda m: np.log1p(np.exp(-m)),
    "squared_hinge": lambda m: np.maximum(0.0, 1.0 - m) ** 2,
    "hinge": lambda m: np.maximum(0.0, 1.0 - m),
}


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge", "hinge"])
def test_one_vs_rest_fit_certifies_each_class_and_saves_its_model(mc, scheduler, tmp_path, loss):
    """``--multi-class ovr --loss L``: each class's alpha_max is the binary one of class k
    against the rest (dl1.alpha_max, a separate pass per class), alpha_max the largest;
    each class certified; the objective (the sum of the K binary ones) NumPy's; the model
    saved and applied by ``dl1 predict``; a progress line per round on stderr."""
    _, X, y, Xt, yt = mc
    result = invoke("fit", mc[0], "--multi-class", "ovr", "--loss", loss, "--alpha-ratio", "4",
                    "--tol", "1e-8", "--output", tmp_path / "m", "--json", "--scheduler",
                    scheduler)  # fmt: skip
    doc = document(result)
    assert "round 0  largest gap" in result.stderr
    binary = [dl1.alpha_max(X, np.where(y == c, 1.0, -1.0), loss=loss) for c in LABELS]
    np.testing.assert_allclose(doc["alpha_max_per_class"], binary, rtol=1e-10)
    assert doc["alpha_max"] == pytest.approx(max(binary), rel=1e-10)
    if loss == "logistic":  # class k's: max |X^T (1[y = k] - pi_k)| / n, the multinomial's
        amax = np.abs(X.T @ _indicators(y)[1]).max() / X.shape[0]
        assert doc["alpha_max"] == pytest.approx(amax, rel=1e-10)
    assert doc["multi_class"] == "ovr" and doc["loss"] == loss and doc["certified"]
    assert len(doc["relative_gaps"]) == 3 and max(doc["relative_gaps"]) <= 1e-8
    model = dl1.load_model(tmp_path / "m")
    assert model.multi_class == "ovr" and model.loss == loss and model.alpha == doc["alpha"]
    W, b = model.coef_.toarray(), model.intercept_
    M = np.where(y[:, None] == LABELS, 1.0, -1.0) * (X @ W.T + b)
    ours = OVR_LOSS[loss](M).mean(axis=0).sum() + model.alpha * np.abs(W).sum()
    assert ours == pytest.approx(doc["primal"], rel=1e-9) and doc["dual"] <= ours
    invoke("predict", tmp_path / "m", mc[0], "--output", tmp_path / "p.npy", "--scheduler",
           scheduler)  # fmt: skip
    expected = LABELS[np.argmax(Xt @ W.T + b, axis=1)]
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), expected)
    assert doc["test_accuracy"] == accuracy_score(yt, expected)


def test_the_help_names_the_multiclass_options():
    text = invoke("fit", "--help").stdout
    assert "--multi-class [multinomial|ovr]" in text and "--penalty [l1|grouped]" in text


def test_a_multinomial_fit_reports_its_rounds_as_it_runs(mc, scheduler):
    result = invoke("fit", mc[0], "--loss", "multinomial", "--alpha-ratio", "6", "--tol",
                    "1e-8", "--progress-every", "1", "--scheduler", scheduler)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "round 0  gap " in result.stderr and "round 1  gap " in result.stderr


@pytest.mark.parametrize("penalty", ["l1", "grouped"])
def test_path_on_class_labels_is_the_multinomial_path_with_test_accuracy(
    mc, scheduler, tmp_path, penalty
):
    """``dl1 path --loss multinomial``: the grid from NumPy's alpha_max, each alpha
    certified (W = 0 at alpha_max), each alpha's test accuracy that of dl1.fit_multiclass
    at that alpha in process, and the most accurate model saved for ``dl1 score``."""
    _, X, y, Xt, yt = mc
    doc = document(invoke("path", mc[0], "--loss", "multinomial", "--penalty", penalty,
                          "--n-alphas", "4", "--eps", "0.1", "--tol", "1e-8", "--output",
                          tmp_path / "best", "--json", "--scheduler", scheduler))  # fmt: skip
    G = X.T @ _indicators(y)[1] / X.shape[0]
    amax = np.abs(G).max() if penalty == "l1" else np.linalg.norm(G, axis=1).max()
    assert doc["alpha_max"] == pytest.approx(amax, rel=1e-10)
    np.testing.assert_allclose(doc["alphas"], np.geomspace(amax, amax / 10, 4), rtol=1e-10)
    assert all(doc["certified"]) and max(doc["relative_gaps"]) <= 1e-8
    assert doc["n_nonzero"][0] == 0 < doc["n_nonzero"][-1] and doc["penalty"] == penalty
    accuracy = []
    for a in doc["alphas"]:
        res = dl1.fit_multiclass(X, y, alpha=a, penalty=penalty, tol=1e-10)
        pred = LABELS[np.argmax(Xt @ res.coef_.toarray().T + res.intercept_, axis=1)]
        accuracy.append(accuracy_score(yt, pred))
    assert doc["test_accuracy"] == accuracy
    best = int(np.argmax(accuracy))
    assert doc["best_index"] == best and doc["best_alpha"] == doc["alphas"][best]
    model = dl1.load_model(tmp_path / "best")
    assert model.alpha == doc["best_alpha"] and model.penalty == penalty
    score = document(invoke("score", tmp_path / "best", mc[0], "--json", "--scheduler",
                            scheduler))  # fmt: skip
    assert score["score"] == accuracy[best]


def test_path_output_without_a_test_split_is_refused_before_any_work(mc, tmp_path):
    _, X, y, _, _ = mc
    dl1.from_scipy(X, y, tmp_path / "train.zarr")
    result = invoke("path", tmp_path / "train.zarr", "--loss", "multinomial", "--output",
                    tmp_path / "m", ok=False)  # fmt: skip
    assert result.exit_code == 2 and "has no test split" in result.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("scheme", [["--loss", "multinomial"], ["--multi-class", "ovr"]])
def test_fit_loads_the_store_once_for_alpha_max_and_the_fit(mc, scheduler, monkeypatch,
                                                            scheme):  # fmt: skip
    loads = []
    real = multiclass.load_blocks

    def counted(*args, **kwargs):
        loads.append(args[1:2])
        return real(*args, **kwargs)

    monkeypatch.setattr(multiclass, "load_blocks", counted)
    result = invoke("fit", mc[0], *scheme, "--alpha-ratio", "4", "--json", "--scheduler",
                    scheduler)  # fmt: skip
    assert document(result)["certified"] and len(loads) == 1
