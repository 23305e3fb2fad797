"""Where numba keeps the compiled kernels of dl1 (``cache=True``) on disk.

By default numba writes them next to the source, in ``site-packages/dl1/**/__pycache__``:
files no installer recorded, so uninstalling dl1 leaves those folders behind, and the next
install (an editable one, say) finds a ``dl1`` folder without ``__init__.py`` first and
imports it as an empty namespace package. dl1 therefore points numba's cache
(``NUMBA_CACHE_DIR``) to a user cache folder before any kernel is compiled.
"""

import os
import sys
import tempfile
from pathlib import Path


def user_cache_dir() -> Path | None:
    """The platform's per-user cache folder (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux)."""
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no HOME and no password entry
        home = None
    if sys.platform == "darwin":
        return None if home is None else home / "Library" / "Caches"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg)
    return None if home is None else home / ".cache"


def _private_writable(path: Path) -> bool:
    """Whether ``path`` is (made) a folder this user owns, writes, and nobody else writes.

    numba's cache index is a pickle: a folder others can write would let them run code here.
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return False
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def candidate_dirs() -> list[Path]:
    """Cache folders in order of preference: the user cache, then the temporary folder."""
    base = user_cache_dir()
    tmp = Path(tempfile.gettempdir()) / f"dl1-numba-{os.getuid()}"
    return [base / "dl1" / "numba", tmp] if base is not None else [tmp]


def configure() -> str | None:
    """Point numba's cache outside the installed package, unless the user chose a folder.

    A ``NUMBA_CACHE_DIR`` already set (environment, or numba's config when numba is already
    imported) is kept. Otherwise the first writable folder of :func:`candidate_dirs` is
    exported as ``NUMBA_CACHE_DIR``, so Dask workers started from this process inherit it
    (and workers started elsewhere choose it the same way when they import dl1). When no
    folder is writable nothing is set and numba keeps its own fallbacks.

    Returns
    -------
    str or None
        The cache folder in force, or None when numba decides.
    """
    config = sys.modules.get("numba.core.config")
    chosen = os.environ.get("NUMBA_CACHE_DIR") or getattr(config, "CACHE_DIR", "")
    if chosen:
        return chosen
    for path in candidate_dirs():
        if _private_writable(path):
            os.environ["NUMBA_CACHE_DIR"] = str(path)
            if config is not None:  # numba imported first (by pydata sparse, say)
                config.CACHE_DIR = str(path)
            return str(path)
    return None
