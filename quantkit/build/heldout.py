"""What the build's gate judges every candidate on: the calibration set's held-out rows (chosen
once per build, the same for every candidate; LOSS_DEFINITION) and, with --eval-tasks, the
original's per-item skills scores; and how a candidate's skills scores are taken."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from quantkit.build.judge import EVAL_PREFIX
from quantkit.build.record import BuildReport, CheckpointBuild, TargetFailed, library_failure
from quantkit.errors import InputError, QuantkitError
from quantkit.eval.gate import measure, unresolvable

# Items per --eval-tasks task without --gate-items: a 0-or-1 metric moves 100 / (items x score)
# percent per item, within the default budget (gate.DEFAULT_MAX_LOSS) for an original that scores
# a third or more.
DEFAULT_EVAL_ITEMS = 200


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


@dataclass
class GateInputs:
    """The held-out rows and the original's scores of one build (``choose`` and ``score_original``
    fill them before any quantize)."""

    model_dir: Path
    calib: Path | None
    opened: object  # models.samples.OpenSet: the set as read once for the model (None without --calib)
    calibrated_ids: set[str]  # the rows the data recipes calibrate on: never judged on
    eval_names: list[str]
    gate_items: int | None
    report: BuildReport
    accept_unresolved: bool = False
    on_warning: object = None
    tasks: set[str] = field(default_factory=set)  # of the held-out rows
    held_out: object = None  # drift.HeldOutChoice: the rows every candidate is judged on
    set_tasks: set[str] = field(default_factory=set)  # of every row the model can take
    original_scores: dict[str, float] | None = None
    original_items: dict[str, list[float]] | None = None  # the original's per-item scores, per eval task
    metrics: dict[str, str] = field(default_factory=dict)  # each eval task's metric (skills.SCORERS)

    @property
    def digest(self) -> str | None:
        """HeldOutChoice.digest(): the rows a candidate's losses are measured on (its cache key)."""
        return self.held_out.digest() if self.held_out is not None else None

    def choose(self) -> None:
        """The rows no candidate calibrates on (of modalities the model takes), their tasks, and the
        held-out choice every candidate is judged on (nothing without --calib). Raises InputError
        when none is left, before anything is quantized, and TargetFailed when a library's error
        fails choosing the rows (the original's forward): no target can be judged."""
        if self.calib is None:
            return
        from quantkit.verify.drift import choose_held_out_rows, held_out_rows

        self.set_tasks = {row["task"] for row in self.opened.usable}
        rows = held_out_rows(
            self.calib,
            exclude_ids=self.calibrated_ids,
            count=sys.maxsize,  # all of them
            seed=0,
            kinds=self.opened.kinds,
            rows=self.opened.usable,
        )
        # Every candidate is judged on the same rows (LOSS_DEFINITION).
        try:
            self.held_out = choose_held_out_rows(
                self.model_dir,
                self.calib,
                exclude_ids=self.calibrated_ids,
                count=len(rows),
                per_task_items=self.gate_items or len(rows),  # every held-out row of a task
                opened=self.opened,
            )
        except QuantkitError:
            raise
        except Exception as error:  # a library's: as a candidate's (out of memory raised)
            message, trace = library_failure(error)
            reason = f"choosing the held-out rows (the original's forward): {message}"
            raise TargetFailed(reason, trace) from error
        self.report.held_out = self.held_out.to_dict()
        self.tasks = {row["task"] for row in rows}

    def below_floor(self) -> dict[str, float]:
        """The tasks whose held-out rows the original answers under the floor, with its best there."""
        if self.held_out is None:
            return {}
        best = self.held_out.best()
        return {task: best[task] for task in self.held_out.below_floor}

    @property
    def eval_items(self) -> int:
        return self.gate_items or DEFAULT_EVAL_ITEMS

    def score(self, entry: CheckpointBuild) -> None:
        """Skills scores of the candidate, per item, for the asked tasks (those not already in its
        record)."""
        from quantkit.eval.skills import score_model

        record = entry.eval_scores or {}
        items = dict(record.get("item_scores") or {}) if record.get("items") == self.eval_items else {}
        missing = [name for name in self.eval_names if name not in items]
        if missing:
            try:
                scored = score_model(
                    Path(entry.checkpoint), missing, items=self.eval_items, suite_from=self.model_dir
                )
            except QuantkitError as error:
                entry.status, entry.reasons = "error", [*entry.reasons, f"eval: {error}"]
                return
            except Exception as error:  # a library's error: recorded as a candidate's
                message, entry.traceback = library_failure(error)
                entry.status, entry.reasons = "error", [*entry.reasons, f"eval: {message}"]
                return
            items.update({t.task: t.item_scores for t in scored.tasks})
        scores = {task: sum(values) / len(values) for task, values in items.items()}
        entry.eval_scores = {"items": self.eval_items, "scores": scores, "item_scores": items}

    def score_original(self) -> None:
        """The original's per-item skills scores (before any quantize: check_resolvable needs
        them). A failure fails every target (TargetFailed); out of memory is raised."""
        if not self.eval_names or self.original_items is not None:
            return
        from quantkit.eval.skills import score_model

        try:
            scored = score_model(self.model_dir, self.eval_names, items=self.eval_items)
        except QuantkitError as error:
            raise TargetFailed(f"scoring the original model: {error}", None) from error
        except Exception as error:  # a library's error: recorded as a candidate's
            message, trace = library_failure(error)
            raise TargetFailed(f"scoring the original model: {message}", trace) from error
        self.original_items = {t.task: t.item_scores for t in scored.tasks}
        self.original_scores = {t.task: t.score for t in scored.tasks}
        self.metrics = {t.task: t.metric for t in scored.tasks}
        self.report.eval_original = self.original_scores

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
