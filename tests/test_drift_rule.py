"""verify's drift thresholds judge a group only when it rests on enough positions (MIN_GROUP_POSITIONS)."""

from __future__ import annotations

import pytest
import torch

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


def test_a_task_the_original_answers_under_the_floor_shows_its_loss_ungated():
    """The floor rule: a task whose best held-out row the original answers under the floor is
    listed "not judged" (build.json, the drift report) and its loss is shown but does not gate."""
    from quantkit.targets.build import CheckpointBuild, _judge
    from quantkit.verify.drift import HeldOutChoice, HeldOutRow

    choice = HeldOutChoice(
        [
            HeldOutRow("a1", "ocr", 0.9),
            HeldOutRow("b1", "asr", 0.05),
            HeldOutRow("b2", "asr", 0.25),  # a task's best row counts
            HeldOutRow("c1", "chat", 0.19),
        ],
        floor=0.2,
        per_task=4,
        seed=0,
    )
    assert choice.not_judged == {"chat"}
    record = choice.to_dict()
    assert {row["id"]: row["judged"] for row in record["rows"]} == {
        "a1": True,
        "b1": True,
        "b2": True,
        "c1": False,
    }
    assert record["not_judged"] == ["chat"] and "0.2" in record["rule"]
    entry = CheckpointBuild(["t"], "w4a16", "ck", "passed", "k", losses={"ocr": 0.5, "asr": 1.0, "chat": 3.0})
    judged = _judge(entry, 1.5, {}, {"ocr", "asr", "chat"}, choice.not_judged)
    assert judged.verdict == "kept" and judged.worst_task == "asr" and judged.losses["chat"] == 3.0
    assert "not judged" in judged.detail and "chat" in judged.detail
    every = _judge(entry, 1.5, {}, {"ocr", "asr", "chat"})
    assert every.verdict == "over budget" and every.worst_task == "chat"


@pytest.fixture(scope="module")
def omni_calib(zoo_model, demo_pool, tmp_path_factory):
    from quantkit.calibset import CalibrateOptions, build_calibration_set

    model = zoo_model("tiny-qwen2.5-omni")
    calib = tmp_path_factory.mktemp("held-out") / "calib"
    build_calibration_set([demo_pool], calib, CalibrateOptions(size=40, model=model, max_seq_len=600))
    return model, calib


def _direct_accuracy(model, processor, row: dict) -> float:
    """The original's expected answer-token accuracy on a row, computed here by hand: the mean
    probability it gives each token of the last assistant turn, teacher-forced."""
    from quantkit.models.inputs import Sample, processor_inputs

    full = Sample.from_row(row)
    prompt = Sample(row["messages"][:-1], full.images, full.videos, full.audios)
    assert row["messages"][-1]["role"] == "assistant"
    inputs = processor_inputs(processor, full)
    ids = inputs["input_ids"][0]
    start = processor_inputs(processor, prompt, add_generation_prompt=True)["input_ids"].shape[1]
    assert 0 < start < len(ids)
    with torch.no_grad():
        probs = torch.softmax(model(**inputs).logits[0].float(), dim=-1)
    return float(probs[torch.arange(start - 1, len(ids) - 1), ids[start:]].mean())


def test_the_held_out_rows_are_those_the_original_answers_best(omni_calib):
    from quantkit.calibset import load_calibration_set
    from quantkit.models.adapters import adapter_for
    from quantkit.quantize.run import saved_dtype
    from quantkit.verify.drift import choose_held_out_rows

    model_dir, calib = omni_calib
    rows = {row["id"]: row for row in load_calibration_set(calib)}
    tasks = {row["task"] for row in rows.values()}
    choice = choose_held_out_rows(model_dir, calib, exclude_ids=set(), count=len(tasks), per_task=3)
    assert sorted(row.task for row in choice.rows) == sorted(tasks)  # one row of every task
    adapter = adapter_for(model_dir)
    model = adapter.load_model(model_dir, dtype=saved_dtype(model_dir))
    processor = adapter.load_processor(model_dir)
    ranked_somewhere = False
    for chosen in choice.rows:
        of_task = [i for i, row in rows.items() if row["task"] == chosen.task]
        assert set(chosen.candidates) <= set(of_task) and len(chosen.candidates) == min(3, len(of_task))
        direct = {i: _direct_accuracy(model, processor, rows[i]) for i in chosen.candidates}
        assert chosen.candidates == pytest.approx(direct, rel=1e-3, abs=1e-7)
        assert chosen.id == max(direct, key=direct.__getitem__)
        assert chosen.original_accuracy == pytest.approx(max(direct.values()), rel=1e-3, abs=1e-7)
        ranked_somewhere |= len(set(direct.values())) > 1
    assert ranked_somewhere  # the ranking chose between different rows


def test_every_checkpoint_is_measured_on_the_chosen_rows(omni_calib, tmp_path):
    import shutil

    from quantkit.errors import InputError
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe
    from quantkit.verify.drift import choose_held_out_rows, measure_drift

    model_dir, calib = omni_calib
    choice = choose_held_out_rows(model_dir, calib, exclude_ids=set(), count=3)
    assert len(choice.rows) == 3
    assert choice == choose_held_out_rows(model_dir, calib, exclude_ids=set(), count=3)  # deterministic
    fp8, copy = tmp_path / "fp8", tmp_path / "copy"
    quantize(model_dir, fp8, resolve_recipe("fp8-dynamic"), [], progress=False)
    shutil.copytree(model_dir, copy)
    for checkpoint in (fp8, copy):
        # num_samples / stratify_by would draw other rows: the choice wins.
        drift = measure_drift(model_dir, checkpoint, calib, exclude_ids=set(), held_out=choice, num_samples=9)
        assert [s.id for s in drift.samples] == choice.ids
        assert drift.held_out == choice.to_dict()
        for sample, row in zip(drift.samples, choice.rows, strict=True):
            assert sample.original_accuracy == pytest.approx(row.original_accuracy, rel=1e-3, abs=1e-7)
    with pytest.raises(InputError, match=f"held-out row {choice.ids[0]} calibrated the checkpoint"):
        measure_drift(model_dir, copy, calib, exclude_ids={choice.ids[0]}, held_out=choice)
