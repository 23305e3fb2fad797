"""The ``dl1`` command line: ``dl1 demo``, ``generate``, ``convert``, ``info``, ``fit``,
``path``, ``predict``, ``score`` and ``warm``.

Every command checks its options and its inputs (manifest, targets, column statistics,
saved model) before it starts or joins a cluster, and shuts down the cluster it started.
An error ends the command with one line on stderr, ``dl1: error: <message>``, and exit
status 2 when the input is wrong (a usage error, an invalid option or file, a path that is
not a usable store or model), 1 for any other; ``--debug`` prints the traceback as well.
``--json`` prints one JSON document on stdout (the result, or the error) and the human text
on stderr. Progress goes to stderr: a bar on a terminal, timestamped lines otherwise.
"""

from dl1.cli import fitting, predicting, stores, warming  # noqa: F401 - registers them
from dl1.cli.app import EXIT_ERROR, EXIT_USAGE, cli, exit_status, main, one_line
from dl1.cli.cluster import ClusterSpec, _client
from dl1.cli.stores import summary

__all__ = [
    "EXIT_ERROR",
    "EXIT_USAGE",
    "ClusterSpec",
    "_client",
    "cli",
    "exit_status",
    "main",
    "one_line",
    "summary",
]
