"""Turning a recipe into llmcompressor modifiers (the library does the quantization itself)."""

from __future__ import annotations

from typing import Any

from quantkit.recipes.schema import Recipe


def kv_cache_fp8_args():
    """FP8 (e4m3) per-tensor static scales for keys and values, from calibration data."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True)


def build_modifiers(
    recipe: Recipe,
    *,
    targets: list[str],
    ignore: list[str],
    smoothquant_mappings: list[list] | None = None,
) -> list:
    """The modifier list for ``oneshot``: SmoothQuant (if any) first, then the quantizer.

    ``targets`` and ``ignore`` are module patterns (exact names or ``re:``) computed from the
    model's language model; nothing here falls back to the library's "every Linear" default.
    """
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    if not targets:
        raise ValueError("no quantization targets")
    modifiers: list = []
    if recipe.smoothquant_strength is not None:
        from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

        if not smoothquant_mappings:
            raise ValueError("this recipe uses SmoothQuant but the adapter has no smoothquant_mappings")
        modifiers.append(
            SmoothQuantModifier(smoothing_strength=recipe.smoothquant_strength, mappings=smoothquant_mappings)
        )
    common: dict[str, Any] = dict(scheme=recipe.scheme, targets=list(targets), ignore=list(ignore))
    if recipe.kv_cache_fp8:
        common["kv_cache_scheme"] = kv_cache_fp8_args()
    if recipe.method == "gptq":
        modifiers.append(
            GPTQModifier(actorder=recipe.actorder, dampening_frac=recipe.dampening_frac, **common)
        )
    else:
        modifiers.append(QuantizationModifier(**common))
    return modifiers


def resolved_scheme(recipe: Recipe) -> dict:
    """The full compressed-tensors scheme the recipe resolves to (for quantkit.json)."""
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme(recipe.scheme, ["<language-model Linear layers>"])
    result: dict[str, Any] = {"preset": recipe.scheme, "format": recipe.checkpoint_format}
    result.update(scheme.model_dump(mode="json", exclude_none=True, exclude={"targets"}))
    if recipe.method == "gptq":
        result["gptq"] = {"actorder": recipe.actorder, "dampening_frac": recipe.dampening_frac}
    if recipe.smoothquant_strength is not None:
        result["smoothquant"] = {"strength": recipe.smoothquant_strength}
    if recipe.kv_cache_fp8:
        result["kv_cache_scheme"] = kv_cache_fp8_args().model_dump(mode="json", exclude_none=True)
    return result
