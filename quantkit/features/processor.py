"""Calibration samples -> processor inputs, cached on disk, and the batch-size-1 data loader.

Preprocessing (decoding video, resampling audio, running the image processor) is the slow part of
a short calibration run, and it does not depend on the recipe: a second recipe on the same set
and model reuses the cached tensors. The cache key is the sample's content (messages and media
bytes) and the processor's files, so a changed sample, media file or processor never hits.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from quantkit.errors import InputError
from quantkit.fsutil import sha256_file
from quantkit.media import MediaError
from quantkit.modelfiles import PROCESSOR_FILES
from quantkit.models.inputs import Sample, UnsupportedModality, processor_inputs
from quantkit.progress import sample_bar

# Bump when processor_inputs changes what it returns for the same files.
FEATURES_VERSION = 1
# Input keys that show a sample reaches a tower.
VISION_KEYS = ("pixel_values", "pixel_values_videos")
AUDIO_KEYS = ("input_features",)
TEXT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")


@dataclass
class FeatureRow:
    """One sample's processor inputs and what they contain."""

    sample_id: str
    label: str
    inputs: dict
    from_cache: bool = False

    @property
    def tokens(self) -> int:
        return int(self.inputs["input_ids"].shape[-1])

    @property
    def has_vision(self) -> bool:
        return any(self.inputs.get(key) is not None for key in VISION_KEYS)

    @property
    def has_audio(self) -> bool:
        return any(self.inputs.get(key) is not None for key in AUDIO_KEYS)


@dataclass
class PreparedFeatures:
    rows: list[FeatureRow]
    dropped: list[dict] = field(default_factory=list)  # {"sample_id", "label", "reason"}
    cache_hits: int = 0
    processed: int = 0


def _media_digest(path: Path) -> str:
    try:
        return sha256_file(Path(path))
    except OSError as err:
        raise InputError(f"cannot read media file: {err.strerror}", path=path) from None


def sample_id(sample: Sample) -> str:
    """A content hash of the sample: messages plus the bytes of every media file it names."""
    payload = {
        "messages": sample.messages,
        "images": [_media_digest(p) for p in sample.images],
        "videos": [_media_digest(p) for p in sample.videos],
        "audios": [_media_digest(p) for p in sample.audios],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def processor_fingerprint(model_dir: Path) -> str:
    """A hash of the processor's files (and the code versions that interpret them)."""
    import transformers

    digest = hashlib.sha256(
        f"quantkit-features-{FEATURES_VERSION}|transformers-{transformers.__version__}".encode()
    )
    for name in PROCESSOR_FILES:
        path = Path(model_dir) / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _cache_path(cache_dir: Path, fingerprint: str, sid: str) -> Path:
    return Path(cache_dir) / fingerprint[:16] / f"{sid}.pt"


def load_entry(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # a torn or foreign file is a miss, never an error
        return None


def store_entry(path: Path, inputs: dict) -> None:
    """Write beside and rename, so a killed run never leaves a torn cache entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    torch.save(inputs, partial)
    partial.replace(path)


def _truncate_text_only(inputs: dict, max_seq_len: int) -> dict:
    return {
        key: value[..., :max_seq_len] if key in TEXT_KEYS and isinstance(value, torch.Tensor) else value
        for key, value in inputs.items()
    }


def prepare_features(
    processor,
    samples: list[Sample],
    *,
    labels: list[str],
    fingerprint: str,
    cache_dir: Path | None = None,
    max_seq_len: int | None = None,
    on_sample: Callable[[], None] | None = None,
) -> PreparedFeatures:
    """Processor inputs for every sample, from the cache when it has them.

    A text-only sample longer than ``max_seq_len`` is truncated; a sample with media is never cut
    (cutting through image or audio tokens breaks the model's placeholder count) and is dropped
    instead, with the reason recorded.
    """
    result = PreparedFeatures(rows=[])
    for index, (sample, label) in enumerate(zip(samples, labels, strict=True)):
        sid = sample_id(sample)
        cached = load_entry(_cache_path(cache_dir, fingerprint, sid)) if cache_dir is not None else None
        if cached is not None:
            inputs, result.cache_hits = cached, result.cache_hits + 1
        else:
            try:
                inputs = processor_inputs(processor, sample)
            except UnsupportedModality as err:
                result.dropped.append({"sample_id": sid, "label": label, "reason": str(err)})
                if on_sample:
                    on_sample()
                continue
            except MediaError as err:
                media = [str(p) for p in (*sample.images, *sample.videos, *sample.audios)]
                raise InputError(
                    f"calibration sample {index} ({label}): {err}", hint=f"media: {', '.join(media)}"
                ) from None
            result.processed += 1
            if cache_dir is not None:
                store_entry(_cache_path(cache_dir, fingerprint, sid), inputs)
        row = FeatureRow(sid, label, inputs, from_cache=cached is not None)
        if max_seq_len is not None and row.tokens > max_seq_len:
            if row.has_vision or row.has_audio:
                reason = f"{row.tokens} tokens with media exceed max_seq_len {max_seq_len}"
                result.dropped.append({"sample_id": sid, "label": label, "reason": reason})
                if on_sample:
                    on_sample()
                continue
            row.inputs = _truncate_text_only(inputs, max_seq_len)
        result.rows.append(row)
        if on_sample:
            on_sample()
    return result


def collate_one(keys: list[str], *, keep_none: bool) -> Callable[[list[dict]], dict]:
    """Batch size 1, as the notes require for mixed media.

    The sequential pipeline traces the model with the first batch, so every batch must carry the
    same keys (None where a sample lacks one); the basic pipeline calls ``model(**batch)`` and
    must not see None. Booleans (``use_audio_in_video``) become tensors, and only when true.
    """

    def collate(batch: list[dict]) -> dict:
        (row,) = batch
        out = {}
        for key in keys:
            value = row.get(key)
            if isinstance(value, bool):
                if value:
                    out[key] = torch.tensor(True)
                elif keep_none:
                    out[key] = None
                continue
            if value is None and not keep_none:
                continue
            out[key] = value
        return out

    return collate


def calibration_loader(rows: list[FeatureRow], *, keep_none: bool) -> DataLoader:
    keys = sorted(set().union(*(row.inputs for row in rows)))
    return DataLoader(
        [row.inputs for row in rows],
        batch_size=1,
        shuffle=False,
        collate_fn=collate_one(keys, keep_none=keep_none),
    )


def prepare_samples(
    _adapter, processor, model_dir: Path, samples, labels, cache_dir, max_seq_len, progress
) -> PreparedFeatures:
    """Samples -> processor inputs (from the feature cache where it has them); InputError if none is usable."""
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
