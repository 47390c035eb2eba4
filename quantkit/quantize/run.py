"""``quantize``: calibration samples + a recipe + a model folder -> a compressed-tensors checkpoint.

Stages (each a plain function, called in this order):
  1. refuse known-bad combinations and a taken output, before any work
  2. samples -> processor inputs (disk cache)            features.prepare_features
  3. load in float32, unfuse MoE experts, compute targets targets.resolve_targets
  4. oneshot under counting hooks                        pipelines.run_oneshot, probe.CalibrationProbe
  5. prove: calibration reached every layer and tower    probe.verify
            exactly the language model is quantized      targets.check_quantized_modules
            every scale finite and positive              scales.check_scales
  6. cast back to the saved dtype, write atomically      export.write_checkpoint
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from quantkit.errors import InputError
from quantkit.export import library_versions, peak_rss_mb, write_checkpoint
from quantkit.fsutil import atomic_output_dir, check_output_free
from quantkit.models.adapters import Adapter, adapter_for, model_architecture
from quantkit.models.inputs import Sample
from quantkit.quantize.features import (
    PreparedFeatures,
    calibration_loader,
    prepare_features,
    processor_fingerprint,
)
from quantkit.quantize.pipelines import run_oneshot
from quantkit.quantize.probe import CalibrationProbe
from quantkit.quantize.progress import calibration_spinner, sample_bar
from quantkit.quantize.scales import check_scales
from quantkit.quantize.targets import (
    TargetPlan,
    check_group_divisibility,
    check_quantized_modules,
    check_smoothquant_mappings,
    resolve_targets,
)
from quantkit.recipes import Recipe, build_modifiers, resolved_scheme

CALIBRATION_DTYPE = torch.float32  # ~4x faster than bf16 matmuls on these CPUs, same error


@dataclass
class QuantizePlan:
    """What ``quantize`` would do (``--dry-run``); computed without loading weights."""

    model_dir: Path
    architecture: str
    adapter: str
    recipe: str
    scheme: str
    checkpoint_format: str
    pipeline: str
    needs_data: bool
    counts: dict[str, dict[str, int]]
    samples: int
    samples_by_label: dict[str, int]
    samples_by_modality: dict[str, int]
    known_failure: str | None
    targets: list[str]
    ignore: list[str]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["model_dir"] = str(self.model_dir)
        return data


@dataclass
class QuantizeResult:
    output: Path
    architecture: str
    adapter: str
    recipe: str
    checkpoint_format: str
    pipeline: str
    samples_used: int
    samples_by_label: dict[str, int]
    dropped_samples: list[dict]
    cache_hits: int
    preprocessed: int
    calibration_calls: dict[str, int]
    quantized_modules: list[str]
    kept_modules: dict[str, str]
    counts: dict[str, dict[str, int]]
    scales_checked: int
    stage_times_s: dict[str, float]
    wall_time_s: float
    peak_rss_mb: float
    metadata: dict = field(repr=False, default_factory=dict)


# ---------------------------------------------------------------------- small stages


def _labels(samples: list[Sample], sample_labels: list[str] | None) -> list[str]:
    if sample_labels is None:
        return ["all"] * len(samples)
    if len(sample_labels) != len(samples):
        raise InputError(f"{len(sample_labels)} sample labels for {len(samples)} samples")
    return list(sample_labels)


def refuse_known_failure(adapter: Adapter, recipe: Recipe, *, allow: bool) -> None:
    """Say up front when the output could not be loaded back, instead of after an hour of GPTQ."""
    failure = adapter.known_failure(recipe.scheme)
    if failure is not None and not allow:
        raise InputError(
            f"recipe {recipe.name!r} ({recipe.scheme}) on {adapter.name}: {failure.reason}",
            hint="choose another recipe (e.g. w4a16 or fp8-dynamic); override the refusal (allow_known_failure) "
            "only if something other than transformers will load the checkpoint",
        )


def saved_dtype(model_dir: Path) -> torch.dtype:
    """The dtype the checkpoint is stored in (config.json ``dtype`` / ``torch_dtype``, top level
    or text_config), bfloat16 when it does not say. Read before loading: loading in float32
    rewrites the in-memory config."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    for section in (config, config.get("text_config") or {}):
        for key in ("dtype", "torch_dtype"):
            value = getattr(torch, str(section.get(key)), None)
            if isinstance(value, torch.dtype) and value.is_floating_point:
                return value
    return torch.bfloat16


def set_saved_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast the model and make its config (and sub-configs: text, vision, audio) say so: loading
    in float32 rewrote ``config.dtype``, and ``model.to`` does not touch it."""
    from compressed_tensors.offload import remove_dispatch
    from transformers import PretrainedConfig

    # oneshot leaves every module behind an offload cache whose __setitem__ copies new values
    # into the old (float32) storage: drop that wrapping first or the cast does nothing.
    remove_dispatch(model, onload_tensors=True)
    model.to(dtype)
    pending, seen = [model.config], set()
    while pending:
        config = pending.pop()
        if id(config) in seen:
            continue
        seen.add(id(config))
        config.dtype = dtype
        pending.extend(v for v in vars(config).values() if isinstance(v, PretrainedConfig))


def unfuse_experts(model: torch.nn.Module) -> None:
    """MoE experts stored as fused 3D tensors -> per-expert Linears (what oneshot does anyway,
    done first so the targets name the real modules)."""
    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes, linearize_moe

    if get_non_linearized_moes(model):
        linearize_moe(model)


def unfuse_experts_on_meta(model: torch.nn.Module) -> None:
    """The same module tree as :func:`unfuse_experts`, built on the meta device (no copy)."""
    from llmcompressor.modeling.moe.linear_experts import LinearExperts2D
    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes

    for name, module in get_non_linearized_moes(model):
        linear_cls = LinearExperts2D.get_linear_experts_cls(type(module))
        with torch.device("meta"):
            model.set_submodule(name, linear_cls(getattr(module, "config", model.config)))


def group_size(recipe: Recipe) -> int | None:
    return resolved_scheme(recipe).get("weights", {}).get("group_size")


def _modality_counts(samples: list[Sample]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for sample in samples:
        kinds = [
            kind
            for kind, media in (("image", sample.images), ("video", sample.videos), ("audio", sample.audios))
            if media
        ]
        counts["+".join(kinds) or "text"] += 1
    return dict(sorted(counts.items()))


def _modifiers(recipe: Recipe, adapter: Adapter, targets: TargetPlan) -> list:
    mappings = [m.as_library_mapping() for m in adapter.smoothquant_mappings]
    return build_modifiers(
        recipe, targets=targets.targets, ignore=targets.ignore, smoothquant_mappings=mappings
    )


# ---------------------------------------------------------------------- dry run


def plan(
    model_dir: Path,
    recipe: Recipe,
    samples: list[Sample],
    *,
    sample_labels: list[str] | None = None,
    adapter: Adapter | Path | None = None,
) -> QuantizePlan:
    """What would be quantized and kept, per group, and which samples would be used; reads the
    config only (the model is built on the meta device)."""
    model_dir = Path(model_dir)
    adapter = adapter_for(model_dir, adapter)
    labels = _labels(samples, sample_labels)
    model = adapter.meta_model(model_dir)
    unfuse_experts_on_meta(model)
    targets = resolve_targets(model, adapter)
    check_group_divisibility(model, targets.quantize, group_size(recipe))
    failure = adapter.known_failure(recipe.scheme)
    used = samples if recipe.needs_data else []
    return QuantizePlan(
        model_dir=model_dir,
        architecture=model_architecture(model_dir),
        adapter=adapter.name,
        recipe=recipe.name,
        scheme=recipe.scheme,
        checkpoint_format=recipe.checkpoint_format,
        pipeline=adapter.pipeline if recipe.needs_data else "datafree",
        needs_data=recipe.needs_data,
        counts=targets.counts(),
        samples=len(used),
        samples_by_label=dict(Counter(labels[: len(used)])),
        samples_by_modality=_modality_counts(used),
        known_failure=failure.reason if failure else None,
        targets=targets.targets,
        ignore=targets.ignore,
    )


# ---------------------------------------------------------------------- the real thing


def _prepare(
    adapter: Adapter, processor, model_dir: Path, samples, labels, cache_dir, max_seq_len, progress
) -> PreparedFeatures:
    with sample_bar("preprocessing samples", len(samples), enabled=progress) as advance:
        prepared = prepare_features(
            processor,
            samples,
            labels=labels,
            fingerprint=processor_fingerprint(model_dir),
            cache_dir=cache_dir,
            max_seq_len=max_seq_len,
            on_sample=advance,
        )
    if not prepared.rows:
        reasons = sorted({d["reason"] for d in prepared.dropped})
        raise InputError("no usable calibration sample", hint="; ".join(reasons[:3]) or None)
    return prepared


def calibrate(
    model: torch.nn.Module,
    processor,
    adapter: Adapter,
    recipe: Recipe,
    targets: TargetPlan,
    prepared: PreparedFeatures | None,
    *,
    progress: bool = True,
) -> CalibrationProbe:
    """Run the recipe's modifiers under counting hooks; verify the hooks when data was used."""
    loader = None
    if prepared is not None:
        loader = calibration_loader(prepared.rows, keep_none=adapter.pipeline == "sequential")
    modifiers = _modifiers(recipe, adapter, targets)
    with (
        calibration_spinner(f"calibrating ({recipe.name}, {adapter.pipeline})", enabled=progress) as tick,
        CalibrationProbe(model, adapter, on_layer_call=tick) as probe,
    ):
        run_oneshot(
            model,
            processor,
            modifiers,
            loader,
            pipeline=adapter.pipeline,
            decoder_layer=adapter.decoder_layer,
            trust_remote_code=adapter.trust_remote_code,
        )
    if prepared is not None:
        rows = prepared.rows
        probe.verify(
            samples=len(rows),
            vision_samples=sum(row.has_vision for row in rows),
            audio_samples=sum(row.has_audio for row in rows),
        )
    return probe


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
) -> QuantizeResult:
    """Quantize the language model of ``model_dir`` with ``recipe`` and write ``output``.

    ``samples`` (with optional stratum ``sample_labels``) calibrate recipes that need data and
    are ignored by data-free ones. ``calib_info`` (calibration-set hash, strata summary) goes
    into quantkit.json as given. ``cache_dir`` keeps processed inputs for the next recipe.
    ``calibration_dtype`` defaults to float32 (4x faster than bf16 on CPUs); unquantized tensors
    are cast back to the checkpoint's own dtype before writing either way.
    Raises InputError for bad input and CheckFailed when a proof fails; in both cases nothing
    is written.
    """
    started = time.perf_counter()
    stage_times: dict[str, float] = {}
    model_dir, output = Path(model_dir), Path(output)
    adapter = adapter_for(model_dir, adapter)
    labels = _labels(samples, sample_labels)
    refuse_known_failure(adapter, recipe, allow=allow_known_failure)
    check_output_free(output, force)
    if recipe.needs_data and not samples:
        raise InputError(f"recipe {recipe.name!r} needs calibration samples and none were given")

    clock = time.perf_counter()
    processor = adapter.load_processor(model_dir)
    prepared = None
    if recipe.needs_data:
        prepared = _prepare(adapter, processor, model_dir, samples, labels, cache_dir, max_seq_len, progress)
    stage_times["preprocess"] = round(time.perf_counter() - clock, 2)

    clock = time.perf_counter()
    target_dtype = saved_dtype(model_dir)
    model = adapter.load_model(model_dir, dtype=calibration_dtype)
    unfuse_experts(model)
    targets = resolve_targets(model, adapter)
    check_group_divisibility(model, targets.quantize, group_size(recipe))
    if recipe.smoothquant_strength is not None:
        check_smoothquant_mappings(model, adapter)
    stage_times["load"] = round(time.perf_counter() - clock, 2)

    clock = time.perf_counter()
    probe = calibrate(model, processor, adapter, recipe, targets, prepared, progress=progress)
    stage_times["oneshot"] = round(time.perf_counter() - clock, 2)

    summary = check_quantized_modules(model, adapter)
    check_scales(model)
    set_saved_dtype(model, target_dtype)  # unquantized tensors go back to the checkpoint's own dtype
    scales_checked = check_scales(model)  # again: a cast must not have broken a scale

    rows = prepared.rows if prepared else []
    used_by_label = dict(Counter(row.label for row in rows))
    result = QuantizeResult(
        output=output,
        architecture=model_architecture(model_dir),
        adapter=adapter.name,
        recipe=recipe.name,
        checkpoint_format=recipe.checkpoint_format,
        pipeline=adapter.pipeline if prepared else "datafree",
        samples_used=len(rows),
        samples_by_label=used_by_label,
        dropped_samples=prepared.dropped if prepared else [],
        cache_hits=prepared.cache_hits if prepared else 0,
        preprocessed=prepared.processed if prepared else 0,
        calibration_calls=dict(probe.counts),
        quantized_modules=summary.quantized,
        kept_modules=targets.kept,
        counts=targets.counts(),
        scales_checked=scales_checked,
        stage_times_s=stage_times,
        wall_time_s=0.0,
        peak_rss_mb=0.0,
    )
    clock = time.perf_counter()
    with atomic_output_dir(output, force=force) as staging:
        result.wall_time_s = round(time.perf_counter() - started, 2)
        result.peak_rss_mb = peak_rss_mb()
        result.metadata = build_metadata(
            result,
            model_dir,
            adapter,
            recipe,
            rows,
            calib_info,
            (calibration_dtype, target_dtype),
            summary.kv_cache,
            max_seq_len,
        )
        if adapter.serving is not None:
            result.metadata["serving_layout"] = adapter.serving.model_dump(mode="json")
        write_checkpoint(
            model,
            staging,
            source=model_dir,
            metadata=result.metadata,
            expected_format=recipe.checkpoint_format,
            kept=list(targets.kept),
            towers=[t for t in (adapter.vision_tower, adapter.audio_tower) if t],
        )
        if adapter.serving is not None:
            from quantkit.export.serving import write_serving_layout

            write_serving_layout(staging, adapter.serving)
    stage_times["write"] = round(time.perf_counter() - clock, 2)
    result.wall_time_s = round(time.perf_counter() - started, 2)
    return result


def _dtype_name(dtype: torch.dtype) -> str:
    return re.sub(r"^torch\.", "", str(dtype))


def build_metadata(
    result: QuantizeResult,
    model_dir: Path,
    adapter: Adapter,
    recipe: Recipe,
    rows: list,
    calib_info: dict | None,
    dtypes: tuple[torch.dtype, torch.dtype],
    kv_cache_modules: list[str],
    max_seq_len: int | None,
) -> dict:
    """The content of quantkit.json."""
    towers = {
        kind: result.calibration_calls.get(path, 0)
        for kind, path in (("vision", adapter.vision_tower), ("audio", adapter.audio_tower))
        if path
    }
    return {
        "name": result.output.name,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": {"model": str(model_dir), "architecture": result.architecture},
        "adapter": adapter.model_dump(mode="json"),
        "recipe": recipe.model_dump(mode="json"),
        "resolved_scheme": resolved_scheme(recipe),
        "checkpoint_format": recipe.checkpoint_format,
        "libraries": library_versions(),
        "dtypes": {"calibration": _dtype_name(dtypes[0]), "saved": _dtype_name(dtypes[1])},
        "calibration": {
            "needed": recipe.needs_data,
            "set": calib_info or {},
            "pipeline": result.pipeline,
            "samples_used": result.samples_used,
            "sample_ids": [row.sample_id for row in rows],
            "by_label": result.samples_by_label,
            "tokens": sum(row.tokens for row in rows),
            "max_seq_len": max_seq_len,
            "dropped": result.dropped_samples,
            "cache_hits": result.cache_hits,
            "tower_calls": towers,
            "decoder_layer_calls": {
                k: v
                for k, v in result.calibration_calls.items()
                if k not in {adapter.vision_tower, adapter.audio_tower}
            },
        },
        "modules": {
            "counts": result.counts,
            "quantized": result.quantized_modules,
            "kept": result.kept_modules,
            "kv_cache": kv_cache_modules,
        },
        "run": {
            "wall_time_s": result.wall_time_s,
            "stage_times_s": result.stage_times_s,
            "peak_rss_mb": result.peak_rss_mb,
        },
    }
