"""Calibration samples for ``quantize``, drawn from a ``quantkit calibrate`` folder."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from quantkit.calibset import load_calibration_report, load_calibration_set, stratified_subsample
from quantkit.errors import InputError
from quantkit.models.inputs import Sample

MEDIA_COLUMNS = (("image", "images"), ("video", "videos"), ("audio", "audios"))


@dataclass
class CalibrationSamples:
    samples: list[Sample]
    labels: list[str]  # the stratum of each sample
    info: dict  # goes into quantkit.json: which set, its hash, what was drawn from it
    left_out: dict[str, int]  # modality -> samples the model cannot take
    tokens: list[int | None] | None = None  # measured by `calibrate --model` (None where not)


def model_media_kinds(adapter, model_dir: Path) -> set[str]:
    """The media kinds the model's processor takes; from the adapter's towers for a folder with
    no processor files (a config-only folder for ``quantize --dry-run``)."""
    from quantkit.features.processor import PROCESSOR_FILES
    from quantkit.models.inputs import processor_capabilities

    has_processor = any((Path(model_dir) / name).is_file() for name in PROCESSOR_FILES)
    if has_processor:
        return processor_capabilities(adapter.load_processor(model_dir))
    kinds = {"image", "video"} if adapter.vision_tower else set()
    return kinds | ({"audio"} if adapter.audio_tower else set())


def samples_from_set(
    calib: Path, *, model_kinds: set[str], num_samples: int | None = None, seed: int = 0
) -> CalibrationSamples:
    """The set's samples the model can take (its processor's media kinds), optionally a
    stratified subsample of ``num_samples`` that keeps the strata's proportions."""
    calib = Path(calib)
    report = load_calibration_report(calib)
    dataset = load_calibration_set(calib)
    usable, left_out = [], Counter()
    for row in dataset:
        kinds = {kind for kind, column in MEDIA_COLUMNS if row[column]}
        if kinds <= model_kinds:
            usable.append(row)
        else:
            left_out[row["modality"]] += 1
    if not usable:
        raise InputError(
            "no sample of the calibration set has a modality this model takes",
            path=calib,
            hint=f"the model takes: {', '.join(sorted(model_kinds | {'text'}))}",
        )
    if num_samples is not None:
        if num_samples < 1:
            raise InputError("--num-samples must be at least 1")
        picked = stratified_subsample([row["stratum"] for row in usable], num_samples, seed=seed)
        usable = [usable[i] for i in picked]
    samples = [Sample.from_row(row) for row in usable]
    info = {
        "path": str(calib.resolve()),
        "samples_sha256": report["samples_sha256"],
        "set_size": report["size"],
        "seed": report["seed"],
        "drawn": len(samples),
        "subsample_seed": seed if num_samples is not None else None,
        "left_out_by_modality": dict(sorted(left_out.items())),
        "strata": dict(sorted(Counter(row["stratum"] for row in usable).items())),
        "by_task": dict(sorted(Counter(row["task"] for row in usable).items())),
        "by_modality": dict(sorted(Counter(row["modality"] for row in usable).items())),
        "sample_ids": [row["id"] for row in usable],  # lets `verify` hold these out of drift checks
    }
    tokens = [row.get("tokens") for row in usable]
    return CalibrationSamples(samples, [row["stratum"] for row in usable], info, dict(left_out), tokens)
