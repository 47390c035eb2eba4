"""Writing a quantized checkpoint: compressed-tensors weights, sidecar files, quantkit.json, model card."""

from __future__ import annotations

import json
import re
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
    "join_compressed_save",
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


def tower_pattern(tower: str) -> str:
    """Matches a tower under any prefix: ``visual.*`` (vLLM), ``model.visual.*`` (transformers),
    ``thinker.visual.*`` (Omni serving layout)."""
    return "re:(.*\\.)?" + re.escape(tower.rsplit(".", 1)[-1]) + "\\..*"


def cover_kept_modules(
    directory: Path, model: torch.nn.Module, kept: list[str], towers: list[str] | None = None
) -> list[str]:
    """Make the saved ``ignore`` list keep the towers and every kept Linear under every naming a
    loader uses. Returns the patterns added.

    llmcompressor writes ``ignore`` as the checkpoint's module names. Loaders name modules
    differently: vLLM fuses a vision tower's q/k/v into ``qkv`` (Qwen2.5-VL / Omni), finds no
    ignore entry for the fused layer and runs the tower through int8 kernels without scales;
    transformers 5 saves Qwen2.5-VL under older names (``visual.*``) than its modules
    (``model.visual.*``) and quantizes the tower on reload. A tower-wide pattern and
    module-name patterns cover both.
    """
    from quantkit.models.adapters import matches_any
    from quantkit.models.targets import compact_patterns

    config_path = Path(directory) / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    ignore = config["quantization_config"].get("ignore") or []
    names = [name for name, _ in model.named_modules()]
    kept_set = set(kept)
    linears = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    added = []
    for tower in towers or []:
        pattern = tower_pattern(tower)
        # Only where it cannot touch a quantized layer.
        if all(name in kept_set for name in linears if matches_any(name, [pattern])):
            added.append(pattern)
    uncovered = [name for name in kept if not matches_any(name, [*ignore, *added])]
    if uncovered:
        added += compact_patterns(uncovered, names)
    if not added:
        return []
    config["quantization_config"]["ignore"] = [*ignore, *added]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return added


def join_compressed_save(model: torch.nn.Module, directory: Path) -> None:
    """On ranks other than 0 under torchrun: take part in the library's save, whose compression
    is spread across ranks (a collective); only rank 0's call writes files."""
    model.save_pretrained(Path(directory), save_compressed=True)


def write_checkpoint(
    model: torch.nn.Module,
    directory: Path,
    *,
    source: Path,
    metadata: dict,
    expected_format: str,
    kept: list[str] | None = None,
    towers: list[str] | None = None,
) -> list[str]:
    """Save ``model`` compressed into ``directory`` (a staging folder) with everything a server needs.

    Fails (CheckFailed) if config.json does not carry the format the recipe implies.
    """
    directory = Path(directory)
    model.save_pretrained(directory, save_compressed=True)
    if kept:
        metadata.setdefault("modules", {})["ignore_added_for_module_names"] = cover_kept_modules(
            directory, model, kept, towers
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
