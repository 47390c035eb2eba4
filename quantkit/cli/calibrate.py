"""`quantkit calibrate`: pool -> calibration-set folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from quantkit import terminal
from quantkit.cli._common import Force, Seed, console, err_console
from quantkit.errors import InputError

PoolsArgument = Annotated[
    list[Path],
    typer.Argument(
        help="Your training data as it is (docs/formats.md lists every format): JSONL, JSON or CSV "
        "files in the ms-swift / LLaMA-Factory / ShareGPT / alpaca / OpenAI / LLaVA / TRL / ... "
        "formats, a LLaMA-Factory data folder (with dataset_info.json) or training config (YAML), "
        "an InternVL meta file, "
        "Parquet, a save_to_disk folder or a Hub-layout folder.",
        show_default=False,
    ),
]
OutputOption = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="Folder to write (atomically); not needed with --dry-run."),
]
SizeOption = Annotated[int, typer.Option(min=1, help="Samples in the set.")]
TaxonomyOption = Annotated[
    Path | None, typer.Option(help="Task taxonomy YAML (default: calibration/taxonomy.yaml).")
]
ModelOption = Annotated[
    Path | None,
    typer.Option(
        help="Model folder: count tokens with its processor and chat template; size images by its rule."
    ),
]
MaxSeqLenOption = Annotated[
    int | None,
    typer.Option(min=1, help="Leave out samples longer than this many tokens (needs --model)."),
]
MinPerStratumOption = Annotated[
    int, typer.Option(min=0, help="Floor of samples for every non-empty stratum.")
]
TaskFieldOption = Annotated[str, typer.Option(help="Record field holding the task name.")]
SkipInvalidOption = Annotated[
    bool,
    typer.Option("--skip-invalid", help="Skip invalid records (counted in the report) instead of failing."),
]
AllowMissingTasksOption = Annotated[
    bool, typer.Option("--allow-missing-tasks", help="Do not fail when a taxonomy task has no sample.")
]
StrictOption = Annotated[
    bool, typer.Option("--strict", help="Fail when the pool has fewer usable samples than --size.")
]
DatasetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--dataset",
        help="LLaMA-Factory dataset names (comma-separated or repeated), as its `dataset:` option "
        "takes them; default: every entry of dataset_info.json whose file exists.",
    ),
]
SplitOption = Annotated[
    str | None, typer.Option(help="Split of a DatasetDict or Hub-layout folder (default: train).")
]
MediaRootOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--media-root",
        help="Folder media may lie in besides the pool's own (repeatable); absolute media paths must "
        "lie inside one, symlinks included.",
    ),
]
TaskOption = Annotated[
    list[str] | None,
    typer.Option(
        "--task",
        help="SOURCE=TASK (repeatable): the task of the records of a pool file, a glob or a "
        "LLaMA-Factory dataset name that carry no task field.",
    ),
]
DefaultTaskOption = Annotated[
    list[str] | None,
    typer.Option(
        help="MODALITY=TASK (repeatable): the task of the MODALITY records (image, multi-image, "
        "video, video+audio, audio, image+audio, text...) nothing else assigns one to; a plain TASK "
        "takes every modality its taxonomy entry lists. A task never takes a modality it does not list.",
    ),
]
VerifyMediaOption = Annotated[
    str,
    typer.Option(
        help="Media kinds checked to decode to their end (image, video, audio, comma-separated; "
        "all; none), so a cut file fails here and not in quantize.",
    ),
]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Processes a JSONL file or JSON array is read in, each taking a part of it; the set is the same for "
        "any number. Default: one per CPU core, for files of 16 MB and more.",
        show_default=False,
    ),
]
IgnoreFieldOption = Annotated[
    list[str] | None,
    typer.Option(
        "--ignore-field",
        help="A record field to leave out although it holds media (repeatable): without it, media "
        "in a field the reader does not use are an error. Unused fields are listed per source.",
    ),
]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run", help="Read and validate everything, print the per-source table, write nothing."
    ),
]


def calibrate(
    pools: PoolsArgument,
    output: OutputOption = None,
    size: SizeOption = 5000,
    taxonomy: TaxonomyOption = None,
    seed: Seed = 0,
    model: ModelOption = None,
    max_seq_len: MaxSeqLenOption = None,
    min_per_stratum: MinPerStratumOption = 2,
    task_field: TaskFieldOption = "task",
    skip_invalid: SkipInvalidOption = False,
    allow_missing_tasks: AllowMissingTasksOption = False,
    strict: StrictOption = False,
    force: Force = False,
    dataset: DatasetOption = None,
    split: SplitOption = None,
    media_root: MediaRootOption = None,
    task: TaskOption = None,
    default_task: DefaultTaskOption = None,
    verify_media: VerifyMediaOption = "image,audio",
    workers: WorkersOption = None,
    ignore_field: IgnoreFieldOption = None,
    dry_run: DryRunOption = False,
) -> None:
    """Build a calibration set stratified by task sensitivity, modality combination and size bucket.

    Every taxonomy task and every (task, modality, size bucket) stratum present in the pool is
    covered; high-tier tasks (OCR, grounding, temporal grounding) get more samples than low-tier
    ones. The folder holds samples.jsonl (read it with quantkit.calibset.load_calibration_set),
    report.json and report.md.

    Examples:

        quantkit calibrate pool/train.jsonl --output calib --model models/omni
        quantkit calibrate data/ --dataset mllm_demo --task mllm_demo=ocr -o calib
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
        media_roots=tuple(media_root or ()),
        datasets=tuple(n.strip() for names in dataset or () for n in names.split(",") if n.strip()),
        split=split,
        verify_media=_media_kinds(verify_media),
        task_mappings=tuple(task or ()),
        default_task=tuple(default_task or ()),
        workers=workers,
        ignore_fields=tuple(ignore_field or ()),
        dry_run=dry_run,
    )
    total = sum(p.stat().st_size for p in pools if p.is_file())
    with terminal.progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(), transient=True
    ) as progress:
        bar = progress.add_task("reading pool", total=total or None)
        advance = _Advance(progress, bar)

        def on_phase(text: str) -> None:
            advance.flush()
            progress.update(bar, description=text)

        result = build_calibration_set(pools, output, options, on_bytes=advance, on_phase=on_phase)
        advance.flush()
    if dry_run:
        print_sources(result.report)
        for note in result.notes:
            err_console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
        if result.error is not None:
            raise result.error
        console.print(f"dry run: {result.report['pool_records']} usable records; nothing written")
        return
    print_report(result.report)
    for note in result.notes:
        err_console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
    console.print(f"wrote {result.report['size']} samples to {result.output}")


class _Advance:
    """``progress.advance`` in steps of at least ``step`` bytes. The reader reports every record;
    rich takes a lock and reads the clock per call, which on a pool of small records cost about a
    tenth of the whole command (the bar redraws ten times a second either way)."""

    def __init__(self, progress: Progress, bar, step: int = 1 << 20) -> None:
        self.progress, self.bar, self.step, self.pending = progress, bar, step, 0

    def __call__(self, n: int) -> None:
        self.pending += n
        if self.pending >= self.step:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.progress.advance(self.bar, self.pending)
            self.pending = 0


def _media_kinds(text: str) -> tuple[str, ...]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if words == ["all"]:
        return ("image", "video", "audio")
    if words in (["none"], []):
        return ()
    bad = [w for w in words if w not in ("image", "video", "audio")]
    if bad:
        raise InputError(
            f"--verify-media: unknown media kind {bad[0]!r}", hint="use image, video, audio, all or none"
        )
    return tuple(words)


def _cells(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


def print_sources(report: dict) -> None:
    """The per-source table of a dry run (and the skipped records by reason)."""
    from quantkit.pool.record import ignored_text

    table = Table(title="Sources")
    table.add_column("source", no_wrap=True)
    for name in ("format", "records", "skipped", "tasks by origin", "modalities"):
        table.add_column(name, overflow="fold")
    for row in report["sources"]:
        table.add_row(
            row["name"], row["format"], str(row["records"]), _cells(row["skipped"]),
            _cells(row["task_origins"]), _cells(row["modalities"]),
        )  # fmt: skip
    console.print(table)
    for row in report["sources"]:  # a line each, whole: field names are what --ignore-field takes
        if row["ignored"]:
            console.print(f"{row['name']}: ignored: {ignored_text(row['ignored'])}", soft_wrap=True, markup=False)
    skipped = report["skipped"]
    if skipped["count"]:
        console.print(f"Skipped records ({skipped['count']}), by reason: {_cells(skipped['by_kind'])}")
        for item in skipped["records"]:  # one a line, whole, so a path can be copied
            console.print(f"  {item['source']}:{item['line']}: {item['reason']}", soft_wrap=True, markup=False)
        if skipped["count"] > len(skipped["records"]):
            console.print(f"  ... and {skipped['count'] - len(skipped['records'])} more")


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
