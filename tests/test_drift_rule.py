"""verify's drift thresholds judge a group only when it rests on enough positions (MIN_GROUP_POSITIONS)."""

from __future__ import annotations

import pytest

from quantkit.verify.drift import (
    MIN_GROUP_POSITIONS,
    DriftReport,
    DriftThresholds,
    SampleDrift,
    _group,
    judge_groups,
)

THRESHOLDS = DriftThresholds(max_kl=0.05, min_top1=0.9, min_cosine=0.99)


def _sample(i: int, modality: str, task: str, top1: float, positions: int = 40) -> SampleDrift:
    return SampleDrift(
        f"s{i}", task, modality, positions, kl=0.001, top1=top1, cosine=0.999, greedy_prefix=1.0
    )


def _report(samples: list[SampleDrift]) -> DriftReport:
    def groups(key):
        names = sorted({getattr(s, key) for s in samples})
        return [_group(n, [s for s in samples if getattr(s, key) == n]) for n in names]

    report = DriftReport("orig", "ckpt", _group("all", samples), groups("modality"), groups("task"), samples)
    judge_groups(report, THRESHOLDS)
    return report


def test_one_text_sample_at_078_no_longer_fails_the_checkpoint():
    samples = [_sample(i, "image", "ocr", 0.99) for i in range(15)] + [_sample(99, "text", "text_chat", 0.78)]
    report = _report(samples)
    assert report.passed, report.breaches
    assert any(note.startswith("modality text (40 < ") for note in report.not_judged)
    assert any("task text_chat" in note for note in report.not_judged)


def test_enough_bad_samples_in_one_group_still_fail():
    samples = [_sample(i, "image", "ocr", 0.99) for i in range(12)]
    bad = MIN_GROUP_POSITIONS // 40 + 1  # just enough short replies to reach the rule
    samples += [_sample(100 + i, "text", "text_chat", 0.78) for i in range(bad)]
    report = _report(samples)
    assert not report.passed
    assert any(b.startswith("modality text: top-1 agreement 0.780") for b in report.breaches)
    assert any(b.startswith("task text_chat: top-1") for b in report.breaches)


def test_bad_samples_spread_over_small_groups_fail_on_the_whole_set():
    # Each task has too few samples to judge alone, but together they are a poor checkpoint.
    samples = [_sample(i, "image", f"task{i}", 0.5, positions=MIN_GROUP_POSITIONS // 2) for i in range(3)]
    report = _report(samples)
    assert any(b.startswith("overall all: top-1") for b in report.breaches)
    assert all(note.startswith("task ") for note in report.not_judged)
    assert not any(b.startswith("task ") for b in report.breaches)


def test_one_long_sample_is_enough_to_judge():
    report = _report([_sample(0, "video", "temporal_grounding", 0.6, positions=MIN_GROUP_POSITIONS)])
    assert any(b.startswith("modality video: top-1") for b in report.breaches)


def test_build_loss_is_the_drop_of_expected_answer_accuracy_in_points_and_a_gain_is_negative():
    """`build`'s per-task loss is the drop of the summed probability of the reference answer
    tokens over the task's samples divided by their number of positions (percentage points of
    expected accuracy, so a task the original barely answers has little to lose); a quantized
    model surer of them gains (< 0)."""
    from quantkit.targets.build import task_losses

    def scored(i, task, positions, p_original, p_quantized):
        item = _sample(i, "text", task, 1.0)
        item.loss_positions, item.loss_p_original, item.loss_p_quantized = positions, p_original, p_quantized
        return item

    samples = [
        scored(0, "qa", 10, 8.0, 7.0),
        scored(1, "qa", 30, 2.0, 2.0),
        scored(2, "chat", 10, 5.0, 5.5),
        scored(3, "rare", 20, 0.02, 0.001),  # the original gives its answer ~0: the ratio would be 95%
    ]
    losses = task_losses(_report(samples))
    assert losses["qa"] == pytest.approx(100 * (10.0 - 9.0) / 40)  # not the mean of the samples' drops
    assert losses["rare"] == pytest.approx(100 * (0.02 - 0.001) / 20)
    assert losses["chat"] < 0
