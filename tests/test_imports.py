"""What importing dl1 loads: workers run its task functions without dask.array."""

from __future__ import annotations

import subprocess
import sys

import pytest

# dask.array pulls in its optional integrations (pandas, xarray, sparse when installed): tens
# of MiB in every worker process, which out of core is memory the working set needs
HEAVY = ("dask.array", "pandas", "xarray", "matplotlib", "rich", "click")


def _loaded(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "module",
    [
        "dl1.tasks.passes",
        "dl1.tasks.subproblem",
        "dl1.tasks.spread",
        "dl1.tasks.spread_newton",
        "dl1.runtime.executor",
        "dl1.runtime.rpc",
        "dl1.runtime.partition_server",
        "dl1.solvers.ws",
        "dl1.solvers.fw",
        "dl1.store.reader",
        "dl1.objective.datafits",
        "dl1.objective.penalties",
    ],
)
def test_the_modules_workers_import_load_no_dask_array(module):
    loaded = _loaded(f"import {module}")
    assert module in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_the_package_loads_its_api_on_first_use():
    assert not _loaded("import dl1") & set(HEAVY)
    loaded = _loaded("import dl1; dl1.fit; dl1.path; dl1.open")
    assert {"dl1.penalised", "dl1.convert", "dask.array"} <= loaded


def test_the_command_line_loads_scikit_learn_and_scipy_optimize_only_when_used():
    """``dl1 --help`` and a refused option pay neither import (about a second each): the
    warning class, the multiclass label check and the hinge's LP load them on first use."""
    later = {"sklearn", "scipy.optimize"}
    assert not _loaded("import dl1.cli") & later
    assert "sklearn" in _loaded("import dl1.cli, dl1\ndl1.ConvergenceWarning")


def test_the_api_names_are_the_functions_whatever_was_imported_first():
    code = (
        "import dl1.penalised\nimport dl1\n"
        "assert callable(dl1.fit) and dl1.fit.__name__ == 'fit', dl1.fit\n"
        "import sys; assert sys.modules['dl1.penalised'].fit is dl1.fit\n"
        "from dl1 import alpha_max, fit, open_store, Store, from_svmlight, datasets\n"
        "assert dl1.runtime.executor.DistributedExecutor and dl1.kernels.cd and dl1.store.reader\n"
        "assert sorted(dl1.__all__) == sorted(set(dl1.__all__) & set(dir(dl1)))\n"
        "try:\n    dl1.no_such_name\nexcept AttributeError as e:\n    print('AE', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "AE module 'dl1' has no attribute 'no_such_name'" in out.stdout


def test_an_import_failing_inside_a_submodule_is_raised_not_hidden(tmp_path, monkeypatch):
    import dl1

    (tmp_path / "broken_probe.py").write_text("import dl1_no_such_dependency\n")
    monkeypatch.setattr(dl1, "__path__", [*dl1.__path__, str(tmp_path)])
    with pytest.raises(ModuleNotFoundError, match="dl1_no_such_dependency"):
        dl1.broken_probe  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        dl1.no_such_name  # noqa: B018
