"""`quantkit calibrate`: pool -> calibration-set folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from quantkit.cli._common import Force, OutputDir, Seed, console, err_console


def calibrate(
    pools: Annotated[
        list[Path],
        typer.Argument(
            help="Pool JSONL file(s) in the ms-swift / LLaMA-Factory format (see calibration/POOL_FORMAT.md), "
            "or a `datasets` folder / Parquet file with the same fields.",
            show_default=False,
        ),
    ],
    output: OutputDir,
    size: Annotated[int, typer.Option(help="Samples in the set.")] = 5000,
    taxonomy: Annotated[
        Path | None, typer.Option(help="Task taxonomy YAML (default: calibration/taxonomy.yaml).")
    ] = None,
    seed: Seed = 0,
    model: Annotated[
        Path | None,
        typer.Option(
            help="Model folder: count tokens with its processor and chat template; size images by its rule."
        ),
    ] = None,
    max_seq_len: Annotated[
        int | None, typer.Option(help="Leave out samples longer than this many tokens (needs --model).")
    ] = None,
    min_per_stratum: Annotated[int, typer.Option(help="Floor of samples for every non-empty stratum.")] = 2,
    task_field: Annotated[str, typer.Option(help="Record field holding the task name.")] = "task",
    skip_invalid: Annotated[
        bool,
        typer.Option(
            "--skip-invalid", help="Skip invalid records (counted in the report) instead of failing."
        ),
    ] = False,
    allow_missing_tasks: Annotated[
        bool, typer.Option("--allow-missing-tasks", help="Do not fail when a taxonomy task has no sample.")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Fail when the pool has fewer usable samples than --size.")
    ] = False,
    force: Force = False,
) -> None:
    """Build a calibration set stratified by task sensitivity, modality combination and size bucket.

    Every taxonomy task and every (task, modality, size bucket) stratum present in the pool is
    covered; high-tier tasks (OCR, grounding, temporal grounding) get more samples than low-tier
    ones. The folder holds samples.jsonl (read it with quantkit.calibset.load_calibration_set),
    report.json and report.md.

    Example:

        quantkit calibrate pool/train.jsonl --output calib --model models/omni
    """
    from quantkit.calibset import CalibrateOptions, build_calibration_set

    options = CalibrateOptions(
        size=size,
        seed=seed,
        taxonomy=taxonomy,
        model=model,
        max_seq_len=max_seq_len,
        min_per_stratum=min_per_stratum,
        task_field=task_field,
        skip_invalid=skip_invalid,
        allow_missing_tasks=allow_missing_tasks,
        strict=strict,
        force=force,
    )
    total = sum(p.stat().st_size for p in pools if p.is_file())
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        bar = progress.add_task("reading pool", total=total or None)
        result = build_calibration_set(
            pools,
            output,
            options,
            on_bytes=lambda n: progress.advance(bar, n),
            on_phase=lambda text: progress.update(bar, description=text),
        )
    print_report(result.report)
    for note in result.notes:
        err_console.print(f"[yellow]note:[/] {note}")
    console.print(f"wrote {result.report['size']} samples to {result.output}")


def print_report(report: dict) -> None:
    table = Table("task", "tier", "weight", "pool", "selected", "share", title="Calibration set by task")
    for row in report["tasks"]:
        table.add_row(
            row["name"],
            row["tier"],
            f"{row['weight']:g}",
            str(row["pool"]),
            str(row["selected"]),
            f"{row['share']:.1%}",
        )
    console.print(table)
    for key, title in (("modalities", "modality"), ("buckets", "size bucket")):
        sub = Table(title, "pool", "selected", "share")
        for row in report[key]:
            sub.add_row(row["name"], str(row["pool"]), str(row["selected"]), f"{row['share']:.1%}")
        console.print(sub)
    cov = report["coverage"]
    console.print(
        f"coverage: {cov['tasks_selected']}/{cov['tasks_in_taxonomy']} tasks, "
        f"{cov['strata_selected']}/{cov['strata_in_pool']} strata; duplicates dropped {report['duplicates_dropped']}; "
        f"skipped {report['skipped']['count']}"
    )
    if report["tokens"]:
        t = report["tokens"]
        console.print(f"tokens per sample: min {t['min']}, p50 {t['p50']}, p95 {t['p95']}, max {t['max']}")
