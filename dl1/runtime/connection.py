"""A scheduler's address given where a client is expected (``client="tcp://host:8786"``):
a ``distributed.Client`` connected for the call, with Dask's configured security
(``distributed.comm.tls.*``), after checking that a Dask scheduler answers there."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import dask
from dask.utils import parse_timedelta

from dl1.errors import ValidationError
from dl1.runtime.exposure import check_scheduler_address


def check_scheduler_answers(address: str, security: Any) -> None:
    """Refuse, naming it, an address where nothing completes Dask's handshake within
    Dask's connect timeout (``distributed.comm.timeouts.connect``): an HTTP server (the
    dashboard's port) or another service. Dask's own client would wait there for ever, or
    read the text as a frame length (``MemoryError``). One Dask comm, opened and closed."""
    # local: distributed (~0.3 s to import) only to reach a scheduler at an address
    from distributed.comm import connect as open_comm

    bound = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")
    kwargs = security.get_connection_args("client") if security is not None else {}

    async def handshake() -> None:
        comm = await asyncio.wait_for(open_comm(address, timeout=bound, **kwargs), bound)
        await comm.close()

    try:  # in a thread of its own: asyncio.run unsets the calling thread's event loop
        with ThreadPoolExecutor(1, thread_name_prefix="dl1-handshake") as pool:
            pool.submit(asyncio.run, handshake()).result()
    except (OSError, TimeoutError, ValueError, MemoryError, EOFError) as e:
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise ConnectionError(
            f"no Dask scheduler answers at {address} within {bound:g} s ({why}); is it the "
            "scheduler's address (not its dashboard's or another service's)?"
        ) from None


def configured_security(address: str) -> Any:
    """Dask's configured client security (``distributed.comm.tls.*``); for a ``tls://``
    address without a CA or a client certificate there, a :class:`ValidationError` naming
    what to set."""
    # local: distributed (~0.3 s to import) only to reach a scheduler at an address
    from distributed.security import Security

    security = Security()
    if address.startswith("tls://") and not (security.tls_ca_file and security.tls_client_cert):
        raise ValidationError(
            f"client={address!r} speaks TLS: set Dask's distributed.comm.tls.ca-file, "
            ".client.cert and .client.key, or pass a distributed.Client made with its "
            "security"
        )
    return security


def connect(address: str) -> Any:
    """A ``distributed.Client`` of the scheduler at ``address`` (not made the default one),
    once a scheduler answers there (:func:`check_scheduler_answers`)."""
    # local: distributed (~0.3 s to import) only to reach a scheduler at an address
    from distributed import Client

    if "://" not in address:
        raise ValidationError(
            f"client={address!r} is neither a distributed.Client nor a scheduler address "
            "('tcp://host:8786', 'tls://host:8786')"
        )
    check_scheduler_address(address)
    security = configured_security(address)
    check_scheduler_answers(address, security)
    return Client(address, security=security, set_as_default=False)


@contextmanager
def connected(client: Any) -> Iterator[Any]:
    """``client`` itself, or for an address a client connected to it (:func:`connect`) and
    closed on leaving."""
    if not isinstance(client, str):
        yield client
        return
    with connect(client) as made:
        yield made
