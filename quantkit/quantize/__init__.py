"""Calibrate and quantize a model's language model with a recipe; prove it; write the checkpoint."""

from quantkit import _aliases
from quantkit.features.processor import (
    FeatureRow,
    PreparedFeatures,
    calibration_loader,
    prepare_features,
    processor_fingerprint,
    sample_id,
)
from quantkit.models.targets import (
    TargetPlan,
    check_quantized_modules,
    compact_patterns,
    language_model_root,
    resolve_targets,
)
from quantkit.quantize.calibration import calibrate
from quantkit.quantize.metadata import QuantizeResult
from quantkit.quantize.preflight import QuantizePlan, plan, refuse_known_failure
from quantkit.quantize.probe import CalibrationProbe
from quantkit.quantize.run import CALIBRATION_DTYPE, quantize, saved_dtype, unfuse_experts
from quantkit.quantize.scales import check_scales

__all__ = [
    "CALIBRATION_DTYPE",
    "CalibrationProbe",
    "FeatureRow",
    "PreparedFeatures",
    "QuantizePlan",
    "QuantizeResult",
    "TargetPlan",
    "calibrate",
    "calibration_loader",
    "check_quantized_modules",
    "check_scales",
    "compact_patterns",
    "language_model_root",
    "plan",
    "prepare_features",
    "processor_fingerprint",
    "quantize",
    "refuse_known_failure",
    "resolve_targets",
    "sample_id",
    "saved_dtype",
    "unfuse_experts",
]

_aliases.register(
    __name__,
    {
        "capture": "quantkit.features.capture",
        "features": "quantkit.features.processor",
        "mixed": "quantkit.precision.mixed",
        "progress": "quantkit.progress",
        "targets": "quantkit.models.targets",
    },
)
