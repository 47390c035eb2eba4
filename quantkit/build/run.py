"""`quantkit build`: one checkpoint per hardware target, gated on accuracy.

Each target has a chain of candidates: its recipe, then (when it misses) the recipe again at each
``avg_bits`` step (4-bit group recipes) and its fallbacks whose ``when`` holds, smallest predicted
checkpoint first (ORDER_RULE). Every candidate is quantized, verified (audit, drift against the
original on held-out calibration samples, optionally vLLM) and, with ``eval_tasks``, scored per
skills task. The first candidate whose checks pass and whose every task loses at most the
target's budget is kept: the smallest that passes. A target none meets fails with the table of
what was tried, and the other targets still build. Candidates are shared between
targets and cached between runs (model bytes, calibration set, recipe, avg bits, options).

The steps: check the inputs, read the earlier build.json, draw the calibration samples, choose
the held-out rows (and score the original), build each target's chain, rewrite the cards.
"""

from __future__ import annotations

from pathlib import Path

from quantkit.build.candidates import Candidates, check_reachable
from quantkit.build.card import card_section, update_card
from quantkit.build.hardware import load_targets
from quantkit.build.heldout import GateInputs, resolve_eval_tasks
from quantkit.build.record import (
    DRIFT_LIMITS,
    BuildRecord,
    BuildReport,
    TargetBuild,
    TargetFailed,
    library_failure,
)
from quantkit.errors import InputError, QuantkitError
from quantkit.eval.gate import in_loss_range
from quantkit.fsutil import check_writable, refuse_overlap
from quantkit.modelfiles import check_model_folder


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
    drift_limits: str = "recipe",
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
    ``drift_limits``: a key of DRIFT_LIMITS (whether the recipes' drift limits fail a candidate).
    """
    from quantkit.models.adapters import adapter_for
    from quantkit.models.samples import open_set

    model_dir, output_root = Path(model_dir), Path(output_root)
    _check_options(model_dir, output_root, target_names, calib, max_loss, gate_items, drift_samples, vllm)
    if drift_limits not in DRIFT_LIMITS:
        raise InputError(f"drift limits {drift_limits!r}: use one of {', '.join(DRIFT_LIMITS)}")
    table = load_targets(targets_file)
    chosen = [table.get(name) for name in dict.fromkeys(target_names)]
    eval_names = resolve_eval_tasks(model_dir, eval_tasks)
    check_reachable(chosen, calib)

    output_root.mkdir(parents=True, exist_ok=True)
    adapter = adapter_for(model_dir)
    opened = open_set(model_dir, calib, adapter=adapter) if calib is not None else None  # read once
    record = BuildRecord(model_dir, output_root, calib)
    samples = _draw(opened, num_samples, drift_samples)
    record.report.eval_tasks = eval_names
    record.report.requested = [target.name for target in chosen]
    record.report.drift_limits = drift_limits
    gate = GateInputs(
        model_dir,
        calib,
        opened,
        set(samples.info["sample_ids"]) if samples is not None else set(),
        eval_names,
        gate_items,
        record.report,
        accept_unresolved=accept_unresolved,
        on_warning=on_warning,
    )
    try:
        gate.choose()  # no held-out sample left: bad input (exit 2) before any quantize
        gate.score_original()
        gate.check_resolvable(sorted({target.budget(max_loss) for target in chosen}))
    except TargetFailed as failed:  # no target can be judged: each fails with the error (exit 1)
        for target in chosen:
            failed_target = TargetBuild(
                target.name, target.budget(max_loss), "failed", error=failed.reason, traceback=failed.trace
            )
            record.report.targets.append(failed_target)
            if on_target:
                on_target(failed_target)
        record.save()
        return record.report
    candidates = Candidates(
        model_dir=model_dir,
        output_root=output_root,
        adapter=adapter,
        calib=calib,
        calib_hash=opened.sha256 if opened is not None else None,
        samples=samples,
        num_samples=num_samples,
        drift_samples=drift_samples,
        vllm=vllm,
        force=force,
        gate=gate,
        drift_limits=drift_limits,
        record=record,
        on_checkpoint=on_checkpoint,
    )
    for target in chosen:
        built = candidates.build_target(target, target.budget(max_loss))
        record.report.targets.append(built)
        record.save()
        if on_target:
            on_target(built)
    _update_cards(record)
    record.save()
    return record.report


def _check_options(
    model_dir: Path,
    output_root: Path,
    target_names: list[str],
    calib: Path | None,
    max_loss: float | None,
    gate_items: int | None,
    drift_samples: int | None,
    vllm: bool,
) -> None:
    """Bad input (exit 2) said before anything is read or quantized."""
    if not target_names:
        raise InputError("no target given", hint="pass --target NAME (see `quantkit targets`)")
    if max_loss is not None and not in_loss_range(max_loss):
        raise InputError(
            f"--max-loss {max_loss}: a loss in [0, 100] (points of drift loss, percent of an --eval-tasks score)"
        )
    for option, value in (("--gate-items", gate_items), ("--drift-samples", drift_samples)):
        if value is not None and value < 1:
            raise InputError(f"{option} {value}: at least 1")
    refuse_overlap(output_root, {"model folder": model_dir, "calibration set": calib}, option="--output-root")
    check_model_folder(model_dir)
    check_writable(output_root, option="--output-root", kind="folder")
    if vllm:  # asked for and cannot run: exit 2 before any quantize
        from quantkit.verify.vllm_check import require_vllm_python

        require_vllm_python("--vllm")


def _draw(opened, num_samples: int | None, drift_samples: int | None):
    """The samples the data recipes calibrate on: without ``num_samples``, all but a stratified
    share (``drift_samples``, by default and at most a quarter of the set) that the gate judges
    on. None without --calib."""
    if opened is None:
        return None
    if num_samples is not None:
        return opened.draw(num_samples)
    spare = len(opened.usable) // 4  # what the set can spare for the gate
    held_out = min(drift_samples or spare, spare)
    # drift needs samples calibration did not see
    return opened.draw(len(opened.usable) - held_out) if held_out else opened.draw()


def _update_cards(record: BuildRecord) -> None:
    """Kept or not, each card says what the gate made of it, earlier runs' candidates included (a
    candidate an earlier run kept that no target keeps now says so)."""
    targets = record.all_targets()
    for folder in record.candidate_folders():
        if (Path(folder) / "config.json").is_file():
            try:
                update_card(Path(folder), card_section(folder, targets, record.drift_reported(folder)))
            except QuantkitError as error:  # one card not rewritten: said, the others still are
                record.report.warnings.append(f"{folder}: model card not updated: {error}")
            except OSError:  # a disk that fails or fills up: exit 1 (quantkit/cli/_common.py)
                raise
            except Exception as error:  # a library's error: as a candidate's
                record.report.warnings.append(
                    f"{folder}: model card not updated: {library_failure(error)[0]}"
                )
