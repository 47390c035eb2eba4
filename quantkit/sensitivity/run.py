"""``sensitivity``: a model folder + calibration samples -> a ranked table of how much quantizing
each language-model Linear layer alone moves the model's output (see measure.py for the method)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import torch

from quantkit.errors import InputError
from quantkit.features.processor import FeatureRow
from quantkit.models.adapters import Adapter, adapter_for, model_architecture
from quantkit.models.inputs import Sample
from quantkit.models.targets import decoder_layers, language_model_root, resolve_targets
from quantkit.precision.mixed import (
    GROUP_SIZE_CANDIDATES,
    choose_group_size,
    group_size_candidates,
    is_expert,
    symmetric_args,
)
from quantkit.precision.table import SensitivityTable
from quantkit.progress import sample_bar
from quantkit.recipes.schemes import SENSITIVITY_SCHEMES, preset_scheme
from quantkit.sensitivity.measure import GRANULARITIES, estimate_fisher, measure

METHODS = ("kl", "fisher")
# Weight-only schemes a layer can be measured with (activations stay in full precision).
SCHEMES = SENSITIVITY_SCHEMES
DEFAULT_SAMPLES = 8
DEFAULT_MAX_SEQ_LEN = 256
DEFAULT_POSITIONS = 128


def scheme_args(scheme: str, group_size: int | None = None):
    if scheme not in SCHEMES:
        raise InputError(f"unknown scheme {scheme!r} for sensitivity", hint=f"one of {', '.join(SCHEMES)}")
    args = preset_scheme(scheme, ["Linear"]).weights  # W8A16: per channel, as quantize writes it
    if group_size and args.group_size:
        args = args.model_copy(update={"group_size": group_size})
    return args


def layer_arguments(
    model: torch.nn.Module, names: list[str], args, candidates
) -> tuple[dict, dict, int | None]:
    """Per layer the args to fake-quantize with: group-wise schemes take the group size quantize
    would choose (the largest candidate dividing every layer); layers none divides are skipped
    (they stay at 8 bits anyway) with the reason."""
    if not args.group_size:
        return dict.fromkeys(names, args), {}, None
    in_features = {n: int(model.get_submodule(n).in_features) for n in names}
    params = {n: int(model.get_submodule(n).weight.numel()) for n in names}
    choice = choose_group_size(in_features, tuple(candidates), params)
    if choice.group_size is None:
        raise InputError(
            f"no group size in {', '.join(map(str, choice.candidates))} divides any targeted layer's in-features",
            hint="choose a per-channel scheme (W8A16) or another --group-size",
        )
    chosen = args.model_copy(update={"group_size": choice.group_size})
    skipped = {
        n: f"in-features {f}: no group size in {choice.candidates} divides it (stays at 8 bits)"
        for n, f in choice.unfit.items()
    }
    return {n: chosen for n in names if n not in choice.unfit}, skipped, choice.group_size


def measure_loaded(
    model: torch.nn.Module,
    adapter: Adapter,
    rows: list[FeatureRow],
    *,
    names: list[str],
    args,
    candidates=GROUP_SIZE_CANDIDATES,
    scheme: str = "W4A16_ASYM",
    model_name: str = "",
    architecture: str = "",
    granularity: str = "layer",
    max_positions: int | None = DEFAULT_POSITIONS,
    batch_size: int = 8,
    replay: bool = True,
    method: str = "kl",
    draws: int = 8,
    progress: bool = True,
) -> SensitivityTable:
    """Measure on a model already loaded (quantize does this on its float32 copy before
    calibrating; the weights are restored). ``method``: kl (measured, one row at a time) or
    fisher (estimated for all rows from ``draws`` backward passes per batch; see measure.py)."""
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}", hint=f"one of {', '.join(METHODS)}")
    if granularity not in GRANULARITIES:
        raise InputError(f"unknown granularity {granularity!r}", hint=f"one of {', '.join(GRANULARITIES)}")
    if not rows:
        raise InputError("no usable sample to measure sensitivity on")
    layer_args, skipped, group = layer_arguments(model, names, args, candidates)
    # quantize keeps MoE experts symmetric even in a zero-point recipe (quantize.mixed): measure them so.
    layer_args = {n: symmetric_args(a) if is_expert(n) else a for n, a in layer_args.items()}
    blocks = decoder_layers(model, adapter)
    root = language_model_root(list(blocks))
    started = time.perf_counter()
    from quantkit.sensitivity.measure import measurement_units

    count = len(measurement_units(list(layer_args), list(blocks), granularity))
    with sample_bar(f"sensitivity ({granularity}, {len(rows)} samples)", count, enabled=progress) as advance:
        if method == "fisher":
            measured, cost, mode, notes = estimate_fisher(
                model,
                rows,
                layer_args,
                blocks=blocks,
                granularity=granularity,
                max_positions=max_positions,
                batch_size=batch_size,
                draws=draws,
                on_unit=advance,
            )
        else:
            measured, cost, mode, notes = measure(
                model,
                rows,
                layer_args,
                blocks=blocks,
                root=root,
                granularity=granularity,
                max_positions=max_positions,
                batch_size=batch_size,
                replay=replay,
                on_unit=advance,
            )
    cost["wall_s"] = round(time.perf_counter() - started, 2)
    weights = (args.model_copy(update={"group_size": group}) if group else args).model_dump(
        mode="json", exclude_none=True
    )
    tokens = sum(row.tokens for row in rows)
    positions = cost.pop("positions")
    return SensitivityTable(
        model=model_name,
        architecture=architecture,
        scheme={"preset": scheme, "weights": weights, "candidates": list(candidates) if group else None},
        granularity=granularity,
        mode=mode,
        samples=len(rows),
        sample_ids=[row.sample_id for row in rows],
        tokens=tokens,
        positions=int(positions),
        rows=measured,
        skipped=skipped,
        cost=cost,
        notes=notes,
        method=method,
    )


def sensitivity(
    model_dir: Path,
    samples: list[Sample],
    *,
    sample_labels: list[str] | None = None,
    scheme: str = "W4A16_ASYM",
    group_size: int | None = None,
    adapter: Adapter | Path | None = None,
    granularity: str = "layer",
    max_seq_len: int | None = DEFAULT_MAX_SEQ_LEN,
    max_positions: int | None = DEFAULT_POSITIONS,
    batch_size: int = 8,
    cache_dir: Path | None = None,
    dtype: torch.dtype = torch.float32,
    replay: bool = True,
    method: str = "kl",
    draws: int = 8,
    progress: bool = True,
    processor=None,
) -> SensitivityTable:
    """Rank the language model's Linear layers of ``model_dir`` by sensitivity to ``scheme``
    (round-to-nearest, group size chosen as quantize would, or ``group_size`` alone) on
    ``samples`` (text-only samples are cut to ``max_seq_len`` tokens). ``processor``: the model's,
    when the caller loaded it already (models.samples.draw_samples)."""
    model_dir = Path(model_dir)
    adapter = adapter_for(model_dir, adapter)
    labels = sample_labels or ["all"] * len(samples)
    if not samples:
        raise InputError("sensitivity needs calibration samples")
    args = scheme_args(scheme)
    candidates = group_size_candidates(group_size)
    from quantkit.features.processor import prepare_samples
    from quantkit.models.loading import unfuse_experts

    processor = adapter.load_processor(model_dir) if processor is None else processor
    prepared = prepare_samples(
        adapter, processor, model_dir, samples, labels, cache_dir, max_seq_len, progress
    )

    model = adapter.load_model(model_dir, dtype=dtype)
    model.eval()
    unfuse_experts(model)
    targets = resolve_targets(model, adapter)
    table = measure_loaded(
        model,
        adapter,
        prepared.rows,
        names=targets.quantize,
        args=args,
        candidates=candidates,
        scheme=scheme,
        model_name=str(model_dir),
        architecture=model_architecture(model_dir),
        granularity=granularity,
        max_positions=max_positions,
        batch_size=batch_size,
        replay=replay,
        method=method,
        draws=draws,
        progress=progress,
    )
    if prepared.dropped:
        table.notes.append(
            f"{len(prepared.dropped)} sample(s) dropped: "
            + "; ".join(sorted({d["reason"] for d in prepared.dropped})[:3])
        )
    table.notes.append(
        "samples by label: "
        + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.label for r in prepared.rows).items()))
    )
    return table
