"""The accuracy gate's one loss rule: a task's paired loss, its bootstrap interval and the verdict.

A task is scored item by item on the same items for the original and the candidate. Its loss is
``100 x sum(original - candidate) / sum(weights)``: with each item's answer positions as weights
(the drift loss: per item the summed expected accuracy of its answer tokens) it reads in
percentage points; with the original's scores as weights it is 100% - recovery (an --eval-tasks
task, a harness metric). The interval resamples the items with replacement, the same items for
both models (paired, so that how hard an item is cancels out), from a seeded generator (a rerun
gives the same bytes). The decision respects it: a task passes when the interval's upper end is
within the budget, fails when its lower end is beyond it, and is unresolved otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_MAX_LOSS = 1.5  # the seed article's bar: points of a task's accuracy (percent of a recovery)
CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
TOLERANCE = 1e-9  # a loss printed as the budget is within it
PASSED, FAILED, UNRESOLVED = "passed", "failed", "unresolved"
DECISION = (
    "Each task's loss is measured on the same held-out items for the original and the candidate, "
    "with a paired bootstrap 95% interval: the task passes when the interval's upper end is within "
    "the budget, fails when its lower end is beyond it, and is otherwise unresolved (counted as "
    "failed unless --accept-unresolved). A budget the items cannot resolve even for a lossless "
    "candidate (too few items, or one item's change alone beyond it) is refused before any "
    "quantization."
)


LOSS_RANGE = (0, 100)  # what a budget can be: points of accuracy or percent of a score


def in_loss_range(value: float) -> bool:
    """A budget (or a fallback's loss threshold) lies in LOSS_RANGE; NaN and infinities do not."""
    low, high = LOSS_RANGE
    return low <= value <= high


def within(loss: float, budget: float) -> bool:
    """The pass rule of every loss against its budget (both in the same unit)."""
    return loss <= budget + TOLERANCE


def _min_items(confidence: float) -> int:
    """The fewest items whose percentile interval's ends are not pinned to one item's value: the
    chance that a resample repeats a single item, n x n**-n, under the tail (1 - confidence) / 2."""
    n = 2
    while n * float(n) ** -n >= (1.0 - confidence) / 2:
        n += 1
    return n


MIN_ITEMS = _min_items(CONFIDENCE)


def _arrays(original, candidate, weights) -> tuple[np.ndarray, np.ndarray]:
    """(per-item drop, per-item weight) as float64 arrays, checked to pair up."""
    original = np.asarray(original, dtype=np.float64)
    candidate = np.asarray(candidate, dtype=np.float64)
    weights = np.ones_like(original) if weights is None else np.asarray(weights, dtype=np.float64)
    if not (original.shape == candidate.shape == weights.shape) or original.ndim != 1:
        raise ValueError("original, candidate and weights must be 1-d arrays of one length (paired items)")
    return original - candidate, weights


def _ratio(drops: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """100 x drops / weights along the last axis; no weight at all reads as no loss (0 / 0) or an
    unbounded one."""
    top, bottom = drops.sum(axis=-1), weights.sum(axis=-1)
    unbounded = np.where(top == 0, 0.0, np.copysign(np.inf, top))
    return np.where(bottom != 0, 100.0 * top / np.where(bottom != 0, bottom, 1.0), unbounded)


def _round(value: float) -> float:
    return float(f"{value:.6g}") + 0.0  # -0.0 reads 0.0


def paired_loss(original: Sequence[float], candidate: Sequence[float], weights=None) -> float:
    """100 x sum(original - candidate) / sum(weights) (weights: one per item by default)."""
    drops, weights = _arrays(original, candidate, weights)
    return _round(float(_ratio(drops, weights)))


def paired_interval(
    original: Sequence[float],
    candidate: Sequence[float],
    weights=None,
    *,
    seed: int = SEED,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """The percentile bootstrap interval of ``paired_loss``: items resampled with replacement, each
    resample taking an item's original and candidate scores together."""
    drops, weights = _arrays(original, candidate, weights)
    picks = np.random.default_rng(seed).integers(0, len(drops), size=(resamples, len(drops)))
    losses = _ratio(drops[picks], weights[picks])
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(losses, [tail, 1.0 - tail])
    return _round(float(low)), _round(float(high))


def decide(n: int, low: float, high: float, budget: float) -> str:
    """passed: the upper end is within the budget; failed: the lower end is beyond it; else (or
    with fewer than MIN_ITEMS items) unresolved."""
    if n < MIN_ITEMS:
        return UNRESOLVED
    if within(high, budget):
        return PASSED
    if not within(low, budget):
        return FAILED
    return UNRESOLVED


def items_to_resolve(n: int, loss: float, low: float, high: float, budget: float) -> int | None:
    """About how many items would resolve an unresolved task at the observed spread (an interval's
    half-width shrinks as 1 / sqrt(n)); None when the loss sits on the budget (none would)."""
    if n < MIN_ITEMS:
        return MIN_ITEMS
    gap = budget - loss
    half = high - loss if gap > 0 else loss - low
    if abs(gap) <= TOLERANCE or not math.isfinite(half):
        return None
    return max(n + 1, math.ceil(n * (half / abs(gap)) ** 2))


def items_hash(items: Sequence) -> str:
    """A hash of the items (ids, or prompt and answer): the same items for every candidate."""
    return hashlib.sha256(json.dumps(list(items), sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class TaskInterval:
    """One task of one candidate: n items, the loss and its interval (unit of the weights)."""

    n: int
    loss: float
    ci_low: float
    ci_high: float
    metric: str
    items: str  # items_hash of the items scored

    def to_dict(self) -> dict:
        return asdict(self)


def measure(original, candidate, weights=None, *, metric: str, items: Sequence) -> TaskInterval:
    """The paired loss and interval of one task's items."""
    low, high = paired_interval(original, candidate, weights)
    loss = paired_loss(original, candidate, weights)
    return TaskInterval(len(items), loss, low, high, metric, items_hash(items))


def verdict_record(interval: dict, budget: float) -> dict:
    """A TaskInterval's record (build.json) with its verdict against ``budget`` and, unresolved,
    the items that would resolve it at the observed spread."""
    n, loss, low, high = interval["n"], interval["loss"], interval["ci_low"], interval["ci_high"]
    record = {**interval, "verdict": decide(n, low, high, budget)}
    if record["verdict"] == UNRESOLVED:
        record["items_to_resolve"] = items_to_resolve(n, loss, low, high, budget)
    return record


def unresolvable(n: int, budget: float, step_loss: float | None = None) -> str | None:
    """Why a budget cannot be resolved on n items even for a lossless candidate, or None.
    ``step_loss``: the loss one item's smallest change makes (a metric scored 0 or 1 per item:
    100 / n points, or 100 / the original's summed score percent); beyond the budget, a candidate
    that changes any answer cannot pass."""
    if n < MIN_ITEMS:
        return f"{n} item(s), fewer than the {MIN_ITEMS} a {CONFIDENCE:.0%} interval needs"
    if step_loss is not None and not within(step_loss, budget):
        why = f"one item of {n} changes the loss by {step_loss:.3g}, more than the budget"
        if budget <= 0:  # no count of items makes one item's change 0
            return f"{why}: only a candidate that changes no answer can pass"
        return f"{why}: about {math.ceil(n * step_loss / budget)} items needed"
    return None


def format_interval(record: dict | None, unit: str = "") -> str:
    """``0.42 [-0.1, 0.9] pts (n=12)`` for a summary table."""
    if not record:
        return "-"
    return f"{record['loss']:.3g} [{record['ci_low']:.3g}, {record['ci_high']:.3g}]{unit} (n={record['n']})"
