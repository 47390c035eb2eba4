"""Stage 6: hardware targets (``recipes/targets.yaml``, quantkit.build.hardware) and the build that
makes one checkpoint per target (quantkit.build.run): quantize, verify, and keep the smallest
candidate of the target's chain that meets its accuracy budget (quantkit.build.record.ORDER_RULE)."""

from __future__ import annotations

from quantkit.build.hardware import DEFAULT_MAX_LOSS, Fallback, Target, TargetsFile, When, load_targets
from quantkit.build.record import BuildReport, CheckpointBuild, TargetBuild, build_key, model_fingerprint
from quantkit.build.run import build_checkpoints

__all__ = [
    "DEFAULT_MAX_LOSS",
    "BuildReport",
    "CheckpointBuild",
    "Fallback",
    "Target",
    "TargetBuild",
    "TargetsFile",
    "When",
    "build_checkpoints",
    "build_key",
    "load_targets",
    "model_fingerprint",
]
