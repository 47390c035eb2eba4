"""How a build judges one candidate for one target: its losses per task (drift on the held-out
rows, LOSS_DEFINITION) decided by their intervals against the target's budget (quantkit.eval.gate),
and the loss texts the summary, the chain table and the card share."""

from __future__ import annotations

from quantkit.build.record import ChainStep, CheckpointBuild, TargetBuild
from quantkit.eval.gate import (
    FAILED,
    MIN_ITEMS,
    PASSED,
    UNRESOLVED,
    decide,
    format_interval,
    measure,
    paired_loss,
    verdict_record,
)

DRIFT_METRIC = "expected answer-token accuracy"
EVAL_PREFIX = "eval "  # an --eval-tasks loss's key: "eval TASK" (drift losses are keyed by the task)


def _task_items(drift) -> dict[str, list]:
    """Per task, its samples in the order measured."""
    found: dict[str, list] = {}
    for sample in drift.samples:
        found.setdefault(sample.task, []).append(sample)
    return dict(sorted(found.items()))


def task_intervals(drift) -> dict[str, dict]:
    """Per task, the drift loss (LOSS_DEFINITION) of its samples with its paired interval: each
    sample an item, weighted by its loss positions (gate.measure; tasks without one left out)."""
    found = {}
    for task, samples in _task_items(drift).items():
        if sum(s.loss_positions for s in samples) > 0:
            found[task] = measure(
                [s.loss_p_original for s in samples],
                [s.loss_p_quantized for s in samples],
                [s.loss_positions for s in samples],
                metric=DRIFT_METRIC,
                items=[s.id for s in samples],
            ).to_dict()
    return found


def _task_sums(drift, numerator, denominator) -> dict[str, tuple[float, float]]:
    """Per task, two per-sample figures summed over its samples (tasks whose denominator sums to
    0 left out)."""
    sums: dict[str, tuple[float, float]] = {}
    for sample in drift.samples:
        top, bottom = sums.get(sample.task, (0.0, 0.0))
        sums[sample.task] = (top + numerator(sample), bottom + denominator(sample))
    return {task: pair for task, pair in sorted(sums.items()) if pair[1] > 0}


def _percent(value: float) -> float:
    return float(f"{value:.6g}") + 0.0  # -0.0 reads 0.0


def task_losses(drift) -> dict[str, float]:
    """Per task, percentage points: the drop of the expected teacher-forced answer-token accuracy,
    100 x (sum p_original(y) - sum p_quantized(y)) / number of positions, over the loss positions
    of its samples (LOSS_DEFINITION; SampleDrift.loss_p_*, loss_positions; gate.paired_loss)."""
    return {
        task: paired_loss(
            [s.loss_p_original for s in samples],
            [s.loss_p_quantized for s in samples],
            [s.loss_positions for s in samples],
        )
        for task, samples in _task_items(drift).items()
        if sum(s.loss_positions for s in samples) > 0
    }


def task_kl_losses(drift) -> dict[str, float]:
    """Per task, percent: KL summed over the loss positions relative to the original's entropy
    there (build.json's kl_losses, not gated on; SampleDrift.loss_kl / loss_entropy)."""
    sums = _task_sums(
        drift,
        lambda s: s.loss_kl * s.loss_positions,
        lambda s: s.loss_entropy * s.loss_positions,
    )
    return {task: _percent(100.0 * kl / entropy) for task, (kl, entropy) in sums.items()}


def loss_unit(task: str | None) -> str:
    """A task's loss unit: percentage points of answer-token accuracy for drift (LOSS_DEFINITION),
    percent of the original's score (100% - recovery) for an --eval-tasks task."""
    return "%" if task and task.startswith(EVAL_PREFIX) else " pts"


def format_loss(loss: float | None, task: str | None) -> str:
    """``0.094 pts`` (a drift loss) or ``3.1%`` (an --eval-tasks loss)."""
    return "-" if loss is None else f"{loss:.3g}{loss_unit(task)}"


def step_interval(step: ChainStep) -> str:
    """The worst task's loss, interval and n (``0.42 [-0.1, 0.9] pts (n=12)``), or its loss alone
    (a record without intervals)."""
    record = step.tasks.get(step.worst_task or "")
    if record is None:
        return format_loss(step.worst_loss, step.worst_task)
    return format_interval(record, loss_unit(step.worst_task))


def worst_interval_text(step: ChainStep, target: TargetBuild) -> str:
    """The card's and summary's sentence: budget, n and the worst task's interval."""
    record = step.tasks.get(step.worst_task or "")
    if record is None:
        return f"budget {budget_text(target)} per task; no task measured"
    counts = sorted({r["n"] for r in step.tasks.values()})
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    return (
        f"budget {budget_text(target)} per task, {n} items per task; the worst task, {step.worst_task}, "
        f"lost {format_interval(record, loss_unit(step.worst_task))}: {record['verdict']}"
    )


def budget_text(target: TargetBuild) -> str:
    """The target's max_loss with its unit: points, and percent too where --eval-tasks losses
    were judged against it."""
    scored = any(task.startswith(EVAL_PREFIX) for step in target.chain for task in step.losses)
    if scored:
        return f"{target.max_loss} (pts of drift loss, % of an eval task's score)"
    return f"{target.max_loss} pts"


def judge(
    entry: CheckpointBuild,
    max_loss: float,
    eval_intervals: dict[str, dict],
    tasks: set[str],
    below_floor: dict[str, float] | None = None,
    accept_unresolved: bool = False,
) -> ChainStep:
    """Each task decided by its interval against ``max_loss`` (gate.decide): one failed, the step
    is over budget; one unresolved, unresolved (kept with ``accept_unresolved``, the tasks listed).
    ``tasks``: the calibration set's, each of which should have a drift loss (one without: a
    task whose every row calibrated the candidate); ``below_floor``: drift tasks whose held-out
    rows the original answers under the accuracy floor, with its accuracy there (judged all the
    same; a note says their loss can hardly show)."""
    intervals = {**(entry.intervals or {}), **eval_intervals}
    step = ChainStep(entry.recipe, entry.avg_bits, entry.checkpoint, "kept", False, entry.size_ratio)
    step.tasks = {task: verdict_record(interval, max_loss) for task, interval in sorted(intervals.items())}
    step.losses = {task: interval["loss"] for task, interval in step.tasks.items()}
    step.kl_losses = dict(entry.kl_losses or {})
    if entry.ok and entry.intervals is not None:
        step.unmeasured = sorted(tasks - set(entry.intervals))
    if step.tasks:  # the task nearest to failing: the highest upper end
        step.worst_task = max(step.tasks, key=lambda t: (step.tasks[t]["ci_high"], step.losses[t]))
        step.worst_loss = step.losses[step.worst_task]
    failed = [t for t, r in step.tasks.items() if r["verdict"] == FAILED]
    unresolved = [t for t, r in step.tasks.items() if r["verdict"] == UNRESOLVED]
    if not entry.ok:
        step.verdict = entry.status if entry.status == "error" else "failed"
        step.detail = "; ".join(entry.reasons)
    elif failed:
        step.verdict = "over budget"
        step.detail = "; ".join(_task_line(t, step.tasks[t], f"beyond {max_loss}") for t in failed)
    elif unresolved:
        lines = "; ".join(_task_line(t, step.tasks[t], f"holds {max_loss}") for t in unresolved)
        if accept_unresolved:
            step.accepted_unresolved = unresolved
            step.detail = f"kept with --accept-unresolved, unresolved: {lines}"
        else:
            step.verdict, step.detail = "unresolved", f"unresolved (counted as failed): {lines}"
    elif not step.tasks:
        step.detail = "loss not measured (no --calib and no --eval-tasks)"
    for task in sorted(set(below_floor or {}) & set(step.tasks)):
        note = below_floor_note(task, below_floor[task])
        step.detail = f"{step.detail}; {note}" if step.detail else note
    if entry.text_scope_samples:
        note = (
            f"{len(entry.text_scope_samples)} held-out sample(s) without answer tokens counted their "
            f"text positions: {', '.join(entry.text_scope_samples)}"
        )
        step.detail = f"{step.detail}; {note}" if step.detail else note
    return step


def _task_line(task: str, record: dict, versus: str) -> str:
    """``ocr lost 2.1 [1.7, 2.6] pts (n=12), beyond 1.5`` (and the items that would resolve it)."""
    line = f"{task} lost {format_interval(record, loss_unit(task))}, interval {versus}"
    if record["n"] < MIN_ITEMS:
        line = f"{task} lost {format_interval(record, loss_unit(task))}, fewer items than an interval needs"
    if record.get("items_to_resolve"):
        line += f" (about {record['items_to_resolve']} items would resolve it)"
    return line


def below_floor_note(task: str, accuracy: float) -> str:
    return f"the original answers {task}'s held-out rows at {accuracy:.2g}: its loss can hardly show"


def should_try(last: ChainStep | None, limit: float) -> bool:
    """The candidate before failed: its checks, or a task did not pass ``limit`` (its interval's
    upper end beyond it: pts of drift loss, % of an eval task's score)."""
    if last is None:
        return False
    if last.verdict in ("failed", "error"):
        return True
    return any(decide(r["n"], r["ci_low"], r["ci_high"], limit) != PASSED for r in last.tasks.values())
