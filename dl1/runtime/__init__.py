"""Where dl1's work runs: executors (in process, Dask tasks, direct calls to the workers'
partition servers), the calls on Dask's comm, the worker preload and dl1's LocalCluster."""
