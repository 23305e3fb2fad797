"""Dask preload that closes the HTTP server of the scheduler or worker that loads it.

A Dask scheduler or worker always starts an HTTP server, ``--no-dashboard`` or not: the
scheduler's serves ``/json/identity.json``, ``/info/logs/<worker>``, call stacks and
``/eventstream``, the workers' ``/health`` and ``/metrics``, without authentication and
without TLS even on a ``tls://`` cluster. Loopback does not keep them private on a machine
shared with other users. Dask has no setting that leaves the server out, so dl1's clusters
start it with no routes (``distributed.scheduler.http.routes`` and
``distributed.worker.http.routes`` empty) and preload this module, which closes its socket
as the scheduler or worker starts, before a worker registers (writing the server's
``services``; upstream: dask/distributed#6301, #7207 and #8136, the HTTP server started
whatever the dashboard setting)::

    dask scheduler --no-dashboard --preload dl1.runtime.nohttp ...
    dask worker ... --no-dashboard --preload dl1.runtime.nohttp

The module imports nothing from dl1: a scheduler without dl1 installed can preload a copy
of this file by its path (``--preload /path/to/nohttp.py``).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def close_http_server(server: Any) -> int | None:
    """Stop listening on ``server``'s HTTP port and drop it from the ports the server
    reports (its ``services``); return the port closed (None: there was none)."""
    http = getattr(server, "http_server", None)
    if http is None:
        return None
    http.stop()
    server.services.pop("dashboard", None)
    port = getattr(http, "port", None)
    logger.info("HTTP server on port %s closed (dl1.runtime.nohttp)", port)
    return port


def dask_setup(server: Any) -> None:
    """Dask's preload entry point: :func:`close_http_server` on the starting server."""
    close_http_server(server)
