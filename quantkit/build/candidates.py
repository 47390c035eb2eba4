"""The candidates of a build: each target's chain (its recipe, then the further candidates whose
condition holds, smallest predicted checkpoint first: ORDER_RULE) and each candidate built once
(quantize and verify), shared by the targets that try it and reused across runs when its inputs
did not change (build_key)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from quantkit.build.heldout import GateInputs
from quantkit.build.judge import judge, loss_unit, should_try, task_intervals, task_kl_losses, task_losses
from quantkit.build.record import (
    BuildRecord,
    ChainStep,
    CheckpointBuild,
    TargetBuild,
    TargetFailed,
    build_key,
    library_failure,
    up_to_date,
)
from quantkit.errors import InputError, QuantkitError

FIRST = "the target's recipe"  # why the first candidate is tried
# A cached candidate's measurements, copied from its earlier record.
_CACHED_FIELDS = (
    "vllm",
    "size_ratio",
    "drift",
    "losses",
    "kl_losses",
    "text_scope_samples",
    "eval_scores",
    "intervals",
    "drift_reported",
)


def further_candidates(target, *, calib: Path | None, max_loss: float, first: ChainStep | None, notes: list):
    """The candidates after the target's recipe whose condition holds, as (recipe, avg bits, why),
    in the file's order (ORDER_RULE sorts them); what is not tried and why goes to ``notes``."""
    found = []
    missed = (
        first is not None
        and first.verdict in ("over budget", "unresolved", "failed")
        and should_try(first, max_loss)
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
            if should_try(first, limit):
                found.append(
                    (
                        fallback.recipe,
                        None,
                        f"the target's recipe failed or lost more than {limit:g}"
                        f"{loss_unit(first.worst_task if first else None)}",
                    )
                )
    return found


def check_reachable(chosen, calib: Path | None) -> None:
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


@dataclass
class Candidates:
    """The candidates of one `quantkit build` invocation, shared by its targets."""

    model_dir: Path
    output_root: Path
    adapter: object
    calib: Path | None
    calib_hash: str | None
    samples: object  # calibset CalibrationSamples the data recipes calibrate on (None without --calib)
    num_samples: int | None
    drift_samples: int | None
    vllm: bool
    force: bool
    gate: GateInputs
    drift_limits: str  # DRIFT_LIMITS: "recipe" (a breach fails the candidate) or "report"
    record: BuildRecord
    on_checkpoint: object = None
    built: dict[str, CheckpointBuild] = field(default_factory=dict)
    sizes: dict[tuple[str, float | None], int | None] = field(default_factory=dict)  # predicted_bytes
    unplanned: dict[tuple[str, float | None], str] = field(default_factory=dict)  # why no size

    @property
    def cache_dir(self) -> Path:  # one processed-feature cache for every candidate
        return self.output_root / ".cache" / "features"

    def build_target(self, target, max_loss: float) -> TargetBuild:
        """The target's recipe; when it misses, the further candidates smallest first (ORDER_RULE)."""
        result = TargetBuild(target.name, max_loss, "failed")
        first = self.try_candidate(result, target.recipe, None, FIRST, max_loss)
        if (first is not None and first.verdict == "kept") or result.error:
            return result
        further = further_candidates(
            target, calib=self.calib, max_loss=max_loss, first=first, notes=result.notes
        )
        sizes = {(recipe, bits): self.predicted_bytes(recipe, bits) for recipe, bits, _ in further}
        # Stable: equal sizes keep the file's order; a size the plan cannot predict goes last.
        further.sort(key=lambda c: (sizes[c[:2]] is None, sizes[c[:2]] or 0))
        for recipe_name, bits, why in further:
            step = self.try_candidate(
                result, recipe_name, bits, why, max_loss, predicted=sizes[(recipe_name, bits)]
            )
            if step is not None and (step.verdict == "kept" or result.error):
                break
        return result

    def try_candidate(
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
        below = self.gate.below_floor()
        try:
            step = judge(
                entry,
                max_loss,
                self.gate.eval_intervals(entry),
                self.gate.set_tasks,
                below,
                self.gate.accept_unresolved,
            )
        except TargetFailed as failed:  # no candidate can be judged: the target fails here
            step = judge(entry, max_loss, {}, self.gate.set_tasks, below)
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
                self.record.report.warnings.append(warning)
        return step

    def predicted_bytes(self, recipe_name: str, bits: float | None) -> int | None:
        """The checkpoint size quantize predicts from the config (the recipe resolved on the meta
        tree). None: the recipe is refused for this model (a QuantkitError, e.g. a width its
        blocks do not divide) or a library's error fails it (out of memory / stack raised): why
        is in ``unplanned``, the candidate is tried last and its build says why."""
        from quantkit.quantize.preflight import resolve_from_config
        from quantkit.recipes import get_recipe

        if (recipe_name, bits) not in self.sizes:
            try:
                resolved, _ = resolve_from_config(
                    self.model_dir, get_recipe(recipe_name), self.adapter, avg_bits=bits
                )
                self.sizes[(recipe_name, bits)] = resolved.checkpoint_bytes
            except QuantkitError as error:
                self.sizes[(recipe_name, bits)] = None
                self.unplanned[(recipe_name, bits)] = (
                    f"size unknown, tried last: the plan refuses it: {error}"
                )
            except Exception as error:  # a library's: quantize hits it too and records the candidate
                message, _ = library_failure(error)  # out of memory / stack still raised
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
        digest = self.gate.digest  # the rows it is measured on: part of its key
        key = build_key(
            self.record.model_hash,
            self.calib_hash,
            recipe,
            self.num_samples,
            self.vllm,
            avg_bits=avg_bits,
            drift_samples=[self.drift_samples, self.gate.gate_items],  # which rows calibrate, which judge
            held_out=digest,
            drift_limits=self.drift_limits,
        )
        entry = CheckpointBuild(
            [target], recipe.name, str(checkpoint), "error", key, avg_bits=avg_bits, held_out=digest
        )
        before = self.record.previous.get(str(checkpoint))
        verified = None
        cached = not self.force and up_to_date(before, key, checkpoint)
        if cached:
            entry.status = "up-to-date"
            for name in _CACHED_FIELDS:
                setattr(entry, name, before.get(name))
        else:
            verified = self._quantize_and_verify(entry, recipe, checkpoint, avg_bits)
        if self.gate.eval_names and entry.ok:
            self.gate.score(entry)
        self.built[str(checkpoint)] = entry
        self.record.report.checkpoints.append(entry)
        if self.on_checkpoint:
            self.on_checkpoint(entry, verified)
        self.record.save()
        return entry, cached

    def _quantize_and_verify(self, entry: CheckpointBuild, recipe, checkpoint: Path, avg_bits: float | None):
        from quantkit.quantize import quantize
        from quantkit.verify import VLLM_ACCEPTED, verify_checkpoint
        from quantkit.verify.drift import ANSWER_SCOPE, nonfinite_metrics

        started = time.perf_counter()
        verified = None
        uses_data = recipe.needs_data or avg_bits is not None
        try:
            drawn = self.samples if uses_data else None
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
                num_samples=len(self.gate.held_out.rows) if self.gate.held_out is not None else 1,
                exclude_ids=set(self.gate.calibrated_ids) if self.calib is not None else None,
                drift_stratify_by="task",
                drift_held_out=self.gate.held_out,
            )
            judged = self.drift_limits == "recipe"
            passed = verified.passed if judged else verified.passed_apart_from_drift_limits
            entry.status = "passed" if passed else "failed"
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
                nonfinite = set(nonfinite_metrics(verified.drift))
                for breach in verified.drift.breaches:
                    if judged or breach in nonfinite:
                        entry.reasons.append(f"drift: {breach}")
                    else:
                        entry.drift_reported.append(breach)
            if verified.vllm is not None:
                entry.vllm = verified.vllm.status
                if verified.vllm.status not in VLLM_ACCEPTED:
                    entry.reasons.append(f"vllm: {verified.vllm.reason}")
        except QuantkitError as error:  # one candidate's failure must not lose the others
            entry.status = "error"
            entry.reasons = [str(error)]
        except Exception as error:  # a library's error: recorded, and the chain goes on
            message, entry.traceback = library_failure(error)  # the traceback: build.json only
            entry.status, entry.reasons = "error", [message]
        entry.seconds = round(time.perf_counter() - started, 1)
        return verified
