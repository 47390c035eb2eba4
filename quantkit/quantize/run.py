"""``quantize``: calibration samples + a recipe + a model folder -> a compressed-tensors checkpoint.

Stages (each a plain function, called in this order):
  1. refuse known-bad combinations and a taken output, before any work
  2. samples -> processor inputs (disk cache)            features.prepare_features
  3. load in float32, unfuse MoE experts, compute targets targets.resolve_targets
     group size and 8-bit layers (W4A16 family; sensitivity   mixed.plan_precision
     measured here for --avg-bits when no table is given)    quantkit.sensitivity
  4. oneshot under counting hooks                        pipelines.run_oneshot, probe.CalibrationProbe
  5. prove: calibration reached every layer and tower    probe.verify
            exactly the language model is quantized      targets.check_quantized_modules
            every scale finite and positive              scales.check_scales
  6. cast back to the saved dtype, write atomically      export.write_checkpoint
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from quantkit.errors import InputError
from quantkit.export import join_compressed_save, library_versions, peak_rss_mb, write_checkpoint
from quantkit.features.capture import capture_decoder_inputs, decoder_loader
from quantkit.features.processor import (
    FeatureRow,
    PreparedFeatures,
    calibration_loader,
    prepare_samples,
    processor_fingerprint,
)
from quantkit.fsutil import (
    atomic_output_dir,
    check_model_folder,
    check_output_free,
    output_lock,
    refuse_overlap,
)
from quantkit.models.adapters import Adapter, adapter_for, model_architecture
from quantkit.models.inputs import Sample
from quantkit.models.loading import saved_dtype, set_saved_dtype, unfuse_experts, unfuse_experts_on_meta
from quantkit.models.targets import (
    TargetPlan,
    check_awq_mappings,
    check_group_divisibility,
    check_quantized_modules,
    check_smoothquant_mappings,
    decoder_layers,
    language_model_root,
    resolve_targets,
)
from quantkit.precision.mixed import (
    PrecisionPlan,
    check_assigned,
    check_avg_bits,
    group_size_candidates,
    order_config_groups,
    plan_precision,
)
from quantkit.progress import calibration_spinner, sample_bar
from quantkit.quantize.distributed import (
    DistContext,
    barrier,
    broadcast_from_main,
    gather,
    init_distributed,
    refuse_shared_weight_smoothing,
    shard,
)
from quantkit.quantize.pipelines import run_oneshot
from quantkit.quantize.plan import ExpandedTree, LayerKinds, expand_targets, memory_plan, reduced_tree
from quantkit.quantize.probe import CalibrationProbe
from quantkit.quantize.scales import check_scales, check_source_weights
from quantkit.quantize.spill import spilled_activations
from quantkit.quantize.token_weights import sample_weights, weights_summary, with_token_weights
from quantkit.recipes import Recipe, build_modifiers, resolved_scheme
from quantkit.recipes.schema import GROUP_SCHEMES

CALIBRATION_DTYPE = torch.float32  # ~4x faster than bf16 matmuls on these CPUs, same error
# The --avg-bits ranking (when no table is given): fusion units (what gets promoted) on a
# stratified subsample of the calibration rows, text cut short, KL estimated to second order from
# a few backward passes (method "fisher": on SmolLM2-135M 5.5x cheaper than measuring every unit,
# Spearman 0.98 against the measured ranking). `quantkit sensitivity` measures (method "kl").
SENSITIVITY_SAMPLES = 8
SENSITIVITY_MAX_SEQ_LEN = 128  # text samples are cut to this for the ranking (not for calibration)
SENSITIVITY_GRANULARITY = "unit"
SENSITIVITY_METHOD = "fisher"
SENSITIVITY_DRAWS = 8


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
    group_size: int | None = None  # chosen for the model (group-wise schemes)
    precision: dict | None = None  # group size, 8-bit layers and the average (W4A16 family)
    checkpoint_bytes: int = 0  # estimated size of the written checkpoint (the free-space check)
    memory: dict | None = None  # the memory plan (quantkit.quantize.plan.MemoryPlan)

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
    precision: PrecisionPlan | None = None  # group size and 8-bit layers (W4A16 family)
    sensitivity: object | None = field(repr=False, default=None)  # the SensitivityTable used
    decoder_inputs: dict | None = None  # what the decoder was calibrated on (captured, cached, bytes)
    token_weights: dict | None = None  # the recipe's token_weights and how they came out (when on)
    world_size: int = 1  # ranks that calibrated (quantize --nproc)
    samples_per_rank: list[int] = field(default_factory=list)
    wrote: bool = True  # False on ranks other than 0 under torchrun


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


def group_size(recipe: Recipe) -> int | None:
    """The recipe's own group size (its preset's when it sets none); quantize chooses per model."""
    return resolved_scheme(recipe).get("weights", {}).get("group_size")


def with_options(recipe: Recipe, *, group_size: int | None = None) -> Recipe:
    """The recipe with command-line overrides, validated like a recipe file."""
    if group_size is None:
        return recipe
    if not recipe.spec.group_size_per_model:
        raise InputError(
            f"--group-size applies to 4-bit weight recipes ({', '.join(sorted(GROUP_SCHEMES))}); "
            f"recipe {recipe.name!r} is {recipe.scheme}, whose weights have one scale per output channel",
            hint="drop --group-size, or use the w4a16 recipe",
        )
    if group_size < 8:
        raise InputError(
            f"--group-size {group_size}: a group size is at least 8 weights (e.g. 32, 64, 128)",
            hint="or leave it out: quantize picks the largest of 128, 64, 32 that divides every layer",
        )
    try:
        return Recipe.model_validate({**recipe.model_dump(), "group_size": group_size})
    except ValueError as err:
        raise InputError(f"--group-size {group_size}: {err}") from None


def check_group_size_fits(model: torch.nn.Module, targets: TargetPlan, recipe: Recipe) -> None:
    """A chosen group size (--group-size or the recipe's) that divides no targeted layer would
    turn a 4-bit run into an all-8-bit model: refuse it, naming sizes that fit."""
    group = recipe.group_size
    if group is None or not recipe.spec.group_size_per_model or not targets.quantize:
        return
    modules = dict(model.named_modules())
    widths = sorted({modules[name].in_features for name in targets.quantize if name in modules})
    if not widths or any(width % group == 0 for width in widths):
        return
    fitting = [g for g in (128, 64, 32, 16, 8) if all(width % g == 0 for width in widths)]
    message = (
        f"group size {group} divides none of the targeted layers' input widths "
        f"({', '.join(map(str, widths))}): every layer would stay at 8 bits, not the recipe's 4"
    )
    hint = (
        f"pass --group-size (or set the recipe's group_size) to one that divides them "
        f"({', '.join(map(str, fitting[:3]))})"
        if fitting
        else "leave the group size out, or use an 8-bit recipe"
    )
    raise InputError(message, hint=hint)


def check_fixed_widths_fit(
    model: torch.nn.Module, targets: TargetPlan, recipe: Recipe, kinds: LayerKinds | None = None
) -> None:
    """Schemes whose weight groups or blocks have a width quantize does not choose per model
    (W4AFP8's groups of 128, FP8_BLOCK's 128x128 blocks, NVFP4's groups of 16): a targeted layer
    whose input width it does not divide fails deep inside llmcompressor's calibration (a raw
    ``unflatten`` error on SmolLM2's 576 in-features). Refuse it first, from the config alone.
    ``kinds``: ``model`` holds one decoder layer per kind; the message counts and names the full
    model's layers."""
    if recipe.spec.group_size_per_model:  # the group size is chosen per model (check_group_size_fits)
        return
    weights = resolved_scheme(recipe).get("weights") or {}
    block = weights.get("block_structure")
    width = block[1] if block else weights.get("group_size")
    if not width:
        return
    modules = dict(model.named_modules())
    bad = {
        name: modules[name].in_features
        for name in targets.quantize
        if name in modules and modules[name].in_features % width
    }
    if kinds:
        bad = kinds.expand(bad)
    if bad:
        unit = f"{block[0]}x{block[1]} blocks" if block else f"groups of {width}"
        shown = ", ".join(f"{name} ({features})" for name, features in list(bad.items())[:5])
        raise InputError(
            f"recipe {recipe.name!r} quantizes weights in {unit}, and {len(bad)} language-model layer(s) "
            f"have an input width {width} does not divide: {shown}" + (" ..." if len(bad) > 5 else ""),
            hint="use w4a16 (its group size is chosen per model) or fp8-dynamic (one scale per output channel)",
        )


def checkpoint_size_estimate(
    model: torch.nn.Module,
    targets: TargetPlan,
    recipe: Recipe,
    precision: PrecisionPlan | None,
    dtype: torch.dtype,
    model_dir: Path,
    avg_bits: float | None = None,
    kinds: LayerKinds | None = None,
) -> int:
    """Bytes the checkpoint will take, from the module tree on the meta device: quantized weights
    at their bits (scales and zero points included), the rest in the saved dtype, plus the
    source's other files (tokenizer, processor). ``kinds``: ``model`` is a reduced tree (one
    decoder layer per kind, counted for each layer of its kind)."""
    item = torch.empty((), dtype=dtype).element_size()
    quantized = set(targets.quantize)
    seen: set[int] = set()
    kept_bytes = quantized_weights = rows = 0
    for name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue  # tied weights are saved once
            seen.add(id(param))
            count = kinds.multiplicity(name) if kinds else 1
            if name in quantized and param_name == "weight":
                quantized_weights += param.numel() * count
                rows += param.shape[0] * count
            else:
                kept_bytes += param.numel() * item * count
    if precision is not None:
        bits = max(
            precision.effective_bits, (avg_bits or 0.0) + (precision.effective_bits - precision.avg_bits)
        )
    else:
        bits = resolved_scheme(recipe).get("weights", {}).get("num_bits", 8)
    scales = rows * 8  # a scale (and zero point) per output row: per-channel schemes
    others = sum(
        f.stat().st_size for f in Path(model_dir).iterdir() if f.is_file() and f.suffix != ".safetensors"
    )
    return int(kept_bytes + quantized_weights * bits / 8 + scales + others)


def media_folders(samples: list[Sample]) -> list[Path]:
    """The folders the samples' media files are in (inputs an output must not overlap)."""
    return sorted({Path(path).parent for s in samples for path in (*s.images, *s.videos, *s.audios)})


def check_precision_options(recipe: Recipe, avg_bits: float | None) -> None:
    if avg_bits is not None and not recipe.spec.group_size_per_model:
        raise InputError(
            f"--avg-bits applies to 4-bit weight recipes ({', '.join(sorted(GROUP_SCHEMES))}), "
            f"not {recipe.name!r} ({recipe.scheme})",
            hint="use the w4a16 recipe (or a W4A16 recipe file)",
        )


def _load_sensitivity(sensitivity):
    """A SensitivityTable, a path to one, or None; read before any work so a bad file fails early."""
    if sensitivity is None:
        return None
    from quantkit.precision.table import SensitivityTable, load_table

    return sensitivity if isinstance(sensitivity, SensitivityTable) else load_table(Path(sensitivity))


def precision_plan(
    model: torch.nn.Module,
    adapter: Adapter,
    recipe: Recipe,
    targets: TargetPlan,
    *,
    avg_bits: float | None = None,
    sensitivity=None,
    count_overhead: bool = False,
) -> PrecisionPlan | None:
    """Group size and 8-bit layers for a W4A16-family recipe (None for other schemes)."""
    if not recipe.spec.group_size_per_model:
        return None
    root = language_model_root(list(decoder_layers(model, adapter)))
    return plan_precision(
        model,
        targets.quantize,
        recipe,
        avg_bits=avg_bits,
        sensitivity=sensitivity,
        count_overhead=count_overhead,
        root=root,
    )


def sensitivity_rows(rows: list[FeatureRow], labels: list[str], count: int) -> list[FeatureRow]:
    """A stratified subsample of the calibration rows, text cut to SENSITIVITY_MAX_SEQ_LEN tokens."""
    from quantkit.calibset import stratified_subsample
    from quantkit.features.processor import TEXT_KEYS

    picked = sorted(stratified_subsample(labels, min(count, len(rows)), seed=0))
    chosen = []
    for index in picked:
        row = rows[index]
        if not (row.has_vision or row.has_audio) and row.tokens > SENSITIVITY_MAX_SEQ_LEN:
            inputs = {
                key: value[..., :SENSITIVITY_MAX_SEQ_LEN]
                if key in TEXT_KEYS and isinstance(value, torch.Tensor)
                else value
                for key, value in row.inputs.items()
            }
            row = FeatureRow(row.sample_id, row.label, inputs, row.from_cache)
        chosen.append(row)
    return chosen


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


def _modifiers(
    recipe: Recipe, adapter: Adapter, targets: TargetPlan, config_groups: dict | None = None
) -> list:
    mappings = [m.as_library_mapping() for m in adapter.smoothquant_mappings]
    return build_modifiers(
        recipe,
        targets=targets.targets,
        ignore=targets.ignore,
        smoothquant_mappings=mappings,
        awq_mappings=[m.as_library_mapping() for m in adapter.awq_mappings]
        if recipe.method == "awq"
        else None,
        config_groups=config_groups,
    )


# ---------------------------------------------------------------------- dry run


def plan(
    model_dir: Path,
    recipe: Recipe,
    samples: list[Sample],
    *,
    sample_labels: list[str] | None = None,
    adapter: Adapter | Path | None = None,
    avg_bits: float | None = None,
    sensitivity=None,
    count_overhead: bool = False,
    sample_tokens: list[int | None] | None = None,
    calibration_dtype: torch.dtype | None = None,
    offload: str | None = None,
    max_cpu_memory: int | None = None,
    host_memory: int | None = None,
    device: str | None = None,
    light_imports: bool = False,
) -> QuantizePlan:
    """What would be quantized and kept, per group, and which samples would be used; reads the
    config only (the model is built on the meta device). For W4A16 recipes: the group size, the
    layers kept at 8 bits because none divides them, and, with ``sensitivity``, the layers
    ``avg_bits`` promotes (without it, they are chosen when quantize measures the ranking).
    A group size (the recipe's or --group-size) that divides no layer is refused.
    The memory plan uses ``sample_tokens`` (per sample, None where the set records none) and
    ``host_memory`` bytes of host memory (default: what this machine has free; 0: decide nothing
    from it), calibrating on ``device`` ("cuda" or "cpu"; default: a GPU when there is one).
    ``light_imports``: the plan is the whole job (a dry run), transformers' generation stack and
    llmcompressor are imported without scikit-learn; off, they are imported untouched."""
    model_dir = check_model_folder(Path(model_dir))  # exists, safetensors headers match their sizes
    adapter = adapter_for(model_dir, adapter)
    labels = _labels(samples, sample_labels)
    check_precision_options(recipe, avg_bits)
    table = _load_sensitivity(sensitivity)
    model = adapter.meta_model(model_dir, light_imports=light_imports)
    # One decoder layer per kind (dense / sparse), multiplied: the same plan as the whole tree.
    reduced = reduced_tree(model, adapter)
    kinds = reduced[1] if reduced else None
    unfuse_experts_on_meta(model, light_imports=light_imports)
    kept_targets = resolve_targets(model, adapter)
    if recipe.method == "awq":  # a wrong mapping is bad input before any weight is read
        check_awq_mappings(model, adapter)
    check_group_size_fits(model, kept_targets, recipe)
    check_fixed_widths_fit(model, kept_targets, recipe, kinds)
    targets = expand_targets(kept_targets, kinds) if kinds else kept_targets
    tree = ExpandedTree(model, kinds) if kinds else model
    precision = precision_plan(
        tree, adapter, recipe, targets, avg_bits=avg_bits, sensitivity=table, count_overhead=count_overhead
    )
    if precision is not None:
        check_group_divisibility(tree, precision.group_sizes(targets.quantize))
    failure = adapter.known_failure(recipe.scheme)
    used = samples if recipe.needs_data else []
    tokens = list(sample_tokens) if sample_tokens is not None else [None] * len(samples)
    memory = memory_plan(
        model,
        adapter,
        recipe,
        kept_targets,
        tokens[: len(used)],
        calibration_dtype=calibration_dtype or default_calibration_dtype(),
        saved_dtype=saved_dtype(model_dir),
        offload=offload,
        max_cpu_memory=max_cpu_memory,
        group_size=precision.group_size if precision else group_size(recipe),
        available=host_memory,
        device=device,
        kinds=kinds,
    )
    return QuantizePlan(
        model_dir=model_dir,
        architecture=model_architecture(model_dir),
        adapter=adapter.name,
        recipe=recipe.name,
        scheme=recipe.scheme,
        checkpoint_format=precision.checkpoint_format if precision else recipe.checkpoint_format,
        pipeline=adapter.pipeline if recipe.needs_data else "datafree",
        needs_data=recipe.needs_data,
        counts=targets.counts(),
        samples=len(used),
        samples_by_label=dict(Counter(labels[: len(used)])),
        samples_by_modality=_modality_counts(used),
        known_failure=failure.reason if failure else None,
        targets=targets.targets,
        ignore=targets.ignore,
        group_size=precision.group_size if precision else group_size(recipe),
        precision=precision.to_dict() if precision else None,
        checkpoint_bytes=checkpoint_size_estimate(
            model, kept_targets, recipe, precision, saved_dtype(model_dir), model_dir, avg_bits, kinds
        ),
        memory=memory.to_dict(),
    )


def default_calibration_dtype() -> torch.dtype:
    """bfloat16 with a GPU, float32 on CPUs (4x faster matmuls there)."""
    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


# ---------------------------------------------------------------------- the real thing


def release_processor_outputs(rows: list[FeatureRow]) -> None:
    """Once the decoder's inputs are captured, a row's processor outputs (pixel values, audio
    features: larger than the hidden states they become) are read for their shapes only (token
    counts in quantkit.json): keep those, on the meta device, and free the tensors."""
    for row in rows:
        row.inputs = {
            key: value.to("meta") if isinstance(value, torch.Tensor) else value
            for key, value in row.inputs.items()
        }


def calibrate(
    model: torch.nn.Module,
    processor,
    adapter: Adapter,
    recipe: Recipe,
    targets: TargetPlan,
    prepared: PreparedFeatures | None,
    *,
    progress: bool = True,
    config_groups: dict | None = None,
    cache_dir: Path | None = None,
    fingerprint: str | None = None,
    spill_folder: Path | None = None,
) -> CalibrationProbe:
    """Run the recipe's modifiers under counting hooks; verify the hooks when data was used.
    ``config_groups`` (from a PrecisionPlan) replace the recipe's preset scheme.

    With the ``sequential`` pipeline the decoder's inputs are captured first (towers once per
    sample, none for samples ``cache_dir`` already holds; ``fingerprint`` is the processor's)
    and the decoder alone is calibrated on them; ``probe.capture`` says what ran. With
    ``spill_folder`` the captured inputs and the activation cache live in memory-mapped files
    there (``probe.spill`` says how much)."""
    modifiers = _modifiers(recipe, adapter, targets, config_groups)
    weights_record = None
    if recipe.token_weights is not None and prepared is not None:
        vectors = sample_weights(
            prepared.rows, recipe.token_weights, config=model.config, processor=processor
        )
        modifiers, weights_record = (
            with_token_weights(modifiers, vectors),
            weights_summary(recipe.token_weights, vectors),
        )
    with contextlib.ExitStack() as stack:
        probe = stack.enter_context(CalibrationProbe(model, adapter))
        spill = stack.enter_context(spilled_activations(spill_folder)) if spill_folder is not None else None
        loader, decoder, captured = None, None, None
        if prepared is not None and adapter.pipeline == "sequential":
            with sample_bar("capturing decoder inputs", len(prepared.rows), enabled=progress) as advance:
                captured = capture_decoder_inputs(
                    model,
                    adapter,
                    prepared.rows,
                    layer_names=list(decoder_layers(model, adapter)),
                    processor_fingerprint=fingerprint,
                    cache_dir=cache_dir,
                    on_sample=advance,
                )
            release_processor_outputs(prepared.rows)  # the decoder runs on the captured inputs
            if spill is not None:
                for row in captured.rows:
                    row.kwargs = spill.map_kwargs(row.kwargs)
            loader, decoder = decoder_loader(captured.rows), adapter.decoder_path
        elif prepared is not None:
            loader = calibration_loader(prepared.rows, keep_none=False)
        probe.on_layer_call = stack.enter_context(
            calibration_spinner(f"calibrating ({recipe.name}, {adapter.pipeline})", enabled=progress)
        )
        run_oneshot(
            model,
            processor,
            modifiers,
            loader,
            pipeline=adapter.pipeline,
            decoder_layer=adapter.decoder_layer,
            decoder=decoder,
            trust_remote_code=adapter.trust_remote_code,
        )
    probe.capture, probe.spill, probe.token_weights = captured, spill, weights_record
    if prepared is not None:
        rows = prepared.rows
        towers = captured.tower_samples if captured is not None else {}
        probe.verify(
            samples=len(rows),
            vision_samples=towers.get("vision", sum(row.has_vision for row in rows)),
            audio_samples=towers.get("audio", sum(row.has_audio for row in rows)),
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
) -> QuantizeResult:
    """Quantize the language model of ``model_dir`` with ``recipe`` and write ``output``.

    ``samples`` (with optional stratum ``sample_labels``) calibrate recipes that need data and
    are ignored by data-free ones. ``calib_info`` (calibration-set hash, strata summary) goes
    into quantkit.json as given. ``cache_dir`` keeps processed inputs for the next recipe.
    ``calibration_dtype`` defaults to float32 (4x faster than bf16 on CPUs); unquantized tensors
    are cast back to the checkpoint's own dtype before writing either way.

    W4A16-family recipes get the largest group size of 128 / 64 / 32 (or the recipe's
    ``group_size``) dividing every targeted layer; a layer none divides stays at 8 bits.
    ``avg_bits`` (e.g. 4.5) also keeps the most sensitive layers at 8 bits (W8A16) within that
    average (weight bits by parameter count; ``count_overhead`` adds scales and zero points):
    ranked by ``sensitivity`` (a SensitivityTable or the JSON of ``quantkit sensitivity``), or
    measured here on ``sensitivity_samples`` of the calibration samples when it is None
    (``sensitivity_method``: fisher, the cheap estimate, or kl, measured per unit).
    Under ``torchrun`` (``distributed``, or found from the environment) every rank calibrates a
    stratified shard of ``samples`` and llmcompressor reduces the statistics across ranks; rank 0
    alone measures the --avg-bits ranking and writes the checkpoint. ``offload`` ("cpu" or
    "disk") loads through compressed-tensors' offloading for models larger than device memory
    (disk: what exceeds ``max_cpu_memory`` bytes goes under ``offload_folder``, default a
    temporary folder beside ``output``, removed after).
    A group size that divides no layer is refused. Before any work: the model folder's files, an output that overlaps
    an input, an output that cannot be written or whose disk is too small for the checkpoint.
    The memory plan (quantkit.quantize.plan) is made once the model is loaded; when the
    activation cache does not fit in host memory it is spilled to memory-mapped files beside
    ``output`` (``spill`` True / False forces it either way). quantkit.json records the plan
    beside the measured peaks.
    Raises InputError for bad input and CheckFailed when a proof fails; in both cases nothing
    is written.
    """
    with contextlib.ExitStack() as cleanup:  # the disk-offload folder, whatever happens
        started = time.perf_counter()
        stage_times: dict[str, float] = {}
        model_dir, output = Path(model_dir), Path(output)
        adapter = adapter_for(model_dir, adapter)
        labels = _labels(samples, sample_labels)
        refuse_known_failure(adapter, recipe, allow=allow_known_failure)
        check_precision_options(recipe, avg_bits)
        check_avg_bits(avg_bits)
        table = _load_sensitivity(sensitivity)
        refuse_overlap(
            output,
            {
                "model folder": model_dir,
                "calibration set": (calib_info or {}).get("path"),
                "media folder": media_folders(samples),
                "sensitivity table": sensitivity if isinstance(sensitivity, (str, Path)) else None,
                "feature cache": cache_dir,
                "offload folder": offload_folder,
            },
        )
        refuse_overlap(
            cache_dir,
            {
                "model folder": model_dir,
                "calibration set": (calib_info or {}).get("path"),
                "media folder": media_folders(samples),
            },
            option="--cache-dir",
        )
        if recipe.needs_data and not samples:
            raise InputError(f"recipe {recipe.name!r} needs calibration samples and none were given")
        if avg_bits is not None and table is None and not samples:
            raise InputError("--avg-bits ranks layers on calibration samples and none were given")
        # The model folder, the group size and the checkpoint's size, from the config alone; then
        # the output: writable, enough free space (a full disk found after hours of GPTQ is too late).
        planned = plan(
            model_dir,
            recipe,
            samples,
            sample_labels=labels,
            adapter=adapter,
            avg_bits=avg_bits,
            sensitivity=table,
            count_overhead=count_overhead,
        )
        check_output_free(output, force, need_bytes=planned.checkpoint_bytes)
        context = distributed or init_distributed()
        if context is None or context.is_main:  # the rank that writes holds the output
            cleanup.enter_context(output_lock(output))
        if context is not None:
            refuse_shared_weight_smoothing(recipe)
        if context is not None and recipe.needs_data:
            samples, labels = shard(samples, labels, context)

        clock = time.perf_counter()
        processor = adapter.load_processor(model_dir)
        prepared = None
        if recipe.needs_data or (avg_bits is not None and table is None):
            prepared = prepare_samples(
                adapter, processor, model_dir, samples, labels, cache_dir, max_seq_len, progress
            )
        ranking_rows = prepared.rows if prepared else []
        if not recipe.needs_data:
            prepared = None  # data-free recipes calibrate on nothing; the rows only rank layers
        stage_times["preprocess"] = round(time.perf_counter() - clock, 2)

        clock = time.perf_counter()
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
        targets = resolve_targets(model, adapter)
        # Group size and layers no group size fits, and the budget they alone take: before any work.
        plan_for = functools.partial(
            precision_plan, model, adapter, recipe, targets, avg_bits=avg_bits, count_overhead=count_overhead
        )
        precision = plan_for(sensitivity=table)
        if recipe.smoothquant_strength is not None:
            check_smoothquant_mappings(model, adapter)
        if recipe.method == "awq":
            check_awq_mappings(model, adapter)
        memory = memory_plan(
            model,
            adapter,
            recipe,
            targets,
            [row.tokens for row in prepared.rows] if prepared else [],
            calibration_dtype=calibration_dtype,
            saved_dtype=target_dtype,
            offload=offload,
            max_cpu_memory=max_cpu_memory,
            group_size=precision.group_size if precision else group_size(recipe),
        )
        spill_folder = None
        if prepared is not None and (memory.spill if spill is None else spill):
            spill_folder = output.parent / f".{output.name}.spill"
        stage_times["load"] = round(time.perf_counter() - clock, 2)

        if avg_bits is not None and table is None:
            clock = time.perf_counter()
            if context is None or context.is_main:  # one ranking for every rank: rank 0's
                table = measure_sensitivity_for(
                    model,
                    adapter,
                    recipe,
                    targets,
                    ranking_rows,
                    precision,
                    sensitivity_samples,
                    progress,
                    method=sensitivity_method,
                )
                table.model, table.architecture = str(model_dir), model_architecture(model_dir)
            table = broadcast_from_main(table, context)
            stage_times["sensitivity"] = round(time.perf_counter() - clock, 2)
            precision = plan_for(sensitivity=table)
        config_groups = None
        if precision is not None:
            check_group_divisibility(model, precision.group_sizes(targets.quantize))  # the final guard
            config_groups = precision.config_groups(recipe)

        clock = time.perf_counter()
        probe = calibrate(
            model,
            processor,
            adapter,
            recipe,
            targets,
            prepared,
            progress=progress,
            config_groups=config_groups,
            cache_dir=cache_dir,
            fingerprint=processor_fingerprint(model_dir),
            spill_folder=spill_folder,
        )
        stage_times["oneshot"] = round(time.perf_counter() - clock, 2)

        summary = check_quantized_modules(model, adapter)
        if precision is not None:
            check_assigned(model, precision, targets.quantize)
        check_scales(model)
        set_saved_dtype(model, target_dtype)  # unquantized tensors go back to the checkpoint's own dtype
        scales_checked = check_scales(model)  # again: a cast must not have broken a scale

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
            recipe=recipe.name,
            checkpoint_format=precision.checkpoint_format if precision else recipe.checkpoint_format,
            pipeline=adapter.pipeline if prepared else "datafree",
            samples_used=len(rows),
            samples_by_label=used_by_label,
            dropped_samples=dropped,
            cache_hits=cache_hits,
            preprocessed=processed,
            calibration_calls=calls,
            quantized_modules=summary.quantized,
            kept_modules=targets.kept,
            counts=targets.counts(),
            scales_checked=scales_checked,
            stage_times_s=stage_times,
            wall_time_s=0.0,
            peak_rss_mb=0.0,
            precision=precision,
            sensitivity=table,
            world_size=context.world_size if context else 1,
            samples_per_rank=per_rank,
            wrote=context is None or context.is_main,
            decoder_inputs=_capture_summary(probe.capture, adapter),
            token_weights=probe.token_weights,
        )
        if not result.wrote:
            join_compressed_save(model, output)  # rank 0 writes the files
            barrier(context)
            return result
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
            result.metadata["memory"] = {"plan": memory.to_dict(), "measured": measured_memory(probe)}
            write_checkpoint(
                model,
                staging,
                source=model_dir,
                metadata=result.metadata,
                expected_format=result.checkpoint_format,
                kept=list(targets.kept),
                towers=[t for t in (adapter.vision_tower, adapter.audio_tower) if t],
            )
            if adapter.serving is not None:
                from quantkit.export.serving import write_serving_layout

                write_serving_layout(staging, adapter.serving)
            if precision is not None and precision.mixed:
                order_config_groups(staging)
        stage_times["write"] = round(time.perf_counter() - clock, 2)
        result.wall_time_s = round(time.perf_counter() - started, 2)
        barrier(context)
        return result


def measured_memory(probe: CalibrationProbe) -> dict:
    """What the run held, beside the plan's figures (bytes)."""
    captured, spill = probe.capture, probe.spill
    measured = {
        "peak_rss": int(peak_rss_mb() * 2**20),
        "captured_inputs": captured.nbytes if captured is not None else 0,
        "spilled": spill is not None,
        "spilled_bytes": spill.bytes if spill is not None else 0,
    }
    if torch.cuda.is_available():
        measured["peak_gpu"] = [
            torch.cuda.max_memory_allocated(index) for index in range(torch.cuda.device_count())
        ]
    return measured


def _capture_summary(captured, adapter: Adapter) -> dict | None:
    """quantkit.json's record of the decoder's captured inputs (this rank's)."""
    if captured is None:
        return None
    return {
        "decoder": adapter.decoder_path,
        "captured": captured.captured,
        "cache_hits": captured.cache_hits,
        "tower_samples": captured.tower_samples,
        "towers_hash": captured.towers_hash,
        "bytes": captured.nbytes,
    }


@dataclass(frozen=True)
class RankRow:
    """What quantkit.json records of a calibration row another rank used."""

    sample_id: str
    label: str
    tokens: int


def merge_ranks(rows, dropped, cache_hits, processed, calls, context: DistContext):
    """Every rank's rows, drops, cache figures and hook counts, summed (hook counts per rank
    were already proved complete for that rank's shard)."""
    mine = ([RankRow(r.sample_id, r.label, r.tokens) for r in rows], dropped, cache_hits, processed, calls)
    everyone = gather(mine, context)
    merged_calls: Counter[str] = Counter()
    for part in everyone:
        merged_calls.update(part[4])
    return (
        [row for part in everyone for row in part[0]],
        [drop for part in everyone for drop in part[1]],
        sum(part[2] for part in everyone),
        sum(part[3] for part in everyone),
        dict(merged_calls),
    )


def measure_sensitivity_for(
    model: torch.nn.Module,
    adapter: Adapter,
    recipe: Recipe,
    targets: TargetPlan,
    rows: list[FeatureRow],
    precision: PrecisionPlan | None,
    count: int,
    progress: bool,
    *,
    method: str = SENSITIVITY_METHOD,
):
    """The --avg-bits ranking, measured on the loaded (calibration-dtype) model with the 4-bit
    scheme and group size this run will use; the weights are restored afterwards."""
    from quantkit.recipes.modifiers import weight_args
    from quantkit.sensitivity.run import measure_loaded

    if not rows:
        raise InputError("--avg-bits ranks layers on calibration samples and none were usable")
    rows = sensitivity_rows(rows, [row.label for row in rows], count)
    group = precision.group_size if precision else None
    candidates = group_size_candidates(group or recipe.group_size)
    return measure_loaded(
        model,
        adapter,
        rows,
        names=targets.quantize,
        args=weight_args(recipe, group),
        candidates=candidates,
        scheme=recipe.preset,
        granularity=SENSITIVITY_GRANULARITY,
        method=method,
        draws=SENSITIVITY_DRAWS,
        progress=progress,
    )


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
    precision = result.precision
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
        "recipe": recipe.model_dump(
            mode="json", exclude={"token_weights"} if recipe.token_weights is None else None
        ),
        "resolved_scheme": resolved_scheme(recipe, group_size=precision.group_size if precision else None),
        "precision": precision.to_dict() if precision else None,
        "checkpoint_format": result.checkpoint_format,
        "libraries": library_versions(),
        "world_size": result.world_size,
        "dtypes": {"calibration": _dtype_name(dtypes[0]), "saved": _dtype_name(dtypes[1])},
        "calibration": {
            "needed": recipe.needs_data,
            "set": calib_info or {},
            "pipeline": result.pipeline,
            "samples_used": result.samples_used,
            "samples_per_rank": result.samples_per_rank,
            "sample_ids": [row.sample_id for row in rows],
            "by_label": result.samples_by_label,
            "tokens": sum(row.tokens for row in rows),
            "max_seq_len": max_seq_len,
            "dropped": result.dropped_samples,
            "cache_hits": result.cache_hits,
            "tower_calls": towers,
            "decoder_inputs": result.decoder_inputs,
            **({"token_weights": result.token_weights} if result.token_weights is not None else {}),
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
