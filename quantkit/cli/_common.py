"""What every command shares: consoles, the error report, the library log, reusable option types."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from quantkit import terminal
from quantkit.errors import CheckFailed, QuantkitError, shorten

console = terminal.console
err_console = terminal.err_console


def report_error(error: QuantkitError) -> None:
    """The one place that turns a QuantkitError into what the user reads; each part shortened
    (errors.shorten), however much user data it quotes."""
    where = error.location()
    prefix = "error" if error.exit_code == 2 else "check failed"
    head = f"[bold red]{prefix}:[/] "
    if where:
        head += f"[bold]{escape(shorten(where))}[/]: "
    err_console.print(head + escape(shorten(error.message)), soft_wrap=True)
    if error.hint:
        err_console.print(f"  [yellow]hint:[/] {escape(shorten(error.hint))}", soft_wrap=True)


class NoteHandler(logging.Handler):
    """quantkit's own log warnings (a stale staging folder removed, ...) as notes on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        err_console.print(f"[yellow]note:[/] {escape(shorten(record.getMessage()))}", soft_wrap=True)


def _show_notes() -> None:
    logger = logging.getLogger("quantkit")
    if not any(isinstance(h, NoteHandler) for h in logger.handlers):
        logger.addHandler(NoteHandler(logging.INFO))
        logger.setLevel(logging.INFO)
        logger.propagate = False


# The commands that run other libraries (the listings do not; "build" is also `zoo build`): their
# output goes to quantkit.log in the folder that holds what the command writes, the first of these
# parameters it was given (eval's and verify's results go into the checkpoint folders); else the
# current folder.
LOGGED_COMMANDS = {"calibrate", "quantize", "build", "verify", "eval", "sensitivity", "demo-pool"}
WRITES_TO = ("report_path", "output_root", "output", "checkpoint", "checkpoints")


def library_log(params: dict[str, Any]) -> Path:
    for name in WRITES_TO:
        value = params.get(name)
        if isinstance(value, list | tuple):
            value = value[0] if value else None
        if value is not None:
            return Path(value).absolute().parent / terminal.LOG_NAME
    return Path.cwd() / terminal.LOG_NAME


Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help=f"Stream other libraries' logs, warnings and progress bars here instead of into "
        f"{terminal.LOG_NAME} (as {terminal.VERBOSE_ENV}=1 does).",
    ),
]


def with_verbose(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with the ``-v/--verbose`` option every command has (QuantkitCommand reads it)."""
    signature = inspect.signature(function, eval_str=True)

    @functools.wraps(function)
    def command(*args: Any, verbose: bool = False, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    option = inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Verbose)
    command.__signature__ = signature.replace(parameters=[*signature.parameters.values(), option])
    return command


class QuantkitCommand(TyperCommand):
    """A command (its function wrapped by with_verbose) that, when in LOGGED_COMMANDS, runs with
    other libraries' output in its quantkit.log unless verbose (quantkit.terminal)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["quantkit.argv"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        asked = ctx.params.pop("verbose", False)
        previous = os.environ.get(terminal.VERBOSE_ENV)
        if asked:  # in the environment, so that the processes the command starts stream too
            os.environ[terminal.VERBOSE_ENV] = "1"
        try:
            if self.name not in LOGGED_COMMANDS or terminal.verbose():
                return super().invoke(ctx)
            names, parent = [], ctx
            while parent.parent is not None:  # the command's names under the root ("zoo build")
                names.insert(0, parent.info_name)
                parent = parent.parent
            line = shlex.join(["quantkit", *names, *ctx.meta.get("quantkit.argv", [])])
            with terminal.library_output_to(library_log(ctx.params), line):
                return super().invoke(ctx)
        finally:
            if asked:
                if previous is None:
                    os.environ.pop(terminal.VERBOSE_ENV, None)
                else:
                    os.environ[terminal.VERBOSE_ENV] = previous


class QuantkitGroup(TyperGroup):
    """Root command group: every QuantkitError raised below it becomes a message and an exit code;
    so does an OSError (a disk that fails or fills up under a running command): exit 1."""

    def invoke(self, ctx: Any) -> Any:
        _show_notes()
        try:
            return super().invoke(ctx)
        except QuantkitError as error:
            report_error(error)
            raise typer.Exit(error.exit_code) from None
        except BrokenPipeError:
            raise  # the reader went away (| head): nothing to report
        except OSError as error:
            report_error(
                CheckFailed(
                    error.strerror or str(error),
                    path=error.filename,
                    hint="a file-system error while working; nothing half-written is left as a result",
                )
            )
            raise typer.Exit(1) from None


Force = Annotated[bool, typer.Option("--force", help="Replace the output if it exists.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives byte-identical output.")]
OutputDir = Annotated[Path, typer.Option("--output", "-o", help="Folder to write (atomically).")]
AdapterFile = Annotated[
    Path | None,
    typer.Option(
        "--adapter",
        help="Adapter YAML for an architecture quantkit has none for (recipes/adapters/README.md).",
    ),
]
FeatureCache = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        help="Processed-feature cache (default: $QUANTKIT_CACHE/features or ~/.cache/quantkit/features).",
    ),
]
SubsampleSeed = Annotated[int, typer.Option("--seed", help="Seed of the --num-samples subsample.")]
