"""Recovery: how much of the original model's score a quantized checkpoint keeps.

For a metric where higher is better (accuracy) recovery is quantized / original; where lower is
better (perplexity, bits per byte) it is original / quantized. Either way 100% means no change and
a value under 100% means the checkpoint is worse. The loss is 100% - recovery; a checkpoint is
within the allowed loss when every metric's loss is at most ``max_loss`` percent (the pass rule
and its default are quantkit.eval.gate's). Which direction a metric goes comes
from the harness (``higher_is_better`` of each task), not from a list of names here; the names
below only cover results that lack it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from quantkit.eval.gate import DEFAULT_MAX_LOSS, within

__all__ = ["DEFAULT_MAX_LOSS", "Comparison", "Score", "compare", "judge", "recovery", "scores_from_results"]
LOWER_IS_BETTER = frozenset(
    {"perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "ter", "wer", "cer"}
)


@dataclass(frozen=True)
class Score:
    """One metric of one task for one model, as the harness reported it."""

    task: str
    metric: str
    filter: str
    value: float
    stderr: float | None
    higher_is_better: bool

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.task, self.metric, self.filter)

    @property
    def label(self) -> str:
        return self.metric if self.filter == "none" else f"{self.metric} ({self.filter})"


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None  # the harness writes "N/A" for a stderr it did not compute
    return float(value)


def scores_from_results(results: dict) -> list[Score]:
    """Every numeric metric in a ``simple_evaluate`` result (tasks and groups), stderr beside it."""
    higher = results.get("higher_is_better") or {}
    out = []
    for section in ("results", "groups"):
        for task, metrics in sorted((results.get(section) or {}).items()):
            if section == "groups" and task in (results.get("results") or {}):
                continue
            for key, value in metrics.items():
                if "," not in key or "_stderr," in key:
                    continue
                metric, filter_name = key.split(",", 1)
                number = _number(value)
                if number is None:
                    continue
                direction = (higher.get(task) or {}).get(metric)
                if direction is None:
                    direction = metric not in LOWER_IS_BETTER
                stderr = _number(metrics.get(f"{metric}_stderr,{filter_name}"))
                out.append(Score(task, metric, filter_name, number, stderr, bool(direction)))
    return out


def recovery(original: float, quantized: float, higher_is_better: bool) -> float | None:
    """Quantized / original (higher is better) or original / quantized (lower is better), as a
    fraction; None when it is undefined (a zero denominator with different values, or NaN)."""
    if any(math.isnan(v) for v in (original, quantized)):
        return None
    if original == quantized:
        return 1.0
    numerator, denominator = (quantized, original) if higher_is_better else (original, quantized)
    if denominator == 0 or math.isinf(denominator):
        return None
    return numerator / denominator


@dataclass(frozen=True)
class Comparison:
    """One metric of one task: the original's value, the checkpoint's, and the verdict."""

    task: str
    metric: str
    filter: str
    higher_is_better: bool
    original: float
    quantized: float
    original_stderr: float | None
    quantized_stderr: float | None
    recovery_pct: float | None
    loss_pct: float | None
    within: bool

    @property
    def label(self) -> str:
        return self.metric if self.filter == "none" else f"{self.metric} ({self.filter})"

    def to_dict(self) -> dict:
        return asdict(self)


def judge(original: float, quantized: float, higher_is_better: bool, max_loss: float) -> tuple:
    """(recovery %, loss %, within) for one metric."""
    ratio = recovery(original, quantized, higher_is_better)
    if ratio is None:
        if any(math.isnan(v) for v in (original, quantized)):
            return None, None, False
        # A zero denominator: only "not worse at all" can be judged.
        worse = quantized < original if higher_is_better else quantized > original
        return None, None, not worse
    recovery_pct = 100.0 * ratio
    loss_pct = 100.0 - recovery_pct
    return recovery_pct, loss_pct, within(loss_pct, max_loss)


def compare(original: list[Score], quantized: list[Score], max_loss: float) -> list[Comparison]:
    """Pair the checkpoint's scores with the original's (same task, metric and filter); a metric
    the checkpoint lacks counts as not within."""
    theirs = {s.key: s for s in quantized}
    rows = []
    for score in original:
        other = theirs.get(score.key)
        if other is None:  # the checkpoint's run lacks this metric: not within (NaN in the table)
            other = Score(score.task, score.metric, score.filter, math.nan, None, score.higher_is_better)
        recovery_pct, loss_pct, within = judge(score.value, other.value, score.higher_is_better, max_loss)
        rows.append(
            Comparison(
                task=score.task,
                metric=score.metric,
                filter=score.filter,
                higher_is_better=score.higher_is_better,
                original=score.value,
                quantized=other.value,
                original_stderr=score.stderr,
                quantized_stderr=other.stderr,
                recovery_pct=recovery_pct,
                loss_pct=loss_pct,
                within=within,
            )
        )
    return rows
