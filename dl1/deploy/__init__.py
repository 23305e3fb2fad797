"""Deployments beyond a LocalCluster: workers as batch jobs (:mod:`dl1.deploy.jobqueue`).

The Kubernetes resources and Helm charts are files, not code: ``cluster/kubernetes/``.
"""

from dl1.deploy.jobqueue import job_script, jobqueue_cluster, worker_settings

__all__ = ["job_script", "jobqueue_cluster", "worker_settings"]
