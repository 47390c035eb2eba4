"""``quantize``: calibration samples + a recipe + a model folder -> a compressed-tensors checkpoint.

Stages (each a plain function, called in this order):
  1. refuse known-bad combinations and a taken output, before any work   preflight
     the recipe resolved on the config's meta tree: the checkpoint's size  preflight.resolve_from_config
  2. samples -> processor inputs (disk cache)            features.prepare_samples
  3. load in float32, unfuse MoE experts, resolve the    resolved.resolve
     recipe on the model: targets, group size, 8-bit layers, config groups (W4A16 family:
     resolved again once sensitivity is measured for --avg-bits)  calibration.measure_sensitivity_for
  4. oneshot under counting hooks                        calibration.calibrate
  5. prove: calibration reached every layer and tower    probe.verify
            exactly the language model is quantized      targets.check_quantized_modules
            every scale finite and positive              scales.check_scales
  6. cast back to the saved dtype, write atomically      export.write_checkpoint

The options of :func:`quantize`:
``samples`` (with optional stratum ``sample_labels``) calibrate recipes that need data and are
ignored by data-free ones. ``calib_info`` (calibration-set hash, strata summary) goes into
quantkit.json as given. ``cache_dir`` keeps processed inputs for the next recipe. ``processor``: the
model's processor where the caller already loaded it (drawing the samples), else loaded here.
``calibration_dtype`` defaults to float32 (4x faster than bf16 on CPUs); unquantized tensors are
cast back to the checkpoint's own dtype before writing either way.

W4A16-family recipes get the largest group size of 128 / 64 / 32 (or the recipe's
``group_size``) dividing every targeted layer; a layer none divides stays at 8 bits. ``avg_bits``
(e.g. 4.5) also keeps the most sensitive layers at 8 bits (W8A16) within that average (weight bits
by parameter count; ``count_overhead`` adds scales and zero points): ranked by ``sensitivity`` (a
SensitivityTable or the JSON of ``quantkit sensitivity``), or measured here on
``sensitivity_samples`` of the calibration samples when it is None (``sensitivity_method``:
fisher, the cheap estimate, or kl, measured per unit).

Under ``torchrun`` (``distributed``, or found from the environment) every rank calibrates a
stratified shard of ``samples`` and llmcompressor reduces the statistics across ranks; rank 0
alone measures the --avg-bits ranking and writes the checkpoint. ``offload`` ("cpu" or "disk")
loads through compressed-tensors' offloading for models larger than device memory (disk: what
exceeds ``max_cpu_memory`` bytes goes under ``offload_folder``, default a temporary folder beside
``output``, removed after).

A group size that divides no layer is refused. Before any work: the model folder's files, an
output that overlaps an input, an output that cannot be written or whose disk is too small for
the checkpoint. The memory plan (quantkit.quantize.plan) is made once the model is loaded; when
the activation cache does not fit in host memory it is spilled to memory-mapped files beside
``output`` (``spill`` True / False forces it either way). quantkit.json records the plan beside
the measured peaks.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from quantkit.errors import InputError
from quantkit.export import join_compressed_save, peak_rss_mb, write_checkpoint
from quantkit.features.processor import FeatureRow, PreparedFeatures, prepare_samples, processor_fingerprint
from quantkit.fsutil import atomic_output_dir, check_output_free, output_lock
from quantkit.modelfiles import check_model_folder
from quantkit.models.adapters import Adapter, adapter_for, model_architecture
from quantkit.models.inputs import Sample
from quantkit.models.loading import saved_dtype, set_saved_dtype, unfuse_experts
from quantkit.models.targets import (
    check_awq_mappings,
    check_quantized_modules,
    check_smoothquant_mappings,
    resolve_targets,
)
from quantkit.precision.proof import check_assigned, order_config_groups
from quantkit.quantize.calibration import (
    SENSITIVITY_METHOD,
    SENSITIVITY_SAMPLES,
    calibrate,
    measure_sensitivity_for,
)
from quantkit.quantize.distributed import (
    DistContext,
    barrier,
    broadcast_from_main,
    gather,
    init_distributed,
    refuse_shared_weight_smoothing,
    shard,
)
from quantkit.quantize.metadata import (
    QuantizeResult,
    build_metadata,
    capture_summary,
    measured_memory,
    merge_ranks,
)
from quantkit.quantize.plan import MemoryPlan, memory_plan
from quantkit.quantize.preflight import _labels, refuse_bad_input, resolve_from_config
from quantkit.quantize.probe import CalibrationProbe
from quantkit.quantize.resolved import ResolvedRecipe, resolve
from quantkit.quantize.scales import check_scales, check_source_weights
from quantkit.recipes import Recipe

CALIBRATION_DTYPE = torch.float32  # ~4x faster than bf16 matmuls on these CPUs, same error


@contextlib.contextmanager
def _timed(stage_times: dict[str, float], stage: str) -> Iterator[None]:
    clock = time.perf_counter()
    yield
    stage_times[stage] = round(time.perf_counter() - clock, 2)


@dataclass
class LoadedModel:
    """The model in the calibration dtype with the recipe resolved on it before calibrating."""

    model: torch.nn.Module
    resolved: ResolvedRecipe  # re-resolved once the --avg-bits ranking is measured
    memory: MemoryPlan
    saved_dtype: torch.dtype
    spill_folder: Path | None


def _preprocess(
    adapter, processor, model_dir, samples, labels, recipe, *, ranking, cache_dir, max_seq_len, progress
) -> tuple[PreparedFeatures | None, list[FeatureRow]]:
    """The samples' processor inputs (the calibration's; and the --avg-bits ranking's when
    ``ranking``): (what calibrates, what ranks)."""
    prepared = None
    if recipe.needs_data or ranking:
        prepared = prepare_samples(
            adapter, processor, model_dir, samples, labels, cache_dir, max_seq_len, progress
        )
    ranking_rows = prepared.rows if prepared else []
    if not recipe.needs_data:
        prepared = None  # data-free recipes calibrate on nothing; the rows only rank layers
    return prepared, ranking_rows


def _load(
    cleanup: contextlib.ExitStack,
    model_dir: Path,
    output: Path,
    adapter: Adapter,
    recipe: Recipe,
    prepared: PreparedFeatures | None,
    *,
    calibration_dtype: torch.dtype,
    offload: str | None,
    offload_folder: Path | None,
    max_cpu_memory: int | None,
    avg_bits: float | None,
    count_overhead: bool,
    table,
    spill: bool | None,
) -> LoadedModel:
    """Load the model, resolve the recipe on it (targets, group size, the layers no group size
    fits and the budget they alone take), check the recipe's mappings and plan the memory."""
    target_dtype = saved_dtype(model_dir)
    if offload not in (None, "cpu", "disk"):
        raise InputError(f"offload must be cpu or disk, not {offload!r}")
    if offload == "disk" and offload_folder is None:
        offload_folder = output.parent / f".{output.name}.offload"
        cleanup.callback(shutil.rmtree, offload_folder, ignore_errors=True)
    model = adapter.load_model(
        model_dir,
        dtype=calibration_dtype,
        offload=offload,
        offload_folder=offload_folder,
        max_cpu_memory=max_cpu_memory,
    )
    check_source_weights(model, model_dir)
    unfuse_experts(model)
    resolved = resolve(
        recipe, model, adapter, resolve_targets(model, adapter), model_dir=model_dir, saved_dtype=target_dtype,
        avg_bits=avg_bits, sensitivity=table, count_overhead=count_overhead,
    )  # fmt: skip
    if recipe.smoothquant_strength is not None:
        check_smoothquant_mappings(model, adapter)
    if recipe.method == "awq":
        check_awq_mappings(model, adapter)
    memory = memory_plan(
        model,
        adapter,
        recipe,
        resolved.targets,
        [row.tokens for row in prepared.rows] if prepared else [],
        calibration_dtype=calibration_dtype,
        saved_dtype=target_dtype,
        offload=offload,
        max_cpu_memory=max_cpu_memory,
        checkpoint=resolved.checkpoint_bytes,
    )
    spill_folder = None
    if prepared is not None and (memory.spill if spill is None else spill):
        spill_folder = output.parent / f".{output.name}.spill"
    return LoadedModel(model, resolved, memory, target_dtype, spill_folder)


def _rank_layers(loaded: LoadedModel, adapter, rows, context, model_dir, *, count, method, progress):
    """The --avg-bits ranking, measured by rank 0 (one ranking for every rank)."""
    table = None
    if context is None or context.is_main:
        table = measure_sensitivity_for(
            loaded.model, adapter, loaded.resolved, rows, count, progress, method=method
        )
        table.model, table.architecture = str(model_dir), model_architecture(model_dir)
    return broadcast_from_main(table, context)


def _prove(loaded: LoadedModel, adapter: Adapter):
    """Exactly the language model quantized as planned, every scale finite and positive before
    and after the cast back to the checkpoint's dtype: (module summary, scales checked)."""
    model, resolved = loaded.model, loaded.resolved
    summary = check_quantized_modules(model, adapter)
    if resolved.precision is not None:
        check_assigned(model, resolved.precision, resolved.targets.quantize)
    check_scales(model)
    set_saved_dtype(model, loaded.saved_dtype)  # unquantized tensors go back to the checkpoint's own dtype
    return summary, check_scales(model)  # again: a cast must not have broken a scale


def collect_result(
    output: Path,
    model_dir: Path,
    adapter: Adapter,
    resolved: ResolvedRecipe,
    table,
    prepared,
    probe: CalibrationProbe,
    summary,
    scales_checked: int,
    stage_times: dict[str, float],
    context: DistContext | None,
) -> tuple[QuantizeResult, list]:
    """The run's result (every rank's rows, drops and hook counts merged under torchrun) and the
    rows quantkit.json lists."""
    rows: list = prepared.rows if prepared else []
    dropped = prepared.dropped if prepared else []
    cache_hits = prepared.cache_hits if prepared else 0
    processed = prepared.processed if prepared else 0
    calls = dict(probe.counts)
    per_rank = [len(rows)]
    if context is not None:  # what every rank calibrated on, for quantkit.json
        per_rank = gather(len(rows), context)
        rows, dropped, cache_hits, processed, calls = merge_ranks(
            rows, dropped, cache_hits, processed, calls, context
        )
    used_by_label = dict(Counter(row.label for row in rows))
    result = QuantizeResult(
        output=output,
        architecture=model_architecture(model_dir),
        adapter=adapter.name,
        recipe=resolved.recipe.name,
        checkpoint_format=resolved.checkpoint_format,
        pipeline=adapter.pipeline if prepared else "datafree",
        samples_used=len(rows),
        samples_by_label=used_by_label,
        dropped_samples=dropped,
        cache_hits=cache_hits,
        preprocessed=processed,
        calibration_calls=calls,
        quantized_modules=summary.quantized,
        kept_modules=resolved.targets.kept,
        counts=resolved.targets.counts(),
        scales_checked=scales_checked,
        stage_times_s=stage_times,
        wall_time_s=0.0,
        peak_rss_mb=0.0,
        precision=resolved.precision,
        sensitivity=table,
        world_size=context.world_size if context else 1,
        samples_per_rank=per_rank,
        wrote=context is None or context.is_main,
        decoder_inputs=capture_summary(probe.capture, adapter),
        token_weights=probe.token_weights,
    )
    return result, rows


def _write(
    result: QuantizeResult,
    loaded: LoadedModel,
    probe,
    model_dir,
    adapter,
    *,
    started,
    force,
    **record,
):
    """quantkit.json, the checkpoint, the serving layout, written atomically to ``result.output``."""
    with atomic_output_dir(result.output, force=force) as staging:
        result.wall_time_s = round(time.perf_counter() - started, 2)
        result.peak_rss_mb = peak_rss_mb()
        result.metadata = build_metadata(result, model_dir, adapter, loaded.resolved, **record)
        if adapter.serving is not None:
            result.metadata["serving_layout"] = adapter.serving.model_dump(mode="json")
        result.metadata["memory"] = {"plan": loaded.memory.to_dict(), "measured": measured_memory(probe)}
        write_checkpoint(
            loaded.model,
            staging,
            source=model_dir,
            metadata=result.metadata,
            expected_format=result.checkpoint_format,
            kept=list(loaded.resolved.targets.kept),
            towers=[t for t in (adapter.vision_tower, adapter.audio_tower) if t],
        )
        if adapter.serving is not None:
            from quantkit.export.serving import write_serving_layout

            write_serving_layout(staging, adapter.serving)
        if loaded.resolved.precision is not None and loaded.resolved.precision.mixed:
            order_config_groups(staging)


def quantize(
    model_dir: Path,
    output: Path,
    recipe: Recipe,
    samples: list[Sample],
    *,
    sample_labels: list[str] | None = None,
    calib_info: dict | None = None,
    adapter: Adapter | Path | None = None,
    force: bool = False,
    allow_known_failure: bool = False,
    cache_dir: Path | None = None,
    max_seq_len: int | None = None,
    calibration_dtype: torch.dtype = CALIBRATION_DTYPE,
    progress: bool = True,
    avg_bits: float | None = None,
    sensitivity=None,
    sensitivity_samples: int = SENSITIVITY_SAMPLES,
    sensitivity_method: str = SENSITIVITY_METHOD,
    count_overhead: bool = False,
    distributed: DistContext | None = None,
    offload: str | None = None,
    offload_folder: Path | None = None,
    max_cpu_memory: int | None = None,
    spill: bool | None = None,
    processor=None,
) -> QuantizeResult:
    """Quantize the language model of ``model_dir`` with ``recipe`` and write ``output`` (the
    options: this module's doc). Raises InputError for bad input and CheckFailed when a proof
    fails; in both cases nothing is written."""
    with contextlib.ExitStack() as cleanup:  # the output lock, the disk-offload folder, whatever happens
        started, stage_times = time.perf_counter(), {}
        model_dir, output = Path(model_dir), Path(output)
        adapter = adapter_for(model_dir, adapter)
        labels = _labels(samples, sample_labels)
        table = refuse_bad_input(
            model_dir, output, recipe, adapter, samples, allow_known_failure=allow_known_failure,
            avg_bits=avg_bits, sensitivity=sensitivity, calib_info=calib_info, cache_dir=cache_dir,
            offload_folder=offload_folder,
        )  # fmt: skip
        # The model folder, the group size and the checkpoint's size, from the config alone; then
        # the output: writable, enough free space (a full disk found after hours of GPTQ is too late).
        planned, _ = resolve_from_config(
            check_model_folder(model_dir), recipe, adapter, avg_bits=avg_bits, sensitivity=table,
            count_overhead=count_overhead,
        )  # fmt: skip
        check_output_free(output, force, need_bytes=planned.checkpoint_bytes)
        context = distributed or init_distributed()
        if context is None or context.is_main:  # the rank that writes holds the output
            cleanup.enter_context(output_lock(output))
        if context is not None:
            refuse_shared_weight_smoothing(recipe)
        if context is not None and recipe.needs_data:
            samples, labels = shard(samples, labels, context)

        with _timed(stage_times, "preprocess"):
            if processor is None:  # a caller that drew the samples hands its processor down
                processor = adapter.load_processor(model_dir)
            prepared, ranking_rows = _preprocess(
                adapter, processor, model_dir, samples, labels, recipe, ranking=avg_bits is not None and table is None,
                cache_dir=cache_dir, max_seq_len=max_seq_len, progress=progress,
            )  # fmt: skip
        with _timed(stage_times, "load"):
            loaded = _load(
                cleanup, model_dir, output, adapter, recipe, prepared, calibration_dtype=calibration_dtype,
                offload=offload, offload_folder=offload_folder, max_cpu_memory=max_cpu_memory,
                avg_bits=avg_bits, count_overhead=count_overhead, table=table, spill=spill,
            )  # fmt: skip
        if avg_bits is not None and table is None:
            with _timed(stage_times, "sensitivity"):
                table = _rank_layers(
                    loaded, adapter, ranking_rows, context, model_dir,
                    count=sensitivity_samples, method=sensitivity_method, progress=progress,
                )  # fmt: skip
            loaded.resolved = resolve(  # the 8-bit layers follow from the ranking
                recipe, loaded.model, adapter, loaded.resolved.targets, model_dir=model_dir,
                saved_dtype=loaded.saved_dtype, avg_bits=avg_bits, sensitivity=table, count_overhead=count_overhead,
            )  # fmt: skip

        with _timed(stage_times, "oneshot"):
            probe = calibrate(
                loaded.model, processor, adapter, loaded.resolved, prepared, progress=progress,
                cache_dir=cache_dir, fingerprint=processor_fingerprint(model_dir),
                spill_folder=loaded.spill_folder,
            )  # fmt: skip
        summary, scales_checked = _prove(loaded, adapter)
        result, rows = collect_result(
            output, model_dir, adapter, loaded.resolved, table, prepared, probe,
            summary, scales_checked, stage_times, context,
        )  # fmt: skip
        if not result.wrote:
            join_compressed_save(loaded.model, output)  # rank 0 writes the files
            barrier(context)
            return result
        with _timed(stage_times, "write"):
            _write(
                result, loaded, probe, model_dir, adapter, started=started, force=force, rows=rows,
                calib_info=calib_info, dtypes=(calibration_dtype, loaded.saved_dtype),
                kv_cache_modules=summary.kv_cache, max_seq_len=max_seq_len,
            )  # fmt: skip
        result.wall_time_s = round(time.perf_counter() - started, 2)
        barrier(context)
        return result
