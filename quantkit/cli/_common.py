"""What every command shares: consoles, the error report, and reusable option types."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from quantkit.errors import QuantkitError

console = Console()
err_console = Console(stderr=True)


def report_error(error: QuantkitError) -> None:
    """The one place that turns a QuantkitError into what the user reads."""
    where = error.location()
    prefix = "error" if error.exit_code == 2 else "check failed"
    head = f"[bold red]{prefix}:[/] "
    if where:
        head += f"[bold]{escape(where)}[/]: "
    err_console.print(head + escape(error.message), soft_wrap=True)
    if error.hint:
        err_console.print(f"  [yellow]hint:[/] {escape(error.hint)}", soft_wrap=True)


class QuantkitGroup(TyperGroup):
    """Root command group: every QuantkitError raised below it becomes a message and an exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except QuantkitError as error:
            report_error(error)
            raise typer.Exit(error.exit_code) from None


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
