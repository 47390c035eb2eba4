"""Calibration samples for a model, drawn from a ``quantkit calibrate`` folder: one way for every
command (quantize, sensitivity, build, the benches).

``draw_samples`` loads the model's processor once, reads and hashes the set once, and returns the
samples the model can take with their strata, the set's hash and the processor, so that a caller
neither loads the processor again nor re-reads the set. ``open_set`` is the same first half for a
caller that draws more than once from one set (the build holds rows out for its gate).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from quantkit.calibset import load_calibration_report, load_calibration_set, stratified_subsample
from quantkit.errors import InputError
from quantkit.modelfiles import PROCESSOR_FILES
from quantkit.models.inputs import Sample, processor_capabilities

MEDIA_COLUMNS = (("image", "images"), ("video", "videos"), ("audio", "audios"))


@dataclass
class CalibrationSamples:
    samples: list[Sample]
    labels: list[str]  # the stratum of each sample
    info: dict  # goes into quantkit.json: which set, its hash, what was drawn from it
    left_out: dict[str, int]  # modality -> samples the model cannot take
    tokens: list[int | None] | None = None  # measured by `calibrate --model` (None where not)
    processor: object = None  # the model's processor (draw_samples), loaded once for the command

    @property
    def sha256(self) -> str:
        """The set's samples file hash (report.json's, checked once when the set was read)."""
        return self.info["samples_sha256"]


@dataclass
class OpenSet:
    """A calibration set read once for a model: its rows the model can take (``usable``)."""

    path: Path
    report: dict
    kinds: set[str]  # the media kinds the model takes
    usable: list[dict]
    left_out: Counter
    processor: object = None

    @property
    def sha256(self) -> str:
        return self.report["samples_sha256"]

    def draw(self, num_samples: int | None = None, seed: int = 0) -> CalibrationSamples:
        """The usable rows, or a stratified subsample of ``num_samples`` that keeps the strata's
        proportions."""
        usable = self.usable
        if num_samples is not None:
            if num_samples < 1:
                raise InputError("--num-samples must be at least 1")
            picked = stratified_subsample([row["stratum"] for row in usable], num_samples, seed=seed)
            usable = [usable[i] for i in picked]
        samples = [Sample.from_row(row) for row in usable]
        info = {
            "path": str(self.path.resolve()),
            "samples_sha256": self.report["samples_sha256"],
            "set_size": self.report["size"],
            "seed": self.report["seed"],
            "drawn": len(samples),
            "subsample_seed": seed if num_samples is not None else None,
            "left_out_by_modality": dict(sorted(self.left_out.items())),
            "strata": dict(sorted(Counter(row["stratum"] for row in usable).items())),
            "by_task": dict(sorted(Counter(row["task"] for row in usable).items())),
            "by_modality": dict(sorted(Counter(row["modality"] for row in usable).items())),
            "sample_ids": [row["id"] for row in usable],  # lets `verify` hold these out of drift checks
        }
        tokens = [row.get("tokens") for row in usable]
        labels = [row["stratum"] for row in usable]
        return CalibrationSamples(samples, labels, info, dict(self.left_out), tokens, self.processor)


def _has_processor_files(model_dir: Path) -> bool:
    return any((Path(model_dir) / name).is_file() for name in PROCESSOR_FILES)


def _tower_kinds(adapter) -> set[str]:
    """The media kinds the adapter's towers take (a folder without a processor to ask)."""
    kinds = {"image", "video"} if adapter.vision_tower else set()
    return kinds | ({"audio"} if adapter.audio_tower else set())


def read_set(calib: Path, model_kinds: set[str], processor=None, report: dict | None = None) -> OpenSet:
    """The set's rows whose media kinds the model takes (``model_kinds``); the set is checked and
    hashed once (``report``: when the caller has done so). InputError when it has none."""
    calib = Path(calib)
    report = load_calibration_report(calib) if report is None else report
    dataset = load_calibration_set(calib, report=report)
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
    return OpenSet(calib, report, model_kinds, usable, left_out, processor)


def open_set(model_dir: Path, calib: Path, *, adapter, config_only_ok: bool = False) -> OpenSet:
    """The set read once for the model in ``model_dir``, whose processor (``adapter``'s) is loaded
    once and kept (``OpenSet.processor``). The set is checked before the processor is loaded.
    ``config_only_ok``: a folder with no processor files (``quantize --dry-run`` of a config-only
    folder) takes the media kinds of the adapter's towers, with no processor."""
    report = load_calibration_report(calib)
    if config_only_ok and not _has_processor_files(model_dir):
        return read_set(calib, _tower_kinds(adapter), None, report)
    processor = adapter.load_processor(model_dir)
    return read_set(calib, processor_capabilities(processor), processor, report)


def draw_samples(
    model_dir: Path,
    calib: Path,
    *,
    adapter,
    num_samples: int | None = None,
    seed: int = 0,
    config_only_ok: bool = False,
) -> CalibrationSamples:
    """The set's samples the model can take (its processor's media kinds), optionally a
    stratified subsample of ``num_samples``; with the processor (loaded once) and the set's hash
    (computed once): what a command needs to calibrate on a set (``config_only_ok``: open_set)."""
    return open_set(model_dir, calib, adapter=adapter, config_only_ok=config_only_ok).draw(num_samples, seed)


def samples_from_set(
    calib: Path, *, model_kinds: set[str], num_samples: int | None = None, seed: int = 0
) -> CalibrationSamples:
    """``draw_samples`` for a caller that knows the media kinds and needs no processor (a bench
    drawing for every kind, a dry run of a config-only folder)."""
    return read_set(calib, model_kinds).draw(num_samples, seed)
