"""Calibrate and quantize a model's language model with a recipe; prove it; write the checkpoint."""

from quantkit.quantize.calibration import calibrate
from quantkit.quantize.metadata import QuantizeResult
from quantkit.quantize.preflight import QuantizePlan, plan, refuse_known_failure
from quantkit.quantize.probe import CalibrationProbe
from quantkit.quantize.resolved import ResolvedRecipe, build_modifiers, resolve
from quantkit.quantize.run import CALIBRATION_DTYPE, quantize, saved_dtype, unfuse_experts
from quantkit.quantize.scales import check_scales

__all__ = [
    "CALIBRATION_DTYPE",
    "CalibrationProbe",
    "QuantizePlan",
    "QuantizeResult",
    "ResolvedRecipe",
    "build_modifiers",
    "calibrate",
    "check_scales",
    "plan",
    "quantize",
    "refuse_known_failure",
    "resolve",
    "saved_dtype",
    "unfuse_experts",
]

