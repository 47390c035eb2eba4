"""Turning a recipe into llmcompressor modifiers (the library does the quantization itself)."""

from __future__ import annotations

from typing import Any

from quantkit.recipes.schema import Recipe

# llmcompressor 0.14 AWQModifier defaults: scales from activations and weights (duo scaling),
# 20 grid points per smoothing step.
AWQ_DUO_SCALING = True
AWQ_N_GRID = 20


def kv_cache_fp8_args():
    """FP8 (e4m3) per-tensor static scales for keys and values, from calibration data."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True)


def preset_name(recipe: Recipe) -> str:
    """The compressed-tensors preset a recipe starts from (``Recipe.preset``)."""
    return recipe.preset


def weight_args(recipe: Recipe, group_size: int | None = None):
    """The recipe's weight QuantizationArgs; ``group_size`` (chosen for the model) overrides the
    preset's (W4A16: 128) for group-wise schemes."""
    return recipe.spec.weight_args(symmetric=recipe.symmetric, group_size=group_size or recipe.group_size)


def build_modifiers(
    recipe: Recipe,
    *,
    targets: list[str],
    ignore: list[str],
    smoothquant_mappings: list[list] | None = None,
    awq_mappings: list | None = None,
    config_groups: dict | None = None,
) -> list:
    """The modifier list for ``oneshot``: SmoothQuant or AWQ (if any) first, then the quantizer.

    ``targets`` and ``ignore`` are module patterns (exact names or ``re:``) computed from the
    model's language model; nothing here falls back to the library's "every Linear" default.
    ``config_groups`` (name -> compressed-tensors QuantizationScheme, each with its own targets),
    when given, replaces the recipe's preset scheme: the group size chosen for the model, zero
    points, and mixed precision (quantkit.precision.mixed) arrive this way.
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
    if recipe.method == "awq":
        from llmcompressor.modifiers.transform.awq import AWQModifier

        if not awq_mappings:
            raise ValueError("this recipe uses AWQ but the adapter has no awq_mappings")
        # The library's defaults, stated: they are what quantkit.json records.
        modifiers.append(
            AWQModifier(mappings=list(awq_mappings), duo_scaling=AWQ_DUO_SCALING, n_grid=AWQ_N_GRID)
        )
    common: dict[str, Any] = dict(targets=list(targets), ignore=list(ignore))
    if not config_groups and recipe.spec.pin_format:
        config_groups = {"group_0": recipe.spec.scheme(targets, symmetric=recipe.symmetric)}
    if config_groups:
        common = dict(config_groups=dict(config_groups), ignore=list(ignore))
    else:
        common["scheme"] = recipe.preset
    if recipe.kv_cache_fp8:
        common["kv_cache_scheme"] = kv_cache_fp8_args()
    if recipe.weight_observer is not None:
        common["weight_observer"] = recipe.weight_observer  # the library applies it to every group
    if recipe.method == "gptq":
        modifiers.append(
            GPTQModifier(actorder=recipe.actorder, dampening_frac=recipe.dampening_frac, **common)
        )
    else:
        modifiers.append(QuantizationModifier(**common))
    return modifiers


def resolved_scheme(recipe: Recipe, *, group_size: int | None = None) -> dict:
    """The full compressed-tensors scheme the recipe resolves to (for quantkit.json).

    ``group_size`` is the one chosen for the model (group-wise schemes); without it the recipe's
    own, else the preset's. Mixed precision is described separately (quantkit.json ``mixed``).
    """
    scheme = recipe.spec.scheme(["<language-model Linear layers>"], symmetric=recipe.symmetric)
    if scheme.weights is not None and scheme.weights.group_size:
        scheme.weights = weight_args(recipe, group_size)
    if scheme.weights is not None and recipe.weight_observer is not None:
        scheme.weights = scheme.weights.model_copy(update={"observer": recipe.weight_observer})
    result: dict[str, Any] = {"preset": recipe.scheme, "format": recipe.checkpoint_format}
    result.update(scheme.model_dump(mode="json", exclude_none=True, exclude={"targets"}))
    if recipe.method == "gptq":
        result["gptq"] = {"actorder": recipe.actorder, "dampening_frac": recipe.dampening_frac}
    if recipe.method == "awq":
        result["awq"] = {"duo_scaling": AWQ_DUO_SCALING, "n_grid": AWQ_N_GRID}
    if recipe.smoothquant_strength is not None:
        result["smoothquant"] = {"strength": recipe.smoothquant_strength}
    if recipe.kv_cache_fp8:
        result["kv_cache_scheme"] = kv_cache_fp8_args().model_dump(mode="json", exclude_none=True)
    return result
