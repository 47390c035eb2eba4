"""`quantkit eval`: the same lm-evaluation-harness tasks on the original and each checkpoint."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Column, Table

from quantkit.cli._common import console, err_console
from quantkit.errors import CheckFailed
from quantkit.eval.gate import DEFAULT_MAX_LOSS


class Backend(StrEnum):
    hf = "hf"
    vllm = "vllm"


def eval_command(
    original: Annotated[
        Path, typer.Argument(help="The original (unquantized) model folder.", show_default=False)
    ],
    checkpoints: Annotated[
        list[Path], typer.Argument(help="One or more quantized checkpoint folders.", show_default=False)
    ],
    tasks: Annotated[
        list[str],
        typer.Option(
            "--tasks",
            "-t",
            help="Harness task, group or tag names, comma-separated or repeated. Offline: "
            "quantkit_prose (all three), quantkit_prose_ppl, quantkit_prose_next_sentence, "
            "quantkit_prose_last_word, or your own YAMLs via --include-path. `skills` alone: per-task "
            "accuracy of tiny-omni-skills (its skills.json), --limit items per task (default 32).",
            show_default=False,
        ),
    ],
    limit: Annotated[
        int | None, typer.Option(min=1, help="At most this many documents per task (quick checks).")
    ] = None,
    backend: Annotated[
        Backend,
        typer.Option(
            help="hf: transformers in this environment. vllm: the harness's vLLM backend in the vLLM "
            "environment (needs lm_eval installed there; quantkit does not install it)."
        ),
    ] = Backend.hf,
    include_path: Annotated[
        list[Path] | None,
        typer.Option("--include-path", help="Extra folder of harness task YAMLs (repeatable)."),
    ] = None,
    max_loss: Annotated[
        float, typer.Option(min=0.0, help="Allowed loss per metric, in percent of the original's score.")
    ] = DEFAULT_MAX_LOSS,
    batch_size: Annotated[int, typer.Option(min=1, help="Harness batch size.")] = 1,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where task data is generated (default: $QUANTKIT_CACHE/eval, else ~/.cache/quantkit/eval)."
        ),
    ] = None,
) -> None:
    """Run harness tasks on the original and each checkpoint and print the recovery of every metric.

    Recovery is quantized / original where higher is better (accuracy) and original / quantized
    where lower is better (perplexity, bits per byte), as the harness says per metric. A checkpoint
    passes when no metric loses more than --max-loss percent. Results go to eval.json beside each
    checkpoint and into an "Evaluation" section of its README.md (replaced on a rerun).

    Text tasks only: on Omni / VL checkpoints they run on the language model (the thinker). For
    image, video and audio fidelity use `quantkit verify CKPT --reference ORIG --calib SET`, which
    measures drift per modality and task stratum (lmms-eval cannot score these models offline).

    Exit code 0 when every checkpoint is within the allowed loss, 1 when one is not, 2 for bad
    input (unknown task, missing folder, backend not available).

    Example:

        quantkit eval models/base out/base-fp8 out/base-w8a8 --tasks quantkit_prose
    """
    if [t for spec in tasks for t in spec.split(",")] == ["skills"]:
        _skills(original, checkpoints, limit=limit, max_loss=max_loss)
        return
    from quantkit.eval import evaluate_checkpoints

    report = evaluate_checkpoints(
        original,
        checkpoints,
        tasks,
        limit=limit,
        backend=backend.value,
        include_paths=include_path or [],
        max_loss=max_loss,
        batch_size=batch_size,
        cache_dir=cache_dir,
        log=lambda message: err_console.print(f"[dim]evaluating {message}[/]"),
    )
    print_eval_report(report)
    if not report.passed:
        names = ", ".join(str(c.checkpoint) for c in report.failed)
        raise CheckFailed(
            f"loss beyond {report.max_loss}% (or no result) on {names}",
            hint="see the table above and eval.json",
        )


def _skills(original: Path, checkpoints: list[Path], *, limit: int | None, max_loss: float) -> None:
    """--tasks skills: per-task accuracy of a tiny-omni-skills model (quantkit.eval.skills)."""
    from quantkit.eval.skills import evaluate_skills

    report = evaluate_skills(
        original,
        checkpoints,
        items=limit or 32,
        max_loss=max_loss,
        log=lambda message: err_console.print(f"[dim]scored {message}[/]"),
    )
    # one column per checkpoint, score and recovery in one cell: the demo compares six side by side
    columns = [Column(name, overflow="fold") for name in ("group", "task", "metric", "original")]
    columns += checkpoint_headers([Path(r.model_dir) for r in report.checkpoints])
    title = (
        f"Per-task accuracy and recovery, {report.items} held-out items per task (allowed loss {max_loss}%)"
    )
    table = Table(*columns, title=title)
    for row in report.rows():
        cells = [row["group"], row["task"], row["metric"], f"{row['original']:.3f}"]
        for result, cell in zip(report.checkpoints, row["checkpoints"], strict=True):
            rec = cell["recovery_pct"]
            ok = report.task_within(result, row["task"])
            colour = "green" if ok else "red"
            cells.append(f"{cell['score']:.3f} [{colour}]{'n/a' if rec is None else f'{rec:.1f}%'}[/]")
        table.add_row(*cells)
    console.print(table)
    for index, result in enumerate(report.checkpoints, 1):
        console.print(f"#{index} {result.model_dir}", soft_wrap=True)
    if not report.passed:
        names = ", ".join(c.model_dir for c in report.checkpoints if not report.within(c))
        raise CheckFailed(f"a task lost more than {max_loss}% on {names}", hint="see the table above and eval.json")


def checkpoint_headers(checkpoints: list[Path]) -> list[Column]:
    """One column header per checkpoint: ``#N`` and its recipe (quantkit.json), which tells columns
    apart where folder names share a long prefix; the folder's name is added where two checkpoints
    share a recipe. Folded, never cut, when the terminal is narrow; ``#N`` is the line under the
    table that gives the checkpoint's path."""
    from quantkit.export.metadata import checkpoint_label  # torch is loaded by the scoring already

    labels = [checkpoint_label(path) for path in checkpoints]
    headers = []
    for index, (path, label) in enumerate(zip(checkpoints, labels, strict=True), 1):
        if labels.count(label) > 1 and label != path.name:
            label = f"{label} ({path.name})"
        header = f"#{index} {label}"
        headers.append(Column(header, overflow="fold", min_width=min(len(header), 16)))
    return headers


def _fmt(value: float | None) -> str:
    from quantkit.eval.report import fmt

    return fmt(value)


def print_eval_report(report) -> None:
    columns = [Column("task", overflow="fold"), Column("metric", overflow="fold"), "original"]
    for header in checkpoint_headers([result.checkpoint for result in report.checkpoints]):
        columns += [header, Column("recovery", no_wrap=True)]
    table = Table(
        *columns, title=f"Recovery vs {report.original.model_dir} (allowed loss {report.max_loss}%)"
    )
    by_key = [{(r.task, r.metric, r.filter): r for r in result.rows} for result in report.checkpoints]
    keys = list(dict.fromkeys(key for rows in by_key for key in rows))
    for key in keys:
        row = next(rows[key] for rows in by_key if key in rows)
        cells = [row.task, f"{row.label} {'↑' if row.higher_is_better else '↓'}", _fmt(row.original)]
        for rows in by_key:
            match = rows.get(key)
            if match is None:
                cells += ["-", "-"]
                continue
            recovery = "n/a" if match.recovery_pct is None else f"{match.recovery_pct:.2f}%"
            colour = "green" if match.within else "red"
            cells += [_fmt(match.quantized), f"[{colour}]{recovery} {'ok' if match.within else 'LOSS'}[/]"]
        table.add_row(*cells)
    console.print(table)
    for index, result in enumerate(report.checkpoints, 1):
        where = f" -> {result.eval_json}" if result.eval_json else ""
        if result.error is not None:
            console.print(f"#{index} {result.checkpoint}: [red]did not run[/]: {result.error}{where}")
            continue
        verdict = "[green]within[/]" if result.passed else "[red]beyond[/]"
        console.print(
            f"#{index} {result.checkpoint}: {verdict} the allowed loss "
            f"({result.run.seconds:.0f} s, {result.run.dtype}){where}"
        )
    console.print(
        f"original: {report.original.seconds:.0f} s, {report.original.dtype}; "
        f"lm_eval {report.harness.get('lm_eval')}, {report.backend} backend"
    )
