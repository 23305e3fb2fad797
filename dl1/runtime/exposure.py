"""Where a cluster's connections can be reached from: dl1 warns before it works on a
scheduler whose plain-TCP address is not on this machine.

Whoever can connect to a Dask scheduler can run code on its workers, and ``tcp://``
traffic is neither encrypted nor authenticated; on anything beyond one machine, a cluster
should use ``tls://`` with certificates (``cluster/README.md``).
"""

from __future__ import annotations

import ipaddress
import socket
import warnings
from typing import Any

from dl1.errors import ValidationError


class InsecureClusterWarning(UserWarning):
    """The scheduler is reached over plain TCP on an address other than loopback."""


_warned: set[str] = set()


def is_loopback_host(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_scheduler_address(address: str) -> None:
    """Warn (:class:`InsecureClusterWarning`, once per address and process) when
    ``address`` is a ``tcp://`` address whose host is not loopback."""
    # local: distributed (~0.3 s to import) only to check a scheduler's address
    from distributed.comm import parse_address
    from distributed.comm.addressing import parse_host_port

    scheme, location = parse_address(address)
    if scheme != "tcp" or address in _warned:
        return
    host, _ = parse_host_port(location)
    if is_loopback_host(host):
        return
    _warned.add(address)
    warnings.warn(
        f"the Dask scheduler {address} is reached over plain TCP from another machine: "
        "its traffic is not encrypted, and whoever can reach it can run code on its "
        "workers; use tls:// with certificates beyond a trusted network "
        "(see cluster/README.md)",
        InsecureClusterWarning,
        stacklevel=3,
    )


def check_client(client: Any) -> None:
    """Refuse a closed client, then :func:`check_scheduler_address` of ``client``'s
    scheduler (nothing for None)."""
    if client is None:
        return
    if client.scheduler is None:  # a closed client has no scheduler connection
        raise ValidationError(
            "the Dask client is closed: pass an open client, or none to fit on the current "
            "client or in this process"
        )
    check_scheduler_address(client.scheduler.address)
