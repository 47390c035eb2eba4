"""`quantkit targets` and `quantkit build`: one checkpoint per hardware target."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from quantkit.build.heldout import DEFAULT_EVAL_ITEMS
from quantkit.build.judge import below_floor_note, budget_text, step_interval
from quantkit.build.record import DRIFT_LIMITS, LOSS_DEFINITION
from quantkit.cli._common import Force, console
from quantkit.errors import CheckFailed
from quantkit.eval.gate import DECISION

DriftSamples = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Without --num-samples: rows of the set held out of calibration for the gate "
        "(default and at most: a quarter of the set).",
    ),
]
MaxLoss = Annotated[
    float | None,
    typer.Option(
        "--max-loss",
        help="The most any task may lose (default: each target's max_loss in targets.yaml): "
        "percentage points of answer-token accuracy for the drift loss, percent of the original's "
        "score (100% - recovery) for --eval-tasks. Loss: " + LOSS_DEFINITION,
    ),
]
EvalTasks = Annotated[
    str | None,
    typer.Option(
        "--eval-tasks",
        help="Comma-separated skills tasks of the model's skills.json (or `skills`: all) scored "
        "on each candidate as `quantkit eval --tasks skills` does; their loss counts too.",
    ),
]
GateItems = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Items per task the gate judges on: at most this many held-out rows of the set "
        f"(default: all of them), and this many items of each --eval-tasks task (default "
        f"{DEFAULT_EVAL_ITEMS}).",
    ),
]
DriftLimitsMode = StrEnum("DriftLimitsMode", {name: name for name in DRIFT_LIMITS})
DriftLimits = Annotated[
    DriftLimitsMode,
    typer.Option(
        "--drift-limits",
        help="recipe: " + DRIFT_LIMITS["recipe"] + ". report: " + DRIFT_LIMITS["report"] + ".",
    ),
]
AcceptUnresolved = Annotated[
    bool,
    typer.Option(
        "--accept-unresolved",
        help="Keep a candidate whose tasks are within the budget or unresolved (an interval "
        "that holds the budget), with a warning in build.json, the summary and the card.",
    ),
]


def targets() -> None:
    """List the hardware targets (recipes/targets.yaml): the recipe each gets, why, and its fallbacks."""
    from quantkit.build import load_targets

    table = Table(title="Hardware targets")
    table.add_column("target", no_wrap=True)
    table.add_column("hardware")
    table.add_column("recipe", no_wrap=True)
    table.add_column("max loss (pts; % for eval tasks)", no_wrap=True)
    table.add_column("avg bits steps", no_wrap=True)
    table.add_column("fallbacks", min_width=12)  # recipe names whole, one a line
    chosen = load_targets().targets
    for target in chosen:
        table.add_row(
            target.name,
            ", ".join(target.hardware),
            target.recipe,
            f"{target.max_loss}",
            ", ".join(f"{b:g}" for b in target.avg_bits) or "-",
            "\n".join(f.recipe for f in target.fallbacks),
        )
    console.print(table)
    for target in chosen:  # the reasons read better as paragraphs than as a narrow column
        console.print(f"[bold]{target.name}[/] -> {target.recipe}: {target.why}")
        for fallback in target.fallbacks:
            console.print(f"    fallback {fallback.recipe} (when {fallback.when.describe()}): {fallback.why}")


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
        int | None, typer.Option(min=1, help="Stratified subsample of the set for calibration.")
    ] = None,
    vllm: Annotated[bool, typer.Option("--vllm", help="Also load and run each checkpoint in vLLM.")] = False,
    drift_samples: DriftSamples = None,
    max_loss: MaxLoss = None,
    eval_tasks: EvalTasks = None,
    gate_items: GateItems = None,
    accept_unresolved: AcceptUnresolved = False,
    drift_limits: DriftLimits = DriftLimitsMode.recipe,
    targets_file: Annotated[
        Path | None, typer.Option(help="Your own targets file (default: recipes/targets.yaml).")
    ] = None,
    force: Force = False,
) -> None:
    """Make one checkpoint per hardware target: quantize with the target's recipe, verify it
    (audit, drift against the original per modality and task, and with --vllm a vLLM run), and
    gate it on accuracy: when a task loses more than --max-loss (or the checkpoint fails its
    checks), try the recipe at the target's avg_bits steps (most sensitive layers at 8 bits) and
    its fallbacks whose `when` holds, smallest first by the checkpoint size quantize's plan
    predicts from the config (equal sizes in targets.yaml's order), and keep the first that
    passes every task: the smallest passing candidate; larger ones are not built.

    DECISION

    Targets sharing a candidate share its checkpoint; all share one processed-feature cache. A
    target none of whose candidates passes fails with the table of every candidate tried; the
    others still build; the exit code is 1 if any failed. A candidate a library error stops is a
    failed candidate (the error's type and message here, its traceback in build.json) and the
    chain goes on. A re-run reuses candidates whose inputs did not change and that passed their
    checks (unless --force); build.json keeps the targets earlier runs built into the same
    --output-root (a target built again replaces its own record), and each candidate's card says
    which targets keep it now. The gate costs nothing when the
    target's recipe passes (its losses come from the drift check verify runs anyway); each further
    candidate costs one quantize and verify (and --eval-tasks one scoring per candidate).

    Example:

        quantkit build --target h20 --target rtx4090 --model models/omni \\
            --calib calib --output-root out

        quantkit build --target rtx4090 --model models/omni --calib calib \\
            --output-root out --max-loss 1.0 --eval-tasks caption,speaker_count
    """
    from quantkit.build import build_checkpoints
    from quantkit.cli.verify import print_verify_report
    from quantkit.eval.run import split_tasks

    def show(entry, verified) -> None:
        if verified is not None:
            print_verify_report(verified)
        console.print(f"[bold]{', '.join(entry.targets)}[/] -> {entry.checkpoint}: {entry.status}")
        for reason in entry.reasons:
            console.print(f"  [red]{reason}[/]")
        if entry.drift_reported:  # verify's report above lists them
            console.print(
                f"  [yellow]{len(entry.drift_reported)} drift limit breach(es) reported, not judged "
                "(--drift-limits report)[/]"
            )

    def show_target(built) -> None:
        if not built.ok or len(built.chain) > 1 or any(s.size_unknown for s in built.chain):
            print_chain(built)

    report = build_checkpoints(
        model,
        output_root,
        target,
        calib=calib,
        num_samples=num_samples,
        vllm=vllm,
        drift_samples=drift_samples,
        force=force,
        max_loss=max_loss,
        eval_tasks=split_tasks(eval_tasks) if eval_tasks else None,
        gate_items=gate_items,
        accept_unresolved=accept_unresolved,
        drift_limits=drift_limits.value,
        targets_file=targets_file,
        on_checkpoint=show,
        on_target=show_target,
        on_warning=lambda line: console.print(f"[yellow]warning: {line}[/]"),
    )
    print_build_summary(report)
    if not report.passed:
        raise CheckFailed("some targets failed", path=Path(output_root) / "build.json")


build.__doc__ = build.__doc__.replace("DECISION", DECISION)  # the gate's own words, one source


def print_build_summary(report) -> None:
    from quantkit.export.metadata import recipe_label  # torch is loaded by the build already

    # what names a row (targets, recipe) folds in a narrow terminal; it is never cut
    table = Table(title="Build summary")
    table.add_column("targets", overflow="fold")
    table.add_column("recipe", overflow="fold")
    for header in ("avg bits", "status", "size", "KL", "top-1", "vLLM", "s"):
        table.add_column(header, no_wrap=True)
    for c in report.checkpoints:
        colour = "green" if c.ok else "red"
        drift = c.drift or {}
        table.add_row(
            ", ".join(c.targets),
            c.recipe,
            "-" if c.avg_bits is None else f"{c.avg_bits:g}",
            f"[{colour}]{c.status}[/]",
            f"{c.size_ratio:.3f}x" if c.size_ratio else "-",
            f"{drift['kl']:.1e}" if "kl" in drift else "-",
            f"{drift['top1']:.3f}" if "top1" in drift else "-",
            c.vllm or "-",
            f"{c.seconds:.0f}",
        )
    console.print(table)
    targets = Table(title="Targets (accuracy gate; the kept candidate's worst task, else the last tried)")
    headers = (
        "target",
        "budget",
        "status",
        "kept",
        "worst task",
        "loss [95% interval] (n)",
        "verdict",
        "tried",
    )
    for header in headers:
        names = header in ("target", "kept")
        targets.add_column(header, overflow="fold" if names else "ellipsis", no_wrap=not names)
    for t in report.targets:
        kept = next((s for s in t.chain if s.verdict == "kept"), None)
        shown = kept or (t.chain[-1] if t.chain else None)
        status = target_status(t)
        colour = "red" if not t.ok else "green" if status == t.status else "yellow"
        worst = (shown.tasks.get(shown.worst_task or "") or {}) if shown else {}
        targets.add_row(
            t.name,
            budget_text(t),
            f"[{colour}]{status}[/]",
            recipe_label(kept.recipe, kept.avg_bits) if kept else "-",
            (shown.worst_task or "-") if shown else "-",
            step_interval(shown) if shown else "-",
            worst.get("verdict", "-"),
            str(len(t.chain)),
        )
    console.print(targets)
    for t in report.targets:
        if t.ok and t.chain[-1].unmeasured:
            missing = t.chain[-1].unmeasured
            console.print(
                f"[yellow]{t.name}: {len(missing)} task(s) of the calibration set not measured "
                f"(no held-out sample): {', '.join(missing)}[/]"
            )
    for task in (report.held_out or {}).get("below_floor", []):
        accuracy = max(r["original_accuracy"] for r in report.held_out["rows"] if r["task"] == task)
        console.print(f"[yellow]{below_floor_note(task, accuracy)}[/]")
    if report.drift_limits != "recipe":
        console.print(f"[yellow]--drift-limits {report.drift_limits}: {DRIFT_LIMITS[report.drift_limits]}[/]")
    for warning in report.warnings:
        console.print(f"[yellow]warning: {warning}[/]")
    console.print(f"build.json in {report.output_root}")


def target_status(target) -> str:
    """A target's status in the summary: one kept with --accept-unresolved says how many of its
    tasks are unresolved (its worst task, the one shown, may have passed)."""
    kept = next((s for s in target.chain if s.verdict == "kept"), None)
    if target.ok and kept is not None and kept.accepted_unresolved:
        return f"passed, {len(kept.accepted_unresolved)} unresolved accepted"
    return target.status


def print_chain(built) -> None:
    """Every candidate a target tried: recipe, avg bits, size, worst task and its loss, verdict."""
    from quantkit.export.metadata import recipe_label  # torch is loaded by the build already

    title = f"Target {built.name}: candidates tried (budget {budget_text(built)} per task)"
    table = Table(title=title)
    headers = (
        "#",
        "recipe",
        "avg bits",
        "size",
        "worst task",
        "loss [95% interval] (n)",
        "verdict",
        "cached",
    )
    for header in (*headers, "why tried"):
        table.add_column(header, no_wrap=header not in ("why tried",))
    for index, step in enumerate(built.chain, 1):
        colour = "green" if step.verdict == "kept" else "red"
        table.add_row(
            str(index),
            step.recipe,
            "-" if step.avg_bits is None else f"{step.avg_bits:g}",
            f"{step.size_ratio:.3f}x" if step.size_ratio else "-",
            step.worst_task or "-",
            step_interval(step),
            f"[{colour}]{step.verdict}[/]",
            "yes" if step.cached else "no",
            step.why,
        )
    console.print(table)
    for step in built.chain:
        name = recipe_label(step.recipe, step.avg_bits)
        for line in (step.size_unknown, step.detail):
            if line:
                console.print(f"  {name}: {line}")
    for note in built.notes:
        console.print(f"  {note}")
    if built.error:
        console.print(f"[red]target {built.name} failed: {built.error}[/]")
    elif not built.ok:
        console.print(f"[red]target {built.name}: no candidate meets {budget_text(built)} on every task[/]")
