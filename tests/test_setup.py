"""README's set-up commands and quickstart, run as a new user runs them.

The commands and the code are read from README.md, so these tests follow the README;
its cluster quickstart is examples/quickstart.py, byte for byte.
"""

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_text() -> str:
    """README.md as it is on disk (decoded, newlines untranslated)."""
    return README.read_bytes().decode("utf-8")


def readme_section(title: str) -> str:
    """The text of README's ``## title`` section, up to the next ``## `` heading."""
    text = readme_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def fenced_blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", section, re.M | re.S)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without its virtual environment or dl1's cache choice."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "NUMBA_CACHE_DIR")}
    venv_bin = str(Path(sys.prefix) / "bin")
    base_bin = str(Path(sys._base_executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env["PATH"] = os.pathsep.join([base_bin, *path])
    env.update(extra)
    return env


def run(args, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, (
        f"{args} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
        f"\n--- stderr\n{done.stderr[-5000:]}"
    )
    return done


# ---------------------------------------------------------------- README's Python code

QUICKSTART = ROOT / "examples" / "quickstart.py"


def quickstart_blocks() -> tuple[str, str]:
    """README's Quickstart code: the in-memory lines, then examples/quickstart.py."""
    blocks = fenced_blocks(readme_section("Quickstart"), "python")
    assert len(blocks) == 2, blocks
    return blocks[0], blocks[1]


def test_readme_python_blocks_are_the_quickstart_and_it_is_the_example():
    """README's Python blocks are the two run below, in order; the second is the example
    file byte for byte (README is read without newline translation)."""
    assert fenced_blocks(readme_text(), "python") == list(quickstart_blocks())
    in_memory, script = quickstart_blocks()
    assert script.encode() == QUICKSTART.read_bytes()
    assert "Client" not in in_memory and "LocalCluster" not in in_memory


def test_readme_in_memory_lines_run_in_this_process(capsys):
    from sklearn.linear_model import Lasso

    in_memory, _ = quickstart_blocks()
    namespace: dict = {"__name__": "readme"}
    exec(compile(in_memory, "README.md", "exec"), namespace)  # warnings are errors here
    est, X, y = namespace["est"], namespace["X"], namespace["y"]
    assert type(est).__module__.startswith("dl1.") and type(X).__module__.startswith("scipy.")
    assert est.tol == 1e-4 and 0 <= est.gap_ <= est.tol
    assert np.flatnonzero(est.coef_).tolist() == list(range(20))  # as the comment says
    gap, printed = capsys.readouterr().out.split(maxsplit=1)
    assert float(gap) == est.gap_ and printed.startswith("[ 0  1  2"), printed
    reference = Lasso(alpha=est.alpha, tol=1e-12, max_iter=100_000).fit(X, y)
    np.testing.assert_allclose(est.predict(X[:3]), reference.predict(X[:3]), rtol=1e-3)


@pytest.mark.slow
def test_readme_quickstart_runs_as_a_script(tmp_path):
    """README's cluster quickstart, as a user runs it: a fresh process in an empty folder."""
    _, script = quickstart_blocks()
    (tmp_path / "quickstart.py").write_text(script)
    done = run([sys.executable, "quickstart.py"], cwd=tmp_path, timeout=300)
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    fit = re.fullmatch(r"gap (\S+) converged True test R\^2 (\S+)", lines[0])
    assert fit and 0 <= float(fit[1]) <= 1e-6 and float(fit[2]) > 0.5, lines[0]
    table = [line.split() for line in lines[2:22]]
    assert [row[0] for row in table] == [str(k) for k in range(20)], lines[1:22]
    assert all(row[4] == "yes" for row in table), lines[1:22]  # the certified column
    assert lines[22].startswith("20 alphas (squared, l1_ratio=1.0, tol=1e-06): 20 certified, 0 not")
    cv = re.fullmatch(r"CV alpha (\S+) 1-SE alpha (\S+) test R\^2 (\S+)", lines[23])
    assert cv and 0 < float(cv[1]) <= float(cv[2]) and float(cv[3]) > 0.5, lines[23]
    assert lines[24].startswith("Lasso(alpha="), lines[24]
    predictions = lines[25].strip("[]").split()
    assert len(predictions) == 3 and all(np.isfinite(float(v)) for v in predictions), lines[25]
    assert len(lines) == 26, lines[26:]
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["e2006.zarr", "lasso-cv", "lasso-fit", "quickstart.py"], written


# ---------------------------------------------------------------- numba's cache location

# prints where numba caches dl1's kernels, in this process and in a LocalCluster's worker,
# after compiling one kernel (its index file is looked for there)
CACHE_PROBE = """
import os, sys
if "--numba-first" in sys.argv:
    import numba  # as pydata sparse does, before dl1
import dl1
from dl1.kernels.cd import soft_threshold
from distributed import Client, LocalCluster

if __name__ == "__main__":
    assert soft_threshold(2.0, 0.5) == 1.5
    import numba
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        (worker,) = client.run(lambda: __import__("numba").config.CACHE_DIR).values()
    print(numba.config.CACHE_DIR)
    print(worker)
"""


def cache_dirs(tmp_path: Path, *args: str, **env: str) -> list[str]:
    script = tmp_path / "probe.py"
    script.write_text(CACHE_PROBE)
    env = clean_env(**env)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    done = run([sys.executable, str(script), *args], cwd=tmp_path, env=env, timeout=300)
    return done.stdout.split()


def numba_index_files(where: Path) -> list[Path]:
    return [*where.rglob("cd.soft_threshold-*.nbi")]


@pytest.mark.parametrize("numba_first", [False, True])
@pytest.mark.slow
def test_numba_cache_in_the_user_cache_folder(tmp_path, numba_first):
    xdg = tmp_path / "xdg"
    dirs = cache_dirs(tmp_path, *["--numba-first"] * numba_first, XDG_CACHE_HOME=str(xdg))
    assert dirs == [str(xdg / "dl1" / "numba")] * 2
    assert numba_index_files(xdg / "dl1" / "numba")
    assert not numba_index_files(ROOT / "dl1"), "numba's cache went into the package"


@pytest.mark.slow
def test_numba_cache_in_a_private_temp_folder_when_home_is_not_writable(tmp_path):
    not_a_dir = tmp_path / "home"
    not_a_dir.write_text("")  # refused even to root: a folder cannot be made in a file
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"HOME": str(not_a_dir), "XDG_CACHE_HOME": "", "TMPDIR": str(tmp)}
    dirs = cache_dirs(tmp_path, **env)
    expected = tmp / f"dl1-numba-{os.getuid()}"
    assert dirs == [str(expected)] * 2
    assert numba_index_files(expected) and expected.stat().st_mode & 0o777 == 0o700


@pytest.mark.slow
def test_a_numba_cache_folder_set_by_the_user_is_kept(tmp_path):
    mine = tmp_path / "mine"
    assert cache_dirs(tmp_path, NUMBA_CACHE_DIR=str(mine)) == [str(mine)] * 2
    assert numba_index_files(mine)


def test_a_folder_others_can_write_is_not_used(tmp_path, monkeypatch):
    from dl1 import _numba_cache

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert not _numba_cache._private_writable(shared)
    (tmp_path / "file").write_text("")
    assert not _numba_cache._private_writable(tmp_path / "file" / "sub")
    assert _numba_cache._private_writable(tmp_path / "new" / "sub")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _numba_cache.candidate_dirs()[0] == tmp_path / "xdg" / "dl1" / "numba"


# ---------------------------------------------------------------- set-up commands in sequence

# what stands for the test suite at the end of README's test command: the command, the
# package imported from elsewhere than the checkout, and the store kernels that once vanished
QUICK_CHECK = (
    'dl1 --help > /dev/null && (cd / && python -c "import dl1, dl1.kernels.store") '
    '&& dl1 generate "$DL1_CHECK_DIR/s.zarr" --preset small > /dev/null '
    '&& dl1 info "$DL1_CHECK_DIR/s.zarr"'
)


def setup_commands() -> list[str]:
    """README's set-up commands, the test suite replaced by :data:`QUICK_CHECK`."""
    blocks = fenced_blocks(readme_section("Set-up on a fresh machine"), "bash")
    assert len(blocks) == 2 and "python -m pytest -q" in blocks[1], blocks
    return [blocks[0], re.sub(r"python -m pytest -q[^&\n]*", lambda _: QUICK_CHECK, blocks[1])]


def copy_checkout(dst: Path) -> Path:
    """The checkout's files as git sees them (tracked or not ignored), without .venv etc."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


def unrecorded_files(site: Path) -> list[Path]:
    """Files under ``site/dl1`` that dl1's installation RECORD does not list (an uninstall
    leaves them behind)."""
    (record,) = site.glob("dl1-*.dist-info/RECORD")
    with record.open() as f:
        recorded = {(site / row[0]).resolve() for row in csv.reader(f)}
    return [p for p in (site / "dl1").rglob("*") if p.is_file() and p.resolve() not in recorded]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="copies the checkout with git")
def test_readme_setup_commands_in_sequence(tmp_path):
    """Both README commands, one after the other in one checkout and one .venv."""
    checkout = copy_checkout(tmp_path / "dl1")
    pip_cache = run([sys.executable, "-m", "pip", "cache", "dir"]).stdout.strip()
    env = clean_env(
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        PIP_CACHE_DIR=pip_cache,
        DL1_CHECK_DIR=str(tmp_path),
    )
    install, tests = setup_commands()

    done = run(["bash", "-c", f"set -eo pipefail; {install}"], cwd=checkout, env=env, timeout=1200)
    assert "certified at tol" in done.stdout, done.stdout
    (site,) = (checkout / ".venv" / "lib").glob("python3.*/site-packages")
    assert not [*(site / "dl1").rglob("*.nb[ic]")], "numba's cache went into the package"
    assert unrecorded_files(site) == []
    assert [*(tmp_path / "cache" / "dl1" / "numba").rglob("*.nbi")], "no kernel was cached"

    done = run(["bash", "-c", f"set -eo pipefail; {tests}"], cwd=checkout, env=env, timeout=1200)
    assert "nnz" in done.stdout and "blocks" in done.stdout, done.stdout
    assert not (site / "dl1").exists(), "the regular install left files behind"
