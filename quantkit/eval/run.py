"""``quantkit eval``: the same harness tasks on the original and each checkpoint, and the recovery.

Stages (plain functions, in this order):
  1. check every input before any model loads: folders, options, backend, task names, and that
     each task's data can be had here                                  tasks.task_catalog
  2. run the harness on the original, then on each checkpoint, one model in memory at a time
                                                                      backends.run_hf / run_in_environment
  3. pair each checkpoint's metrics with the original's, judge the loss   compare.compare
  4. write eval.json and the README section beside each checkpoint       report.write_results
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from pathlib import Path

from quantkit.errors import CheckFailed, InputError, QuantkitError
from quantkit.eval.backends import BACKENDS, HarnessRun, run_hf, run_in_environment, vllm_status
from quantkit.eval.compare import DEFAULT_MAX_LOSS, Comparison, compare, scores_from_results
from quantkit.eval.gate import in_loss_range
from quantkit.eval.report import write_results
from quantkit.eval.tasks import task_catalog
from quantkit.fsutil import refuse_overlap, within


@dataclass
class CheckpointEval:
    checkpoint: Path
    run: HarnessRun | None  # None when the checkpoint did not load or run (see error)
    rows: list[Comparison]
    payload: dict = field(repr=False, default_factory=dict)
    eval_json: Path | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.rows) and all(row.within for row in self.rows)

    @property
    def breaches(self) -> list[Comparison]:
        return [row for row in self.rows if not row.within]


@dataclass
class EvalReport:
    original: HarnessRun
    checkpoints: list[CheckpointEval]
    tasks: list[str]
    limit: int | None
    backend: str
    max_loss: float
    data: dict
    harness: dict

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checkpoints)

    @property
    def failed(self) -> list[CheckpointEval]:
        return [c for c in self.checkpoints if not c.passed]


def split_tasks(tasks: str | Sequence[str]) -> list[str]:
    """``"a,b"`` or ``["a", "b,c"]`` -> ``["a", "b", "c"]`` (order kept, duplicates dropped)."""
    items = [tasks] if isinstance(tasks, str) else list(tasks)
    out: list[str] = []
    for item in items:
        for name in str(item).split(","):
            name = name.strip()
            if name and name not in out:
                out.append(name)
    return out


def _check_model_folder(path: Path, what: str) -> Path:
    from quantkit.models.adapters import model_architecture

    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} folder not found", path=path)
    if not path.is_dir():
        raise InputError(f"{what} must be a model folder", path=path)
    model_architecture(path)  # config.json present, valid, naming an architecture
    return path


def check_inputs(
    original: Path,
    checkpoints: Sequence[Path],
    *,
    limit: int | None,
    backend: str,
    max_loss: float,
    batch_size: int,
) -> tuple[Path, list[Path]]:
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}", hint=f"choose one of: {', '.join(BACKENDS)}")
    if not checkpoints:
        raise InputError("no checkpoint folder given", hint="quantkit eval ORIGINAL CHECKPOINT... --tasks T")
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, not {limit}")
    if not in_loss_range(max_loss):
        raise InputError(f"--max-loss must be a percentage between 0 and 100, not {max_loss}")
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, not {batch_size}")
    original = _check_model_folder(original, "original model")
    return original, [_check_model_folder(c, "checkpoint") for c in checkpoints]


def refuse_writing_the_original(original: Path, checkpoints: Sequence[Path]) -> None:
    """eval.json and a README section go into each checkpoint: none may be the original model,
    hold it, or lie inside it (the one overlap rule, quantkit.fsutil.refuse_overlap)."""
    for checkpoint in checkpoints:
        if within(checkpoint, original) and within(original, checkpoint):
            raise InputError(
                "the original model is among the checkpoints: eval writes its results into each "
                "checkpoint and never into the original",
                path=checkpoint,
                hint="pass the original once, first, and only quantized checkpoints after it",
            )
        refuse_overlap(checkpoint, {"original model": original}, option="checkpoint")


def harness_versions() -> dict[str, str | None]:
    versions = {}
    for name in ("lm_eval", "transformers", "torch", "compressed-tensors"):
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _payload(
    report_args: dict,
    original: HarnessRun,
    checkpoint: Path,
    run: HarnessRun | None,
    rows: list[Comparison],
    error: str | None = None,
) -> dict:
    def run_info(r: HarnessRun) -> dict:
        return {
            "folder": str(r.model_dir),
            "dtype": r.dtype,
            "loaded_as": r.loaded_as,
            "seconds": r.seconds,
            "n_samples": r.results.get("n-samples"),
            "results": r.results.get("results"),
            "groups": r.results.get("groups"),
            "higher_is_better": r.results.get("higher_is_better"),
            "versions": r.results.get("versions"),
        }

    return {
        "checkpoint": str(checkpoint),
        "original": str(original.model_dir),
        "passed": error is None and bool(rows) and all(r.within for r in rows),
        "error": error,
        **report_args,
        "rows": [r.to_dict() for r in rows],
        "original_run": run_info(original),
        "checkpoint_run": run_info(run) if run is not None else None,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def evaluate_checkpoints(
    original: Path,
    checkpoints: Sequence[Path],
    tasks: str | Sequence[str],
    *,
    limit: int | None = None,
    backend: str = "hf",
    include_paths: Sequence[Path] = (),
    max_loss: float = DEFAULT_MAX_LOSS,
    batch_size: int = 1,
    cache_dir: Path | None = None,
    write: bool = True,
    log: Callable[[str], None] | None = None,
) -> EvalReport:
    """Run ``tasks`` on ``original`` and every checkpoint; return the recovery per metric.

    Writes ``eval.json`` and the README section beside each checkpoint (``write=False`` keeps the
    folders untouched). Raises InputError for bad input, before any model loads; a checkpoint
    beyond ``max_loss`` is not an exception: see ``report.passed`` / ``report.failed``.
    """
    say = log or (lambda _message: None)
    names = split_tasks(tasks)
    if not names:
        raise InputError("no task given", hint="e.g. --tasks quantkit_prose_ppl")
    original, checkpoints = check_inputs(
        original, checkpoints, limit=limit, backend=backend, max_loss=max_loss, batch_size=batch_size
    )
    refuse_overlap(
        cache_dir,
        {"original model": original, "checkpoint": checkpoints, "task folder": include_paths},
        option="--cache-dir",
    )
    if write:
        refuse_writing_the_original(original, checkpoints)
    python = None
    if backend == "vllm":
        python, why = vllm_status()
        if python is None:
            raise InputError(f"--backend vllm is not available: {why}")

    catalog = task_catalog(include_paths, cache_dir, names)
    catalog.check_names(names)
    say(f"loading task(s) {', '.join(names)}")
    catalog.load(names)  # every dataset reachable before any model loads

    def run(model_dir: Path) -> HarnessRun:
        if backend == "hf":
            return run_hf(model_dir, names, catalog, limit=limit, batch_size=batch_size)
        return run_in_environment(python, model_dir, names, catalog, limit=limit, batch_size=batch_size)

    say(f"original {original}")
    try:
        original_run = run(original)
    except CheckFailed as err:  # the reference itself does not run: nothing to compare against
        raise InputError(
            f"the original model does not run in the harness: {err.message}", path=original
        ) from None
    original_scores = scores_from_results(original_run.results)
    if not original_scores:
        raise CheckFailed("the harness reported no metric for the original model", path=original)
    args = {
        "max_loss_pct": max_loss,
        "tasks": names,
        "limit": limit,
        "backend": backend,
        "batch_size": batch_size,
        "data": catalog.data.provenance(),
        "harness": harness_versions(),
    }
    results = []
    for checkpoint in checkpoints:
        say(f"checkpoint {checkpoint}")
        try:
            checkpoint_run, error = run(checkpoint), None
            rows = compare(original_scores, scores_from_results(checkpoint_run.results), max_loss)
        except QuantkitError as err:  # does not load or breaks in forward: a failed checkpoint
            checkpoint_run, error, rows = None, str(err), []
        payload = _payload(args, original_run, checkpoint, checkpoint_run, rows, error)
        result = CheckpointEval(checkpoint, checkpoint_run, rows, payload, error=error)
        if write:
            result.eval_json, _ = write_results(checkpoint, result.payload)
        results.append(result)
    return EvalReport(
        original=original_run,
        checkpoints=results,
        tasks=names,
        limit=limit,
        backend=backend,
        max_loss=max_loss,
        data=args["data"],
        harness=args["harness"],
    )
