"""Stage 5: verify a checkpoint. An audit of config and tensors (always), fidelity against the
original model per modality and task (with a reference and a calibration set), and a vLLM load
and generation check (on request). Results go to ``verify.json`` in the checkpoint folder."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from quantkit.errors import InputError
from quantkit.verify.audit import AuditResult, audit_checkpoint
from quantkit.verify.drift import DriftReport, DriftThresholds, measure_drift
from quantkit.verify.vllm_check import VllmCheck, check_with_vllm

__all__ = [
    "AuditResult",
    "DriftReport",
    "DriftThresholds",
    "VerifyReport",
    "VllmCheck",
    "audit_checkpoint",
    "check_with_vllm",
    "measure_drift",
    "recipe_thresholds",
    "verify_checkpoint",
]

VERIFY_FILE = "verify.json"


@dataclass
class VerifyReport:
    checkpoint: str
    audit: AuditResult
    drift: DriftReport | None = None
    vllm: VllmCheck | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Everything that ran passed; a vLLM check skipped for a missing kernel is not a failure."""
        return (
            self.audit.passed
            and (self.drift is None or self.drift.passed)
            and (self.vllm is None or self.vllm.status != "failed")
        )

    def to_dict(self) -> dict:
        return {
            "checkpoint": self.checkpoint,
            "passed": self.passed,
            "audit": self.audit.to_dict(),
            "drift": self.drift.to_dict() if self.drift else None,
            "vllm": self.vllm.to_dict() if self.vllm else None,
            "notes": self.notes,
        }


def recipe_thresholds(checkpoint: Path) -> DriftThresholds | None:
    """The drift thresholds of the recipe the checkpoint was made with (from its quantkit.json)."""
    meta = Path(checkpoint) / "quantkit.json"
    if not meta.is_file():
        return None
    data = json.loads(meta.read_text(encoding="utf-8"))
    limits = (data.get("recipe") or {}).get("drift_thresholds")
    return DriftThresholds(**limits) if limits else None


def verify_checkpoint(
    checkpoint: Path,
    *,
    reference: Path | None = None,
    calib: Path | None = None,
    vllm: bool = False,
    thresholds: DriftThresholds | None = None,
    num_samples: int = 16,
    write: bool = True,
) -> VerifyReport:
    """Audit ``checkpoint``; with ``reference`` and ``calib`` measure drift; with ``vllm`` run it in vLLM.

    Failed checks are reported in the result (and verify.json), never raised; bad input is.
    """
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise InputError("not a checkpoint folder (no config.json)", path=checkpoint)
    if (reference is None) != (calib is None):
        raise InputError("drift needs both --reference and --calib")
    report = VerifyReport(str(checkpoint), audit_checkpoint(checkpoint))
    if reference is not None:
        limits = thresholds or recipe_thresholds(checkpoint)
        if limits is None:
            report.notes.append(
                "no drift thresholds (recipe has none, none given): drift is reported, not judged"
            )
        report.drift = measure_drift(reference, checkpoint, calib, num_samples=num_samples, thresholds=limits)
    if vllm:
        report.vllm = check_with_vllm(checkpoint)
    if write:
        target = checkpoint / VERIFY_FILE
        partial = checkpoint / f".{VERIFY_FILE}.partial-{os.getpid()}"
        partial.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        partial.replace(target)
    return report
