"""Before any weight is read: known-bad combinations and options refused, the dry run's plan
(targets, group size and 8-bit layers, memory, the checkpoint's size) from the config alone."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from quantkit.errors import InputError
from quantkit.fsutil import refuse_overlap
from quantkit.modelfiles import check_model_folder
from quantkit.models.adapters import Adapter, adapter_for, model_architecture
from quantkit.models.inputs import Sample
from quantkit.models.loading import saved_dtype, unfuse_experts_on_meta
from quantkit.models.targets import TargetPlan, check_awq_mappings, resolve_targets
from quantkit.precision.mixed import check_avg_bits
from quantkit.quantize.plan import LayerKinds, memory_plan, reduced_tree
from quantkit.quantize.resolved import ResolvedRecipe, resolve
from quantkit.recipes import Recipe
from quantkit.recipes.schema import GROUP_SCHEMES


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
class ConfigTree:
    """The model built from its config on the meta device, as the plan reads it: ``model`` holds
    one decoder layer per kind when ``kinds`` is given (quantkit.quantize.plan.reduced_tree),
    ``targets`` are its names."""

    model: torch.nn.Module
    targets: TargetPlan
    kinds: LayerKinds | None


def resolve_from_config(
    model_dir: Path,
    recipe: Recipe,
    adapter: Adapter,
    *,
    avg_bits: float | None = None,
    sensitivity=None,
    count_overhead: bool = False,
    light_imports: bool = False,
) -> tuple[ResolvedRecipe, ConfigTree]:
    """``recipe`` resolved on the model's meta tree (config.json alone: no weight is read), and
    that tree. A wrong AWQ mapping, a group size or block width the layers do not take: refused."""
    model = adapter.meta_model(model_dir, light_imports=light_imports)
    # One decoder layer per kind (dense / sparse), multiplied: the same plan as the whole tree.
    reduced = reduced_tree(model, adapter)
    kinds = reduced[1] if reduced else None
    unfuse_experts_on_meta(model, light_imports=light_imports)
    targets = resolve_targets(model, adapter)
    if recipe.method == "awq":  # a wrong mapping is bad input before any weight is read
        check_awq_mappings(model, adapter)
    resolved = resolve(
        recipe, model, adapter, targets, model_dir=model_dir, saved_dtype=saved_dtype(model_dir),
        avg_bits=avg_bits, sensitivity=sensitivity, count_overhead=count_overhead, kinds=kinds,
    )  # fmt: skip
    return resolved, ConfigTree(model, targets, kinds)


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
    resolved, tree = resolve_from_config(
        model_dir, recipe, adapter, avg_bits=avg_bits, sensitivity=_load_sensitivity(sensitivity),
        count_overhead=count_overhead, light_imports=light_imports,
    )  # fmt: skip
    used = samples if recipe.needs_data else []
    tokens = list(sample_tokens) if sample_tokens is not None else [None] * len(samples)
    memory = memory_plan(
        tree.model,
        adapter,
        recipe,
        tree.targets,
        tokens[: len(used)],
        calibration_dtype=calibration_dtype or default_calibration_dtype(),
        saved_dtype=saved_dtype(model_dir),
        offload=offload,
        max_cpu_memory=max_cpu_memory,
        checkpoint=resolved.checkpoint_bytes,
        available=host_memory,
        device=device,
        kinds=tree.kinds,
    )
    failure = adapter.known_failure(recipe.scheme)
    precision = resolved.precision
    return QuantizePlan(
        model_dir=model_dir,
        architecture=model_architecture(model_dir),
        adapter=adapter.name,
        recipe=recipe.name,
        scheme=recipe.scheme,
        checkpoint_format=resolved.checkpoint_format,
        pipeline=adapter.pipeline if recipe.needs_data else "datafree",
        needs_data=recipe.needs_data,
        counts=resolved.targets.counts(),
        samples=len(used),
        samples_by_label=dict(Counter(labels[: len(used)])),
        samples_by_modality=_modality_counts(used),
        known_failure=failure.reason if failure else None,
        targets=resolved.targets.targets,
        ignore=resolved.targets.ignore,
        group_size=resolved.group_size,
        precision=precision.to_dict() if precision else None,
        checkpoint_bytes=resolved.checkpoint_bytes,
        memory=memory.to_dict(),
    )


def default_calibration_dtype() -> torch.dtype:
    """bfloat16 with a GPU, float32 on CPUs (4x faster matmuls there)."""
    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


def refuse_bad_input(
    model_dir: Path,
    output: Path,
    recipe: Recipe,
    adapter: Adapter,
    samples: list[Sample],
    *,
    allow_known_failure: bool,
    avg_bits: float | None,
    sensitivity,
    calib_info: dict | None,
    cache_dir: Path | None,
    offload_folder: Path | None,
):
    """What quantize refuses before any work: a known failure, options the recipe does not take,
    an output or cache folder overlapping an input, no samples for a recipe that needs them.
    Returns the sensitivity table (read now, so that a bad file fails early)."""
    refuse_known_failure(adapter, recipe, allow=allow_known_failure)
    check_precision_options(recipe, avg_bits)
    check_avg_bits(avg_bits)
    table = _load_sensitivity(sensitivity)
    inputs = {
        "model folder": model_dir,
        "calibration set": (calib_info or {}).get("path"),
        "media folder": media_folders(samples),
    }
    refuse_overlap(
        output,
        {
            **inputs,
            "sensitivity table": sensitivity if isinstance(sensitivity, (str, Path)) else None,
            "feature cache": cache_dir,
            "offload folder": offload_folder,
        },
    )
    refuse_overlap(cache_dir, inputs, option="--cache-dir")
    if recipe.needs_data and not samples:
        raise InputError(f"recipe {recipe.name!r} needs calibration samples and none were given")
    if avg_bits is not None and table is None and not samples:
        raise InputError("--avg-bits ranks layers on calibration samples and none were given")
    return table
