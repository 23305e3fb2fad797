"""A certified regularisation path on dl1 workers running as SLURM jobs.

python examples/slurm_job.py [OUT_DIR] [--tiny]

Run it where ``sbatch`` reaches SLURM: a login node, or this machine after
``sudo bash cluster/slurm/start-single-node.sh``. Each worker is a SLURM job (one core, 2 GiB)
carrying dl1's worker settings (:func:`dl1.deploy.jobqueue_cluster`); the jobs are cancelled
when the ``with`` block ends. The scheduler listens on 127.0.0.1, which reaches jobs on this
node only: on a multi-node cluster pass ``interface="ib0"`` (the nodes' network) and use TLS
(``security=``), see cluster/README.md. The store must be on a file system (or object store)
every node reads. ``--tiny`` writes a 300 x 200 store instead of the ``small`` preset.
"""

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from distributed import Client

import dl1
from dl1.datasets import make_e2006_like
from dl1.deploy import jobqueue_cluster


def tiny_store(out: Path) -> dl1.Store:
    """A 300 x 200 sparse regression problem with 8 informative features."""
    rng = np.random.default_rng(0)
    X = sp.random(300, 200, density=0.05, format="csr", random_state=rng)
    y = X[:, :8] @ rng.standard_normal(8) + 0.01 * rng.standard_normal(300)
    return dl1.from_scipy(X, y, out / "tiny.zarr", n_feature_blocks=4)


def main(out: Path, tiny: bool) -> None:
    store = tiny_store(out) if tiny else make_e2006_like(out / "small.zarr", preset="small")
    n_alphas = 4 if tiny else 20
    t0 = time.perf_counter()
    with (
        jobqueue_cluster(
            "slurm", 2, memory="2GiB", walltime="00:30:00", log_directory=str(out / "slurm-logs")
        ) as cluster,  # fmt: skip
        Client(cluster) as client,
    ):
        print(f"2 SLURM worker jobs up in {time.perf_counter() - t0:.1f} s")
        path = dl1.path(store, n_alphas=n_alphas, eps=0.05, tol=1e-6, client=client)
    nnz = np.diff(path.coefs_.tocsc().indptr)  # coefs_: (n_features, n_alphas)
    for alpha, gap, k in zip(path.alphas_, path.gaps_, nnz, strict=True):
        print(f"alpha {alpha:.3e}  nnz {k:4d}  gap {gap:.1e}")
    print(f"certified {int(path.converged_.sum())}/{len(path.alphas_)} "
          f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--tiny"]
    if args:
        main(Path(args[0]), "--tiny" in sys.argv)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp), "--tiny" in sys.argv)
