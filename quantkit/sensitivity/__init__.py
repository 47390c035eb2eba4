"""Per-layer sensitivity to quantization: which language-model Linear layers move the model's
output most when quantized alone (drives mixed precision: quantize --avg-bits)."""

from quantkit.sensitivity.fakequant import fake_quantized, qdq_weight
from quantkit.sensitivity.measure import GRANULARITIES
from quantkit.sensitivity.run import SCHEMES, measure_loaded, scheme_args, sensitivity

__all__ = [
    "GRANULARITIES",
    "SCHEMES",
    "fake_quantized",
    "measure_loaded",
    "qdq_weight",
    "scheme_args",
    "sensitivity",
]
