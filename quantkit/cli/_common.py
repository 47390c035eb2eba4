"""What every command shares: consoles, the error report, and reusable option types."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from quantkit.errors import CheckFailed, QuantkitError, shorten

console = Console()
err_console = Console(stderr=True)


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
