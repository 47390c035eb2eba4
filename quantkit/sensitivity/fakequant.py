"""Round-to-nearest quantize-dequantize of a weight tensor with compressed-tensors' own helpers
(min/max observer, ``calculate_qparams``, ``fake_quantize``): what the weight would look like in
the checkpoint under a scheme, without GPTQ's error compensation."""

from __future__ import annotations

from contextlib import contextmanager

import torch


def qdq_weight(weight: torch.Tensor, args) -> torch.Tensor:
    """``weight`` ([out, in]) quantized and dequantized with QuantizationArgs ``args``
    (strategies tensor, channel, group); same dtype as ``weight``."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    w = weight.detach().float()
    strategy = str(getattr(args.strategy, "value", args.strategy))
    if strategy == "group":
        if w.shape[-1] % args.group_size:
            raise ValueError(f"in-features {w.shape[-1]} not divisible by group size {args.group_size}")
        grouped = w.unflatten(-1, (-1, args.group_size))
        low, high = grouped.amin(-1), grouped.amax(-1)
    elif strategy == "channel":
        low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    elif strategy == "tensor":
        low, high = w.amin().reshape(1), w.amax().reshape(1)
    else:
        raise ValueError(f"weight strategy {strategy!r} is not supported for sensitivity measurement")
    scale, zero_point = calculate_qparams(low, high, args)
    return fake_quantize(w, scale, zero_point, args).to(weight.dtype)


@contextmanager
def fake_quantized(model: torch.nn.Module, layer_args: dict):
    """Within the block, the named Linear layers' weights are replaced by their quantize-dequantize
    (``layer_args``: name -> QuantizationArgs); the original tensors come back afterwards, bit for bit."""
    saved = {}
    try:
        with torch.no_grad():
            for name, args in layer_args.items():
                weight = model.get_submodule(name).weight
                saved[name] = weight.detach().clone()
                weight.copy_(qdq_weight(weight, args))
        yield
    finally:
        with torch.no_grad():
            for name, original in saved.items():
                model.get_submodule(name).weight.copy_(original)
