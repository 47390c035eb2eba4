"""What a quantize run returns and records: its result, quantkit.json's content, the figures
merged across ranks."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from quantkit.export import library_versions, peak_rss_mb
from quantkit.models.adapters import Adapter
from quantkit.precision.mixed import PrecisionPlan
from quantkit.quantize.distributed import DistContext, gather
from quantkit.quantize.probe import CalibrationProbe
from quantkit.quantize.resolved import ResolvedRecipe


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


def capture_summary(captured, adapter: Adapter) -> dict | None:
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


def _dtype_name(dtype: torch.dtype) -> str:
    return re.sub(r"^torch\.", "", str(dtype))


def build_metadata(
    result: QuantizeResult,
    model_dir: Path,
    adapter: Adapter,
    resolved: ResolvedRecipe,
    rows: list,
    calib_info: dict | None,
    dtypes: tuple[torch.dtype, torch.dtype],
    kv_cache_modules: list[str],
    max_seq_len: int | None,
) -> dict:
    """The content of quantkit.json."""
    recipe, precision = resolved.recipe, resolved.precision
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
        "resolved_scheme": resolved.to_dict(),
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
