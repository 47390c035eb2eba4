"""Writing a quantized checkpoint: compressed-tensors weights, sidecar files, quantkit.json, model card."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from quantkit.errors import CheckFailed
from quantkit.export.card import render_model_card
from quantkit.export.files import SIDECAR_FILES, copy_sidecar_files
from quantkit.export.metadata import (
    METADATA_FILE,
    library_versions,
    peak_rss_mb,
    read_metadata,
    write_metadata,
)

__all__ = [
    "METADATA_FILE",
    "SIDECAR_FILES",
    "checkpoint_format",
    "copy_sidecar_files",
    "library_versions",
    "peak_rss_mb",
    "read_metadata",
    "render_model_card",
    "write_checkpoint",
    "write_metadata",
]


def checkpoint_format(directory: Path) -> str | None:
    """The compressed-tensors ``format`` recorded in a checkpoint's config.json."""
    config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    return (config.get("quantization_config") or {}).get("format")


def cover_kept_modules(directory: Path, model: torch.nn.Module, kept: list[str]) -> list[str]:
    """Make the saved ``ignore`` list match the kept Linears under the model's own module names too.

    For architectures whose checkpoint keys use older names than the modules (transformers 5 saves
    Qwen2.5-VL as ``visual.*`` / ``model.layers.*`` while the modules are ``model.visual.*``),
    llmcompressor writes ``ignore`` in the checkpoint's names: right for vLLM, but transformers
    matches it against module names on reload, misses, and quantizes the vision tower with
    garbage scales. Returns the patterns added.
    """
    from quantkit.models.adapters import matches_any
    from quantkit.quantize.targets import compact_patterns

    config_path = Path(directory) / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    ignore = config["quantization_config"].get("ignore") or []
    uncovered = [name for name in kept if not matches_any(name, ignore)]
    if not uncovered:
        return []
    added = compact_patterns(uncovered, [name for name, _ in model.named_modules()])
    config["quantization_config"]["ignore"] = [*ignore, *added]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return added


def write_checkpoint(
    model: torch.nn.Module,
    directory: Path,
    *,
    source: Path,
    metadata: dict,
    expected_format: str,
    kept: list[str] | None = None,
) -> list[str]:
    """Save ``model`` compressed into ``directory`` (a staging folder) with everything a server needs.

    Fails (CheckFailed) if config.json does not carry the format the recipe implies.
    """
    directory = Path(directory)
    model.save_pretrained(directory, save_compressed=True)
    if kept:
        metadata.setdefault("modules", {})["ignore_added_for_module_names"] = cover_kept_modules(
            directory, model, kept
        )
    copy_sidecar_files(source, directory)
    found = checkpoint_format(directory)
    if found != expected_format:
        raise CheckFailed(
            f"the checkpoint's quantization_config format is {found!r}, expected {expected_format!r}"
        )
    write_metadata(directory, metadata)
    (directory / "README.md").write_text(render_model_card(metadata), encoding="utf-8")
    return sorted(p.name for p in directory.iterdir())
