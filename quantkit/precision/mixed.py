"""Group size selection and mixed precision for group-wise weight schemes (W4A16).

Two decisions are made here, before any calibration, from the model's shapes (the meta model
suffices) and, for mixed precision, a sensitivity table (quantkit.sensitivity):

Group size. One group size for the whole 4-bit part: the largest candidate (128, 64, 32, or the
recipe's own group_size alone) that divides the in-features of every targeted layer. A layer that
no candidate divides is kept at 8 bits (W8A16, per-channel scales: no divisibility constraint)
and reported, instead of failing deep inside oneshot. One group size rather than one per layer:
a single 4-bit config group is what every kernel and loader handles, and the candidates are
nested (32 | 64 | 128), so "the largest that divides all" loses little against a per-layer pick
while keeping the checkpoint uniform.

Mixed precision (``avg_bits``). Layers are promoted to 8 bits in *fusion units* (q/k/v together,
gate/up together, all experts of a block together): vLLM loads each unit as one fused layer and
refuses shards with different schemes. Units are ranked by measured sensitivity per promoted
bit (KL of the model's next-token distribution when only that unit is quantized to 4 bits,
divided by the bits promotion costs) and taken greedily while the average stays within the
budget. The budget counts weight bits by parameter count over the language model's targeted
Linear layers: 4 per 4-bit weight, 8 per 8-bit weight; scales and zero points are not counted
unless ``count_overhead`` (they are always reported: ``effective_bits``).

Zero points (recipe ``symmetric: false``) go on every 4-bit layer except MoE experts, which stay
symmetric: transformers 5 cannot reload per-expert int4 weights with zero points (its
DecompressExperts conversion asserts "Asymmetric quant requires zero-point values"), vLLM's CPU
backend has no asymmetric MoE kernel and vLLM before vllm-project/vllm#44025 refuses them.

Checkpoint layout: compressed-tensors config groups, all ``pack-quantized`` (W8A8 promoted
layers are ``int-quantized``, the checkpoint ``mixed-precision``):
  group_0  W8A16 (int8, per-channel; or W8A8, recipe promoted_scheme), targets: one ``re:``
           pattern per promoted unit
  group_1  W4A16 symmetric for the 4-bit MoE expert units of a zero-point recipe, one ``re:``
           pattern per unit (only then)
  group_2  W4A16 (chosen group size, symmetric or not), targets ["Linear"] (minus the ignore list)
(absent groups are skipped and the rest renumbered: a dense model without promoted layers has the
W4A16 group alone, as the plain preset writes it).
Both compressed-tensors (transformers reload) and vLLM prefer a name match over the class match
"Linear", so the promoted layers get group_1 and every other Linear group_0. vLLM keeps regex
targets as written (its hf_to_vllm_mapper renames only plain dotted names), so the patterns are
written against the name *suffix* below the language model's root (``layers.3.mlp.down_proj``)
with any prefix allowed: transformers' ``model.layers.3...``, Qwen-VL's
``model.language_model.layers.3...``, vLLM's ``language_model.model.layers.3...`` and the Omni
serving layout ``thinker.model.layers.3...`` all end that way. A fused vLLM layer
(``...self_attn.qkv_proj``) matches a target only when all its shards do, which the unit rule
guarantees. Towers that reuse the same suffixes (an audio encoder's ``layers.N.self_attn``) are
excluded by the ignore list, which both loaders apply before any target.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from quantkit.errors import CheckFailed, InputError
from quantkit.precision.table import SHOWN, ranked_units
from quantkit.recipes.schemes import PROMOTED_SCHEMES, SCHEMES, preset_scheme, scheme_spec

GROUP_SIZE_CANDIDATES = (128, 64, 32)
LOW_BITS = 4
HIGH_BITS = 8


def high_scheme(name: str, targets: list[str]):
    """The 8-bit QuantizationScheme of promoted layers (the scheme table's record: per-channel
    weights, no group, so no divisibility constraint)."""
    if name not in PROMOTED_SCHEMES:
        raise ValueError(f"unknown 8-bit scheme {name!r}")
    return SCHEMES[name].scheme(list(targets))


SCALE_BITS = 16  # scales are stored in the checkpoint's dtype (bf16 / fp16)


# Leaves vLLM fuses into one layer (packed_modules_mapping of its Llama / Qwen models).
FUSED_LEAVES = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}


# ---------------------------------------------------------------------- fusion units


def fusion_unit(name: str) -> str:
    """The layer vLLM loads ``name`` into: ``...self_attn.qkv_proj`` for q/k/v, ``...mlp.gate_up_proj``
    for gate/up, ``...mlp.experts`` for every expert Linear of a block, else the layer itself."""
    parts = name.split(".")
    if "experts" in parts[:-1]:
        last = len(parts) - 1 - parts[::-1].index("experts")
        return ".".join(parts[: last + 1])
    if parts[-1] in FUSED_LEAVES:
        return ".".join([*parts[:-1], FUSED_LEAVES[parts[-1]]])
    return name


def is_expert(name: str) -> bool:
    """A Linear inside an MoE block's experts (``...mlp.experts.3.up_proj``)."""
    return "experts" in name.split(".")[:-1]


def four_bit_symmetric(name: str, recipe_symmetric: bool) -> bool:
    """Whether layer ``name`` takes the 4-bit scheme without zero points: the recipe says so, or
    it is an MoE expert (see the module doc)."""
    return recipe_symmetric or is_expert(name)


def fusion_units(names: list[str]) -> dict[str, list[str]]:
    units: dict[str, list[str]] = defaultdict(list)
    for name in names:
        units[fusion_unit(name)].append(name)
    return dict(units)


# ---------------------------------------------------------------------- group size


def group_size_candidates(group_size: int | None = None) -> tuple[int, ...]:
    """The group sizes the 4-bit part chooses among: a given one (the recipe's ``group_size`` or
    ``--group-size``) alone, else GROUP_SIZE_CANDIDATES (the largest dividing every layer wins)."""
    return (group_size,) if group_size else GROUP_SIZE_CANDIDATES


@dataclass
class GroupChoice:
    group_size: int | None  # None: no layer takes any candidate (all 8-bit)
    candidates: tuple[int, ...]
    unfit: dict[str, int] = field(default_factory=dict)  # layer -> in-features no candidate divides

    def describe(self) -> str:
        text = f"group size {self.group_size} (largest of {', '.join(map(str, self.candidates))} dividing every targeted layer)"
        if self.unfit:
            shown = ", ".join(f"{n} ({f})" for n, f in list(self.unfit.items())[:SHOWN])
            more = f" ... and {len(self.unfit) - SHOWN} more" if len(self.unfit) > SHOWN else ""
            text += f"; {len(self.unfit)} layer(s) with in-features no candidate divides stay at 8 bits: {shown}{more}"
        return text


def choose_group_size(
    in_features: dict[str, int],
    candidates: tuple[int, ...] = GROUP_SIZE_CANDIDATES,
    params: dict[str, int] | None = None,
) -> GroupChoice:
    """The group size for the 4-bit part and the layers none of ``candidates`` fits.

    Among the candidates, the one that fits the most parameters wins (ties: the larger group,
    fewer scales); for nested candidates (128, 64, 32) that is the largest dividing every layer
    some candidate divides. Layers the winner does not divide are ``unfit`` (kept at 8 bits)."""
    candidates = tuple(sorted({int(c) for c in candidates}, reverse=True))
    if not candidates or min(candidates) < 1:
        raise InputError(f"group size candidates must be positive integers, got {candidates}")
    weight = params or dict.fromkeys(in_features, 1)
    best, best_fit = None, -1
    for size in candidates:
        fit = sum(weight[name] for name, features in in_features.items() if features % size == 0)
        if fit > best_fit:
            best, best_fit = size, fit
    if best_fit <= 0:
        return GroupChoice(None, candidates, dict(in_features))
    unfit = {name: features for name, features in in_features.items() if features % best}
    return GroupChoice(best, candidates, unfit)


# ---------------------------------------------------------------------- budget


def layer_bits(bits: int, in_features: int, group_size: int | None, symmetric: bool) -> float:
    """Bits per weight including scales (and zero points): 4-bit groups carry one 16-bit scale per
    ``group_size`` weights (+ a 4-bit zero point when asymmetric); 8-bit per-channel weights one
    scale per output row (``in_features`` weights)."""
    if bits == LOW_BITS and group_size:
        return bits + SCALE_BITS / group_size + (0 if symmetric else LOW_BITS / group_size)
    return bits + SCALE_BITS / in_features


@dataclass
class UnitChoice:
    unit: str
    layers: list[str]
    params: int
    bits: int
    score: float | None = None
    rank: int | None = None  # by sensitivity, 1 = most sensitive
    reason: str = ""


@dataclass
class PrecisionPlan:
    """Which Linear layers get 4 and 8 bits, the group size, and what that averages."""

    low_scheme: str  # W4A16 / W4A16_ASYM
    high_scheme: str  # W8A16 / W8A8
    group_size: int | None
    candidates: tuple[int, ...]
    symmetric: bool  # the recipe's: False puts zero points on every 4-bit layer but MoE experts
    high: dict[str, str]  # layer -> why it stays at 8 bits
    units: list[UnitChoice]
    params_total: int
    params_high: int
    avg_bits: float  # nominal: 4 / 8 per weight, by parameter count
    effective_bits: float  # with scales and zero points
    avg_bits_requested: float | None = None
    count_overhead: bool = False
    selection: str = "density"
    high_patterns: list[str] = field(default_factory=list)
    # 4-bit MoE expert layers kept symmetric in a zero-point recipe (see the module doc), and the
    # patterns of their units (their own config group).
    symmetric_experts: list[str] = field(default_factory=list)
    symmetric_patterns: list[str] = field(default_factory=list)
    sensitivity: dict | None = None  # where the ranking came from
    notes: list[str] = field(default_factory=list)

    @property
    def mixed(self) -> bool:
        return bool(self.high)

    @property
    def checkpoint_format(self) -> str:
        """The compressed-tensors format config.json will carry."""
        formats = set()
        if self.group_size is not None and len(self.high) < sum(len(u.layers) for u in self.units):
            formats.add(scheme_spec(self.low_scheme).format)
        if self.high:
            formats.add(SCHEMES[self.high_scheme].format)
        return formats.pop() if len(formats) == 1 else "mixed-precision"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["candidates"] = list(self.candidates)
        data["budget_counts"] = (
            "weights, scales and zero points"
            if self.count_overhead
            else "weight bits only (4 or 8 per weight)"
        )
        data["avg_bits"] = round(self.avg_bits, 4)
        data["effective_bits"] = round(self.effective_bits, 4)
        return data

    def layer_symmetric(self, name: str) -> bool:
        """Whether the 4-bit scheme of ``name`` has no zero points."""
        return four_bit_symmetric(name, self.symmetric)

    def group_sizes(self, names: list[str]) -> dict[str, int | None]:
        """Per layer: the group size it will be quantized with (None: per-channel 8-bit)."""
        return {name: None if name in self.high else self.group_size for name in names}

    def config_groups(self) -> dict:
        """compressed-tensors config groups: the 4-bit scheme on "Linear", the 8-bit one on the
        promoted units' patterns (a name match wins over the class match in both loaders)."""
        from compressed_tensors.quantization import QuantizationScheme

        # The 8-bit group first: compressed-tensors' matcher tries targets in this order and
        # warns about a pattern it never reached (a Linear stops at the first target it matches);
        # which scheme a layer gets does not depend on the order (name matches win in both loaders).
        groups = {}
        if self.high_patterns:
            groups["group_0"] = high_scheme(self.high_scheme, list(self.high_patterns))
        if self.group_size is not None:
            low = preset_scheme(self.low_scheme, ["Linear"]).weights.model_copy(
                update={"group_size": self.group_size}
            )
            if self.symmetric_patterns:
                groups[f"group_{len(groups)}"] = QuantizationScheme(
                    targets=list(self.symmetric_patterns), weights=symmetric_args(low)
                )
            groups[f"group_{len(groups)}"] = QuantizationScheme(targets=["Linear"], weights=low)
        if not groups:
            raise InputError("nothing to quantize: no layer takes the 4-bit scheme and none was promoted")
        return groups

    def summary(self) -> str:
        head = f"{self.low_scheme} group {self.group_size}" if self.group_size else "no 4-bit layer"
        text = (
            f"{head}; {len(self.high)} of the language model's Linear layers at 8 bits "
            f"({self.params_high / max(self.params_total, 1):.1%} of its weights); average {self.avg_bits:.3f} bits "
            f"per weight ({self.effective_bits:.3f} with scales)"
        )
        if self.avg_bits_requested is not None:
            text += f", budget {self.avg_bits_requested}"
        if not self.symmetric and self.group_size:
            text += "; zero points on the 4-bit layers"
            if self.symmetric_experts:
                text += f" except {len(self.symmetric_experts)} MoE expert layers (symmetric)"
        return text


def symmetric_args(args):
    """The same 4-bit weight arguments without zero points."""
    return args if args.symmetric else args.model_copy(update={"symmetric": True})


def check_avg_bits(avg_bits: float | None) -> None:
    if avg_bits is not None and not LOW_BITS < avg_bits <= HIGH_BITS:
        raise InputError(
            f"--avg-bits {avg_bits}: must lie in ({LOW_BITS}, {HIGH_BITS}] for a {LOW_BITS}-bit scheme "
            f"with {HIGH_BITS}-bit layers"
        )


def _unfit_units(
    units: dict[str, list[str]], choice: GroupChoice, in_features: dict[str, int]
) -> dict[str, str]:
    """The units with a layer no group size divides (all when none fits any), and why: they stay
    at 8 bits whatever the budget."""
    high_units: dict[str, str] = {}
    for unit, layers in units.items():
        if choice.group_size is None or any(n in choice.unfit for n in layers):
            features = sorted({in_features[n] for n in layers})
            high_units[unit] = (
                f"in-features {', '.join(map(str, features))}: no group size in "
                f"{', '.join(map(str, choice.candidates))} divides it"
            )
    return high_units


def _effective_bits(names, high, in_features, params, group_size, symmetric) -> float:
    """Average bits per weight with scales and zero points, by parameter count."""
    return sum(
        layer_bits(
            HIGH_BITS if n in high else LOW_BITS, in_features[n], group_size, four_bit_symmetric(n, symmetric)
        )
        * params[n]
        for n in names
    ) / sum(params.values())


def _promote_sensitive(
    order: list[tuple[list[str], float]],
    ranks: dict[str, int],
    high_units: dict[str, str],
    cost: Callable[[str, int], float],
    *,
    spent: float,
    budget: float,
    selection: str,
) -> None:
    """Promote the ranked groups of units to 8 bits (into ``high_units``, with the reason) while
    the bits ``spent`` stay within ``budget``: by KL per promoted bit (density) or by KL (score)."""

    def extra(group: list[str]) -> float:
        return sum(cost(u, HIGH_BITS) - cost(u, LOW_BITS) for u in group)

    def key(item: tuple[list[str], float]) -> float:
        group, score = item
        return -(score / max(extra(group), 1e-9)) if selection == "density" else -score

    for group, score in sorted(order, key=key):
        if score <= 0 or any(u in high_units for u in group):
            continue
        if spent + extra(group) <= budget + 1e-6:
            spent += extra(group)
            for unit in group:
                high_units[unit] = f"sensitive: rank {ranks[unit]} of {len(order)} (KL {score:.4g})"


def plan_precision(
    model: torch.nn.Module,
    names: list[str],
    recipe,
    *,
    avg_bits: float | None = None,
    sensitivity=None,
    candidates: tuple[int, ...] | None = None,
    count_overhead: bool = False,
    selection: str = "density",
    root: str = "",
) -> PrecisionPlan:
    """Group size and 8-bit layers for ``recipe`` (a W4A16 recipe) on the targeted Linear ``names``.

    ``avg_bits`` (4 < avg_bits <= 8) promotes the most sensitive fusion units per promoted bit
    (from ``sensitivity``: a SensitivityTable or its JSON path) while the average stays within
    it; without a ranking (a dry run) or without ``avg_bits`` only the layers no group size fits
    are promoted, and the budget is checked against them.
    ``root`` is the language model's root (``model``, ``model.language_model``): patterns are
    written for the names below it. Raises InputError when the layers no group size divides
    already exceed the budget, before any work.
    """
    if selection not in {"density", "score"}:
        raise InputError(f"unknown selection {selection!r}: density or score")
    check_avg_bits(avg_bits)
    modules = {name: model.get_submodule(name) for name in names}
    in_features = {name: int(m.in_features) for name, m in modules.items()}
    params = {name: int(m.in_features) * int(m.out_features) for name, m in modules.items()}
    if candidates is None:
        candidates = group_size_candidates(recipe.group_size)
    choice = choose_group_size(in_features, tuple(candidates), params)
    units = fusion_units(names)
    unit_params = {unit: sum(params[n] for n in layers) for unit, layers in units.items()}
    total = sum(params.values())

    def cost(unit: str, bits: int) -> float:
        """Bits this unit costs at ``bits`` (budget accounting)."""
        if not count_overhead:
            return bits * unit_params[unit]
        return sum(
            layer_bits(bits, in_features[n], choice.group_size, four_bit_symmetric(n, recipe.symmetric))
            * params[n]
            for n in units[unit]
        )

    high_units = _unfit_units(units, choice, in_features)
    spent = sum(cost(u, HIGH_BITS if u in high_units else LOW_BITS) for u in units)
    budget = avg_bits * total if avg_bits is not None else None
    notes: list[str] = []
    if budget is not None and spent > budget + 1e-6:
        raise InputError(
            f"--avg-bits {avg_bits}: the {len(high_units)} layer unit(s) no group size divides already need "
            f"{spent / total:.3f} bits per weight",
            hint="raise --avg-bits, or allow a smaller group size (recipe group_size)",
        )

    order, scores, ranks, source = (
        ranked_units(sensitivity, names, units) if sensitivity is not None else ([], {}, {}, None)
    )
    if budget is not None and sensitivity is None:
        notes.append("no sensitivity ranking yet: the sensitive layers are chosen when it is measured")
    if budget is not None and sensitivity is not None:
        _promote_sensitive(order, ranks, high_units, cost, spent=spent, budget=budget, selection=selection)
        if not any(r.startswith("sensitive") for r in high_units.values()):
            notes.append(f"no unit fits the budget of {avg_bits} bits: everything stays at 4 bits")

    high = {
        layer: high_units[unit] for unit, layers in units.items() if unit in high_units for layer in layers
    }
    params_high = sum(params[n] for n in high)
    nominal = (HIGH_BITS * params_high + LOW_BITS * (total - params_high)) / total
    effective = _effective_bits(names, high, in_features, params, choice.group_size, recipe.symmetric)
    # MoE experts stay symmetric in a zero-point recipe (see the module doc): their own group.
    zero_points = not recipe.symmetric and choice.group_size is not None
    expert_units = [
        u for u, ls in units.items() if zero_points and u not in high_units and any(map(is_expert, ls))
    ]
    plan = PrecisionPlan(
        low_scheme=recipe.preset,
        high_scheme=recipe.promoted_scheme,
        group_size=choice.group_size,
        candidates=choice.candidates,
        symmetric=recipe.symmetric,
        high=high,
        units=[
            UnitChoice(
                unit,
                list(layers),
                unit_params[unit],
                HIGH_BITS if unit in high_units else LOW_BITS,
                scores.get(unit),
                ranks.get(unit),
                high_units.get(unit, ""),
            )
            for unit, layers in units.items()
        ],
        params_total=total,
        params_high=params_high,
        avg_bits=nominal,
        effective_bits=effective,
        avg_bits_requested=avg_bits,
        count_overhead=count_overhead,
        selection=selection,
        high_patterns=unit_patterns([u for u in units if u in high_units], units, root),
        symmetric_experts=[n for u in expert_units for n in units[u]],
        symmetric_patterns=unit_patterns(expert_units, units, root),
        sensitivity=source,
        notes=notes,
    )
    check_precision_plan(plan, names)
    return plan


# ---------------------------------------------------------------------- patterns and their proof


def _relative(name: str, root: str) -> str:
    return name[len(root) + 1 :] if root and name.startswith(root + ".") else name


def unit_patterns(chosen: list[str], units: dict[str, list[str]], root: str) -> list[str]:
    """One ``re:`` pattern per promoted unit, matching its layers under any prefix (see module doc)."""
    patterns = []
    for unit in chosen:
        layers = units[unit]
        relative = _relative(unit, root)
        if (
            unit.rsplit(".", 1)[-1] == "experts"
            or len(layers) > 1
            and not all(layer.rsplit(".", 1)[0] == layers[0].rsplit(".", 1)[0] for layer in layers)
        ):
            patterns.append(r"re:(.*\.)?" + re.escape(relative) + r"(\..*)?$")
            continue
        parent = re.escape(_relative(layers[0].rsplit(".", 1)[0], root))
        leaves = [layer.rsplit(".", 1)[1] for layer in layers]
        leaf = re.escape(leaves[0]) if len(leaves) == 1 else "(" + "|".join(map(re.escape, leaves)) + ")"
        patterns.append(r"re:(.*\.)?" + parent + r"\." + leaf + "$")
    return patterns


def scheme_matcher(targets_in_order: list[tuple[str, str]]) -> Callable[[str], str | None]:
    """Which config group a Linear called ``name`` gets: a name (or regex) match first, then the
    class name "Linear", as compressed-tensors' match_targets and vLLM's find_matched_target do
    (compressed-tensors' ``match_name``: a ``re:`` target by ``re.match``, any other by equality).
    The patterns are compiled once: the guard asks for each of a 30B MoE's 18,624 targeted
    Linears against its 48 expert patterns."""
    named = [
        (
            re.compile(target.removeprefix("re:")).match
            if target.startswith("re:")
            else re.compile(re.escape(target)).fullmatch,
            index,
        )
        for target, index in targets_in_order
        if target != "Linear"
    ]
    by_class = next((index for target, index in targets_in_order if target == "Linear"), None)

    def scheme(name: str) -> str | None:
        for matches, index in named:
            if matches(name) is not None:
                return index
        return by_class

    return scheme


def planned_scheme(plan: PrecisionPlan, name: str) -> str:
    if name in plan.high:
        return f"{HIGH_BITS}-bit"
    return f"{LOW_BITS}-bit " + ("symmetric" if plan.layer_symmetric(name) else "with zero points")


def check_precision_plan(plan: PrecisionPlan, names: list[str]) -> None:
    """Prove the config groups give exactly the planned layers 8 bits, the rest 4 (with or
    without zero points as planned) under the loaders' matching rules (every other Linear is on
    the ignore list: resolve_targets proves that), and that every fused unit gets one scheme."""
    low = f"{LOW_BITS}-bit " + ("symmetric" if plan.symmetric else "with zero points")
    targets: list[tuple[str, str]] = [(pattern, f"{HIGH_BITS}-bit") for pattern in plan.high_patterns]
    targets += [(pattern, f"{LOW_BITS}-bit symmetric") for pattern in plan.symmetric_patterns]
    if plan.group_size is not None:
        targets.append(("Linear", low))
    problems = []
    scheme = scheme_matcher(targets)
    given = {name: scheme(name) for name in {*names, *(n for u in plan.units for n in u.layers)}}
    for name in names:
        got = given[name]
        expected = planned_scheme(plan, name)
        if got != expected:
            problems.append(f"{name}: planned {expected}, the config groups give {got}")
    for unit in plan.units:
        got = {given[layer] for layer in unit.layers}
        if len(got) > 1:
            problems.append(f"fused unit {unit.unit} would get different schemes {sorted(map(str, got))}")
    if problems:
        raise CheckFailed(
            "mixed-precision config groups disagree with the plan: " + "; ".join(problems[:SHOWN]),
            hint="a bug in quantkit.precision.mixed; nothing was written",
        )
