"""An S3-compatible server (moto's server mode) on 127.0.0.1 for the test session, and a
fresh bucket per test.

The server is a separate process, as a real object store is: the workers of a test's
LocalCluster reach it over HTTP like the client does. Credentials and the endpoint are set
in the environment (``AWS_*``), where botocore looks by default, before any cluster starts,
so worker processes inherit them and no test passes a credential in ``storage_options``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a moto S3 server on 127.0.0.1, with ``AWS_*`` set to reach it."""
    from dl1.testing import s3_server

    with s3_server() as url:
        yield url


@pytest.fixture(scope="session")
def s3_cluster(s3_endpoint):
    """A 2-process LocalCluster started after the S3 server (its workers inherit
    ``AWS_*``), shared by the directory's tests."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield client


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Iterator[str]:
    """A fresh, empty bucket (``s3://<name>``), deleted with its objects afterwards."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    name = f"dl1-{uuid.uuid4().hex[:12]}"
    fs.mkdir(name)
    try:
        yield f"s3://{name}"
    finally:
        fs.rm(name, recursive=True)
