"""A recipe resolved for one model, once per run: what every later stage reads of the scheme.

:func:`resolve` turns a recipe (with the command line's options applied) and a model (loaded, or
its meta tree) into a :class:`ResolvedRecipe`: the Linear layers it quantizes, the group size and
the layers kept at 8 bits (W4A16 family), the compressed-tensors config groups the quantizer gets,
the observer, the SmoothQuant / AWQ / GPTQ settings, the checkpoint's format and predicted size.
The dry run (``plan``) resolves on the meta tree, ``quantize`` on the loaded model (again once the
--avg-bits ranking is measured: the precision plan depends on it); the modifiers
(:func:`build_modifiers`) and quantkit.json's ``resolved_scheme`` (:meth:`ResolvedRecipe.to_dict`)
are read from it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quantkit.errors import InputError
from quantkit.models.adapters import Adapter
from quantkit.models.targets import TargetPlan, check_group_divisibility, decoder_layers, language_model_root
from quantkit.precision.mixed import PrecisionPlan, plan_precision
from quantkit.quantize.plan import ExpandedTree, LayerKinds, checkpoint_size_estimate, expand_targets
from quantkit.recipes import Recipe
from quantkit.recipes.modifiers import AWQ_DUO_SCALING, AWQ_N_GRID, kv_cache_fp8_args

# Where quantkit.json's ``resolved_scheme`` says the recipe's scheme applies.
LANGUAGE_MODEL_LINEARS = "<language-model Linear layers>"


@dataclass(frozen=True)
class ResolvedRecipe:
    """A recipe on one model: what quantize runs and what the checkpoint records of it."""

    recipe: Recipe
    targets: TargetPlan  # the full model's Linear layers, quantized and kept
    precision: PrecisionPlan | None  # group size and 8-bit layers (W4A16 family)
    group_size: int | None  # of the 4-bit part (precision) or of the scheme's weights; None: no groups
    # The recipe's scheme as quantkit.json describes it: its group size, its weight observer.
    scheme: Any  # compressed_tensors QuantizationScheme
    # What the quantizer gets: config group name -> QuantizationScheme; None: the recipe's
    # preset by name (``scheme=``, which the library turns into one group on ``targets``).
    config_groups: dict[str, Any] | None
    weight_observer: str | None  # the modifier's override, applied by the library to every group
    kv_cache_scheme: Any  # compressed_tensors QuantizationArgs, or None
    gptq: dict | None  # GPTQModifier's settings (method gptq)
    awq: dict | None  # AWQModifier's settings (method awq)
    smoothquant: dict | None  # SmoothQuantModifier's strength
    checkpoint_format: str  # the compressed-tensors format config.json will carry
    checkpoint_bytes: int  # the predicted size of the written checkpoint

    @property
    def preset(self) -> str:
        """The compressed-tensors preset the recipe starts from (W4A16_ASYM with zero points)."""
        return self.recipe.preset

    def to_dict(self) -> dict:
        """quantkit.json's ``resolved_scheme`` (mixed precision is recorded apart: ``precision``)."""
        result: dict[str, Any] = {"preset": self.recipe.scheme, "format": self.recipe.checkpoint_format}
        result.update(self.scheme.model_dump(mode="json", exclude_none=True, exclude={"targets"}))
        if self.gptq is not None:
            result["gptq"] = dict(self.gptq)
        if self.awq is not None:
            result["awq"] = dict(self.awq)
        if self.smoothquant is not None:
            result["smoothquant"] = dict(self.smoothquant)
        if self.kv_cache_scheme is not None:
            result["kv_cache_scheme"] = self.kv_cache_scheme.model_dump(mode="json", exclude_none=True)
        return result


def _recipe_scheme(recipe: Recipe, precision: PrecisionPlan | None):
    """The recipe's scheme with the group size chosen for the model (else the recipe's, else
    the preset's) and the recipe's weight observer."""
    scheme = recipe.spec.scheme([LANGUAGE_MODEL_LINEARS], symmetric=recipe.symmetric)
    group = (precision.group_size if precision else None) or recipe.group_size
    if scheme.weights is not None and scheme.weights.group_size and group:
        scheme.weights = scheme.weights.model_copy(update={"group_size": group})
    if scheme.weights is not None and recipe.weight_observer is not None:
        scheme.weights = scheme.weights.model_copy(update={"observer": recipe.weight_observer})
    return scheme


def check_group_size_fits(model: torch.nn.Module, targets: TargetPlan, recipe: Recipe) -> None:
    """A chosen group size (--group-size or the recipe's) that divides no targeted layer would
    turn a 4-bit run into an all-8-bit model: refuse it, naming sizes that fit."""
    group = recipe.group_size
    if group is None or not recipe.spec.group_size_per_model or not targets.quantize:
        return
    modules = dict(model.named_modules())
    widths = sorted({modules[name].in_features for name in targets.quantize if name in modules})
    if not widths or any(width % group == 0 for width in widths):
        return
    fitting = [g for g in (128, 64, 32, 16, 8) if all(width % g == 0 for width in widths)]
    message = (
        f"group size {group} divides none of the targeted layers' input widths "
        f"({', '.join(map(str, widths))}): every layer would stay at 8 bits, not the recipe's 4"
    )
    hint = (
        f"pass --group-size (or set the recipe's group_size) to one that divides them "
        f"({', '.join(map(str, fitting[:3]))})"
        if fitting
        else "leave the group size out, or use an 8-bit recipe"
    )
    raise InputError(message, hint=hint)


def check_fixed_widths_fit(tree, targets: TargetPlan, recipe: Recipe, weights) -> None:
    """Schemes whose weight groups or blocks have a width quantize does not choose per model
    (W4AFP8's groups of 128, FP8_BLOCK's 128x128 blocks, NVFP4's groups of 16): a targeted layer
    whose input width it does not divide fails deep inside llmcompressor's calibration (a raw
    ``unflatten`` error on SmolLM2's 576 in-features). Refuse it first, from the config alone.
    ``weights``: the scheme's QuantizationArgs; ``tree`` answers ``get_submodule`` for the full
    model's names ``targets`` (a reduced meta tree: quantkit.quantize.plan.ExpandedTree)."""
    if recipe.spec.group_size_per_model or weights is None:  # chosen per model (check_group_size_fits)
        return
    block = weights.block_structure
    width = block[1] if block else weights.group_size
    if not width:
        return
    widths = {name: tree.get_submodule(name).in_features for name in targets.quantize}
    bad = {name: features for name, features in widths.items() if features % width}
    if bad:
        unit = f"{block[0]}x{block[1]} blocks" if block else f"groups of {width}"
        shown = ", ".join(f"{name} ({features})" for name, features in list(bad.items())[:5])
        raise InputError(
            f"recipe {recipe.name!r} quantizes weights in {unit}, and {len(bad)} language-model layer(s) "
            f"have an input width {width} does not divide: {shown}" + (" ..." if len(bad) > 5 else ""),
            hint="use w4a16 (its group size is chosen per model) or fp8-dynamic (one scale per output channel)",
        )


def _precision_plan(
    tree, adapter: Adapter, recipe: Recipe, targets: TargetPlan, *, avg_bits, sensitivity, count_overhead
) -> PrecisionPlan | None:
    """Group size and 8-bit layers for a W4A16-family recipe (None for other schemes), after the
    guard that every planned group size divides its layer."""
    if not recipe.spec.group_size_per_model:
        return None
    root = language_model_root(list(decoder_layers(tree, adapter)))
    precision = plan_precision(
        tree,
        targets.quantize,
        recipe,
        avg_bits=avg_bits,
        sensitivity=sensitivity,
        count_overhead=count_overhead,
        root=root,
    )
    check_group_divisibility(tree, precision.group_sizes(targets.quantize))
    return precision


def _config_groups(recipe: Recipe, targets: TargetPlan, precision: PrecisionPlan | None) -> dict | None:
    """The quantizer's config groups: the precision plan's, or the recipe's scheme with its
    format pinned (W4AFP8); None where the preset goes by name."""
    if precision is not None:
        return precision.config_groups()
    if recipe.spec.pin_format:
        return {"group_0": recipe.spec.scheme(targets.targets, symmetric=recipe.symmetric)}
    return None


def resolve(
    recipe: Recipe,
    model: torch.nn.Module,
    adapter: Adapter,
    targets: TargetPlan,
    *,
    model_dir: Path,
    saved_dtype: torch.dtype,
    avg_bits: float | None = None,
    sensitivity=None,
    count_overhead: bool = False,
    kinds: LayerKinds | None = None,
) -> ResolvedRecipe:
    """``recipe`` on ``model`` (loaded, or on the meta device) whose Linear layers ``targets``
    splits. ``kinds``: ``model`` is a reduced tree (quantkit.quantize.plan.reduced_tree) and
    ``targets`` its names; the result speaks of the full model. ``avg_bits``, ``sensitivity`` (a
    SensitivityTable) and ``count_overhead``: the --avg-bits options (the 8-bit layers are chosen
    once a ranking is given). ``saved_dtype`` and ``model_dir``'s other files size the checkpoint.
    Refuses a group size or block width the targeted layers do not take (InputError)."""
    check_group_size_fits(model, targets, recipe)
    full = expand_targets(targets, kinds) if kinds else targets
    tree = ExpandedTree(model, kinds) if kinds else model
    precision = _precision_plan(
        tree, adapter, recipe, full, avg_bits=avg_bits, sensitivity=sensitivity, count_overhead=count_overhead
    )
    scheme = _recipe_scheme(recipe, precision)
    check_fixed_widths_fit(tree, full, recipe, scheme.weights)
    weights_group = scheme.weights.group_size if scheme.weights is not None else None
    return ResolvedRecipe(
        recipe=recipe,
        targets=full,
        precision=precision,
        group_size=precision.group_size if precision else weights_group,
        scheme=scheme,
        config_groups=_config_groups(recipe, full, precision),
        weight_observer=recipe.weight_observer,
        kv_cache_scheme=kv_cache_fp8_args() if recipe.kv_cache_fp8 else None,
        gptq={"actorder": recipe.actorder, "dampening_frac": recipe.dampening_frac}
        if recipe.method == "gptq"
        else None,
        awq={"duo_scaling": AWQ_DUO_SCALING, "n_grid": AWQ_N_GRID} if recipe.method == "awq" else None,
        smoothquant={"strength": recipe.smoothquant_strength}
        if recipe.smoothquant_strength is not None
        else None,
        checkpoint_format=precision.checkpoint_format if precision else recipe.checkpoint_format,
        checkpoint_bytes=checkpoint_size_estimate(
            model, targets, recipe, precision, saved_dtype, model_dir, avg_bits, kinds
        ),
    )


def build_modifiers(
    resolved: ResolvedRecipe, *, smoothquant_mappings: list | None = None, awq_mappings: list | None = None
) -> list:
    """The modifier list for ``oneshot``: SmoothQuant or AWQ (if any) first, then the quantizer,
    on the resolved targets and ignore list (never the library's "every Linear" default) and the
    resolved config groups (copies: the library sets observers on the schemes it is given)."""
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    targets = resolved.targets
    if not targets.targets:
        raise ValueError("no quantization targets")
    modifiers: list = []
    if resolved.smoothquant is not None:
        from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

        if not smoothquant_mappings:
            raise ValueError("this recipe uses SmoothQuant but the adapter has no smoothquant_mappings")
        modifiers.append(
            SmoothQuantModifier(
                smoothing_strength=resolved.smoothquant["strength"], mappings=smoothquant_mappings
            )
        )
    if resolved.awq is not None:
        from llmcompressor.modifiers.transform.awq import AWQModifier

        if not awq_mappings:
            raise ValueError("this recipe uses AWQ but the adapter has no awq_mappings")
        modifiers.append(AWQModifier(mappings=list(awq_mappings), **resolved.awq))
    common: dict[str, Any]
    if resolved.config_groups:
        common = dict(config_groups=copy.deepcopy(resolved.config_groups), ignore=list(targets.ignore))
    else:
        common = dict(targets=list(targets.targets), ignore=list(targets.ignore), scheme=resolved.preset)
    if resolved.kv_cache_scheme is not None:
        common["kv_cache_scheme"] = resolved.kv_cache_scheme.model_copy()
    if resolved.weight_observer is not None:
        common["weight_observer"] = resolved.weight_observer
    if resolved.gptq is not None:
        modifiers.append(GPTQModifier(**resolved.gptq, **common))
    else:
        modifiers.append(QuantizationModifier(**common))
    return modifiers
