"""One validated record per call: the keywords are checked once, the record is frozen, the
solver options live on the solver object, and a call solved in one piece runs the entry
point's core function on its record in the worker, not the public entry point again."""

from __future__ import annotations

import dataclasses

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dl1
import dl1.params
from dl1.cross_validation import FoldRun
from dl1.penalised import FitCall, fitted
from dl1.penalised_path import walked
from dl1.routing import solved_here
from dl1.runtime import one_piece
from dl1.solvers.options import SolverOptions
from dl1.solvers.registry import SOLVERS, make_solver
from dl1.solvers.ws import WorkingSetSolver


def _data(n=80, p=30, seed=3):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.3, format="csr", random_state=rng)
    y = X @ np.r_[rng.standard_normal(4), np.zeros(p - 4)] + 0.01 * rng.standard_normal(n)
    return X, y


@pytest.fixture
def validations(monkeypatch):
    """The fitting entry points' validations, counted (each a call of ``validate_params``;
    ``dl1.persist``'s, of the data handle a cross-validation makes, left out)."""
    seen: list[str] = []
    check = dl1.params.validate_params
    monkeypatch.setattr(dl1.params, "validate_params",
                        lambda c, p, where: (where != "dl1.persist()" and seen.append(where))
                        or check(c, p, where))  # fmt: skip
    return seen


def test_a_fit_a_cross_validated_path_and_fit_cv_are_validated_once(validations):
    """Pass criterion: dl1.fit, dl1.path(cv=3) and dl1.fit_cv (which refits) each check
    their keywords exactly once: the path on the whole data after its folds and the refit
    run the core functions on the record, not the public entry points again."""
    X, y = _data()
    dl1.fit(X, y, alpha=0.01)
    assert validations == ["dl1.fit()"]
    validations.clear()
    dl1.path(X, y, n_alphas=3, eps=0.1, cv=3)
    assert validations == ["dl1.path()"]
    validations.clear()
    dl1.fit_cv(X, y, n_alphas=3, eps=0.1, cv=3)
    assert validations == ["dl1.fit_cv()"]


def test_a_bad_keyword_is_refused_before_any_work():
    """Pass criterion: a value outside its constraints names the parameter and the entry
    point; an unknown keyword is Python's TypeError."""
    X, y = _data()
    with pytest.raises(ValueError, match=r"'tol' parameter of dl1.path\(\) must be"):
        dl1.path(X, y, tol=2.0)
    with pytest.raises(TypeError, match=r"fit\(\) got an unexpected keyword argument 'alhpa'"):
        dl1.fit(X, y, alpha=0.1, alhpa=0.1)
    with pytest.raises(TypeError, match=r"fit\(\) missing a required argument: 'alpha'"):
        dl1.fit(X, y)


def test_the_record_is_frozen():
    """Pass criterion: a call's record and its parts cannot be changed after validation."""
    call = FitCall(dl1.specs.Data(None), dl1.specs.Model("squared", None), None,
                   dl1.specs.Execution())  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.solver = "cd"
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.model.tol = 1.0


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_each_solver_takes_the_options_it_has(name):
    """Pass criterion: every registered solver built from one SolverOptions record holds
    each option its constructor names, at the record's value (max_rounds None: 1000)."""
    options = SolverOptions(max_rounds=None, max_epochs=7, n_epochs=3, random_order=True,
                            seed=11, screen=True, spread="cocoa", tight_inner=True,
                            verbose=True, callback=print)  # fmt: skip
    solver = make_solver(name, options)
    assert type(solver) is SOLVERS[name]
    expected = {**dataclasses.asdict(options), "max_rounds": 1000}
    held = {k: getattr(solver, k) for k in expected if hasattr(solver, k)}
    assert held and held == {k: expected[k] for k in held}
    # every solver is bounded and reports; the deterministic ones (row-newton) have no seed
    assert "callback" in held and {"max_rounds", "max_epochs"} & held.keys()
    assert "seed" in held or name == "row-newton"


def test_auto_and_a_solver_object():
    """Pass criterion: "auto" resolves by the datafit; a solver object is used as it is."""
    from dl1.objective.datafits import make_datafit

    assert make_solver("auto", SolverOptions(), make_datafit("hinge")).name == "smoothing"
    own = WorkingSetSolver(ws_start=7)
    assert make_solver(own, SolverOptions(seed=3)) is own


def test_one_piece_runs_the_core_function_on_the_record(local_cluster, monkeypatch):
    """Pass criterion: shipped in one piece, a fit and a path travel as their records (no
    data, no client inside; the data beside them) to ``solved_here``, which runs
    ``fitted`` / ``walked``; the answers equal the in-process ones, and a fit's per-round
    callback is relayed from the worker."""
    sent = []
    run_many = one_piece.run_many

    def spy(ex, shipments, blocks, **kw):
        sent.extend(shipments)
        return run_many(ex, shipments, blocks, **kw)

    monkeypatch.setattr(one_piece, "run_many", spy)
    X, y = _data()
    rounds = []
    with dask.config.set({"dl1.one-piece": True}):
        fit = dl1.fit(X, y, alpha=0.01, tol=1e-8, client=local_cluster, callback=rounds.append)
        path = dl1.path(X, y, n_alphas=3, eps=0.1, tol=1e-8, client=local_cluster)
    assert [s.entry for s in sent] == [solved_here, solved_here]
    assert [s.kwargs["solve"] for s in sent] == [fitted, walked]
    for s in sent:
        call = s.kwargs["call"]
        assert call.data.X is None and call.data.y is None
        assert call.execution.client is None and call.callback is None
        assert s.kwargs["y"] is not None
    here = dl1.fit(X, y, alpha=0.01, tol=1e-8)
    np.testing.assert_allclose(fit.coef_, here.coef_, atol=1e-9)
    assert len(rounds) == len(fit.history_) > 0 and rounds[-1]["gap"] == fit.history_[-1]["gap"]
    np.testing.assert_allclose(
        path.coefs_.toarray(), dl1.path(X, y, n_alphas=3, eps=0.1, tol=1e-8).coefs_.toarray(),
        atol=1e-9,
    )


def test_folds_copy_the_solver():
    """Pass criterion: each fold solves with its own copy of the configured solver (folds
    run side by side in threads), configured as the call's."""
    solver = WorkingSetSolver(seed=5, tight_inner=True)
    model = dl1.specs.Model("squared", dl1.penalised.make_penalty(1.0, 1.0, None, False))
    run = FoldRun(model, solver)
    X, y = _data()
    ds = dl1.persist(X, y)
    try:
        got, _ = run.problem_for(ds, None, None)
    finally:
        ds.release()
    assert got is not solver and vars(got) == vars(solver)
