"""Calibrate and quantize a model's language model with a recipe; prove it; write the checkpoint."""

from quantkit.quantize.features import (
    FeatureRow,
    PreparedFeatures,
    calibration_loader,
    prepare_features,
    processor_fingerprint,
    sample_id,
)
from quantkit.quantize.probe import CalibrationProbe
from quantkit.quantize.run import (
    CALIBRATION_DTYPE,
    QuantizePlan,
    QuantizeResult,
    calibrate,
    plan,
    quantize,
    refuse_known_failure,
    saved_dtype,
    unfuse_experts,
)
from quantkit.quantize.scales import check_scales
from quantkit.quantize.targets import (
    TargetPlan,
    check_quantized_modules,
    compact_patterns,
    language_model_root,
    resolve_targets,
)

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
