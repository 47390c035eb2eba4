"""The modifier settings a recipe implies that are not in the scheme table: AWQ's stated
defaults and the FP8 KV-cache arguments (quantkit.quantize.resolved builds the modifiers)."""

from __future__ import annotations

# llmcompressor 0.14 AWQModifier defaults: scales from activations and weights (duo scaling),
# 20 grid points per smoothing step.
AWQ_DUO_SCALING = True
AWQ_N_GRID = 20


def kv_cache_fp8_args():
    """FP8 (e4m3) per-tensor static scales for keys and values, from calibration data."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True)
