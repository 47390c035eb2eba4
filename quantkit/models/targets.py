"""Which modules get quantized, computed positively, and the check that only they were.

Targets are the Linear layers of the language model (minus the adapter's keep-list), never the
library's "every Linear" default. After quantization, and before anything is written, the model
itself is inspected: every quantized module must lie in the language model, and every
language-model Linear that is not kept on purpose must be quantized. The language model used by
that check is found from the decoder layers themselves, not from the adapter's path, so an
adapter with a wrong path is caught too.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from quantkit.errors import CheckFailed, InputError
from quantkit.models.adapters import GROUPS, Adapter, is_under, matches, matches_any

SHOWN = 12  # names listed in an error before "... and N more"


@dataclass
class TargetPlan:
    """The Linear layers of one model, split into quantized and kept, with patterns for the library."""

    groups: dict[str, str]  # every Linear -> group (language_model, vision, audio, head, other)
    quantize: list[str]
    kept: dict[str, str]  # Linear -> why it stays in full precision
    targets: list[str]
    ignore: list[str]

    def counts(self) -> dict[str, dict[str, int]]:
        table = {group: {"quantized": 0, "kept": 0} for group in GROUPS}
        chosen = set(self.quantize)
        for name, group in self.groups.items():
            table[group]["quantized" if name in chosen else "kept"] += 1
        return table


@dataclass
class QuantizedSummary:
    quantized: list[str]
    kv_cache: list[str] = field(default_factory=list)


def linear_names(model: torch.nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def _shape_of(name: str) -> tuple[str, ...]:
    """Module path with numeric parts (layer, expert indices) generalised."""
    return tuple(r"\d+" if part.isdigit() else re.escape(part) for part in name.split("."))


def compact_patterns(names: list[str], universe: list[str]) -> list[str]:
    """Anchored ``re:`` patterns matching exactly ``names`` among ``universe`` (all module names).

    Names that differ only in layer/expert indices share one pattern, and sibling leaves merge
    into an alternation (``self_attn\\.(q_proj|k_proj|v_proj)$``). A pattern that would also
    match something outside ``names`` (a layer kept on purpose) falls back to exact names.
    This keeps the targets short for a 48-layer x 128-expert model, where matching tens of
    thousands of exact names against every module is slow.
    """
    wanted = set(names)
    by_parent: dict[tuple[str, ...], list[str]] = defaultdict(list)
    members: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name in names:
        shape = _shape_of(name)
        if shape[-1] not in by_parent[shape[:-1]]:
            by_parent[shape[:-1]].append(shape[-1])
        members[shape[:-1]].append(name)
    patterns: list[str] = []
    for parent, leaves in by_parent.items():
        leaf = leaves[0] if len(leaves) == 1 else "(" + "|".join(leaves) + ")"
        regex = "^" + r"\.".join((*parent, leaf)) + "$"
        compiled = re.compile(regex)
        hits = {name for name in universe if compiled.match(name)}
        if hits <= wanted:
            patterns.append("re:" + regex)
        else:
            patterns.extend(members[parent])
    return patterns


def resolve_targets(model: torch.nn.Module, adapter: Adapter) -> TargetPlan:
    """Split the model's Linear layers into quantized (language model, not kept) and kept."""
    universe = [name for name, _ in model.named_modules()]
    linears = linear_names(model)
    groups = {name: adapter.group_of(name) for name in linears}
    quantize = [name for name in linears if adapter.should_quantize(name)]
    if not quantize:
        raise InputError(
            f"adapter {adapter.name!r}: no Linear layer lies in language_model {adapter.language_model!r}",
            hint="check the adapter's language_model path against the model's module names",
        )
    kept = {}
    chosen = set(quantize)
    for name in linears:
        if name in chosen:
            continue
        kept[name] = adapter.keep_reason(name) or f"outside the language model ({groups[name]})"
    # Ignore everything else explicitly too: the keep-list, whole towers (so kv-cache attention
    # matching never reaches a tower), and every other Linear.
    tower_patterns = [f"re:^{re.escape(t)}(\\.|$)" for t in (adapter.vision_tower, adapter.audio_tower) if t]
    unmatched = [name for name in kept if not matches_any(name, [*adapter.keep_patterns, *tower_patterns])]
    ignore = list(
        dict.fromkeys([*adapter.keep_patterns, *tower_patterns, *compact_patterns(unmatched, universe)])
    )
    # The library gets the class target "Linear" minus ``ignore``: vLLM matches config-group
    # targets against its own module names (``language_model.model.layers...``), so name patterns
    # written for transformers' names would leave every layer unquantized there. The positive
    # set is still what decides: the ignore list is computed from it and checked against it.
    plan = TargetPlan(groups, quantize, kept, ["Linear"], ignore)
    _check_patterns_agree(plan, linears)
    return plan


def _check_patterns_agree(plan: TargetPlan, linears: list[str]) -> None:
    """Linear minus the ignore patterns must be exactly the computed names (a guard on compact_patterns)."""
    selected = {name for name in linears if not matches_any(name, plan.ignore)}
    if selected != set(plan.quantize):
        extra = sorted(selected - set(plan.quantize))
        missing = sorted(set(plan.quantize) - selected)
        raise CheckFailed(
            f"target patterns disagree with the target list: extra {extra[:SHOWN]}, missing {missing[:SHOWN]}"
        )


def decoder_layers(model: torch.nn.Module, adapter: Adapter) -> dict[str, torch.nn.Module]:
    layers = {name: m for name, m in model.named_modules() if type(m).__name__ == adapter.decoder_layer}
    if not layers:
        raise InputError(
            f"adapter {adapter.name!r}: the model has no {adapter.decoder_layer!r} module",
            hint="set decoder_layer to the class name of the language model's decoder layer",
        )
    return layers


def language_model_root(layer_names: list[str]) -> str:
    """The module holding the decoder-layer list: ``model.language_model`` for
    ``model.language_model.layers.N``, ``model`` for ``model.layers.N``."""
    containers = {name.rsplit(".", 1)[0] if "." in name else "" for name in layer_names}
    parts = [c.split(".") for c in containers]
    common = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    container = ".".join(common)
    return container.rsplit(".", 1)[0] if "." in container else ""


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" ... and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _weight_quantized(module: torch.nn.Module) -> bool:
    scheme = getattr(module, "quantization_scheme", None)
    return scheme is not None and getattr(scheme, "weights", None) is not None


def check_quantized_modules(model: torch.nn.Module, adapter: Adapter) -> QuantizedSummary:
    """Fail unless exactly the language model's Linear layers (minus the keep-list) are quantized.

    The language model is located from the decoder layers (independently of the adapter's
    ``language_model``); towers and the keep-list are never part of it.
    """
    root = language_model_root(list(decoder_layers(model, adapter)))

    def expected(name: str) -> bool:
        in_tower = is_under(name, adapter.vision_tower) or is_under(name, adapter.audio_tower)
        return is_under(name, root) and not in_tower and adapter.keep_reason(name) is None

    quantized, kv_cache = [], []
    for name, module in model.named_modules():
        if _weight_quantized(module):
            quantized.append(name)
        elif getattr(module, "quantization_scheme", None) is not None:
            kv_cache.append(name)  # attention modules carrying only kv-cache quantization
    outside = [
        name
        for name in quantized
        if not expected(name) or not isinstance(model.get_submodule(name), torch.nn.Linear)
    ]
    quantized_set = set(quantized)
    missing = [name for name in linear_names(model) if expected(name) and name not in quantized_set]
    stray_kv = [name for name in kv_cache if not is_under(name, root)]
    problems = []
    if outside:
        problems.append(
            f"{len(outside)} quantized module(s) outside the language model ({root or 'root'}): {_listing(outside)}"
        )
    if missing:
        problems.append(
            f"{len(missing)} language-model Linear layer(s) left unquantized: {_listing(missing)}"
        )
    if stray_kv:
        problems.append(f"kv-cache quantization outside the language model: {_listing(stray_kv)}")
    if problems:
        raise CheckFailed(
            "; ".join(problems),
            hint=f"adapter {adapter.name!r}: check language_model, keep and the towers; nothing was written",
        )
    return QuantizedSummary(quantized=quantized, kv_cache=kv_cache)


def check_smoothquant_mappings(model: torch.nn.Module, adapter: Adapter) -> None:
    """Every module a SmoothQuant mapping names must lie in the language model (anchoring)."""
    check_mappings(model, adapter, adapter.smoothquant_mappings, what="SmoothQuant")


def check_awq_mappings(model: torch.nn.Module, adapter: Adapter) -> None:
    """The adapter has AWQ mappings, and each names modules of the language model only."""
    if not adapter.awq_mappings:
        raise InputError(
            f"adapter {adapter.name!r} has no awq_mappings, which a method: awq recipe needs",
            hint="add awq_mappings to the adapter (see recipes/adapters/README.md) or use the w4a16 recipe",
        )
    check_mappings(model, adapter, adapter.awq_mappings, what="AWQ")


def check_mappings(model: torch.nn.Module, adapter: Adapter, mappings, *, what: str) -> None:
    root = language_model_root(list(decoder_layers(model, adapter)))
    for mapping in mappings:
        for pattern in (*mapping.balance, mapping.smooth):
            hits = [name for name, _ in model.named_modules() if matches(name, pattern)]
            if not hits:
                raise InputError(
                    f"adapter {adapter.name!r}: {what} pattern {pattern!r} matches no module",
                    hint="anchor the pattern to the language model's module names",
                )
            stray = [name for name in hits if not is_under(name, root)]
            if stray:
                raise InputError(
                    f"adapter {adapter.name!r}: {what} pattern {pattern!r} reaches outside the "
                    f"language model: {_listing(stray)}",
                    hint="anchor it, e.g. 're:^model\\.layers\\.\\d+\\.self_attn\\.(q|k|v)_proj$'",
                )


def check_group_divisibility(model: torch.nn.Module, group_sizes: dict[str, int | None]) -> None:
    """The final guard before oneshot: every layer planned with a group size (name -> group size,
    None for per-channel layers) has in-features divisible by it; otherwise llmcompressor would
    fail deep inside oneshot. quantize.mixed plans group sizes so that this holds (a layer no
    candidate divides stays at 8 bits, per channel): a failure here is a planning bug."""
    bad = [
        f"{name} ({model.get_submodule(name).in_features} in-features, group {size})"
        for name, size in group_sizes.items()
        if size and model.get_submodule(name).in_features % size
    ]
    if bad:
        raise CheckFailed(
            f"{len(bad)} target layer(s) planned with a group size that does not divide their in-features: {_listing(bad)}",
            hint="a bug in quantkit.precision.mixed; nothing was calibrated or written",
        )
