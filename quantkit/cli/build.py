"""`quantkit targets` and `quantkit build`: one checkpoint per hardware target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from quantkit.cli._common import Force, console
from quantkit.errors import CheckFailed


def targets() -> None:
    """List the hardware targets (recipes/targets.yaml): the recipe each gets, why, and its fallbacks."""
    from quantkit.targets import load_targets

    table = Table(title="Hardware targets")
    table.add_column("target", no_wrap=True)
    table.add_column("hardware")
    table.add_column("recipe", no_wrap=True)
    table.add_column("fallbacks")
    chosen = load_targets().targets
    for target in chosen:
        table.add_row(
            target.name,
            ", ".join(target.hardware),
            target.recipe,
            ", ".join(f.recipe for f in target.fallbacks),
        )
    console.print(table)
    for target in chosen:  # the reasons read better as paragraphs than as a narrow column
        console.print(f"[bold]{target.name}[/] -> {target.recipe}: {target.why}")
        for fallback in target.fallbacks:
            console.print(f"    fallback {fallback.recipe}: {fallback.when}")


def build(
    target: Annotated[
        list[str], typer.Option("--target", help="Target name (repeatable); see `quantkit targets`.")
    ],
    model: Annotated[Path, typer.Option(help="The original model folder.")],
    output_root: Annotated[Path, typer.Option(help="Folder for `OUTPUT_ROOT/MODEL-RECIPE/` and build.json.")],
    calib: Annotated[
        Path | None, typer.Option(help="Calibration-set folder (for recipes that need data, and drift).")
    ] = None,
    num_samples: Annotated[
        int | None, typer.Option(help="Stratified subsample of the set for calibration.")
    ] = None,
    vllm: Annotated[bool, typer.Option("--vllm", help="Also load and run each checkpoint in vLLM.")] = False,
    drift_samples: Annotated[int, typer.Option(help="Held-out samples for the drift check.")] = 12,
    force: Force = False,
) -> None:
    """Make one checkpoint per hardware target: quantize with the target's recipe, then verify
    (audit, drift against the original per modality and task, and with --vllm a vLLM run).

    Targets sharing a recipe share a checkpoint; all share one processed-feature cache. A failing
    target does not stop the others; the exit code is 1 if any failed. A re-run skips checkpoints
    whose inputs did not change and that passed (unless --force).

    Example:

        quantkit build --target h20 --target rtx4090 --model models/omni \\
            --calib calib --output-root out
    """
    from quantkit.cli.verify import print_verify_report
    from quantkit.targets import build_checkpoints

    def show(entry, verified) -> None:
        if verified is not None:
            print_verify_report(verified)
        console.print(f"[bold]{', '.join(entry.targets)}[/] -> {entry.checkpoint}: {entry.status}")
        for reason in entry.reasons:
            console.print(f"  [red]{reason}[/]")

    report = build_checkpoints(
        model,
        output_root,
        target,
        calib=calib,
        num_samples=num_samples,
        vllm=vllm,
        drift_samples=drift_samples,
        force=force,
        on_checkpoint=show,
    )
    print_build_summary(report)
    if not report.passed:
        raise CheckFailed("some targets failed", path=Path(output_root) / "build.json")


def print_build_summary(report) -> None:
    table = Table(title="Build summary")
    table.add_column("targets")
    for header in ("recipe", "status", "size", "KL", "top-1", "vLLM", "s"):
        table.add_column(header, no_wrap=True)
    for c in report.checkpoints:
        colour = "green" if c.ok else "red"
        drift = c.drift or {}
        table.add_row(
            ", ".join(c.targets),
            c.recipe,
            f"[{colour}]{c.status}[/]",
            f"{c.size_ratio:.3f}x" if c.size_ratio else "-",
            f"{drift['kl']:.1e}" if "kl" in drift else "-",
            f"{drift['top1']:.3f}" if "top1" in drift else "-",
            c.vllm or "-",
            f"{c.seconds:.0f}",
        )
    console.print(table)
    console.print(f"build.json in {report.output_root}")
