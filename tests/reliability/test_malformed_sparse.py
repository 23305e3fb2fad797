"""Malformed SciPy sparse input is refused where it enters, naming the row (or column),
before SciPy's compiled code reads an index out of range: no crash of the caller, no
silent wrong answer. Each entry point's cases run in a child process, so a crash fails
this test, not the run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

#: case: (format, how the matrix is broken, what the error must say)
CASES = {
    "csr index far out": ("csr", "X.indices[5] = 10**6",
                          r"row \d+ has column index 1000000 outside \[0, 10\)"),
    "csr index -1": ("csr", "X.indices[5] = -1", r"row \d+ has column index -1 outside"),
    "csr index p": ("csr", "X.indices[5] = 10", r"column index 10 outside \[0, 10\)"),
    "csc row index n": ("csc", "X.indices[0] = 30", r"column 0 has row index 30 outside"),
    "csr indptr decreases": ("csr", "X.indptr[4] = X.indptr[5] + 3", "indptr decreases"),
    "csr indptr beyond": ("csr", "X.indptr[-1] = X.indptr[-1] + 50", "beyond the"),
    "coo column out": ("coo", "X.col[2] = 99", r"(entry 2|row \d+) has column index 99"),
}  # fmt: skip
CALLS = {
    "fit": "dl1.fit(X, y, alpha=0.01)",
    "estimator": "dl1.Lasso(alpha=0.01).fit(X, y)",
    "predict": "dl1.predict.predict(X, np.ones(10), 0.0, 'squared')",
}

CHILD = """
import json, sys
import numpy as np, scipy.sparse as sp
import dl1, dl1.predict
cases, call = json.loads(sys.argv[1]), sys.argv[2]
for name, (fmt, breakage, _) in cases.items():
    X = sp.random(30, 10, density=0.3, random_state=0, format=fmt)
    y = np.linspace(-1.0, 1.0, 30)
    exec(breakage)
    print(name, flush=True)  # a crash names the case it was in
    try:
        eval(call)
    except dl1.errors.ValidationError as e:
        print(json.dumps([name, "refused", str(e)]), flush=True)
    else:
        print(json.dumps([name, "accepted", ""]), flush=True)
"""


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.slow
def test_malformed_sparse_input_is_a_named_error_not_a_crash(call):
    """Pass: the child exits normally, every case refused by a ValidationError naming the
    bad index and where it is (before: rc -11 for a far index, nothing for -1 or p)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), json.dumps(CASES),
                          CALLS[call]], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout[-500:] + out.stderr[-2000:]
    seen = dict((r[0], r[1:]) for r in map(json.loads, re.findall(r"^\[.*$", out.stdout, re.M)))
    assert set(seen) == set(CASES)
    for name, (_, _, message) in CASES.items():
        verdict, text = seen[name]
        assert verdict == "refused" and re.search(message, text), (name, verdict, text)
