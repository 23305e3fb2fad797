"""The command group, its error handling and its output: human text, or one JSON document.

An error ends a command with one line on stderr, ``dl1: error: <message>``, and an exit
status: :data:`EXIT_USAGE` (2) when the input is wrong (options, files, a path that is not a
usable dl1 store or model), :data:`EXIT_ERROR` (1) for anything else (a cluster that cannot
be reached, a destination that exists, a bug). ``--debug`` prints the traceback as well.
With ``--json`` the error is also the JSON document on stdout.
"""

from __future__ import annotations

import json
import math
import traceback
from typing import Any

import click
import numpy as np

from dl1.errors import (
    Dl1Error,
    IncompleteStoreError,
    ModelFileError,
    StoreCorruptError,
    ValidationError,
)

#: Exit status of a usage or validation error (the input is wrong; click's own usage
#: errors exit with 2 too) and of any other error.
EXIT_USAGE, EXIT_ERROR = 2, 1

#: Errors meaning "the input given is wrong": options, files, stores and models.
INPUT_ERRORS = (
    ValidationError,
    IncompleteStoreError,
    StoreCorruptError,
    ModelFileError,
    FileNotFoundError,
    NotADirectoryError,
)


def exit_status(error: BaseException) -> int:
    """:data:`EXIT_USAGE` for invalid input (options, data, files), else :data:`EXIT_ERROR`."""
    return EXIT_USAGE if isinstance(error, INPUT_ERRORS) else EXIT_ERROR


def message(error: BaseException) -> str:
    """The error on one line: dl1's own errors say what and where already; others (a
    connection refused, a bug) are prefixed with their type."""
    text = " ".join(str(error).split()) or repr(error)
    if not isinstance(error, (Dl1Error, OSError)):
        text = f"{type(error).__name__}: {text}"
    return text


def one_line(error: BaseException) -> str:
    """``dl1: error: <message>`` (see :func:`message`)."""
    return f"dl1: error: {message(error)}"


def _jsonable(x: Any) -> Any:
    """``x`` with numpy scalars / arrays as Python values and non-finite floats as None
    (JSON has no NaN)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


class Output:
    """Where a command writes: human text on stdout (on stderr under ``--json``), and the
    result, a JSON document printed once on stdout under ``--json``."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.result: dict[str, Any] = {}

    def say(self, text: str) -> None:
        """A line (or lines) of human text."""
        click.echo(text, err=self.as_json)

    def emit(self) -> None:
        """The JSON document (``--json`` only), ``"ok": true`` and the result."""
        if self.as_json:
            click.echo(json.dumps(_jsonable({"ok": True, **self.result}), allow_nan=False))


def output() -> Output:
    """The current command's :class:`Output` (made on first use)."""
    ctx = click.get_current_context()
    out = ctx.meta.get("dl1.output")
    if out is None:
        out = ctx.meta["dl1.output"] = Output(bool(ctx.meta.get("dl1.json")))
    return out


def _wants_json(ctx: click.Context) -> bool:
    """``--json`` was given (parsed, or still among the arguments of a failed parse)."""
    unparsed = [*getattr(ctx, "_protected_args", ()), *ctx.args]  # the command and its args
    return bool(ctx.meta.get("dl1.json")) or "--json" in unparsed


def _json_error(status: int, text: str) -> None:
    doc = {"ok": False, "exit_status": status, "error": text}
    click.echo(json.dumps(doc))


class Dl1Group(click.Group):
    """The command group: an exception of a command becomes :func:`one_line` on stderr and
    :func:`exit_status`, with the traceback only under ``--debug``; under ``--json`` it is
    also the JSON document on stdout."""

    def invoke(self, ctx: click.Context):
        try:
            result = super().invoke(ctx)
        except click.exceptions.ClickException as e:
            if _wants_json(ctx):
                _json_error(e.exit_code, e.format_message())
            raise
        except (click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - every error of a command ends here
            if ctx.meta.get("dl1.debug"):
                traceback.print_exc()
            status = exit_status(e)
            click.echo(one_line(e), err=True)
            if _wants_json(ctx):
                _json_error(status, message(e))
            ctx.exit(status)
        out = ctx.meta.get("dl1.output")
        if out is not None:
            out.emit()
        elif ctx.meta.get("dl1.json"):
            Output(True).emit()
        return result


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta["dl1.debug"] = True  # meta is shared by the group's and commands' contexts


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta["dl1.json"] = True


def debug_option(f):
    """``--debug``: print the traceback of an error (accepted before or after the command)."""
    return click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_debug,
        help="Print the full traceback of an error.",
    )(f)


def json_option(f):
    """``--json``: one JSON document on stdout (the result), human text on stderr."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_json,
        help="Print one JSON document on stdout (the result, or the error); human text "
        "goes to stderr.",
    )(f)


def command_options(f):
    """The options of every command: ``--debug`` and ``--json``."""
    return debug_option(json_option(f))


@click.group(cls=Dl1Group)
@click.version_option(package_name="dl1")
@debug_option
def cli() -> None:
    """dl1: L1 / elastic-net models on sparse data larger than memory, on Dask."""


def main() -> None:
    """Entry point: errors become one line and an exit status (see :class:`Dl1Group`)."""
    cli(standalone_mode=True)
