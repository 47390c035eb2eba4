"""After oneshot: the layers carry the planned bits, and the saved config groups are ordered so
that loaders try the name targets first."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from quantkit.errors import CheckFailed
from quantkit.precision.mixed import HIGH_BITS, LOW_BITS, PrecisionPlan
from quantkit.precision.table import SHOWN


def assigned_bits(model: torch.nn.Module) -> dict[str, int]:
    """After oneshot: the weight bits compressed-tensors attached to each quantized module."""
    found = {}
    for name, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is not None and getattr(scheme, "weights", None) is not None:
            found[name] = int(scheme.weights.num_bits)
    return found


def check_assigned(model: torch.nn.Module, plan: PrecisionPlan, names: list[str]) -> None:
    """After oneshot: every targeted layer carries the planned bits and group size."""
    problems = []
    for name in names:
        scheme = getattr(model.get_submodule(name), "quantization_scheme", None)
        weights = getattr(scheme, "weights", None)
        if weights is None:
            problems.append(f"{name}: not quantized")
            continue
        bits, group = (HIGH_BITS, None) if name in plan.high else (LOW_BITS, plan.group_size)
        symmetric = True if name in plan.high else plan.layer_symmetric(name)
        if (
            int(weights.num_bits) != bits
            or (group is not None and weights.group_size != group)
            or bool(weights.symmetric) != symmetric
        ):
            problems.append(
                f"{name}: {weights.num_bits} bits group {weights.group_size} symmetric {weights.symmetric}, "
                f"planned {bits} bits group {group} symmetric {symmetric}"
            )
    if problems:
        raise CheckFailed(
            f"{len(problems)} layer(s) quantized otherwise than planned: " + "; ".join(problems[:SHOWN]),
            hint="nothing was written",
        )


def order_config_groups(directory) -> bool:
    """Rewrite the saved config.json so config groups with name targets come first.

    compressed-tensors saves groups in module order (the 4-bit group first) and, on reload, tries
    targets in that order, warning "Could not match" for every pattern a Linear never reached
    because it stopped at "Linear". The scheme each layer gets does not depend on the order
    (name matches win in compressed-tensors and vLLM alike); only the warning does."""
    path = Path(directory) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    holder = config.get("quantization_config") or {}
    groups = holder.get("config_groups") or {}
    if len(groups) < 2:
        return False
    named = [g for g in groups.values() if any(t != "Linear" for t in g.get("targets", []))]
    ordered = named + [g for g in groups.values() if not any(t != "Linear" for t in g.get("targets", []))]
    holder["config_groups"] = {f"group_{i}": group for i, group in enumerate(ordered)}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return True
