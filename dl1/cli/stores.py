"""``dl1 generate``, ``dl1 convert`` and ``dl1 info``: stores written and described.

A store is a local path or a URL fsspec reaches (``s3://``, ``gs://``, ``abfs://``,
``file://``, ``memory://``), with ``--storage-options`` (a JSON object, or the
``DL1_STORAGE_OPTIONS`` environment variable; credentials come from the environment by
default). The options are passed through, never printed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from dl1.cli.app import cli, command_options, output
from dl1.cli.progress import Progress
from dl1.datasets import make_e2006_like
from dl1.errors import ValidationError
from dl1.io.svmlight import from_svmlight
from dl1.params import COMMON, validate_params
from dl1.store import open_store
from dl1.store.csr import add_csr as add_csr_blocks
from dl1.store.location import as_location

if TYPE_CHECKING:
    from dl1.store import Store

#: ``--storage-options`` longer than this is refused unparsed.
MAX_STORAGE_OPTIONS_CHARS = 64 << 10


def is_url(path: str) -> bool:
    """``path`` names a location by URL (``scheme://...``) rather than a local path."""
    return "://" in str(path)


def storage_options_option(f):
    """``--storage-options JSON`` (or ``DL1_STORAGE_OPTIONS``), parsed to a dict."""
    return click.option(
        "--storage-options",
        "storage_options",
        envvar="DL1_STORAGE_OPTIONS",
        show_envvar=True,
        default=None,
        callback=lambda _ctx, _p, v: parse_storage_options(v),
        help="fsspec options of a URL store, as a JSON object (e.g. '{\"anon\": true}'); "
        "credentials are read from the environment by default. Never printed.",
    )(f)


def parse_storage_options(text: str | None) -> dict[str, Any] | None:
    """``text`` as a JSON object; the messages never quote it (it may hold credentials)."""
    if text is None or not text.strip():
        return None
    if len(text) > MAX_STORAGE_OPTIONS_CHARS:
        raise click.BadParameter(
            f"longer than {MAX_STORAGE_OPTIONS_CHARS:,} characters", param_hint="--storage-options"
        )
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise click.BadParameter(
            "must be a JSON object (its text is not shown: it may hold credentials)",
            param_hint="--storage-options",
        )
    return value


def located(path: str, storage_options: dict[str, Any] | None) -> Any:
    """``path`` as given, or with ``storage_options`` a
    :class:`~dl1.store.location.Location` carrying them (every reader and writer of dl1
    takes one where it takes a path or URL)."""
    if storage_options is None:
        return path
    return as_location(path, storage_options)


def open_input(path: str, storage_options: dict[str, Any] | None = None) -> Store:
    """The store at ``path`` (a local path or URL), opened and checked."""
    return open_store(located(path, storage_options))


def where(store: Store) -> str:
    """The store's location as shown to users (credentials never included)."""
    return str(getattr(store, "location", None) or store.path)


def summary(store: Store) -> str:
    """Human-readable summary of a store: shape, nnz, density, blocks, column frequencies."""
    lines = [f"store   {where(store)}"]
    for key in ("preset", "source", "task", "n_classes", "seed", "row_multiplier", "snr"):
        if key in store.attrs:
            lines.append(f"{key:<7} {store.attrs[key]}")
    for split in store.splits:
        n, p = store.shape(split)
        nnz = store.nnz(split)
        bn = store.block_nnz(split)
        e = store.entry(split)
        col_nnz = store.read("stats/col_nnz", split)
        lines += [
            f"[{split}]",
            f"  shape          {n:,} x {p:,}   dtype {np.dtype(e['dtype']).name}",
            f"  nnz            {nnz:,}   density {nnz / max(1, n * p):.4%}"
            f"   nnz/row {nnz / max(1, n):,.1f}",
            f"  blocks         {bn.shape[0]} row x {bn.shape[1]} feature blocks "
            f"({', '.join(e['formats'])}); nnz per block min {bn.min():,} / "
            f"median {int(np.median(bn)):,} / max {bn.max():,}",
        ]
        if p and nnz:
            srt = np.sort(col_nnz)[::-1]
            top = max(1, p // 100)
            q = np.percentile(col_nnz, [50, 90, 99, 100])
            lines += [
                "  column frequency (rows per column): "
                f"median {q[0]:g}, p90 {q[1]:g}, p99 {q[2]:g}, max {q[3]:g}",
                f"  empty columns  {int((col_nnz == 0).sum()):,}"
                f"   columns in <= 2 rows {(col_nnz <= 2).mean():.1%}"
                f"   top 1% of columns hold {srt[:top].sum() / nnz:.1%} of nonzeros",
            ]
    return "\n".join(lines)


def describe(store: Store) -> dict[str, Any]:
    """The store as JSON: location, attributes, and per split shape, nnz, dtype, blocks."""
    splits = {}
    for split in store.splits:
        n, p = store.shape(split)
        e = store.entry(split)
        splits[split] = {
            "n_samples": int(n),
            "n_features": int(p),
            "nnz": int(store.nnz(split)),
            "dtype": np.dtype(e["dtype"]).name,
            "blocks": list(store.block_nnz(split).shape),
            "formats": list(e["formats"]),
        }
    attrs = {k: store.attrs[k] for k in ("preset", "source", "task", "n_classes", "seed")
             if k in store.attrs}  # fmt: skip
    return {"store": where(store), "attrs": attrs, "splits": splits}


def _report(store: Store, seconds: float, what: str) -> None:
    out = output()
    out.say(summary(store))
    out.result.update(describe(store), seconds=seconds, command=what)


@cli.command()
@command_options
@click.argument("dst")
@click.option(
    "--preset", type=click.Choice(["small", "tfidf", "log1p"]), default="small", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--row-multiplier", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--task",
    type=click.Choice(["regression", "classification", "multiclass"]),
    default="regression",
    show_default=True,
    help="Targets: real, labels -1 / +1 of a logistic model, or labels 0 .. K-1 of a "
    "multinomial one (a planted sparse K x p model: y = argmax of X W*^T + b + Gumbel noise).",
)
@click.option(
    "--n-classes",
    type=click.IntRange(min=2),
    default=None,
    help="--task multiclass: the number of classes K (default 3).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing dl1 store at DST.")
@storage_options_option
def generate(
    dst: str,
    preset: str,
    seed: int,
    row_multiplier: int,
    task: str,
    n_classes: int | None,
    overwrite: bool,
    storage_options: dict[str, Any] | None,
) -> None:
    """Generate an E2006-like synthetic store at DST, a path or URL (out-of-core)."""
    validate_params(COMMON, {"seed": seed}, "dl1 generate")
    if n_classes is not None and task != "multiclass":
        raise click.UsageError("--n-classes is for --task multiclass")
    check_fresh(dst, overwrite)
    t0 = time.perf_counter()
    with Progress("generate") as progress:
        progress.note(f"writing preset {preset} x{row_multiplier} ({task})")
        store = make_e2006_like(
            located(dst, storage_options),
            preset=preset,
            seed=seed,
            row_multiplier=row_multiplier,
            task=task,
            overwrite=overwrite,
            **({"n_classes": n_classes} if task == "multiclass" else {}),
        )
        dt = time.perf_counter() - t0
        progress.note(f"written in {dt:.1f} s")
    output().say(f"generated in {dt:.1f} s")
    _report(store, dt, "generate")


@cli.command()
@command_options
@click.argument("src")
@click.argument("dst", required=False)
@click.option(
    "--add-csr",
    is_flag=True,
    help="SRC is a store: add CSR copies of its blocks (for the sample-wise solvers), out "
    "of core; no DST.",
)
@click.option(
    "--zero-based",
    type=click.Choice(["auto", "true", "false"]),
    default="auto",
    show_default=True,
    help="Index base of the svmlight file.",
)
@click.option(
    "--n-features",
    type=click.IntRange(min=1),
    default=None,
    help="Number of features (default: the largest index seen, refused above max(2**24, "
    "16 x nonzeros) columns).",
)
@click.option(
    "--dtype", type=click.Choice(["float64", "float32"]), default="float64", show_default=True
)
@click.option(
    "--formats",
    default="csc",
    show_default=True,
    help="Comma-separated block formats to store: csc, csr or csc,csr.",
)
@click.option(
    "--block-nnz", type=click.IntRange(min=1), default=None, help="Target nonzeros per block."
)
@click.option("--overwrite", is_flag=True, help="Replace an existing dl1 store at DST.")
@storage_options_option
def convert(
    src: str,
    dst: str | None,
    add_csr: bool,
    zero_based: str,
    n_features: int | None,
    dtype: str,
    formats: str,
    block_nnz: int | None,
    overwrite: bool,
    storage_options: dict[str, Any] | None,
) -> None:
    """Convert an svmlight/libsvm file (plain, .gz or .bz2) SRC into a store at DST (a path
    or URL), or (--add-csr) add CSR blocks to the store SRC."""
    if add_csr:
        _add_csr(src, dst, storage_options)
        return
    if dst is None or (not is_url(src) and Path(src).is_dir()):
        raise click.UsageError("convert needs an svmlight file SRC and a DST (or --add-csr)")
    if not is_url(src) and not Path(src).is_file():
        raise FileNotFoundError(f"no svmlight file {src}")
    check_fresh(dst, overwrite)
    zb: bool | str = {"auto": "auto", "true": True, "false": False}[zero_based]
    kw = {} if block_nnz is None else {"block_nnz": block_nnz}
    t0 = time.perf_counter()
    with Progress("convert") as progress:
        progress.note(f"reading {src}")
        store = from_svmlight(
            src,
            located(dst, storage_options),
            zero_based=zb,
            n_features=n_features,
            dtype=np.dtype(dtype),
            formats=tuple(f.strip() for f in formats.split(",")),
            overwrite=overwrite,
            **kw,
        )
        dt = time.perf_counter() - t0
        progress.note(f"written in {dt:.1f} s")
    if is_url(src):
        output().say(f"converted in {dt:.1f} s")
    else:
        size = os.path.getsize(src)
        output().say(f"converted {size / 1e6:,.1f} MB in {dt:.1f} s ({size / 1e6 / dt:,.1f} MB/s)")
    _report(store, dt, "convert")


def _add_csr(src: str, dst: str | None, storage_options: dict[str, Any] | None) -> None:
    if dst is not None or (not is_url(src) and not Path(src).is_dir()):
        raise click.UsageError("--add-csr takes one argument: the store SRC")
    t0 = time.perf_counter()
    with Progress("convert") as progress:
        progress.note(f"adding CSR blocks to {src}")
        store = add_csr_blocks(located(src, storage_options))
    dt = time.perf_counter() - t0
    output().say(f"CSR blocks added in {dt:.1f} s")
    _report(store, dt, "convert --add-csr")


@cli.command()
@command_options
@click.argument("store")
@storage_options_option
def info(store: str, storage_options: dict[str, Any] | None) -> None:
    """Shape, nnz, density, blocks and column-frequency summary of STORE (a path or URL)."""
    st = open_input(store, storage_options)
    _report(st, 0.0, "info")


def check_fresh(dst: str, overwrite: bool) -> None:
    """A local ``dst`` that exists is refused before any work (unless ``overwrite``; the
    writer then checks that it is a dl1 store)."""
    if not overwrite and not is_url(dst) and os.path.lexists(dst):
        raise FileExistsError(
            f"{dst} already exists; a store is always written into a fresh path (pass "
            "--overwrite to replace an existing dl1 store)"
        )


def check_split(store: Store, split: str | None) -> str:
    """``split`` of ``store`` (default: ``test`` when it has one, else ``train``)."""
    if split is None:
        return "test" if "test" in store.splits else "train"
    if split not in store.splits:
        raise ValidationError(f"{where(store)} has no split {split!r}; it has {store.splits}")
    return split


__all__ = ["check_split", "describe", "is_url", "open_input", "summary"]
