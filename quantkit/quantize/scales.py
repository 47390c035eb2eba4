"""The last guard before writing: every quantization scale finite and positive, every quantized
weight finite. A NaN scale loads fine and produces NaN logits; it must never reach a checkpoint."""

from __future__ import annotations

import torch

from quantkit.errors import CheckFailed

SHOWN = 12


def _scale_tensors(model: torch.nn.Module):
    """(name, tensor) for every ``*_scale`` parameter or buffer: weight_scale, input_scale,
    output_scale, k_scale, v_scale, weight_global_scale, ..."""
    seen = set()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if name.rsplit(".", 1)[-1].endswith("_scale") and name not in seen:
            seen.add(name)
            yield name, tensor


def _problem(tensor: torch.Tensor) -> str | None:
    values = tensor.detach().float()
    nonfinite = int((~torch.isfinite(values)).sum())
    if nonfinite:
        return f"{nonfinite} non-finite value(s)"
    nonpositive = int((values <= 0).sum())
    if nonpositive:
        return f"{nonpositive} value(s) <= 0 (min {values.min().item():.3g})"
    return None


def check_scales(model: torch.nn.Module) -> int:
    """Raise CheckFailed listing every bad scale or non-finite quantized weight; return how many
    scale tensors were checked."""
    problems: list[str] = []
    checked = 0
    for name, tensor in _scale_tensors(model):
        checked += 1
        if (issue := _problem(tensor)) is not None:
            problems.append(f"{name}: {issue}")
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        quantized = getattr(module, "quantization_scheme", None) is not None
        floating = isinstance(weight, torch.Tensor) and weight.is_floating_point()
        if quantized and floating and not bool(torch.isfinite(weight).all()):
            problems.append(f"{name}.weight: non-finite values")
    if problems:
        shown = "; ".join(problems[:SHOWN]) + (
            f" ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        )
        raise CheckFailed(
            f"refusing to write a checkpoint with bad quantization parameters: {shown}",
            hint="calibration went wrong (see the calibration counts); nothing was written",
        )
    return checked


def check_source_weights(model: torch.nn.Module, model_dir) -> None:
    """Refuse (InputError, exit 2) a source model with a NaN or infinite weight, naming the tensor,
    before calibration: no calibration data can repair it, and quantizing it would end in
    non-finite scales blamed on the data. Offloaded (meta) tensors are not read here."""
    from quantkit.errors import InputError

    bad: list[str] = []
    for name, tensor in model.named_parameters():  # buffers may hold -inf masks by design
        if tensor.device.type == "meta" or not tensor.is_floating_point():
            continue
        count = int((~torch.isfinite(tensor.detach())).sum())
        if count:
            bad.append(f"{name} ({count} of {tensor.numel()} values)")
    if bad:
        shown = "; ".join(bad[:SHOWN]) + (f" ... and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
        raise InputError(
            f"the model's weights hold non-finite values (NaN or infinity): {shown}",
            path=model_dir,
            hint="the model files are broken: download or export the model again",
        )
