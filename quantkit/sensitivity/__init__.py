"""Per-layer sensitivity to quantization: which language-model Linear layers move the model's
output most when quantized alone (drives mixed precision: quantize --avg-bits)."""

from quantkit import _aliases
from quantkit.precision.table import (
    SensitivityRow,
    SensitivityTable,
    format_table,
    load_table,
    save_table,
)
from quantkit.sensitivity.fakequant import fake_quantized, qdq_weight
from quantkit.sensitivity.measure import GRANULARITIES
from quantkit.sensitivity.run import SCHEMES, measure_loaded, scheme_args, sensitivity

_aliases.register(__name__, {"table": "quantkit.precision.table"})

__all__ = [
    "GRANULARITIES",
    "SCHEMES",
    "SensitivityRow",
    "SensitivityTable",
    "fake_quantized",
    "format_table",
    "load_table",
    "measure_loaded",
    "qdq_weight",
    "save_table",
    "scheme_args",
    "sensitivity",
]
