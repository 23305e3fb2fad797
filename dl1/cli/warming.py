"""``dl1 warm``: compile every kernel into numba's cache once per installation
(:mod:`dl1.warming`), so that later processes and workers start fitting in seconds."""

from __future__ import annotations

import time

from dl1.cli.app import cli, command_options, output
from dl1.warming import warm_all


@cli.command()
@command_options
def warm() -> None:
    """Compile dl1's kernels into numba's cache (once after installing; the first fit of
    every later process then loads them instead of compiling them)."""
    o = output()
    t0 = time.perf_counter()
    stages = warm_all()
    total = time.perf_counter() - t0
    o.say(f"kernels compiled or loaded in {total:.1f} s")
    o.result["seconds"] = round(total, 3)
    o.result["stages"] = {k: round(v, 3) for k, v in stages.items()}
