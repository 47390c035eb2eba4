"""Fidelity: how far a quantized checkpoint's outputs move from the original's, per modality and task.

Both models run on the same held-out samples of the calibration set (never those used to
calibrate), chosen to keep the set's strata proportions. Per sample: next-token KL divergence
(original || quantized), top-1 agreement and logit cosine over every position of the
conversation, and the length of the greedy continuation both models agree on.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from quantkit.calibset import load_calibration_set, stratified_subsample
from quantkit.errors import InputError
from quantkit.models.inputs import Sample, processor_capabilities, processor_inputs

METRICS = ("kl", "top1", "cosine", "greedy_prefix")
# A group's means are judged only when they rest on at least this many scored positions (tokens,
# summed over its samples): top-1 agreement is a rate over positions, and at 256 its binomial
# standard error near 0.9 is under 0.02, while one short text reply (e.g. 40 positions at 0.78)
# cannot tell a checkpoint from noise. Smaller groups are listed as "not judged"; the whole set
# ("all") is judged by the same rule, so bad samples spread over small groups still fail.
MIN_GROUP_POSITIONS = 256


@dataclass(frozen=True)
class DriftThresholds:
    max_kl: float
    min_top1: float
    min_cosine: float
    min_positions: int = MIN_GROUP_POSITIONS

    def judges(self, group: DriftGroup) -> bool:
        return group.positions >= self.min_positions

    def breaches(self, group: DriftGroup) -> list[str]:
        found: list[str] = []
        if not self.judges(group):
            return found
        if group.kl > self.max_kl:
            found.append(f"KL {group.kl:.4f} > {self.max_kl}")
        if group.top1 < self.min_top1:
            found.append(f"top-1 agreement {group.top1:.3f} < {self.min_top1}")
        if group.cosine < self.min_cosine:
            found.append(f"logit cosine {group.cosine:.4f} < {self.min_cosine}")
        return found


@dataclass
class SampleDrift:
    id: str
    task: str
    modality: str
    positions: int
    kl: float
    top1: float
    cosine: float
    greedy_prefix: float  # fraction of the greedy continuation both models agree on
    entropy: float = 0.0  # the original's mean next-token entropy (nats): KL relative to it is `build`'s loss


@dataclass
class DriftGroup:
    name: str
    samples: int
    kl: float
    top1: float
    cosine: float
    greedy_prefix: float
    positions: int = 0  # scored positions summed over the group's samples


@dataclass
class DriftReport:
    reference: str
    checkpoint: str
    overall: DriftGroup
    by_modality: list[DriftGroup]
    by_task: list[DriftGroup]
    samples: list[SampleDrift] = field(default_factory=list)
    thresholds: DriftThresholds | None = None
    breaches: list[str] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)  # groups under thresholds.min_positions

    @property
    def passed(self) -> bool:
        return not self.breaches

    def to_dict(self) -> dict:
        data = asdict(self)
        data["passed"] = self.passed
        return data


def _group(name: str, items: list[SampleDrift]) -> DriftGroup:
    def mean(metric: str) -> float:
        return round(sum(getattr(s, metric) for s in items) / len(items), 5)

    return DriftGroup(name, len(items), *(mean(m) for m in METRICS), positions=sum(s.positions for s in items))


def _compare_logits(reference: torch.Tensor, quantized: torch.Tensor) -> tuple[float, float, float, float]:
    ref_logp = torch.log_softmax(reference.float(), dim=-1)
    q_logp = torch.log_softmax(quantized.float(), dim=-1)
    kl = (ref_logp.exp() * (ref_logp - q_logp)).sum(-1).mean()
    top1 = (reference.argmax(-1) == quantized.argmax(-1)).float().mean()
    cosine = torch.nn.functional.cosine_similarity(reference.float(), quantized.float(), dim=-1).mean()
    entropy = -(ref_logp.exp() * ref_logp).sum(-1).mean()
    return float(kl), float(top1), float(cosine), float(entropy)


def _prompt_only(sample: Sample) -> Sample:
    """The conversation up to (not including) the last assistant turn, to generate from."""
    messages = list(sample.messages)
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    return Sample(messages or sample.messages, sample.images, sample.videos, sample.audios)


def held_out_rows(
    calib: Path, *, exclude_ids: set[str], count: int, seed: int, kinds: set[str], by: str = "stratum"
) -> list[dict]:
    """Rows of the calibration set not used to calibrate and of modalities the model takes,
    subsampled keeping the proportions of ``by`` (a row field: ``stratum``, or ``task`` for one
    sample of every task while ``count`` allows)."""
    dataset = load_calibration_set(calib)
    rows = [
        row
        for row in dataset
        if row["id"] not in exclude_ids
        and {
            k
            for k, paths in (("image", row["images"]), ("video", row["videos"]), ("audio", row["audios"]))
            if paths
        }
        <= kinds
    ]
    if not rows:
        raise InputError(
            "no held-out sample of a modality this model takes is left in the calibration set",
            path=calib,
            hint="calibrate with fewer --num-samples, or build a larger set",
        )
    picked = stratified_subsample([row[by] for row in rows], count, seed=seed)
    return [rows[i] for i in picked]


def measure_drift(
    reference: Path,
    checkpoint: Path,
    calib: Path,
    *,
    num_samples: int = 16,
    seed: int = 1,
    greedy_tokens: int = 8,
    exclude_ids: set[str] | None = None,
    thresholds: DriftThresholds | None = None,
    stratify_by: str = "stratum",
) -> DriftReport:
    from quantkit.models.adapters import adapter_for

    reference, checkpoint = Path(reference), Path(checkpoint)
    ref_adapter, q_adapter = adapter_for(reference), adapter_for(checkpoint)
    processor = q_adapter.load_processor(checkpoint)
    if exclude_ids is None:
        exclude_ids = _used_ids(checkpoint)
    rows = held_out_rows(
        calib,
        exclude_ids=exclude_ids,
        count=num_samples,
        seed=seed,
        kinds=processor_capabilities(processor),
        by=stratify_by,
    )
    # Each in its saved dtype: transformers cannot run some reloaded quantized models in float32.
    from quantkit.quantize.run import saved_dtype

    original = ref_adapter.load_model(reference, dtype=saved_dtype(reference))
    quantized = q_adapter.load_model(checkpoint, dtype=saved_dtype(checkpoint))
    results = []
    for row in rows:
        sample = Sample.from_row(row)
        inputs = processor_inputs(processor, sample)
        with torch.no_grad():
            kl, top1, cosine, entropy = _compare_logits(original(**inputs).logits[0], quantized(**inputs).logits[0])
            prompt = processor_inputs(processor, _prompt_only(sample), add_generation_prompt=True)
            start = prompt["input_ids"].shape[1]
            a = original.generate(**prompt, max_new_tokens=greedy_tokens, do_sample=False)[0, start:].tolist()
            b = quantized.generate(**prompt, max_new_tokens=greedy_tokens, do_sample=False)[
                0, start:
            ].tolist()
        agree = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        results.append(
            SampleDrift(
                id=row["id"],
                task=row["task"],
                modality=row["modality"],
                positions=int(inputs["input_ids"].shape[1]),
                kl=round(kl, 6),
                top1=round(top1, 4),
                cosine=round(cosine, 6),
                greedy_prefix=round(agree / max(1, greedy_tokens), 4),
                entropy=round(entropy, 6),
            )
        )
    by_modality: dict[str, list[SampleDrift]] = defaultdict(list)
    by_task: dict[str, list[SampleDrift]] = defaultdict(list)
    for item in results:
        by_modality[item.modality].append(item)
        by_task[item.task].append(item)
    report = DriftReport(
        reference=str(reference),
        checkpoint=str(checkpoint),
        overall=_group("all", results),
        by_modality=[_group(name, items) for name, items in sorted(by_modality.items())],
        by_task=[_group(name, items) for name, items in sorted(by_task.items())],
        samples=results,
        thresholds=thresholds,
    )
    if thresholds is not None:
        judge_groups(report, thresholds)
    return report


def judge_groups(report: DriftReport, thresholds: DriftThresholds) -> None:
    """Fill ``report.breaches`` (and ``not_judged``) by the MIN_GROUP_POSITIONS rule."""
    kinds = (("overall", [report.overall]), ("modality", report.by_modality), ("task", report.by_task))
    for kind, groups in kinds:
        for group in groups:
            if not thresholds.judges(group):
                report.not_judged.append(
                    f"{kind} {group.name} ({group.positions} < {thresholds.min_positions} positions)"
                )
                continue
            report.breaches += [f"{kind} {group.name}: {b}" for b in thresholds.breaches(group)]


def _used_ids(checkpoint: Path) -> set[str]:
    """Sample ids the checkpoint was calibrated on, from its quantkit.json (empty if unknown)."""
    meta = checkpoint / "quantkit.json"
    if not meta.is_file():
        return set()
    data = json.loads(meta.read_text(encoding="utf-8"))
    calibration_set = (data.get("calibration") or {}).get("set") or {}
    return set(calibration_set.get("sample_ids") or [])
