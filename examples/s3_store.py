"""A store on S3: written to a bucket, fitted from it by workers that read their blocks
straight from the bucket, and checked against the same store on a local disk.

python examples/s3_store.py [--tiny] [--bucket NAME] [--scheduler ADDRESS]

With ``AWS_ENDPOINT_URL`` set (and credentials in ``AWS_*`` or your AWS config) it uses
that S3 endpoint; otherwise it starts a local S3-compatible server (moto's server mode, on
127.0.0.1, ``pip install "moto[server]"``) for the run, with throwaway credentials. No
credential goes into ``storage_options``: s3fs and the workers find them in the
environment, as they would on a cluster. With ``--scheduler`` it fits on that cluster
(whose workers must reach the endpoint with credentials of their own); otherwise on a
two-worker LocalCluster started for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from distributed import Client

import dl1
from dl1.datasets import E2006Preset, make_e2006_like
from dl1.runtime.localcluster import local_cluster
from dl1.testing import s3_server

#: A preset small enough for a test (a few seconds to write and fit).
TINY = E2006Preset(
    "tiny", n_train=400, n_test=80, n_features=3000, row_nnz=40.0, n_informative=30,
    batch_rows=128, pilot_rows=256,
)  # fmt: skip


def s3_endpoint() -> contextlib.AbstractContextManager[str]:
    """The endpoint of ``AWS_ENDPOINT_URL``, or a moto server on 127.0.0.1 for the run."""
    if os.environ.get("AWS_ENDPOINT_URL"):
        return contextlib.nullcontext(os.environ["AWS_ENDPOINT_URL"])
    return s3_server(key="example", secret="example")


@contextlib.contextmanager
def cluster_client(scheduler: str | None) -> Iterator[Client]:
    """A client of the cluster at ``scheduler``, or of a LocalCluster for the run."""
    if scheduler:
        with Client(scheduler) as client:
            yield client
        return
    with (
        local_cluster(n_workers=2, threads_per_worker=1, silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
    ):
        yield client


def main(tiny: bool, bucket: str | None, scheduler: str | None = None) -> None:
    import s3fs

    preset = TINY if tiny else "small"
    fs = s3fs.S3FileSystem()
    bucket = bucket or f"dl1-example-{uuid.uuid4().hex[:8]}"
    made_bucket = not fs.exists(bucket)
    if made_bucket:
        fs.mkdir(bucket)
    url = f"s3://{bucket}/e2006-{'tiny' if tiny else 'small'}.zarr"
    try:
        store = make_e2006_like(url, preset=preset, seed=0, n_feature_blocks=4, overwrite=True)
        print(store)
        with tempfile.TemporaryDirectory() as tmp, cluster_client(scheduler) as client:
            local = make_e2006_like(Path(tmp) / "local.zarr", preset=preset, seed=0,
                                    n_feature_blocks=4)  # fmt: skip
            amax = dl1.alpha_max(url, client=client)
            t0 = time.perf_counter()
            res = dl1.fit(url, alpha=amax / 10, tol=1e-8, client=client)
            took = time.perf_counter() - t0
            ref = dl1.fit(local, alpha=amax / 10, tol=1e-8, client=client)
            print(
                f"fit from {url}: {np.count_nonzero(res.coef_)} nonzeros, gap {res.gap_:.1e} "
                f"(certified: {res.converged_}) in {took:.2f} s"
            )
            if not np.array_equal(res.coef_, ref.coef_):
                raise SystemExit("the fit from S3 differs from the fit from the local disk")
            print("the same coefficients as from the local disk, bit for bit")
    finally:
        if made_bucket:
            fs.rm(bucket, recursive=True)
        elif fs.exists(url):
            fs.rm(url, recursive=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few-second run (tests)")
    parser.add_argument("--bucket", help="an existing bucket to use (default: a new one)")
    parser.add_argument("--scheduler", help="a running cluster's scheduler address")
    args = parser.parse_args()
    with s3_endpoint():
        main(args.tiny, args.bucket, args.scheduler)
