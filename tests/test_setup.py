"""README's set-up commands and quickstart, run as a new user runs them.

The commands and the code are read from README.md, so these tests follow the README.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_section(title: str) -> str:
    """The text of README's ``## title`` section, up to the next ``## `` heading."""
    text = README.read_text()
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


# ---------------------------------------------------------------- quickstart as a script


def quickstart_script() -> str:
    """README's quickstart on the ``small`` preset, a free dashboard port and 10 alphas a path."""
    (code,) = fenced_blocks(readme_section("Quickstart"), "python")
    code = re.sub(r"""preset=(["'])\w+\1""", 'preset="small"', code)
    code = re.sub(r"n_alphas=\d+", "n_alphas=10", code)
    return re.sub(r"""(dashboard_address=["'][\w.]*):\d+""", r"\1:0", code)


@pytest.mark.slow
def test_readme_quickstart_runs_as_a_script(tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart_script())
    done = run([sys.executable, str(script)], cwd=tmp_path, timeout=600)
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stdout.splitlines()) >= 2, done.stdout
    assert set(tmp_path.iterdir()) > {script}, "the quickstart wrote nothing"


def test_example_quickstart_runs(tmp_path):
    done = run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path)],
        cwd=tmp_path,
        timeout=600,
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("alpha_max/")]
    assert len(rows) == 3 and all("certified: True" in line for line in rows)
