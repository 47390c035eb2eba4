"""Fidelity: how far a quantized checkpoint's outputs move from the original's, per modality and task.

Both models run on the same held-out samples of the calibration set (never those used to
calibrate), chosen to keep the set's strata proportions. Per sample: next-token KL divergence
(original || quantized), top-1 agreement and logit cosine over every position of the
conversation, and the length of the greedy continuation both models agree on. Beside them, the
probability each model gives the reference next token (teacher-forced: the answer's own token)
over the positions that predict the answer's tokens (the last assistant turn, what a task's
accuracy is scored on; ANSWER_SCOPE), `quantkit build`'s per-task loss, and the KL and the
original's entropy there.

The build judges every candidate on the same rows, chosen once (``choose_held_out_rows``): of a
few held-out candidates per task, those the original answers at ACCURACY_FLOOR or more (its expected
answer-token accuracy), picked keeping their strata; a task none of whose candidates reaches the
floor is judged on its best one and listed ``below_floor`` (its loss can hardly show).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from quantkit.calibset import load_calibration_set, stratified_subsample
from quantkit.errors import InputError
from quantkit.models.adapters import adapter_for
from quantkit.models.inputs import Sample, processor_capabilities, processor_inputs
from quantkit.quantize.run import saved_dtype
from quantkit.quantize.token_weights import media_token_ids

METRICS = ("kl", "top1", "cosine", "greedy_prefix")
# A group's means are judged only when they rest on at least this many scored positions (tokens,
# summed over its samples): top-1 agreement is a rate over positions, and at 256 its binomial
# standard error near 0.9 is under 0.02, while one short text reply (e.g. 40 positions at 0.78)
# cannot tell a checkpoint from noise. Smaller groups are listed as "not judged"; the whole set
# ("all") is judged by the same rule, so bad samples spread over small groups still fail.
MIN_GROUP_POSITIONS = 256
# The positions `quantkit build`'s loss averages over (SampleDrift.loss_scope): those whose next
# token is one of the answer's (the last assistant turn's tokens, its end-of-turn marker included,
# found as what follows the prompt-only rendering), or, for a sample without an answer, every
# position whose next token is text (not an image / video / audio placeholder).
ANSWER_SCOPE = "answer"
TEXT_SCOPE = "text (no answer tokens)"
# choose_held_out_rows: how many held-out rows of a task are candidates (drawn keeping the task's
# strata), and the original's expected answer-token accuracy a candidate needs to be picked (on a
# row the original answers at 0.04, a loss in points is bounded by 4: it can hardly show). A task
# none of whose candidates reaches it is still judged, on its best, and listed below_floor.
CANDIDATES_PER_TASK = 4
ACCURACY_FLOOR = 0.2


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
        # Written as "not within" so that a NaN (every comparison with it is false) is a breach.
        if not group.kl <= self.max_kl:
            found.append(f"KL {group.kl:.4f} > {self.max_kl}")
        if not group.top1 >= self.min_top1:
            found.append(f"top-1 agreement {group.top1:.3f} < {self.min_top1}")
        if not group.cosine >= self.min_cosine:
            found.append(f"logit cosine {group.cosine:.4f} < {self.min_cosine}")
        return found


def nonfinite_metrics(report: DriftReport) -> list[str]:
    """Every group and sample with a NaN or infinite metric (non-finite logits): a failure with
    thresholds or without, judged or not (a NaN compares false with any threshold)."""
    found = []
    groups = [("overall", report.overall), *(("modality", g) for g in report.by_modality)]
    groups += [("task", g) for g in report.by_task]
    for kind, group in groups:
        bad = [m for m in METRICS if not math.isfinite(getattr(group, m))]
        if bad:
            found.append(f"{kind} {group.name}: non-finite {', '.join(bad)} (the logits hold NaN or infinity)")
    for sample in report.samples:
        bad = [m for m in (*METRICS, "entropy") if not math.isfinite(getattr(sample, m))]
        if bad:
            found.append(f"sample {sample.id}: non-finite {', '.join(bad)}")
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
    entropy: float = 0.0  # the original's mean next-token entropy (nats), every position
    # Over the loss_scope's positions: the sums of the probability the original / the quantized
    # model gives the reference next token (expected teacher-forced accuracy; `build`'s loss),
    # and the means of KL and the original's entropy.
    loss_scope: str = ANSWER_SCOPE
    loss_positions: int = 0
    loss_kl: float = 0.0
    loss_entropy: float = 0.0
    loss_p_original: float = 0.0
    loss_p_quantized: float = 0.0
    original_accuracy: float = 0.0  # loss_p_original / loss_positions: the original's expected accuracy


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
    held_out: dict | None = None  # HeldOutChoice.to_dict() when the rows were chosen by it

    @property
    def passed(self) -> bool:
        return not self.breaches and not nonfinite_metrics(self)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["passed"] = self.passed
        return data


def _group(name: str, items: list[SampleDrift]) -> DriftGroup:
    def mean(metric: str) -> float:
        return round(sum(getattr(s, metric) for s in items) / len(items), 5)

    return DriftGroup(
        name, len(items), *(mean(m) for m in METRICS), positions=sum(s.positions for s in items)
    )


@dataclass(frozen=True)
class Comparison:
    """``_compare_logits``'s figures: means over every position, then over the loss positions."""

    kl: float
    top1: float
    cosine: float
    entropy: float
    loss_kl: float = 0.0
    loss_entropy: float = 0.0
    loss_p_original: float = 0.0  # sum of p_original(reference next token)
    loss_p_quantized: float = 0.0  # sum of p_quantized(reference next token)


def _compare_logits(
    reference: torch.Tensor,
    quantized: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    next_ids: torch.Tensor | None = None,
) -> Comparison:
    """Means over every position (KL, top-1, cosine, entropy), then over the positions of
    ``loss_mask`` (bool, one per position; None: every position) the means of KL and entropy and
    the sums of the probability each model gives ``next_ids`` (the reference next token, one per
    position: the input shifted by one; None: no probabilities)."""
    ref_logp = torch.log_softmax(reference.float(), dim=-1)
    q_logp = torch.log_softmax(quantized.float(), dim=-1)
    kl = (ref_logp.exp() * (ref_logp - q_logp)).sum(-1)
    top1 = (reference.argmax(-1) == quantized.argmax(-1)).float().mean()
    cosine = torch.nn.functional.cosine_similarity(reference.float(), quantized.float(), dim=-1).mean()
    entropy = -(ref_logp.exp() * ref_logp).sum(-1)
    mask = torch.ones_like(kl, dtype=torch.bool) if loss_mask is None else loss_mask.to(kl.device)
    picked = max(int(mask.sum()), 1)
    p_original = p_quantized = 0.0
    if next_ids is not None:
        p_original = _reference_probability(ref_logp, mask, next_ids)
        p_quantized = _reference_probability(q_logp, mask, next_ids)
    return Comparison(
        float(kl.mean()),
        float(top1),
        float(cosine),
        float(entropy.mean()),
        float(kl[mask].sum()) / picked,
        float(entropy[mask].sum()) / picked,
        p_original,
        p_quantized,
    )


def _reference_probability(logp: torch.Tensor, mask: torch.Tensor, next_ids: torch.Tensor) -> float:
    """The sum over the positions of ``mask`` of the probability (``logp``: log-softmax, one row
    per position) given the reference next token ``next_ids``."""
    index = next_ids.to(logp.device)[mask.to(logp.device)].unsqueeze(-1)
    return float(logp[mask.to(logp.device)].gather(-1, index).exp().sum())


def next_token_ids(ids: list[int]) -> torch.Tensor:
    """The reference next token of each position (the input shifted by one; the last position,
    which predicts nothing in the input, gets its own token and is never in a loss mask)."""
    return torch.tensor([*ids[1:], ids[-1]], dtype=torch.long)


def loss_positions(ids: list[int], prompt_length: int, media_ids: set[int]) -> tuple[torch.Tensor, str]:
    """The positions `build`'s loss averages over and their scope (ANSWER_SCOPE / TEXT_SCOPE):
    position t predicts token t + 1, so the answer's tokens ``ids[prompt_length:]`` are
    predicted at ``prompt_length - 1 ..``; a sample without answer tokens falls back to the
    positions whose next token is text."""
    target = torch.tensor(ids[1:], dtype=torch.long)
    mask = torch.zeros(len(ids), dtype=torch.bool)
    if 0 < prompt_length < len(ids):
        mask[prompt_length - 1 : len(ids) - 1] = True
        return mask, ANSWER_SCOPE
    if media_ids:
        mask[:-1] = ~torch.isin(target, torch.tensor(sorted(media_ids), dtype=torch.long))
    else:
        mask[:-1] = True
    return mask, TEXT_SCOPE


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (the prompt-only rendering and the full one)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _prompt_only(sample: Sample) -> Sample:
    """The conversation up to (not including) the last assistant turn, to generate from."""
    messages = list(sample.messages)
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    return Sample(messages or sample.messages, sample.images, sample.videos, sample.audios)


@dataclass(frozen=True)
class _RowInputs:
    """One row as both models see it: the whole conversation, the prompt to generate from, and
    the positions of the loss with their reference next tokens."""

    inputs: dict
    prompt: dict
    ids: list[int]
    mask: torch.Tensor
    scope: str

    @property
    def next_ids(self) -> torch.Tensor:
        return next_token_ids(self.ids)


def _row_inputs(processor, row: dict, media_ids: set[int]) -> _RowInputs:
    sample = Sample.from_row(row)
    inputs = processor_inputs(processor, sample)
    prompt = processor_inputs(processor, _prompt_only(sample), add_generation_prompt=True)
    ids = inputs["input_ids"][0].tolist()
    mask, scope = loss_positions(ids, _common_prefix(prompt["input_ids"][0].tolist(), ids), media_ids)
    return _RowInputs(inputs, prompt, ids, mask, scope)


def _media_ids(model) -> set[int]:
    return set().union(*media_token_ids(model.config).values())


def held_out_rows(
    calib: Path,
    *,
    exclude_ids: set[str],
    count: int,
    seed: int,
    kinds: set[str],
    by: str = "stratum",
    rows: list[dict] | None = None,
) -> list[dict]:
    """Rows of the calibration set not used to calibrate and of modalities the model takes,
    subsampled keeping the proportions of ``by`` (a row field: ``stratum``, or ``task`` for one
    sample of every task while ``count`` allows). ``rows``: the set's rows, when the caller has
    read them already (models.samples.open_set)."""
    dataset = load_calibration_set(calib) if rows is None else rows
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


@dataclass
class HeldOutRow:
    """A chosen held-out row: the original's expected answer-token accuracy on it (mean over its
    loss positions of p_original(reference next token)) and that of every candidate of its task."""

    id: str
    task: str
    original_accuracy: float
    candidates: dict[str, float] = field(default_factory=dict)  # id -> accuracy, the task's drawn


@dataclass
class HeldOutChoice:
    """The held-out rows a build judges every candidate on (``choose_held_out_rows``)."""

    rows: list[HeldOutRow]
    floor: float
    per_task: int
    seed: int
    below_floor: list[str] = field(default_factory=list)  # tasks no candidate of which reached the floor

    @property
    def ids(self) -> list[str]:
        return [row.id for row in self.rows]

    def digest(self) -> str:
        """A hash of the chosen ids (build.py's cache key: losses measured on other rows are stale)."""
        return hashlib.sha256(json.dumps(self.ids).encode()).hexdigest()[:16]

    def best(self) -> dict[str, float]:
        """Per task, the original's accuracy on its best chosen row."""
        found: dict[str, float] = {}
        for row in self.rows:
            found[row.task] = max(found.get(row.task, 0.0), row.original_accuracy)
        return found

    def to_dict(self) -> dict:
        return {
            "rule": (
                f"per task, up to {self.per_task} held-out rows drawn keeping its strata (seed "
                f"{self.seed}); of those the original answers at an expected answer-token accuracy "
                f">= {self.floor}, the task's share picked keeping their strata (seed {self.seed}); "
                "a task none of whose rows reaches it is judged on its best and listed below_floor"
            ),
            "floor": self.floor,
            "ids_sha256": self.digest(),
            "rows": [asdict(row) for row in self.rows],
            "below_floor": list(self.below_floor),
        }


def original_accuracy(model, processor, row: dict, media_ids: set[int]) -> float:
    """The original's expected answer-token accuracy on ``row``: the mean over its loss positions
    of the probability it gives the reference next token."""
    prepared = _row_inputs(processor, row, media_ids)
    with torch.no_grad():
        logp = torch.log_softmax(model(**prepared.inputs).logits[0].float(), dim=-1)
    positions = max(int(prepared.mask.sum()), 1)
    return _reference_probability(logp, prepared.mask, prepared.next_ids) / positions


def _pick(drawn: list[dict], accuracy: dict[str, float], share: int, floor: float, seed: int) -> list[str]:
    """Of a task's drawn candidates, ``share`` ids: those at ``floor`` or more picked keeping their
    strata (not the most confident: that would favour easy rows), topped up (too few reach it)
    with the best of the others."""
    kept = [row for row in drawn if accuracy[row["id"]] >= floor]
    picked = [kept[i]["id"] for i in stratified_subsample([row["stratum"] for row in kept], share, seed=seed)]
    rest = sorted((row["id"] for row in drawn if accuracy[row["id"]] < floor), key=lambda i: -accuracy[i])
    return picked + rest[: share - len(picked)]


def choose_held_out_rows(
    reference: Path,
    calib: Path,
    *,
    exclude_ids: set[str],
    count: int,
    per_task: int = CANDIDATES_PER_TASK,
    seed: int = 0,
    floor: float | None = None,
    per_task_items: int | None = None,
    opened=None,
) -> HeldOutChoice:
    """The held-out rows (not in ``exclude_ids``, of modalities the model takes) to judge
    candidates on: ``count`` split over the tasks as ``held_out_rows(by="task")`` splits it (one
    row of every task while ``count`` allows); each task's share picked (``_pick``) from up to
    ``max(per_task, share)`` of its rows drawn keeping their strata, scored by the original
    (``reference``, ``original_accuracy``). ``floor``: default ACCURACY_FLOOR. ``per_task_items``:
    instead of splitting ``count``, every task's share is that many of its rows (all it has, if
    fewer): the build's gate judges each task on all of them. ``opened``: the set as
    models.samples.open_set read it for ``reference`` (its processor and rows), not read again."""
    floor = ACCURACY_FLOOR if floor is None else floor
    reference = Path(reference)
    adapter = adapter_for(reference)
    processor = adapter.load_processor(reference) if opened is None else opened.processor
    kinds = processor_capabilities(processor)
    rows = held_out_rows(
        calib,
        exclude_ids=exclude_ids,
        count=sys.maxsize,
        seed=seed,
        kinds=kinds,
        rows=None if opened is None else opened.usable,
    )
    shares: dict[str, int] = defaultdict(int)
    if per_task_items is not None:
        for row in rows:
            shares[row["task"]] = min(shares[row["task"]] + 1, per_task_items)
    else:
        for i in stratified_subsample([row["task"] for row in rows], count, seed=seed):
            shares[rows[i]["task"]] += 1
    model = adapter.load_model(reference, dtype=saved_dtype(reference))
    media_ids = _media_ids(model)
    chosen, below = [], []
    for task in sorted(shares):
        of_task = [row for row in rows if row["task"] == task]
        drawn = [
            of_task[i]
            for i in stratified_subsample(
                [row["stratum"] for row in of_task], max(per_task, shares[task]), seed=seed
            )
        ]
        accuracy = {row["id"]: original_accuracy(model, processor, row, media_ids) for row in drawn}
        if max(accuracy.values()) < floor:
            below.append(task)
        picked = _pick(drawn, accuracy, shares[task], floor, seed)
        chosen += [HeldOutRow(i, task, accuracy[i], dict(accuracy)) for i in picked]
    return HeldOutChoice(chosen, floor, per_task, seed, below)


def _rows_by_id(calib: Path, ids: list[str], exclude_ids: set[str]) -> list[dict]:
    """The calibration set's rows of ``ids``, in that order; one missing or calibrated on is bad input."""
    found = {row["id"]: row for row in load_calibration_set(calib)}
    for row_id in ids:
        if row_id not in found or row_id in exclude_ids:
            why = "is not in the calibration set" if row_id not in found else "calibrated the checkpoint"
            raise InputError(
                f"held-out row {row_id} {why}",
                path=calib,
                hint="choose the rows again (choose_held_out_rows) from this set and checkpoint",
            )
    return [found[row_id] for row_id in ids]


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
    held_out: HeldOutChoice | None = None,
) -> DriftReport:
    """``held_out``: the rows to measure on (``choose_held_out_rows``, recorded in the report),
    instead of ``num_samples`` drawn keeping the proportions of ``stratify_by``."""
    reference, checkpoint = Path(reference), Path(checkpoint)
    ref_adapter, q_adapter = adapter_for(reference), adapter_for(checkpoint)
    processor = q_adapter.load_processor(checkpoint)
    if exclude_ids is None:
        exclude_ids = _used_ids(checkpoint)
    if held_out is not None:
        rows = _rows_by_id(calib, held_out.ids, exclude_ids)
    else:
        rows = held_out_rows(
            calib,
            exclude_ids=exclude_ids,
            count=num_samples,
            seed=seed,
            kinds=processor_capabilities(processor),
            by=stratify_by,
        )
    # Each in its saved dtype: transformers cannot run some reloaded quantized models in float32.
    original = ref_adapter.load_model(reference, dtype=saved_dtype(reference))
    quantized = q_adapter.load_model(checkpoint, dtype=saved_dtype(checkpoint))
    media_ids = _media_ids(original)
    results = []
    for row in rows:
        prepared = _row_inputs(processor, row, media_ids)
        inputs, prompt, mask, scope = prepared.inputs, prepared.prompt, prepared.mask, prepared.scope
        with torch.no_grad():
            compared = _compare_logits(
                original(**inputs).logits[0], quantized(**inputs).logits[0], mask, prepared.next_ids
            )
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
                kl=round(compared.kl, 6),
                top1=round(compared.top1, 4),
                cosine=round(compared.cosine, 6),
                greedy_prefix=round(agree / max(1, greedy_tokens), 4),
                entropy=round(compared.entropy, 6),
                loss_scope=scope,
                loss_positions=int(mask.sum()),
                loss_kl=float(f"{compared.loss_kl:.6g}"),  # significant figures: FP8's KL is ~1e-6
                loss_entropy=float(f"{compared.loss_entropy:.6g}"),
                # Unrounded: the loss is 1 - their ratio, and FP8's is ~1e-3.
                loss_p_original=compared.loss_p_original,
                loss_p_quantized=compared.loss_p_quantized,
                original_accuracy=compared.loss_p_original / max(int(mask.sum()), 1),
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
        held_out=held_out.to_dict() if held_out is not None else None,
    )
    if thresholds is not None:
        judge_groups(report, thresholds)
    report.breaches += nonfinite_metrics(report)
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
