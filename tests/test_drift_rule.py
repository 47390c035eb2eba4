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
    from quantkit.build.judge import task_losses

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


def test_a_task_below_the_floor_is_still_judged_with_a_note():
    """No task is ungated: one whose held-out rows the original answers under the floor is judged
    on its loss like the others (over budget fails the candidate), with a note that says so."""
    from quantkit.build.judge import judge
    from quantkit.build.record import CheckpointBuild
    from quantkit.verify.drift import HeldOutChoice, HeldOutRow

    choice = HeldOutChoice(
        [HeldOutRow("a1", "ocr", 0.9), HeldOutRow("c1", "chat", 0.04)],
        floor=0.2,
        per_task=4,
        seed=0,
        below_floor=["chat"],
    )
    record = choice.to_dict()
    assert record["below_floor"] == ["chat"] and "0.2" in record["rule"] and "not_judged" not in record
    assert (
        record["ids_sha256"]
        == choice.digest()
        != HeldOutChoice([HeldOutRow("a2", "ocr", 0.9)], 0.2, 4, 0).digest()
    )

    def interval(loss, low, high):
        return {"n": 8, "loss": loss, "ci_low": low, "ci_high": high, "metric": "m", "items": "h"}

    intervals = {"ocr": interval(0.5, 0.2, 0.8), "chat": interval(3.0, 2.0, 4.0)}
    entry = CheckpointBuild(["t"], "w4a16", "ck", "passed", "k", losses={"ocr": 0.5, "chat": 3.0})
    entry.intervals = intervals
    step = judge(entry, 1.5, {}, {"ocr", "chat"}, {"chat": 0.04})
    assert step.verdict == "over budget" and step.worst_task == "chat"
    assert step.tasks["chat"]["verdict"] == "failed" and step.tasks["ocr"]["verdict"] == "passed"
    assert "the original answers chat's held-out rows at 0.04: its loss can hardly show" in step.detail


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


def test_rows_under_the_floor_are_dropped_and_the_kept_are_picked_by_strata(omni_calib, monkeypatch):
    """Of a task's drawn candidates, those the original answers under the floor are dropped when
    one reaches it, and the task's row is the stratified pick among the kept, not the argmax."""
    from quantkit.calibset import load_calibration_set, stratified_subsample
    from quantkit.verify import drift

    model_dir, calib = omni_calib
    rows = {row["id"]: row for row in load_calibration_set(calib)}
    tasks = {row["task"] for row in rows.values()}
    drawn = {}  # task -> its candidates, in the drawn order

    def score(model, processor, row, media_ids):
        drawn.setdefault(row["task"], []).append(row["id"])
        return 0.5

    monkeypatch.setattr(drift, "original_accuracy", score)
    drift.choose_held_out_rows(model_dir, calib, exclude_ids=set(), count=len(tasks), floor=0.2)
    task = next(t for t, ids in drawn.items() if len(ids) >= 3)
    dropped, kept = drawn[task][0], drawn[task][1:]
    (pick,) = [kept[i] for i in stratified_subsample([rows[i]["stratum"] for i in kept], 1, seed=0)]
    argmax = next(i for i in kept if i != pick)
    accuracy = {dropped: 0.1, pick: 0.3, argmax: 0.9}  # the others kept at 0.5

    def constructed(model, processor, row, media_ids):
        return accuracy.get(row["id"], 0.5 if row["task"] == task else 0.01)

    monkeypatch.setattr(drift, "original_accuracy", constructed)
    choice = drift.choose_held_out_rows(model_dir, calib, exclude_ids=set(), count=len(tasks), floor=0.2)
    (chosen,) = [row for row in choice.rows if row.task == task]
    assert chosen.id == pick and chosen.original_accuracy == 0.3 and chosen.candidates[argmax] == 0.9
    assert task not in choice.below_floor and dropped in chosen.candidates
    # every other task's candidates are all under the floor: judged on the best, listed below_floor
    assert sorted(choice.below_floor) == sorted(tasks - {task})
    assert choice.to_dict()["below_floor"] == choice.below_floor


def test_the_held_out_rows_of_a_task_under_the_floor_are_the_best(omni_calib):
    """The zoo's random-weight model answers every row at about 1 / its vocabulary: every task
    is below the floor and judged on the row the original answers best."""
    from quantkit.calibset import load_calibration_set
    from quantkit.models.adapters import adapter_for
    from quantkit.quantize.run import saved_dtype
    from quantkit.verify.drift import choose_held_out_rows

    model_dir, calib = omni_calib
    rows = {row["id"]: row for row in load_calibration_set(calib)}
    tasks = {row["task"] for row in rows.values()}
    choice = choose_held_out_rows(model_dir, calib, exclude_ids=set(), count=len(tasks), per_task=3)
    assert sorted(row.task for row in choice.rows) == sorted(tasks)  # one row of every task
    assert sorted(choice.below_floor) == sorted(tasks)
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
