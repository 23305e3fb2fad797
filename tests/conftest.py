import pytest


@pytest.fixture(scope="session")
def local_cluster():
    """A real two-process LocalCluster shared by the distributed tests."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield client
