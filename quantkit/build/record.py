"""build.json: the records of a build (candidates, targets' chains, the report), what makes a
candidate "the same" across runs (build_key), and how they are read back and merged by target."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import traceback
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from quantkit import __version__
from quantkit.errors import shorten
from quantkit.fsutil import sha256_file, write_file_atomic

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

DRIFT_LIMITS = {
    "recipe": "a candidate whose next-token drift on the held-out rows breaks its recipe's "
    "drift_thresholds (KL, top-1, cosine; per modality and task) fails its checks",
    "report": "the drift limits' breaches are recorded (build.json's drift_reported, the summary) "
    "and not judged: the per-task accuracy gate alone decides. For small models (a few hundred "
    "million parameters), whose next-token KL exceeds limits set for large ones even where no "
    "task loses accuracy; non-finite drift still fails",
}
LOSS_VERSION = "answer-accuracy-points-5"  # -5: every held-out row of a task, with an interval


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
    drift_reported: list[str] = field(default_factory=list)  # drift limits breached, not judged (DRIFT_LIMITS)

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
    drift_limits: str = "recipe"  # DRIFT_LIMITS

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
            "drift_limits": {"mode": self.drift_limits, "meaning": DRIFT_LIMITS[self.drift_limits]},
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
    drift_limits: str = "recipe",
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
    if drift_limits != "recipe":  # a candidate passed with its limits reported has not met them
        payload["drift_limits"] = drift_limits
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


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


def up_to_date(before: dict | None, key: str, checkpoint: Path) -> bool:
    """The last build made this checkpoint from the same inputs, it passed, and it is still there."""
    return (
        before is not None
        and before["key"] == key
        and before["status"] in ("passed", "up-to-date")
        and (checkpoint / "quantkit.json").is_file()
    )


def library_failure(error: Exception) -> tuple[str, str]:
    """A library's error (not a QuantkitError) that fails one piece of the build, the others going
    on: its ``type: message`` and traceback (for build.json; call it inside the ``except``). Out of
    memory or of stack is the machine's state, not the candidate's: raised, never recorded (the
    next candidate would only fail the same way, or be judged on it)."""
    import torch

    if isinstance(error, (MemoryError, RecursionError, torch.OutOfMemoryError)):
        raise error
    return f"{type(error).__name__}: {error}", traceback.format_exc()


class TargetFailed(Exception):
    """What fails a whole target, not one candidate (the original model could not be scored)."""

    def __init__(self, reason: str, trace: str | None) -> None:
        super().__init__(reason)
        self.reason, self.trace = reason, trace


class BuildRecord:
    """build.json as a build goes: this run's report, merged with the earlier runs' records of the
    same model (by its bytes; another model's records are not merged, nor its folders' cards
    rewritten)."""

    def __init__(self, model_dir: Path, output_root: Path, calib: Path | None) -> None:
        self.output_root = output_root
        self.model_hash = model_fingerprint(model_dir)
        data = _read_build_file(output_root)
        self.same_model = _same_model(data, model_dir, self.model_hash)
        self.previous = _previous(data, output_root) if self.same_model else {}
        self.earlier_targets = _earlier_targets(data, output_root) if self.same_model else []
        self.report = BuildReport(
            str(output_root), str(model_dir), str(calib) if calib else None, [], model_hash=self.model_hash
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

    def drift_reported(self, folder: str) -> list[str]:
        """The drift limits a candidate broke without them being judged (DRIFT_LIMITS "report")."""
        for entry in self.report.checkpoints:
            if entry.checkpoint == folder:
                return entry.drift_reported
        return self.previous.get(folder, {}).get("drift_reported") or []

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
