"""Stage 5: verify a checkpoint. An audit of config and tensors (always), fidelity against the
original model per modality and task (with a reference and a calibration set), and a vLLM load
and generation check (on request). Results go to ``verify.json`` in the checkpoint folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from quantkit.errors import InputError
from quantkit.fsutil import check_writable, refuse_overlap, write_file_atomic
from quantkit.modelfiles import check_model_folder
from quantkit.verify.audit import FILES_CHECK, AuditResult, audit_checkpoint
from quantkit.verify.drift import DriftReport, DriftThresholds, measure_drift, nonfinite_metrics
from quantkit.verify.serve import ServeCheck, check_port, check_served, serve_python
from quantkit.verify.vllm_check import VllmCheck, check_with_vllm, require_vllm_python

__all__ = [
    "AuditResult",
    "DriftReport",
    "DriftThresholds",
    "ServeCheck",
    "VerifyReport",
    "VllmCheck",
    "audit_checkpoint",
    "check_served",
    "check_with_vllm",
    "measure_drift",
    "recipe_thresholds",
    "verify_checkpoint",
]

VERIFY_FILE = "verify.json"
VLLM_ACCEPTED = ("passed", "skipped")  # a vLLM / serve status that does not fail verification


@dataclass
class VerifyReport:
    checkpoint: str
    audit: AuditResult
    drift: DriftReport | None = None
    vllm: VllmCheck | None = None
    serve: ServeCheck | None = None  # --serve: vLLM's OpenAI server against its offline engine
    notes: list[str] = field(default_factory=list)
    saved_to: Path | None = None  # where the report was written; None when it was not
    not_saved: str | None = None  # why it could not be written (a read-only checkpoint folder)

    @property
    def passed(self) -> bool:
        """Everything that ran passed; a vLLM check skipped for a missing kernel is not a failure,
        one that could not run at all (no vLLM environment: "unavailable") is."""
        return self.passed_apart_from_drift_limits and (self.drift is None or self.drift.passed)

    @property
    def passed_apart_from_drift_limits(self) -> bool:
        """As ``passed``, with the drift limits' breaches not judged (``quantkit build
        --drift-limits report``); non-finite drift metrics still fail."""
        return (
            self.audit.passed
            and (self.drift is None or not nonfinite_metrics(self.drift))
            and (self.vllm is None or self.vllm.status in VLLM_ACCEPTED)
            and (self.serve is None or self.serve.status in VLLM_ACCEPTED)
        )

    def to_dict(self) -> dict:
        return {
            "checkpoint": self.checkpoint,
            "passed": self.passed,
            "audit": self.audit.to_dict(),
            "drift": self.drift.to_dict() if self.drift else None,
            "vllm": self.vllm.to_dict() if self.vllm else None,
            "serve": self.serve.to_dict() if self.serve else None,
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
    report_path: Path | None = None,
    exclude_ids: set[str] | None = None,
    drift_stratify_by: str = "stratum",
    drift_held_out=None,
    serve: bool = False,
    serve_port: int | None = None,
) -> VerifyReport:
    """Audit ``checkpoint``; with ``reference`` and ``calib`` measure drift; with ``vllm`` run it in vLLM.

    Failed checks are reported in the result (and verify.json), never raised; bad input is.
    The report goes to ``report_path`` (default: verify.json in the checkpoint); when it cannot
    be written (a read-only folder) the result is kept and ``not_saved`` says why.
    ``exclude_ids``: sample ids drift must not use (default: those the checkpoint calibrated on);
    ``drift_stratify_by``: the row field whose proportions the drift samples keep (``task``: every
    task measured while ``num_samples`` allows, as the build's accuracy gate needs);
    ``drift_held_out``: a ``drift.HeldOutChoice``, the rows drift measures instead (the build's).
    ``serve``: vLLM's OpenAI-compatible server answers one request per modality through the
    ``openai`` client, checked against vLLM's offline engine (quantkit.verify.serve), on
    ``serve_port`` (default: a free one); the result also goes into the card (README.md).
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        problem = (
            "is a file, not a checkpoint folder" if checkpoint.exists() else "the checkpoint does not exist"
        )
        raise InputError(problem, path=checkpoint, hint="pass the folder `quantkit quantize` wrote")
    if not (checkpoint / "config.json").is_file():
        raise InputError("not a checkpoint folder (no config.json)", path=checkpoint)
    if (reference is None) != (calib is None):
        raise InputError("drift needs both --reference and --calib")
    if serve_port is not None:
        if not serve:
            raise InputError("--port is the --serve check's port", hint="add --serve, or drop --port")
        check_port(serve_port)
    if vllm:  # no vLLM environment: bad input, before the audit and drift
        require_vllm_python("--vllm")
    if serve:
        serve_python()
    target = Path(report_path) if report_path is not None else checkpoint / VERIFY_FILE
    refuse_overlap(
        target,
        {"checkpoint": checkpoint, "reference model": reference, "calibration set": calib},
        option="--report",
        inside_ok=["checkpoint"] if target.name == VERIFY_FILE else [],
    )
    if report_path is not None and write:
        check_writable(target, option="--report")  # asked for a place: it must take the report
    if reference is not None:
        check_model_folder(reference, what="reference model folder")
    report = VerifyReport(str(checkpoint), audit_checkpoint(checkpoint))
    damaged = any(c.name == FILES_CHECK and not c.passed for c in report.audit.checks)
    if damaged and (reference is not None or vllm or serve):
        report.notes.append("drift and vLLM checks not run: the checkpoint's weight files are damaged")
        reference = vllm = serve = None
    if reference is not None:
        limits = thresholds or recipe_thresholds(checkpoint)
        if limits is None:
            report.notes.append(
                "no drift thresholds (recipe has none, none given): drift is reported, not judged"
            )
        report.drift = measure_drift(
            reference,
            checkpoint,
            calib,
            num_samples=num_samples,
            thresholds=limits,
            exclude_ids=exclude_ids,
            stratify_by=drift_stratify_by,
            held_out=drift_held_out,
        )
    if vllm:
        report.vllm = check_with_vllm(checkpoint)
    if serve:
        report.serve = check_served(checkpoint, port=serve_port)
    if write:
        try:
            if report_path is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomic(target, json.dumps(report.to_dict(), indent=2) + "\n")
            report.saved_to = target
        except OSError as err:
            report.not_saved = f"{target}: {err.strerror or err}"
        served = report.serve is not None and report.serve.status != "unavailable"
        if served and report.saved_to is not None and report_path is None:
            from quantkit.verify.serve import write_card_section

            try:
                write_card_section(checkpoint, report.serve)
            except OSError as err:
                report.notes.append(f"the card's serve section could not be written: {err.strerror or err}")
    return report
