"""`quantkit build`: one checkpoint per hardware target, gated on accuracy.

Each target has a chain of candidates: its recipe, then (when it misses) the recipe again at each
``avg_bits`` step (4-bit group recipes) and its fallbacks whose ``when`` holds, smallest predicted
checkpoint first (ORDER_RULE). Every candidate is quantized, verified (audit, drift against the
original on held-out calibration samples, optionally vLLM) and, with ``eval_tasks``, scored per
skills task. The first candidate whose checks pass and whose every task loses at most the
target's budget is kept: the smallest that passes. A target none meets fails with the table of
what was tried, and the other targets still build. Candidates are shared between
targets and cached between runs (model bytes, calibration set, recipe, avg bits, options).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from quantkit import __version__
from quantkit.errors import InputError, QuantkitError, shorten
from quantkit.eval.gate import (
    DECISION,
    FAILED,
    MIN_ITEMS,
    PASSED,
    UNRESOLVED,
    decide,
    format_interval,
    measure,
    paired_loss,
    unresolvable,
    verdict_record,
)
from quantkit.fsutil import check_model_folder, check_writable, refuse_overlap, sha256_file, write_file_atomic

BUILD_FILE = "build.json"
LOSS_DEFINITION = (
    "the loss of a task is the drop of its expected teacher-forced answer-token accuracy, in "
    "percentage points: 100 x (sum of p_original(y) - sum of p_quantized(y)) / the number of "
    "positions, over the positions that predict the answer's tokens (the last assistant turn, "
    "what the task's accuracy is scored on; prompt and media positions do not count) in the "
    "task's held-out calibration samples, y being the answer's own next token there; negative is "
    "a gain. The held-out samples are chosen once per build, the same for every candidate: every "
    "row of the task no candidate calibrates on (at most --gate-items, drawn keeping its strata); "
    "a task the original answers under an expected answer-token accuracy of 0.2 "
    "(ACCURACY_FLOOR) on all of them is listed below_floor (its loss in points is bounded by that "
    "accuracy: it can hardly show). Each loss comes with a paired bootstrap 95% interval over the "
    "task's items (quantkit.eval.gate), which decides the task: passed, failed or unresolved. A "
    "sample without answer tokens counts its text positions instead (build.json lists it under "
    "text_scope_samples). build.json also records, as kl_losses, 100 x sum of "
    "KL(original || quantized) / sum of the original's entropy at the same positions "
    "(informative, not gated on). With --eval-tasks, each skills task also counts 100% - "
    "recovery (checkpoint score / original score)."
)
ORDER_RULE = (
    "the target's recipe is tried first; when it misses the budget or fails its checks, the "
    "further candidates whose condition holds (its avg_bits steps, its fallbacks' `when`) are "
    "tried smallest first by the checkpoint size quantize's plan predicts from the config (equal "
    "sizes in the file's order; one whose size the plan refuses to predict, e.g. a block width "
    "a layer does not divide, last, its record saying why), so the first that passes every task "
    "is the smallest that passes and the larger ones are not built"
)
LOSS_VERSION = "answer-accuracy-points-5"  # -5: every held-out row of a task, with an interval
DRIFT_METRIC = "expected answer-token accuracy"
# Items per --eval-tasks task without --gate-items: a 0-or-1 metric moves 100 / (items x score)
# percent per item, within the 1.5 default for an original that scores a third or more.
DEFAULT_EVAL_ITEMS = 200
FIRST = "the target's recipe"  # why the first candidate is tried
EVAL_PREFIX = "eval "  # an --eval-tasks loss's key: "eval TASK" (drift losses are keyed by the task)
_CARD_START, _CARD_END = "<!-- quantkit:build:start -->", "<!-- quantkit:build:end -->"


@dataclass
class CheckpointBuild:
    """One candidate checkpoint: a recipe (and avg bits), built or found up to date."""

    targets: list[str]
    recipe: str
    checkpoint: str
    status: str  # passed | failed | error | up-to-date (its checks, not the accuracy budget)
    key: str
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    vllm: str | None = None
    size_ratio: float | None = None
    drift: dict | None = None  # overall KL / top-1 of the checkpoint
    avg_bits: float | None = None
    losses: dict[str, float] | None = None  # drift loss per task, pts (LOSS_DEFINITION)
    kl_losses: dict[str, float] | None = None  # KL / entropy per task, percent (not gated on)
    text_scope_samples: list[str] | None = None  # held-out samples without answer tokens (text positions)
    eval_scores: dict | None = None  # {"items": n, "scores": {task: score}} with --eval-tasks
    traceback: str | None = None  # a library error's (not a QuantkitError), for build.json only
    held_out: str | None = None  # HeldOutChoice.digest(): the held-out rows its losses were measured on
    intervals: dict[str, dict] | None = None  # per task (eval tasks keyed "eval TASK"): gate.TaskInterval

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "up-to-date")


@dataclass
class ChainStep:
    """One candidate as a target judged it."""

    recipe: str
    avg_bits: float | None
    checkpoint: str
    verdict: str  # kept | over budget | unresolved | failed | error
    cached: bool
    size_ratio: float | None = None
    worst_task: str | None = None
    worst_loss: float | None = None
    losses: dict[str, float] = field(default_factory=dict)
    kl_losses: dict[str, float] = field(default_factory=dict)  # informative (task_kl_losses)
    why: str = ""  # why this step was tried
    detail: str = ""
    unmeasured: list[str] = field(default_factory=list)  # held-out tasks without a loss
    predicted_bytes: int | None = None  # the plan's size, by which the further candidates are ordered
    size_unknown: str | None = None  # why the plan cannot predict its size (it was ordered last)
    # Per task: n, loss, ci_low, ci_high, metric, items (hash), verdict against the target's budget.
    tasks: dict[str, dict] = field(default_factory=dict)
    accepted_unresolved: list[str] = field(default_factory=list)  # kept with --accept-unresolved


@dataclass
class TargetBuild:
    name: str
    max_loss: float
    status: str  # passed | failed | stale (its kept checkpoint was rebuilt by a later run)
    checkpoint: str | None = None  # the kept candidate
    chain: list[ChainStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # what failed the whole target, not one candidate (scoring the original)
    traceback: str | None = None  # that error's, when a library raised it (build.json only)

    @property
    def ok(self) -> bool:
        return self.status == "passed"


@dataclass
class BuildReport:
    output_root: str
    model: str
    calib: str | None
    checkpoints: list[CheckpointBuild]
    targets: list[TargetBuild] = field(default_factory=list)
    eval_tasks: list[str] = field(default_factory=list)
    eval_original: dict[str, float] | None = None  # the original's skills scores, per task
    requested: list[str] = field(default_factory=list)  # the targets asked for
    model_hash: str | None = None  # model_fingerprint: what "the same model" means across runs
    warnings: list[str] = field(default_factory=list)  # what the build could not do (a card not rewritten)
    held_out: dict | None = None  # drift.HeldOutChoice.to_dict(): the rows every candidate is judged on

    @property
    def complete(self) -> bool:
        """This run built every target it was asked for (build.json is saved while a build runs)."""
        return {t.name for t in self.targets} >= set(self.requested)

    @property
    def passed(self) -> bool:
        """This run's targets all passed (the exit code); build.json's ``passed`` is the file's."""
        return self.complete and all(t.ok for t in self.targets)

    def to_dict(self) -> dict:
        return {
            "output_root": self.output_root,
            "model": self.model,
            "model_hash": self.model_hash,
            "calib": self.calib,
            "passed": self.passed,
            "complete": self.complete,
            "requested": self.requested,
            "quantkit_version": __version__,
            "loss": LOSS_DEFINITION,
            "order": ORDER_RULE,
            "eval_tasks": self.eval_tasks,
            "eval_original": self.eval_original,
            "warnings": self.warnings,
            "held_out": self.held_out,
            "targets": [asdict(t) for t in self.targets],
            "checkpoints": [asdict(c) for c in self.checkpoints],
        }


def model_fingerprint(model_dir: Path) -> str:
    """A hash of the model folder's config and weights (bytes, not dates)."""
    digest = hashlib.sha256()
    for file in sorted(Path(model_dir).iterdir()):
        if file.is_file() and (file.suffix in (".json", ".safetensors", ".jinja", ".txt", ".model")):
            digest.update(file.name.encode())
            digest.update(sha256_file(file).encode())
    return digest.hexdigest()


def build_key(
    model_hash: str,
    calib_hash: str | None,
    recipe,
    num_samples: int | None,
    vllm: bool,
    *,
    avg_bits: float | None = None,
    drift_samples: int | None = None,
    held_out: str | None = None,
) -> str:
    """What makes a candidate "the same": model, calibration data, recipe, avg bits, options,
    version, and ``held_out`` (HeldOutChoice.digest(): the rows its losses are measured on)."""
    uses_data = recipe.needs_data or avg_bits is not None
    payload = {
        "model": model_hash,
        "calib": calib_hash if uses_data else None,
        "recipe": recipe.model_dump(mode="json"),
        "avg_bits": avg_bits,
        "num_samples": num_samples if uses_data else None,
        # What the losses were measured on: held-out samples of the set, outside those calibrated on.
        "drift": [calib_hash, drift_samples, num_samples, held_out] if calib_hash else None,
        "vllm": vllm,
        "quantkit": __version__,
        "loss": LOSS_VERSION,  # losses cached under another definition are measured again
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


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


def _read_build_file(output_root: Path) -> dict:
    """The earlier build.json; one that cannot be read (damaged, not JSON, not an object) is moved
    aside with a note, not overwritten: it may be the only record of earlier builds."""
    path = output_root / BUILD_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            return data
        problem = "it is not a JSON object"
    except (ValueError, RecursionError) as err:
        problem = f"it is not readable JSON ({shorten(str(err), 120)})"
    aside = next(
        candidate
        for n in itertools.count(1)
        if not (candidate := path.with_name(f"{BUILD_FILE}.unreadable-{n}")).exists()
    )
    path.rename(aside)
    logging.getLogger("quantkit").warning(
        f"{path}: {problem}; moved aside to {aside.name} and started a new build.json "
        "(earlier targets and candidates in it are not merged)"
    )
    return {}


def _same_model(data: dict, model_dir: Path, model_hash: str) -> bool:
    """The earlier build.json is of this model: by its bytes (``model_hash``), whatever path it was
    given by; a file written before the hash was recorded compares the resolved paths."""
    if "model_hash" in data:
        return data["model_hash"] == model_hash
    return bool(data.get("model")) and Path(data["model"]).resolve() == Path(model_dir).resolve()


def _here(output_root: Path, checkpoint: str | None) -> str | None:
    """An earlier record's candidate folder as this run names it: every candidate lies directly in
    the output root, which an earlier run may have given by another path (relative, absolute)."""
    return None if checkpoint is None else str(output_root / Path(checkpoint).name)


def _previous(data: dict, output_root: Path) -> dict[str, dict]:
    """The candidates an earlier build.json records, by checkpoint folder (as this run names it)."""
    entries = [*data.get("earlier", []), *data.get("checkpoints", [])]
    found = {}
    for entry in entries:
        if isinstance(entry, dict) and "checkpoint" in entry and "key" in entry:
            folder = _here(output_root, entry["checkpoint"])
            found[folder] = {**entry, "checkpoint": folder}
    return found


def _earlier_targets(data: dict, output_root: Path) -> list[TargetBuild]:
    """The targets an earlier build recorded (build.json merges by target; the caller checks it was
    of the same model)."""
    step_fields = {f.name for f in fields(ChainStep)}
    target_fields = {f.name for f in fields(TargetBuild)} - {"chain"}
    found = []
    for record in data.get("targets", []):
        try:
            chain = [ChainStep(**{k: v for k, v in s.items() if k in step_fields}) for s in record["chain"]]
            target = TargetBuild(**{k: v for k, v in record.items() if k in target_fields}, chain=chain)
        except (KeyError, TypeError):  # a record of another quantkit version: dropped
            continue
        target.checkpoint = _here(output_root, target.checkpoint)
        for step in target.chain:
            step.checkpoint = _here(output_root, step.checkpoint)
        found.append(target)
    return found


def _write_build_file(
    output_root: Path, report: BuildReport, previous: dict[str, dict], targets: list[TargetBuild]
) -> None:
    """build.json: ``targets`` (this run's and the earlier ones it did not build again), this
    run's candidates, and earlier candidates this run did not touch; each candidate says which
    targets keep it (kept_for). ``passed`` / ``complete`` are of every target record in the file,
    ``this_run`` of this run's targets."""
    data = report.to_dict()
    data["targets"] = [asdict(t) for t in targets]
    # The file's verdict is over every target record in it, earlier runs' included (a stale one is
    # not a current judgement); this run's alone is this_run (the command's exit code).
    data["complete"] = report.complete and not any(t.status == "stale" for t in targets)
    data["passed"] = data["complete"] and all(t.ok for t in targets)
    data["this_run"] = {"targets": report.requested, "passed": report.passed, "complete": report.complete}
    touched = {c.checkpoint for c in report.checkpoints}
    data["earlier"] = [dict(entry) for name, entry in sorted(previous.items()) if name not in touched]
    for entry in [*data["checkpoints"], *data["earlier"]]:
        entry["kept_for"] = [t.name for t in targets if t.checkpoint == entry["checkpoint"]]
    write_file_atomic(output_root / BUILD_FILE, json.dumps(data, indent=2) + "\n")


def _up_to_date(before: dict | None, key: str, checkpoint: Path) -> bool:
    """The last build made this checkpoint from the same inputs, it passed, and it is still there."""
    return (
        before is not None
        and before["key"] == key
        and before["status"] in ("passed", "up-to-date")
        and (checkpoint / "quantkit.json").is_file()
    )


def _card_section(checkpoint: str, targets: list[TargetBuild]) -> str:
    """The card's build section: each target that kept this checkpoint (with its chain), and each
    that tried it and went on (why)."""
    kept = [t for t in targets if t.checkpoint == checkpoint]
    verdict = "kept this checkpoint" if kept else "did not keep this checkpoint for any target"
    lines = [
        _CARD_START,
        "## Build: accuracy gate",
        "",
        f"`quantkit build` {verdict}. Loss: {LOSS_DEFINITION}",
        "",
        f"Decision: {DECISION}",
        "",
        f"Candidates: {ORDER_RULE}.",
        "",
    ]
    for target in kept:
        lines += [f"Target `{target.name}`: {worst_interval_text(target.chain[-1], target)}.", ""]
        lines += [
            f"Target `{target.name}` (budget {budget_text(target)} per task), candidates in the order tried:",
            "",
            "| # | recipe | avg bits | size | worst task | loss [95% interval] (n) | its KL / entropy | "
            "verdict | tried because |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for index, step in enumerate(target.chain, 1):
            lines.append(
                f"| {index} | {step.recipe} | {_fmt_bits(step.avg_bits)} | {_fmt_size(step.size_ratio)} | "
                f"{step.worst_task or '-'} | {step_interval(step)} | "
                f"{_fmt_percent(step.kl_losses.get(step.worst_task or ''))} | {step.verdict} | {step.why} |"
            )
        lines.append("")
        if target.chain[-1].detail:  # the kept one's notes (tasks below the accuracy floor, ...)
            lines += [f"Note: {target.chain[-1].detail}.", ""]
        if target.chain[-1].unmeasured:
            lines += [
                f"Tasks of the calibration set not measured: {', '.join(target.chain[-1].unmeasured)}.",
                "",
            ]
    for target in targets:
        for step in target.chain:
            if step.checkpoint == checkpoint and target.status == "stale" and step.verdict == "kept":
                lines += [
                    f"Target `{target.name}` kept an earlier build of this folder, since rebuilt: its "
                    "record is stale until it is built again.",
                    "",
                ]
            elif step.checkpoint == checkpoint and step.verdict != "kept":
                lines += [
                    f"Not kept for target `{target.name}` (budget {budget_text(target)}): {step.detail}.",
                    "",
                ]
    lines += ["The whole chain is in the build folder's `build.json`.", _CARD_END, ""]
    return "\n".join(lines)


def _update_card(checkpoint: Path, section: str) -> None:
    from quantkit.export.card import update_card_section

    update_card_section(checkpoint, _CARD_START, _CARD_END, section)


def _fmt_bits(bits: float | None) -> str:
    return "-" if bits is None else f"{bits:g}"


def _fmt_size(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}x"


def _fmt_percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}%"


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


def resolve_eval_tasks(model_dir: Path, eval_tasks: list[str] | None) -> list[str]:
    """The skills tasks to score (``skills``: all of the model's); [] when none are asked for."""
    if not eval_tasks:
        return []
    from quantkit.eval.skills import read_skills

    names = [t["name"] for t in read_skills(model_dir)["tasks"]]
    if "skills" in eval_tasks:
        return names
    unknown = sorted(set(eval_tasks) - set(names))
    if unknown:
        raise InputError(
            f"--eval-tasks: unknown skills task(s) {', '.join(unknown)}",
            hint=f"choose from {', '.join(names)} or skills",
        )
    return [n for n in names if n in eval_tasks]


def _judge(
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


def _library_failure(error: Exception) -> tuple[str, str]:
    """A library's error (not a QuantkitError) that fails one piece of the build, the others going
    on: its ``type: message`` and traceback (for build.json; call it inside the ``except``). Out of
    memory or of stack is the machine's state, not the candidate's: raised, never recorded (the
    next candidate would only fail the same way, or be judged on it)."""
    import torch

    if isinstance(error, (MemoryError, RecursionError, torch.OutOfMemoryError)):
        raise error
    return f"{type(error).__name__}: {error}", traceback.format_exc()


class _TargetFailed(Exception):
    """What fails a whole target, not one candidate (the original model could not be scored)."""

    def __init__(self, reason: str, trace: str | None) -> None:
        super().__init__(reason)
        self.reason, self.trace = reason, trace


def _should_try(last: ChainStep | None, limit: float) -> bool:
    """The candidate before failed: its checks, or a task did not pass ``limit`` (its interval's
    upper end beyond it: pts of drift loss, % of an eval task's score)."""
    if last is None:
        return False
    if last.verdict in ("failed", "error"):
        return True
    return any(decide(r["n"], r["ci_low"], r["ci_high"], limit) != PASSED for r in last.tasks.values())


def _further_candidates(target, *, calib: Path | None, max_loss: float, first: ChainStep | None, notes: list):
    """The candidates after the target's recipe whose condition holds, as (recipe, avg bits, why),
    in the file's order (ORDER_RULE sorts them); what is not tried and why goes to ``notes``."""
    found = []
    missed = (
        first is not None
        and first.verdict in ("over budget", "unresolved", "failed")
        and _should_try(first, max_loss)
    )
    for bits in target.avg_bits:
        if missed:
            found.append((target.recipe, bits, f"most sensitive layers at 8 bits, {bits:g} bits on average"))
    for fallback in target.fallbacks:
        when = fallback.when
        if when.on_request:
            notes.append(f"{fallback.recipe} not tried: on request only ({fallback.why})")
        elif when.no_calibration_data and calib is None:
            found.append((fallback.recipe, None, "no calibration data"))
        elif when.task_loss_above is not None:
            limit = max_loss if when.task_loss_above == "max_loss" else float(when.task_loss_above)
            if _should_try(first, limit):
                found.append(
                    (
                        fallback.recipe,
                        None,
                        f"the target's recipe failed or lost more than {limit:g}"
                        f"{loss_unit(first.worst_task if first else None)}",
                    )
                )
    return found


def _check_reachable(chosen, calib: Path | None) -> None:
    """Without --calib, every target needs a data-free candidate its chain can reach."""
    from quantkit.recipes import get_recipe

    if calib is not None:
        return
    stuck = []
    for target in chosen:
        options = [target.recipe] + [f.recipe for f in target.fallbacks if f.when.no_calibration_data]
        if all(get_recipe(name).needs_data for name in options):
            stuck.append(f"{target.name} ({target.recipe})")
    if stuck:
        raise InputError(
            f"targets {', '.join(stuck)} calibrate on data and have no data-free fallback: pass --calib SET"
        )


def build_checkpoints(
    model_dir: Path,
    output_root: Path,
    target_names: list[str],
    *,
    calib: Path | None = None,
    num_samples: int | None = None,
    vllm: bool = False,
    drift_samples: int | None = None,
    force: bool = False,
    targets_file: Path | None = None,
    max_loss: float | None = None,
    eval_tasks: list[str] | None = None,
    gate_items: int | None = None,
    accept_unresolved: bool = False,
    on_checkpoint=None,
    on_target=None,
    on_warning=None,
) -> BuildReport:
    """Build each target's chain until a candidate meets its accuracy budget (ORDER_RULE).

    ``max_loss`` (per task: percentage points of drift loss, percent for eval tasks) overrides
    every target's ``max_loss``; the loss is drift on every held-out calibration row of a task (at
    most ``gate_items``; LOSS_DEFINITION) and, with ``eval_tasks`` (skills task names of the
    model's skills.json, or ``skills`` for all), 100% - recovery on ``gate_items`` items per task
    (DEFAULT_EVAL_ITEMS); each task is decided by its interval (quantkit.eval.gate), unresolved
    counting as failed unless ``accept_unresolved``. A budget the items cannot resolve for a
    lossless candidate is an InputError before any quantize (a warning with ``accept_unresolved``).
    A target that fails (bad input, failed proof, failed checks, every candidate over budget) is
    recorded and the others go on. A candidate whose inputs match the last build and that passed
    its checks then is reused unless ``force``.
    ``on_checkpoint`` is called with each (CheckpointBuild, VerifyReport | None) as it finishes,
    ``on_target`` with each TargetBuild, ``on_warning`` with what is said before any quantize.

    Without ``num_samples``, a stratified share of the set (``drift_samples``, by default and at
    most a quarter of it) is held out of calibration so that the gate has samples it did not see.
    """
    from quantkit.calibset import load_calibration_report
    from quantkit.models.adapters import adapter_for
    from quantkit.build import load_targets

    if not target_names:
        raise InputError("no target given", hint="pass --target NAME (see `quantkit targets`)")
    if max_loss is not None and not 0 <= max_loss <= 100:
        raise InputError(
            f"--max-loss {max_loss}: a loss in [0, 100] (points of drift loss, percent of an --eval-tasks score)"
        )
    for option, value in (("--gate-items", gate_items), ("--drift-samples", drift_samples)):
        if value is not None and value < 1:
            raise InputError(f"{option} {value}: at least 1")
    model_dir, output_root = Path(model_dir), Path(output_root)
    refuse_overlap(output_root, {"model folder": model_dir, "calibration set": calib}, option="--output-root")
    check_model_folder(model_dir)
    check_writable(output_root, option="--output-root", kind="folder")
    if vllm:  # asked for and cannot run: exit 2 before any quantize
        from quantkit.verify.vllm_check import require_vllm_python

        require_vllm_python("--vllm")
    table = load_targets(targets_file)
    chosen = [table.get(name) for name in dict.fromkeys(target_names)]
    eval_names = resolve_eval_tasks(model_dir, eval_tasks)
    _check_reachable(chosen, calib)

    output_root.mkdir(parents=True, exist_ok=True)
    run = _Run(
        model_dir=model_dir,
        output_root=output_root,
        adapter=adapter_for(model_dir),
        calib=calib,
        calib_hash=load_calibration_report(calib)["samples_sha256"] if calib is not None else None,
        num_samples=num_samples,
        vllm=vllm,
        drift_samples=drift_samples,
        force=force,
        eval_names=eval_names,
        gate_items=gate_items,
        accept_unresolved=accept_unresolved,
        on_checkpoint=on_checkpoint,
        on_warning=on_warning,
    )
    run.report.eval_tasks = eval_names
    run.report.requested = [target.name for target in chosen]
    try:
        run.held_out_tasks()  # no held-out sample left: bad input (exit 2) before any quantize
        run.score_original()
        budgets = sorted({target.max_loss if max_loss is None else max_loss for target in chosen})
        run.check_resolvable(budgets)  # before any quantize: InputError, or warnings when accepted
    except _TargetFailed as failed:  # no target can be judged: each fails with the error (exit 1)
        for target in chosen:
            budget = target.max_loss if max_loss is None else max_loss
            failed_target = TargetBuild(
                target.name, budget, "failed", error=failed.reason, traceback=failed.trace
            )
            run.report.targets.append(failed_target)
            if on_target:
                on_target(failed_target)
        run.save()
        return run.report
    for target in chosen:
        built = run.build_target(target, target.max_loss if max_loss is None else max_loss)
        run.report.targets.append(built)
        run.save()
        if on_target:
            on_target(built)
    # Kept or not, each card says what the gate made of it, earlier runs' candidates included (a
    # candidate an earlier run kept that no target keeps now says so).
    targets = run.all_targets()
    for folder in run.candidate_folders():
        if (Path(folder) / "config.json").is_file():
            try:
                _update_card(Path(folder), _card_section(folder, targets))
            except QuantkitError as error:  # one card not rewritten: said, the others still are
                run.report.warnings.append(f"{folder}: model card not updated: {error}")
            except OSError:  # a disk that fails or fills up: exit 1 (quantkit/cli/_common.py)
                raise
            except Exception as error:  # a library's error: as in _quantize_and_verify
                run.report.warnings.append(f"{folder}: model card not updated: {_library_failure(error)[0]}")
    run.save()
    return run.report


@dataclass
class _Run:
    """One `quantkit build` invocation: its candidates (shared by targets), samples and caches."""

    model_dir: Path
    output_root: Path
    adapter: object
    calib: Path | None
    calib_hash: str | None
    num_samples: int | None
    vllm: bool
    drift_samples: int | None
    force: bool
    eval_names: list[str]
    gate_items: int | None
    accept_unresolved: bool = False
    on_checkpoint: object = None
    on_warning: object = None
    report: BuildReport = None
    drawn: object = None
    tasks: set[str] | None = None  # of the held-out rows (held_out_tasks)
    held_out: object = None  # drift.HeldOutChoice (held_out_tasks): the rows every candidate is judged on
    set_tasks: set[str] = field(default_factory=set)  # of every row the model can take
    original_scores: dict[str, float] | None = None
    original_items: dict[str, list[float]] | None = None  # the original's per-item scores, per eval task
    metrics: dict[str, str] = field(default_factory=dict)  # each eval task's metric (skills.SCORERS)
    built: dict[str, CheckpointBuild] = field(default_factory=dict)
    sizes: dict[tuple[str, float | None], int | None] = field(default_factory=dict)  # predicted_bytes
    unplanned: dict[tuple[str, float | None], str] = field(default_factory=dict)  # why no size

    def __post_init__(self) -> None:
        self.model_hash = model_fingerprint(self.model_dir)
        data = _read_build_file(self.output_root)
        # Another model's records are not merged, nor its folders' cards rewritten.
        self.same_model = _same_model(data, self.model_dir, self.model_hash)
        self.previous = _previous(data, self.output_root) if self.same_model else {}
        self.earlier_targets = _earlier_targets(data, self.output_root) if self.same_model else []
        self.cache_dir = self.output_root / ".cache" / "features"
        calib = str(self.calib) if self.calib else None
        self.report = BuildReport(
            str(self.output_root), str(self.model_dir), calib, [], model_hash=self.model_hash
        )

    def save(self) -> None:  # after each candidate: an interrupted build keeps what finished
        _write_build_file(self.output_root, self.report, self.previous, self.all_targets())

    def all_targets(self) -> list[TargetBuild]:
        """This run's targets and the earlier build's others, a rerun replacing a target's record
        in place; an earlier record whose kept checkpoint this run built again is "stale": its
        judgement was of the folder's former contents, so it keeps no checkpoint and says why."""
        now = {t.name: t for t in self.report.targets}
        rebuilt = {c.checkpoint: c for c in self.report.checkpoints if c.status != "up-to-date"}
        merged = []
        for earlier in self.earlier_targets:
            if earlier.name in now:
                merged.append(now.pop(earlier.name))
            elif earlier.checkpoint in rebuilt:
                by = ", ".join(rebuilt[earlier.checkpoint].targets)
                note = (
                    f"stale: {earlier.checkpoint}, which this target kept, was rebuilt by a later run "
                    f"(for target {by}): build {earlier.name} again"
                )
                merged.append(replace(earlier, status="stale", checkpoint=None, notes=[*earlier.notes, note]))
            else:
                merged.append(earlier)
        return [*merged, *now.values()]

    def candidate_folders(self) -> list[str]:
        """Every candidate folder build.json records that passed its checks: this run's, and the
        earlier build's when it was of the same model (another model's targets are not merged)."""
        folders = [c.checkpoint for c in self.report.checkpoints if c.ok]
        if not self.same_model:
            return folders
        touched = {c.checkpoint for c in self.report.checkpoints}
        folders += [
            name
            for name, entry in sorted(self.previous.items())
            if name not in touched and entry.get("status") in ("passed", "up-to-date")
        ]
        return folders

    def build_target(self, target, max_loss: float) -> TargetBuild:
        """The target's recipe; when it misses, the further candidates smallest first (ORDER_RULE)."""
        result = TargetBuild(target.name, max_loss, "failed")
        first = self._try(result, target.recipe, None, FIRST, max_loss)
        if (first is not None and first.verdict == "kept") or result.error:
            return result
        further = _further_candidates(
            target, calib=self.calib, max_loss=max_loss, first=first, notes=result.notes
        )
        sizes = {(recipe, bits): self.predicted_bytes(recipe, bits) for recipe, bits, _ in further}
        # Stable: equal sizes keep the file's order; a size the plan cannot predict goes last.
        further.sort(key=lambda c: (sizes[c[:2]] is None, sizes[c[:2]] or 0))
        for recipe_name, bits, why in further:
            step = self._try(result, recipe_name, bits, why, max_loss, predicted=sizes[(recipe_name, bits)])
            if step is not None and (step.verdict == "kept" or result.error):
                break
        return result

    def _try(
        self,
        result: TargetBuild,
        recipe_name: str,
        bits: float | None,
        why: str,
        max_loss: float,
        *,
        predicted: int | None = None,
    ) -> ChainStep | None:
        """Build (or reuse) one candidate and judge it for the target; None: it needs data and no
        --calib was given (a note says so)."""
        if self._needs_data(recipe_name, bits) and self.calib is None:
            result.notes.append(f"{recipe_name} not tried: it calibrates on data and no --calib was given")
            return None
        entry, cached = self.candidate(recipe_name, bits, result.name)
        below = self.below_floor()
        try:
            step = _judge(
                entry, max_loss, self.eval_intervals(entry), self.set_tasks, below, self.accept_unresolved
            )
        except _TargetFailed as failed:  # no candidate can be judged: the target fails here
            step = _judge(entry, max_loss, {}, self.set_tasks, below)
            step.verdict, step.detail = "error", failed.reason
            result.error, result.traceback = failed.reason, failed.trace
        step.cached, step.why, step.predicted_bytes = cached, why, predicted
        if predicted is None and why != FIRST:  # a further candidate the plan could not size
            step.size_unknown = self.unplanned.get((recipe_name, bits))
        result.chain.append(step)
        if step.verdict == "kept":
            result.status, result.checkpoint = "passed", entry.checkpoint
            if step.accepted_unresolved:
                warning = (
                    f"target {result.name} kept {Path(entry.checkpoint).name} with --accept-unresolved: "
                    f"task(s) {', '.join(step.accepted_unresolved)} unresolved against {max_loss}"
                )
                result.notes.append(warning)
                self.report.warnings.append(warning)
        return step

    def below_floor(self) -> dict[str, float]:
        """The tasks whose held-out rows the original answers under the floor, with its best there."""
        self.held_out_tasks()
        if self.held_out is None:
            return {}
        best = self.held_out.best()
        return {task: best[task] for task in self.held_out.below_floor}

    def predicted_bytes(self, recipe_name: str, bits: float | None) -> int | None:
        """The checkpoint size quantize's plan predicts from the config. None: the plan refuses the
        recipe for this model (a QuantkitError, e.g. a width its blocks do not divide) or a
        library's error fails it (out of memory / stack raised): why is in ``unplanned``, the
        candidate is tried last and its build says why."""
        from quantkit.quantize import plan
        from quantkit.recipes import get_recipe

        if (recipe_name, bits) not in self.sizes:
            try:
                planned = plan(
                    self.model_dir, get_recipe(recipe_name), [], adapter=self.adapter, avg_bits=bits
                )
                self.sizes[(recipe_name, bits)] = planned.checkpoint_bytes
            except QuantkitError as error:
                self.sizes[(recipe_name, bits)] = None
                self.unplanned[(recipe_name, bits)] = (
                    f"size unknown, tried last: the plan refuses it: {error}"
                )
            except Exception as error:  # a library's: quantize hits it too and records the candidate
                message, _ = _library_failure(error)  # out of memory / stack still raised
                self.sizes[(recipe_name, bits)] = None
                self.unplanned[(recipe_name, bits)] = f"size unknown, tried last: the plan failed: {message}"
        return self.sizes[(recipe_name, bits)]

    @staticmethod
    def _needs_data(recipe_name: str, bits: float | None) -> bool:
        from quantkit.recipes import get_recipe

        return get_recipe(recipe_name).needs_data or bits is not None

    def candidate(
        self, recipe_name: str, avg_bits: float | None, target: str
    ) -> tuple[CheckpointBuild, bool]:
        """The candidate's record: from this run, from the last build (same inputs), or built now."""
        from quantkit.recipes import get_recipe

        recipe = get_recipe(recipe_name)
        suffix = "" if avg_bits is None else f"-avg{avg_bits:g}"
        checkpoint = self.output_root / f"{self.model_dir.name}-{recipe.name}{suffix}"
        if str(checkpoint) in self.built:
            entry = self.built[str(checkpoint)]
            if target not in entry.targets:
                entry.targets.append(target)
            return entry, True
        self.held_out_tasks()  # the rows it is measured on: part of its key
        digest = self.held_out.digest() if self.held_out is not None else None
        key = build_key(
            self.model_hash,
            self.calib_hash,
            recipe,
            self.num_samples,
            self.vllm,
            avg_bits=avg_bits,
            drift_samples=[self.drift_samples, self.gate_items],  # which rows calibrate, which judge
            held_out=digest,
        )
        entry = CheckpointBuild(
            [target], recipe.name, str(checkpoint), "error", key, avg_bits=avg_bits, held_out=digest
        )
        before = self.previous.get(str(checkpoint))
        verified = None
        cached = not self.force and _up_to_date(before, key, checkpoint)
        if cached:
            entry.status = "up-to-date"
            for name in (
                "vllm",
                "size_ratio",
                "drift",
                "losses",
                "kl_losses",
                "text_scope_samples",
                "eval_scores",
                "intervals",
            ):
                setattr(entry, name, before.get(name))
        else:
            verified = self._quantize_and_verify(entry, recipe, checkpoint, avg_bits)
        if self.eval_names and entry.ok:
            self._score(entry)
        self.built[str(checkpoint)] = entry
        self.report.checkpoints.append(entry)
        if self.on_checkpoint:
            self.on_checkpoint(entry, verified)
        self.save()
        return entry, cached

    def _samples(self):
        from quantkit.models.inputs import processor_capabilities
        from quantkit.quantize.calibration_set import samples_from_set

        if self.drawn is None:
            kinds = processor_capabilities(self.adapter.load_processor(self.model_dir))
            drawn = samples_from_set(self.calib, model_kinds=kinds, num_samples=self.num_samples)
            spare = len(drawn.samples) // 4  # what the set can spare for the gate
            held_out = min(self.drift_samples or spare, spare) if self.num_samples is None else 0
            if held_out:  # drift needs samples calibration did not see
                drawn = samples_from_set(
                    self.calib, model_kinds=kinds, num_samples=len(drawn.samples) - held_out
                )
            self.drawn = drawn
        return self.drawn

    def held_out_tasks(self) -> set[str]:
        """The tasks of the rows no candidate calibrates on (of modalities the model takes): the
        drift samples cover each of them ({} without --calib). Raises InputError when none is
        left, before anything is quantized, and _TargetFailed when a library's error fails
        choosing the rows (the original's forward): no target can be judged."""
        if self.calib is None:
            return set()
        if self.tasks is None:
            from quantkit.models.inputs import processor_capabilities
            from quantkit.verify.drift import choose_held_out_rows, held_out_rows

            kinds = processor_capabilities(self.adapter.load_processor(self.model_dir))
            every = held_out_rows(self.calib, exclude_ids=set(), count=sys.maxsize, seed=0, kinds=kinds)
            self.set_tasks = {row["task"] for row in every}
            rows = held_out_rows(
                self.calib,
                exclude_ids=set(self._samples().info["sample_ids"]),
                count=sys.maxsize,  # all of them
                seed=0,
                kinds=kinds,
            )
            tasks = {row["task"] for row in rows}
            # Every candidate is judged on the same rows (LOSS_DEFINITION).
            try:
                self.held_out = choose_held_out_rows(
                    self.model_dir,
                    self.calib,
                    exclude_ids=set(self._samples().info["sample_ids"]),
                    count=len(rows),
                    per_task_items=self.gate_items or len(rows),  # every held-out row of a task
                )
            except QuantkitError:
                raise
            except Exception as error:  # a library's: as in _quantize_and_verify (out of memory raised)
                message, trace = _library_failure(error)
                reason = f"choosing the held-out rows (the original's forward): {message}"
                raise _TargetFailed(reason, trace) from error
            self.report.held_out = self.held_out.to_dict()
            self.tasks = tasks
        return self.tasks

    def _quantize_and_verify(self, entry: CheckpointBuild, recipe, checkpoint: Path, avg_bits: float | None):
        from quantkit.quantize import quantize
        from quantkit.verify import VLLM_ACCEPTED, verify_checkpoint
        from quantkit.verify.drift import ANSWER_SCOPE

        started = time.perf_counter()
        verified = None
        uses_data = recipe.needs_data or avg_bits is not None
        try:
            drawn = self._samples() if uses_data else None
            quantize(
                self.model_dir,
                checkpoint,
                recipe,
                drawn.samples if uses_data else [],
                sample_labels=drawn.labels if uses_data else None,
                calib_info=drawn.info if uses_data else None,
                force=True,  # a stale or failed checkpoint of this recipe is replaced
                cache_dir=self.cache_dir,
                progress=False,
                avg_bits=avg_bits,
            )
            verified = verify_checkpoint(
                checkpoint,
                reference=self.model_dir if self.calib is not None else None,
                calib=self.calib,
                vllm=self.vllm,
                # Every task of the held-out rows measured (at least one sample each), every
                # candidate on the same samples: those no data recipe calibrated on.
                num_samples=len(self.held_out.rows) if self.held_out is not None else 1,
                exclude_ids=set(self._samples().info["sample_ids"]) if self.calib is not None else None,
                drift_stratify_by="task",
                drift_held_out=self.held_out,
            )
            entry.status = "passed" if verified.passed else "failed"
            entry.size_ratio = round(verified.audit.size_ratio, 4)
            entry.reasons = [f"audit: {c.name}: {c.detail}" for c in verified.audit.checks if not c.passed]
            if verified.drift is not None:
                overall = verified.drift.overall
                entry.drift = {"kl": overall.kl, "top1": overall.top1, "cosine": overall.cosine}
                entry.losses = task_losses(verified.drift)
                entry.intervals = task_intervals(verified.drift)
                entry.kl_losses = task_kl_losses(verified.drift)
                entry.text_scope_samples = [
                    s.id for s in verified.drift.samples if s.loss_scope != ANSWER_SCOPE
                ]
                entry.reasons += [f"drift: {b}" for b in verified.drift.breaches]
            if verified.vllm is not None:
                entry.vllm = verified.vllm.status
                if verified.vllm.status not in VLLM_ACCEPTED:
                    entry.reasons.append(f"vllm: {verified.vllm.reason}")
        except QuantkitError as error:  # one candidate's failure must not lose the others
            entry.status = "error"
            entry.reasons = [str(error)]
        except Exception as error:  # a library's error: recorded, and the chain goes on
            message, entry.traceback = _library_failure(error)  # the traceback: build.json only
            entry.status, entry.reasons = "error", [message]
        entry.seconds = round(time.perf_counter() - started, 1)
        return verified

    @property
    def eval_items(self) -> int:
        return self.gate_items or DEFAULT_EVAL_ITEMS

    def _score(self, entry: CheckpointBuild) -> None:
        """Skills scores of the candidate, per item, for the asked tasks (those not already in its
        record)."""
        from quantkit.eval.skills import score_model

        record = entry.eval_scores or {}
        items = dict(record.get("item_scores") or {}) if record.get("items") == self.eval_items else {}
        missing = [name for name in self.eval_names if name not in items]
        if missing:
            try:
                scored = score_model(Path(entry.checkpoint), missing, items=self.eval_items)
            except QuantkitError as error:
                entry.status, entry.reasons = "error", [*entry.reasons, f"eval: {error}"]
                return
            except Exception as error:  # a library's error: as in _quantize_and_verify
                message, entry.traceback = _library_failure(error)
                entry.status, entry.reasons = "error", [*entry.reasons, f"eval: {message}"]
                return
            items.update({t.task: t.item_scores for t in scored.tasks})
        scores = {task: sum(values) / len(values) for task, values in items.items()}
        entry.eval_scores = {"items": self.eval_items, "scores": scores, "item_scores": items}

    def score_original(self) -> None:
        """The original's per-item skills scores (before any quantize: check_resolvable needs
        them). A failure fails every target (_TargetFailed); out of memory is raised."""
        if not self.eval_names or self.original_items is not None:
            return
        from quantkit.eval.skills import score_model

        try:
            scored = score_model(self.model_dir, self.eval_names, items=self.eval_items)
        except QuantkitError as error:
            raise _TargetFailed(f"scoring the original model: {error}", None) from error
        except Exception as error:  # a library's error: as in _quantize_and_verify
            message, trace = _library_failure(error)
            raise _TargetFailed(f"scoring the original model: {message}", trace) from error
        self.original_items = {t.task: t.item_scores for t in scored.tasks}
        self.original_scores = {t.task: t.score for t in scored.tasks}
        self.metrics = {t.task: t.metric for t in scored.tasks}
        self.report.eval_original = self.original_scores

    def gate_sizes(self) -> dict[str, tuple[int, float | None]]:
        """Per task the gate judges: (items, the loss one item's whole change makes, or None for a
        continuous score), for gate.unresolvable."""
        from quantkit.eval.skills import HIT_METRICS

        sizes: dict[str, tuple[int, float | None]] = {}
        for row in self.held_out.rows if self.held_out is not None else []:
            count, _ = sizes.get(row.task, (0, None))
            sizes[row.task] = (count + 1, None)  # expected accuracy: continuous
        for task, values in (self.original_items or {}).items():
            base = sum(values)
            if base > 0:  # a task the original scores 0 on is not judged
                step = 100.0 / base if self.metrics[task] in HIT_METRICS else None
                sizes[f"{EVAL_PREFIX}{task}"] = (len(values), step)
        return sizes

    def check_resolvable(self, budgets: list[float]) -> None:
        """Said before any quantize: the tasks whose items cannot resolve a budget even for a
        lossless candidate. An InputError, or with --accept-unresolved a warning."""
        problems = []
        for task, (count, step) in sorted(self.gate_sizes().items()):
            for budget in budgets:
                why = unresolvable(count, budget, step)
                if why:
                    problems.append(f"{task} at budget {budget}: {why}")
                    break
        if not problems:
            return
        if self.accept_unresolved:
            for line in problems:
                self.report.warnings.append(f"unresolvable, accepted: {line}")
                if self.on_warning:
                    self.on_warning(self.report.warnings[-1])
            return
        raise InputError(
            "the gate's items cannot resolve the budget even for a lossless candidate: "
            + "; ".join(problems),
            hint="give the gate more items (a larger calibration set, fewer --num-samples, --gate-items N "
            "for --eval-tasks), a looser --max-loss, or --accept-unresolved to keep unresolved candidates "
            "with a warning",
        )

    def eval_intervals(self, entry: CheckpointBuild) -> dict[str, dict]:
        """Per asked skills task, 100% - recovery with its paired interval: the original's per-item
        scores as weights (tasks the original scores 0 on are not judged)."""
        if not self.eval_names or not entry.eval_scores:
            return {}
        self.score_original()
        candidate = entry.eval_scores.get("item_scores") or {}
        from quantkit.eval.skills import EVAL_SEED

        found = {}
        for task, original in self.original_items.items():
            if sum(original) > 0 and len(candidate.get(task, [])) == len(original):
                found[f"{EVAL_PREFIX}{task}"] = measure(
                    original,
                    candidate[task],
                    original,
                    metric=self.metrics[task],
                    items=[f"{task}:{EVAL_SEED}:{i}" for i in range(len(original))],
                ).to_dict()
        return found
