"""Rewrite a quantized thinker checkpoint into the layout vLLM serves Omni models from:
the whole model's config (``thinker_config`` inside), weights and ignore entries under ``thinker.``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from quantkit.modelfiles import INDEX_FILE
from quantkit.models.adapters import ServingLayout, prefix_pattern


def _under(name: str, prefix: str) -> str:
    """``name`` under ``prefix``, once: a thinker loaded from the whole model (an upstream
    checkpoint) is saved by transformers under its names there, prefix included."""
    return name if name.startswith(prefix) else prefix + name


def _under_pattern(pattern: str, prefix: str) -> str:
    if pattern.startswith((prefix, "re:^" + re.escape(prefix))):
        return pattern
    return prefix_pattern(pattern, prefix)


def _rename_tensors(directory: Path, prefix: str) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    # One shard at a time, so memory stays at one shard's size for real models.
    for shard in sorted(directory.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            metadata = handle.metadata() or {"format": "pt"}
            tensors = {_under(key, prefix): handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
        save_file(tensors, str(shard), metadata=metadata)
    index = directory / INDEX_FILE
    if index.is_file():
        data = json.loads(index.read_text(encoding="utf-8"))
        data["weight_map"] = {_under(key, prefix): file for key, file in data["weight_map"].items()}
        index.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_serving_layout(directory: Path, layout: ServingLayout) -> None:
    """Rewrite ``directory`` (a staging folder holding the thinker) in place."""
    import transformers

    directory = Path(directory)
    config_path = directory / "config.json"
    inner = json.loads(config_path.read_text(encoding="utf-8"))
    quantization = inner.pop("quantization_config", None)
    config_class = getattr(transformers, layout.config_class)
    whole = config_class(**{f"{layout.attribute}_config": inner}, **layout.config_extra).to_dict()
    whole["architectures"] = [layout.architecture]
    whole["dtype"] = inner.get("dtype", whole.get("dtype"))
    if quantization is not None:
        quantization["ignore"] = [_under_pattern(p, layout.prefix) for p in quantization.get("ignore") or []]
        for group in (quantization.get("config_groups") or {}).values():
            group["targets"] = [_under_pattern(t, layout.prefix) for t in group.get("targets") or []]
        whole["quantization_config"] = quantization
    _rename_tensors(directory, layout.prefix)
    config_path.write_text(json.dumps(whole, indent=2, sort_keys=True) + "\n", encoding="utf-8")
