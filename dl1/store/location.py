"""Where a store lives: a local folder, or a prefix on any filesystem fsspec reaches.

A :class:`Location` is what task graphs carry to the workers (a URL and its storage
options, a few hundred bytes), so each worker reads its blocks straight from the object
store; nothing is read by the client and shipped. Every read names a key relative to the
location's root and is checked to stay inside it; every read is bounded before its bytes
are transferred. Plain local paths read with ``os`` calls, as before.

Credentials are never shown: ``str``, ``repr`` and :meth:`Location.display` drop the
storage options' values and a URL's user information and query string. By default the
options are empty and fsspec's backends take credentials from the environment (``AWS_*``,
``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_*``...).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from dl1.errors import ClusterStalledError, StoreAccessError, StoreCorruptError, ValidationError
from dl1.timeouts import stall_timeout

T = TypeVar("T")

__all__ = ["Location", "OversizeObjectError", "as_location", "is_store_source", "is_url"]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_LOCAL_PROTOCOLS = ("file", "local")


class OversizeObjectError(ValueError):
    """An object holds more bytes than a read accepts (found before its bytes are read)."""


class NotRegularFileError(OSError):
    """A file dl1 reads is a FIFO, a device, a socket or a directory: refused unread (a
    FIFO's open or read would wait for a writer for ever)."""


def open_regular(path: str | os.PathLike, mode: str = "rb", **kwargs: Any) -> Any:
    """``open(path, mode)`` for reading, refused with :class:`NotRegularFileError` unless
    ``path`` (symlinks followed) is a regular file: it is opened without blocking (a
    FIFO's plain open waits for a writer), checked by ``fstat``, then read as usual."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(
                f"{path} is not a regular file (a FIFO, a device, a socket or a directory): "
                "refused unread"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def is_url(source: Any) -> bool:
    """Whether ``source`` is a string of the form ``protocol://...``."""
    return isinstance(source, str) and _SCHEME.match(source) is not None


def is_store_source(source: Any) -> bool:
    """Whether ``source`` names a store :func:`as_location` takes: a path, a URL, a
    :class:`Location` or a zarr store object."""
    if isinstance(source, str | os.PathLike | Location):
        return True
    if not type(source).__module__.startswith("zarr."):
        return False
    # local: zarr (~0.25 s, ~24 MiB to import) is loaded already when source is a zarr object
    from zarr.abc.store import Store as ZarrStore

    return isinstance(source, ZarrStore)


def _check_rel(rel: str) -> str:
    """``rel`` unchanged if it is a relative key of plain parts (no ``..``, no absolute)."""
    if not isinstance(rel, str) or "\\" in rel or "\0" in rel:
        raise StoreCorruptError(f"key {rel!r} is not a relative name inside the store")
    if rel == "":
        return rel
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise StoreCorruptError(f"key {rel!r} is not a relative name inside the store")
    return rel


def _redact_url(url: str) -> str:
    """A URL without user information, query or fragment (where tokens hide)."""
    if not is_url(url):
        return url
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    return shown + ("?<redacted>" if parts.query or parts.fragment else "")


def stall_types() -> tuple[type[BaseException], ...]:
    """The errors of a request to storage that did not answer in time (botocore's, when
    installed, and the standard ``TimeoutError`` fsspec's timeouts derive from)."""
    try:
        # local: botocore is optional (with s3fs: dl1[s3]); without it, TimeoutError only
        from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError
    except ImportError:  # optional: only object storage needs botocore
        return (TimeoutError,)
    return (TimeoutError, ConnectTimeoutError, ReadTimeoutError)


#: s3fs's attempts of one request (its public ``retries``, 5 by default, which it applies
#: twice over to a read: up to 25 attempts); botocore's own retries are off.
S3FS_ATTEMPTS = 2


#: Errors of object storage clients that mean "no access" (botocore's, gcsfs', adlfs'),
#: by name: their packages are optional.
DENIED_NAMES = frozenset({"NoCredentialsError", "PartialCredentialsError",
                          "CredentialRetrievalError", "NoAuthTokenError",
                          "ClientAuthenticationError", "RefreshError"})  # fmt: skip


def denied(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) is a refusal of access: missing
    or rejected credentials, or a permission error."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, PermissionError) or type(e).__name__ in DENIED_NAMES:
            return True
        e = e.__cause__ or e.__context__
    return False


def this_process() -> str:
    """``worker <address>`` in a Dask worker (a task, or a worker's thread), else ``this
    process``: where a read failed."""
    try:
        from distributed import get_worker  # optional here: stores are read without Dask too

        return f"worker {get_worker().address}"
    except (ImportError, ValueError):
        return "this process"


def access_error(what: str, e: BaseException) -> StoreAccessError:
    """The error of a read of ``what`` refused for lack of access, naming where it ran and
    what the caller can do."""
    where = this_process()
    hint = ("a worker lacks the access the calling process has: give the workers the "
            "store's credentials (their environment, e.g. AWS_* variables, or a role) or "
            "pass them in storage_options, which travel with the store"
            if where.startswith("worker") else
            "give this process the store's credentials or storage_options")  # fmt: skip
    return StoreAccessError(f"{what} cannot be read on {where}: {type(e).__name__}: {e}; "
                            f"{hint}")  # fmt: skip


def bound_retries(fs: Any) -> Any:
    """``fs`` with s3fs's retries set to :data:`S3FS_ATTEMPTS` (other filesystems as they
    are): with :func:`bounded_options`' timeouts, a request that gets no answer fails
    within about half the stall timeout."""
    if type(fs).__module__.startswith("s3fs") and hasattr(fs, "retries"):
        fs.retries = S3FS_ATTEMPTS
    return fs


def bounded_options(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """``storage_options`` with every request to S3 bounded in time, unless the caller set
    the bounds: connect and read timeouts of an eighth of the stall timeout (at most s3fs's
    5 s and 15 s) and botocore's retries off (s3fs's are bounded by :func:`bound_retries`),
    so that storage that stops answering is an error within about half the stall timeout,
    not a wait of minutes (s3fs's and botocore's retries multiply: over six minutes)."""
    out = dict(storage_options)
    if url.split("://", 1)[0] not in ("s3", "s3a"):
        return out
    eighth = stall_timeout() / 8.0
    config = dict(out.get("config_kwargs") or {})
    config.setdefault("connect_timeout", min(5.0, eighth))
    config.setdefault("read_timeout", min(15.0, eighth))
    config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
    out["config_kwargs"] = config
    return out


@dataclass(frozen=True, repr=False)
class Location:
    """The root of a store: a local folder or a URL with its fsspec storage options.

    Parameters
    ----------
    url : str
        An absolute local path, or a URL (``s3://bucket/x.zarr``, ``gs://``, ``abfs://``,
        ``memory://``) without a trailing slash. Build one with :func:`as_location`.
    storage_options : Mapping
        Keyword arguments of the fsspec filesystem (endpoint, credentials...); empty by
        default, so credentials come from the environment. Never shown.
    """

    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    # -- identity ---------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        """Whether the store is a local folder (read with ``os`` calls)."""
        return not is_url(self.url)

    @property
    def path(self) -> Path:
        """The local folder (only for a local location)."""
        if not self.is_local:
            raise ValueError(f"{self.display()} is not a local folder")
        return Path(self.url)

    def display(self, rel: str = "") -> str:
        """The location (and key ``rel`` in it) as shown in messages: no credentials."""
        base = _redact_url(self.url)
        return f"{base}/{rel}" if rel else base

    def __str__(self) -> str:
        return self.display()

    def __repr__(self) -> str:
        opts = f", storage_options=<{len(self.storage_options)} redacted>"
        return f"Location({self.display()!r}{opts if self.storage_options else ''})"

    def __dask_tokenize__(self) -> tuple[str, str, str]:
        from dask.base import tokenize  # a one-way digest: no option value appears

        return ("dl1.Location", self.url, tokenize(dict(self.storage_options)))

    def __getstate__(self) -> dict[str, Any]:  # the filesystem object is not shipped
        return {"url": self.url, "storage_options": dict(self.storage_options)}

    def join(self, *parts: str) -> Location:
        """The location of a relative key under this one."""
        rel = _check_rel("/".join(parts))
        return self if not rel else Location(f"{self.url}/{rel}", self.storage_options)

    # -- filesystem access --------------------------------------------------------------
    @property
    def fs(self) -> Any:
        """The fsspec filesystem (created once per process and location)."""
        cached = self.__dict__.get("_fs")
        if cached is None:
            # local: fsspec (~0.04 s to import) only once a store's files are reached
            from fsspec.core import url_to_fs

            if self.is_local:
                cached = (url_to_fs("file://" + self.url)[0], self.url)
            else:
                fs, root = url_to_fs(self.url, **bounded_options(self.url, self.storage_options))
                cached = (bound_retries(fs), root)
            object.__setattr__(self, "_fs", cached)
        return cached[0]

    def key(self, rel: str = "") -> str:
        """The full path of key ``rel``: a local path, or the filesystem's path."""
        _check_rel(rel)
        if self.is_local:
            return os.path.join(self.url, rel) if rel else self.url
        self.fs  # noqa: B018 -- sets the cache
        root = self.__dict__["_fs"][1].rstrip("/")
        return f"{root}/{rel}" if rel else root

    def read(self, rel: str, max_bytes: int) -> bytes:
        """The bytes of object ``rel``, refused with :class:`OversizeObjectError` if it
        holds more than ``max_bytes``: a local file is ``fstat``-ed before it is read, a
        remote object read by a ranged request of at most ``max_bytes + 1`` bytes.

        Raises ``FileNotFoundError`` if the object does not exist."""
        p = self.key(rel)
        if self.is_local:
            with open_regular(p) as fh:
                size = os.fstat(fh.fileno()).st_size
                if size > max_bytes:
                    raise OversizeObjectError(
                        f"{self.display(rel)} has {size:,} bytes, more than {max_bytes:,}"
                    )
                data = fh.read(max_bytes + 1)
        else:
            data = self._remote(rel, self.fs.cat_file, p, start=0, end=max_bytes + 1)
        if len(data) > max_bytes:
            raise OversizeObjectError(f"{self.display(rel)} has more than {max_bytes:,} bytes")
        return bytes(data)

    def read_many(self, rels: Sequence[str], max_bytes: Sequence[int]) -> list[bytes | Exception]:
        """Several objects, as :meth:`read` returns each (``max_bytes[i]`` for ``rels[i]``),
        or the exception its read raised (``FileNotFoundError``, :class:`OversizeObjectError`
        ...): on an object store, concurrent ranged requests (one round trip, not one each).
        """
        if len(rels) != len(max_bytes):
            raise ValueError(f"{len(rels)} keys but {len(max_bytes)} sizes")
        if self.is_local or len(rels) <= 1:
            out: list[bytes | Exception] = []
            for rel, m in zip(rels, max_bytes, strict=True):
                try:
                    out.append(self.read(rel, m))
                except (OSError, OversizeObjectError) as e:
                    out.append(e)
            return out
        paths = [self.key(rel) for rel in rels]
        got = self._remote(rels[0], self.fs.cat_ranges, paths, [0] * len(paths),
                           [m + 1 for m in max_bytes], on_error="return")  # fmt: skip
        for rel, g in zip(rels, got, strict=True):
            if isinstance(g, stall_types()):
                raise self._stalled(rel, g) from g
            if isinstance(g, BaseException) and denied(g):
                raise access_error(self.display(rel), g) from g
        out = []
        for rel, m, g in zip(rels, max_bytes, got, strict=True):
            if isinstance(g, Exception):
                out.append(g)
            elif len(g) > m:
                out.append(OversizeObjectError(f"{self.display(rel)} has more than {m:,} bytes"))
            else:
                out.append(bytes(g))
        return out

    def size(self, rel: str = "") -> int:
        """Bytes of object ``rel`` (one ``stat`` or ``HEAD``); ``FileNotFoundError`` if
        missing."""
        p = self.key(rel)
        if self.is_local:
            return os.stat(p).st_size
        return int(self._remote(rel, self.fs.size, p))

    def exists(self, rel: str = "") -> bool:
        """Whether object (or prefix) ``rel`` exists."""
        p = self.key(rel)
        return os.path.exists(p) if self.is_local else bool(self._remote(rel, self.fs.exists, p))

    def isdir(self, rel: str = "") -> bool:
        """Whether ``rel`` is a folder (a prefix holding objects, on an object store)."""
        p = self.key(rel)
        return os.path.isdir(p) if self.is_local else bool(self._remote(rel, self.fs.isdir, p))

    def listing(self, max_entries: int) -> dict[str, int]:
        """``{relative key: size}`` of every object under the location (one recursive
        listing, paginated by the backend), refused beyond ``max_entries`` objects."""
        root = self.key()
        found = self._remote("", self.fs.find, root, withdirs=False, detail=True)
        if len(found) > max_entries:
            raise StoreCorruptError(
                f"{self.display()} holds {len(found):,} objects, more than the "
                f"{max_entries:,} its manifest accounts for"
            )
        prefix = root.rstrip("/") + "/"
        return {
            name[len(prefix) :]: int(info.get("size") or 0)
            for name, info in found.items()
            if name.startswith(prefix)
        }

    def _remote(self, rel: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, a request to object storage: one that timed out (the
        bounds of :func:`bounded_options`) is a :class:`ClusterStalledError` naming it."""
        try:
            return fn(*args, **kwargs)
        except stall_types() as e:
            raise self._stalled(rel, e) from e
        except Exception as e:
            if denied(e):
                raise access_error(self.display(rel), e) from e
            raise

    def _stalled(self, rel: str, e: BaseException) -> ClusterStalledError:
        return ClusterStalledError(
            f"object storage did not answer a request for {self.display(rel)} within its "
            f"bounds (timeouts of {stall_timeout() / 8.0:.3g} s, from dl1.stall-timeout): "
            f"{type(e).__name__}: {e}"
        )

    def zarr_store(self) -> Any:
        """A read-only zarr store object rooted here."""
        # local: zarr (~0.25 s, ~24 MiB to import) only once a store is opened through zarr
        from zarr.storage import FsspecStore, LocalStore

        if self.is_local:
            return LocalStore(self.url, read_only=True)
        store = FsspecStore.from_url(
            self.url, storage_options=bounded_options(self.url, self.storage_options),
            read_only=True,
        )
        bound_retries(store.fs)
        return store


def _from_zarr_store(store: Any) -> Location:
    # local: zarr (~0.25 s, ~24 MiB to import) is loaded already when given a zarr store
    from zarr.storage import FsspecStore, LocalStore

    if isinstance(store, LocalStore):
        return Location(str(Path(store.root).absolute()))
    if isinstance(store, FsspecStore):
        fs = store.fs
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if protocol in _LOCAL_PROTOCOLS:
            return Location(os.path.abspath(store.path))
        options = {k: v for k, v in fs.storage_options.items() if k != "asynchronous"}
        return Location(fs.unstrip_protocol(store.path).rstrip("/"), options)
    raise ValidationError(
        f"a {type(store).__name__} cannot hold a dl1 store read by workers: pass a "
        "zarr LocalStore or FsspecStore, a path or a URL"
    )


def as_location(source: Any, storage_options: Mapping[str, Any] | None = None) -> Location:
    """The :class:`Location` of a store given as a path, a URL, a zarr store object or a
    Location.

    ``file://`` URLs become local paths; ``storage_options`` apply to URLs only (a zarr
    store object brings its filesystem's own options).
    """
    if isinstance(source, Location):
        if storage_options:
            return Location(source.url, dict(storage_options))
        return source
    if is_url(source):
        protocol = source.split("://", 1)[0].lower()
        if protocol in _LOCAL_PROTOCOLS:
            # local: fsspec (~0.04 s to import) only for a file:// or local:// URL
            from fsspec.core import url_to_fs

            return Location(os.path.abspath(url_to_fs(source)[1]))
        return Location(source.rstrip("/"), dict(storage_options or {}))
    if isinstance(source, str | os.PathLike):
        if storage_options:
            raise ValidationError(
                "storage_options apply to URLs (s3://, gs://, ...), not to the local path "
                f"{os.fspath(source)!r}"
            )
        return Location(str(Path(source).absolute()))
    try:
        # local: zarr (~0.25 s, ~24 MiB to import) only for a source not a path, URL or Location
        from zarr.abc.store import Store as ZarrStore
    except ImportError:  # pragma: no cover - zarr is a dependency
        ZarrStore = ()  # noqa: N806
    if isinstance(source, ZarrStore):
        return _from_zarr_store(source)
    raise ValidationError(
        f"a store is a path, a URL or a zarr store object, got {type(source).__name__}"
    )
