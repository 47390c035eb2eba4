"""`quantkit build` gated on accuracy: a target whose recipe loses too much on a task ends on a
promoted or fallback candidate that meets the budget, or fails with the table of every candidate
tried while the other targets build; a rebuilt chain reuses its cached candidates.

The budgets come from losses measured here first (4-bit and 8-bit on the same model and
samples), so the tests fail if the gate stops acting on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from quantkit.build import build_checkpoints, load_targets
from quantkit.calibset import CalibrateOptions, build_calibration_set
from quantkit.cli import app
from quantkit.eval.gate import MIN_ITEMS

pytestmark = pytest.mark.slow
runner = CliRunner()
MODEL = "tiny-qwen2.5-omni"
# The set spares a few held-out rows per task, some fewer than an interval needs (unresolvable up
# front): unresolved tasks are accepted with a warning, and the budgets below are set from the
# intervals' ends, where a candidate's verdict is decided (quantkit.eval.gate).
OPTIONS = {"num_samples": 8, "accept_unresolved": True}
CLI_OPTIONS = ["--num-samples", "8", "--accept-unresolved"]


def fails_below(step) -> float:
    """A budget under this fails the candidate: its largest interval lower end (of decided tasks)."""
    return max((r["ci_low"] for r in step.tasks.values() if r["n"] >= MIN_ITEMS), default=float("-inf"))


def passes_from(step) -> float:
    """A budget at this or more passes every decided task of the candidate: the largest upper end."""
    return max((r["ci_high"] for r in step.tasks.values() if r["n"] >= MIN_ITEMS), default=0.0)


def between(low: float, high: float) -> float:
    """A budget in [low, high), or a skip: the random-weight model's intervals must separate them."""
    if not 0 <= low < high:
        pytest.skip(f"the two candidates' intervals do not separate here ({low:.3g} vs {high:.3g})")
    return float(f"{(low + high) / 2:.6g}")


def target(name: str, recipe: str, max_loss: float = 100.0, *, avg_bits=(), fallbacks=()) -> dict:
    return {
        "name": name,
        "hardware": ["test GPU"],
        "recipe": recipe,
        "why": "test target",
        "max_loss": max_loss,
        "avg_bits": list(avg_bits),
        "fallbacks": [
            {"recipe": r, "when": {"task_loss_above": "max_loss"}, "why": "loses too much"} for r in fallbacks
        ],
    }


def targets_file(folder: Path, *targets: dict) -> Path:
    path = folder / "targets.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "targets": list(targets)}, sort_keys=False))
    load_targets(path)  # the file the tests write is valid
    return path


@pytest.fixture(scope="module")
def setup(zoo_model, demo_pool, tmp_path_factory) -> dict:
    """Model, calibration set, one output root, and w4a16 and fp8-dynamic measured on it: ``worse``
    and ``better`` by their worst task's loss (which loses more depends on the model)."""
    root = tmp_path_factory.mktemp("gate")
    model = zoo_model(MODEL)
    calib = root / "calib"
    build_calibration_set([demo_pool], calib, CalibrateOptions(size=40, model=model, max_seq_len=1024))
    out = root / "out"
    probes = targets_file(root, target("probe-a", "w4a16"), target("probe-b", "fp8-dynamic"))
    report = build_checkpoints(
        model, out, ["probe-a", "probe-b"], calib=calib, targets_file=probes, **OPTIONS
    )
    assert report.passed, [t.chain for t in report.targets]
    measured = [t.chain[0] for t in report.targets]
    assert all(m.verdict == "kept" and m.losses for m in measured)
    assert set(measured[0].losses) == set(measured[1].losses)  # the same held-out samples and tasks
    # Every task of the rows w4a16 did not calibrate on has a loss: every held-out row is judged.
    used = set(
        json.loads((out / f"{model.name}-w4a16" / "quantkit.json").read_text())["calibration"]["sample_ids"]
    )
    rows = [json.loads(line) for line in (calib / "samples.jsonl").read_text().splitlines()]
    held_out_tasks = {row["task"] for row in rows if row["id"] not in used}
    assert all(r["n"] >= 1 and r["ci_low"] <= r["loss"] <= r["ci_high"] for r in measured[0].tasks.values())
    assert set(measured[0].losses) == held_out_tasks
    data = json.loads((out / "build.json").read_text())
    assert data["complete"] and data["requested"] == ["probe-a", "probe-b"]
    worse, better = sorted(measured, key=fails_below, reverse=True)
    return {"model": model, "calib": calib, "out": out, "worse": worse, "better": better}


def test_primary_over_budget_ends_on_a_promoted_or_fallback_candidate(setup, tmp_path):
    worse, better = setup["worse"], setup["better"]
    budget = between(passes_from(better), fails_below(worse))
    steps = [5.0] if worse.recipe == "w4a16" else []  # promotion applies to 4-bit group recipes
    file = targets_file(tmp_path, target("gated", worse.recipe, avg_bits=steps, fallbacks=[better.recipe]))
    args = ["build", "--target", "gated", "--model", str(setup["model"]), "--calib", str(setup["calib"])]
    args += ["--output-root", str(setup["out"]), "--max-loss", str(budget), "--targets-file", str(file)]
    result = runner.invoke(app, [*args, *CLI_OPTIONS])
    assert result.exit_code == 0, result.output
    build = json.loads((setup["out"] / "build.json").read_text())
    (gated,) = [t for t in build["targets"] if t["name"] == "gated"]  # build.json merges by target
    chain = gated["chain"]
    assert chain[0]["recipe"] == worse.recipe and chain[0]["avg_bits"] is None
    assert chain[0]["verdict"] == "over budget" and chain[0]["cached"] is True  # measured above
    assert chain[0]["worst_loss"] == pytest.approx(worse.worst_loss)
    kept = chain[-1]
    assert kept["verdict"] == "kept" and all(r["verdict"] != "failed" for r in kept["tasks"].values())
    assert (kept["recipe"], kept["avg_bits"]) in [(worse.recipe, b) for b in steps] + [(better.recipe, None)]
    assert all(step["verdict"] == "over budget" for step in chain[:-1])
    assert gated["status"] == "passed" and gated["checkpoint"] == kept["checkpoint"]
    assert f"Target gated: candidates tried (budget {budget} pts per task)" in result.output
    # The card of the kept checkpoint records the chain and what "loss" means.
    card = (Path(kept["checkpoint"]) / "README.md").read_text()
    assert (
        "## Build: accuracy gate" in card and "p_quantized(y)" in card and "KL(original || quantized)" in card
    )
    assert f"| 1 | {worse.recipe} | - |" in card and "over budget" in card
    first = chain[0]["tasks"][chain[0]["worst_task"]]
    assert f"| {chain[0]['worst_task']} | {first['loss']:.3g} [{first['ci_low']:.3g}, " in card
    assert f"(budget {budget} pts per task)" in card


def test_a_4bit_recipe_over_budget_is_promoted_before_the_fallbacks(setup, tmp_path):
    four = next(m for m in (setup["worse"], setup["better"]) if m.recipe == "w4a16")
    budget = between(0.0, fails_below(four))
    file = targets_file(
        tmp_path, target("promote", "w4a16", budget, avg_bits=[5.0], fallbacks=["fp8-dynamic"])
    )
    # An earlier test of this module may have built the promotion already (when w4a16 is "worse").
    built_before = any(setup["out"].glob("*-w4a16-avg5/quantkit.json"))
    report = build_checkpoints(
        setup["model"], setup["out"], ["promote"], calib=setup["calib"], targets_file=file, **OPTIONS
    )
    (built,) = report.targets
    first, promoted = built.chain[:2]
    assert (first.recipe, first.verdict, first.cached) == ("w4a16", "over budget", True)
    assert (promoted.recipe, promoted.avg_bits, promoted.cached) == ("w4a16", 5.0, built_before)
    assert promoted.size_ratio > first.size_ratio  # the most sensitive layers went to 8 bits
    precision = json.loads((Path(promoted.checkpoint) / "quantkit.json").read_text())["precision"]
    assert precision["avg_bits_requested"] == 5.0
    # Kept if it meets the budget, else the fallback was tried next.
    failed = any(r["verdict"] == "failed" for r in promoted.tasks.values())
    assert promoted.verdict == ("over budget" if failed else "kept")
    if promoted.verdict == "over budget":
        assert built.chain[2].recipe == "fp8-dynamic"


def test_nothing_meets_the_budget_fails_that_target_only(setup, tmp_path):
    worse, better = setup["worse"], setup["better"]
    budget = between(0.0, fails_below(better))  # below both candidates' lower ends
    file = targets_file(
        tmp_path,
        target("tight", worse.recipe, budget, fallbacks=[better.recipe]),
        target("loose", "fp8", 100.0),
    )
    args = ["build", "--target", "tight", "--target", "loose", "--model", str(setup["model"])]
    args += ["--calib", str(setup["calib"]), "--output-root", str(setup["out"]), "--targets-file", str(file)]
    result = runner.invoke(app, [*args, *CLI_OPTIONS])
    assert result.exit_code == 1, result.output
    # The table of every candidate tried: recipe, avg bits, size, worst task and its loss.
    assert "Target tight: candidates tried" in result.output and "no candidate meets" in result.output
    build = json.loads((setup["out"] / "build.json").read_text())
    assert build["passed"] is False
    tight, loose = ({t["name"]: t for t in build["targets"]}[name] for name in ("tight", "loose"))
    assert tight["status"] == "failed" and tight["checkpoint"] is None
    steps = [(s["recipe"], s["verdict"]) for s in tight["chain"]]
    assert steps == [(worse.recipe, "over budget"), (better.recipe, "over budget")]
    for step in tight["chain"]:
        assert step["worst_task"] in step["losses"] and step["size_ratio"]
        assert any(r["verdict"] == "failed" and r["ci_low"] > budget for r in step["tasks"].values())
        assert f"{step['worst_loss']:.3g} [" in result.output  # the interval beside the loss
    # The other target in the same command built.
    assert loose["status"] == "passed" and (Path(loose["checkpoint"]) / "quantkit.json").is_file()
    assert loose["chain"][0]["recipe"] == "fp8" and loose["chain"][0]["cached"] is False
    # The card of a candidate tight did not keep says why, and whether another target keeps it
    # (build.json merges the targets of earlier runs on this output root).
    folder = tight["chain"][0]["checkpoint"]
    (entry,) = [c for c in [*build["checkpoints"], *build["earlier"]] if c["checkpoint"] == folder]
    card = (Path(folder) / "README.md").read_text()
    verdict = "kept this checkpoint" if entry["kept_for"] else "did not keep this checkpoint for any target"
    assert verdict in card and "Not kept for target `tight`" in card


def test_rebuilt_chain_reuses_cached_candidates(setup, tmp_path):
    worse, better = setup["worse"], setup["better"]
    file = targets_file(
        tmp_path,
        target("again", worse.recipe, between(0.0, fails_below(better)), fallbacks=[better.recipe]),
    )
    folders = [Path(worse.checkpoint), Path(better.checkpoint)]
    stamps = [(folder / "quantkit.json").stat().st_mtime_ns for folder in folders]
    report = build_checkpoints(
        setup["model"], setup["out"], ["again"], calib=setup["calib"], targets_file=file, **OPTIONS
    )
    (again,) = report.targets
    assert [s.recipe for s in again.chain] == [worse.recipe, better.recipe]
    assert all(s.cached for s in again.chain)
    assert [c.status for c in report.checkpoints] == ["up-to-date", "up-to-date"]
    assert [(folder / "quantkit.json").stat().st_mtime_ns for folder in folders] == stamps  # not rebuilt
    # The cache keeps the measured losses.
    assert [s.worst_loss for s in again.chain] == [worse.worst_loss, better.worst_loss]


def test_eval_tasks_scores_count_in_the_gate(tmp_path):
    """--eval-tasks: each candidate's skills score per task; 100% - recovery is a loss like drift's."""
    from quantkit.zoo import skills
    from quantkit.zoo.models import build_zoo_model

    assert skills.committed_weights() is not None, f"the trained weights are committed: {skills.WEIGHTS}"
    model = build_zoo_model("tiny-omni-skills", tmp_path / "skills")
    file = targets_file(tmp_path, target("eval", "fp8-dynamic"))
    out = tmp_path / "out"
    args = ["build", "--target", "eval", "--model", str(model), "--output-root", str(out)]
    args += [
        "--targets-file",
        str(file),
        "--eval-tasks",
        "caption",
        "--gate-items",
        "6",
        "--accept-unresolved",
    ]
    result = runner.invoke(app, args)  # no --calib: the skills scores are the only loss
    assert result.exit_code == 0, result.output
    build = json.loads((out / "build.json").read_text())
    (step,) = build["targets"][0]["chain"]
    scores, original = build["checkpoints"][0]["eval_scores"], build["eval_original"]
    assert scores["items"] == 6 and set(scores["scores"]) == set(original) == {"caption"}
    assert original["caption"] > 0, "the committed model has learned caption"
    expected = round(100 - 100 * scores["scores"]["caption"] / original["caption"], 4)
    assert step["losses"] == {"eval caption": pytest.approx(expected, abs=1e-3)}
    assert step["worst_task"] == "eval caption"
    # A budget below the interval's lower end fails the target; otherwise the task is passed or
    # unresolved (accepted here: 6 items cannot resolve a 0 budget).
    tight = build_checkpoints(
        model,
        out,
        ["eval"],
        targets_file=file,
        eval_tasks=["caption"],
        gate_items=6,
        max_loss=0,
        accept_unresolved=True,
    )
    interval = step["tasks"]["eval caption"]
    assert tight.targets[0].status == ("failed" if interval["ci_low"] > 0 else "passed")
    assert tight.targets[0].chain[0].cached and tight.checkpoints[0].eval_scores == scores  # from build.json


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--num-samples", "40"], "no held-out sample"),  # the whole set calibrates: nothing to judge on
        (["--drift-samples", "0"], "--drift-samples"),
        (["--gate-items", "0"], "--gate-items"),
    ],
)
def test_a_gate_with_nothing_to_measure_on_is_refused_before_any_quantize(setup, tmp_path, extra, message):
    file = targets_file(tmp_path, target("probe", "w4a16"))
    args = ["build", "--target", "probe", "--model", str(setup["model"]), "--calib", str(setup["calib"])]
    args += ["--output-root", str(tmp_path / "out"), "--targets-file", str(file), *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    built = list((tmp_path / "out").glob("*-w4a16")) if (tmp_path / "out").exists() else []
    assert not built


def test_task_loss_is_the_drop_of_answer_accuracy_recomputed_from_both_models_logits(setup):
    """The loss of a task is the relative drop of the expected teacher-forced accuracy on the
    answer's tokens (the last assistant turn), not the prompt's or the media's: recomputed here
    from both models' logits on the samples the build measured, with the KL / entropy figure
    beside it (kl_losses)."""
    import torch

    from quantkit.models.adapters import adapter_for
    from quantkit.models.inputs import Sample, processor_inputs
    from quantkit.quantize.run import saved_dtype

    four = next(m for m in (setup["worse"], setup["better"]) if m.recipe == "w4a16")
    checkpoint, model = Path(four.checkpoint), setup["model"]
    measured = json.loads((checkpoint / "verify.json").read_text())["drift"]["samples"]
    rows = {
        row["id"]: row for row in map(json.loads, (setup["calib"] / "samples.jsonl").read_text().splitlines())
    }
    task = max(four.losses, key=four.losses.__getitem__)
    adapter = adapter_for(model)
    processor = adapter.load_processor(checkpoint)
    original = adapter.load_model(model, dtype=saved_dtype(model))
    quantized = adapter_for(checkpoint).load_model(checkpoint, dtype=saved_dtype(checkpoint))
    # p_quantized(y), p_original(y), KL, entropy, positions
    sums = {"answer": [0.0] * 5, "every": [0.0] * 5}
    for sample in (s for s in measured if s["task"] == task):
        row = rows[sample["id"]]
        assert row["messages"][-1]["role"] == "assistant"
        full = Sample.from_row(row)
        prompt = Sample(row["messages"][:-1], full.images, full.videos, full.audios)
        inputs = processor_inputs(processor, full)
        start = processor_inputs(processor, prompt, add_generation_prompt=True)["input_ids"].shape[1]
        with torch.no_grad():
            ref = torch.log_softmax(original(**inputs).logits[0].float(), -1)
            q = torch.log_softmax(quantized(**inputs).logits[0].float(), -1)
        ids = inputs["input_ids"][0]
        kl, entropy = (ref.exp() * (ref - q)).sum(-1)[:-1], -(ref.exp() * ref).sum(-1)[:-1]
        # Position t predicts token t + 1: the reference next token is the input's own.
        p_ref = ref[:-1].gather(-1, ids[1:, None]).exp()[:, 0]
        p_q = q[:-1].gather(-1, ids[1:, None]).exp()[:, 0]
        answer = slice(start - 1, None)
        assert 0 < len(kl[answer]) < len(kl)
        assert sample["loss_positions"] == len(kl[answer]) and sample["loss_scope"] == "answer"
        for name, part in (("answer", answer), ("every", slice(None))):
            for i, figure in enumerate((p_q, p_ref, kl, entropy)):
                sums[name][i] += float(figure[part].sum())
            sums[name][4] += len(kl[part])
    # Percentage points of expected answer-token accuracy: the drop of the summed probability
    # over the number of positions.
    answer_loss, every_loss = (100 * (pref - pq) / n for pq, pref, _, _, n in sums.values())
    assert four.losses[task] == pytest.approx(answer_loss, rel=1e-4, abs=1e-4)
    assert answer_loss != pytest.approx(every_loss, rel=1e-2)  # the answer's positions only
    kl, entropy = sums["answer"][2:4]
    assert four.kl_losses[task] == pytest.approx(100 * kl / entropy, rel=1e-3)
    build = json.loads((setup["out"] / "build.json").read_text())
    assert "accuracy" in build["loss"] and "kl_losses" in build["loss"]
    assert all(c["text_scope_samples"] == [] for c in build["checkpoints"])  # every row has an answer
    assert all(set(c["kl_losses"]) == set(c["losses"]) for c in build["checkpoints"])


def test_a_quantized_copy_identical_to_the_original_loses_nothing(setup, tmp_path):
    """The loss is 0 on every task (and so is the KL figure) when the checkpoint's outputs are the
    original's: a copy of the original measured as the build measures its candidates."""
    import shutil

    from quantkit.build.judge import task_intervals, task_kl_losses, task_losses
    from quantkit.eval.gate import verdict_record
    from quantkit.verify.drift import measure_drift

    copy = tmp_path / "copy"
    shutil.copytree(setup["model"], copy)
    drift = measure_drift(
        setup["model"], copy, setup["calib"], num_samples=16, exclude_ids=set(), stratify_by="task"
    )
    losses = task_losses(drift)
    assert losses and set(losses.values()) == {0.0}
    assert set(task_kl_losses(drift).values()) == {0.0}
    # Its intervals are 0 wide: it passes even a budget of 0 wherever a task has enough items.
    intervals = task_intervals(drift)
    assert {(r["loss"], r["ci_low"], r["ci_high"]) for r in intervals.values()} == {(0.0, 0.0, 0.0)}
    decided = {t: verdict_record(r, 0.0)["verdict"] for t, r in intervals.items() if r["n"] >= MIN_ITEMS}
    assert set(decided.values()) <= {"passed"}


def test_a_library_error_is_a_failed_candidate_and_the_smallest_passing_candidate_is_kept(
    setup, tmp_path, monkeypatch
):
    """A library's error (not a QuantkitError) in one candidate: recorded with its type, message
    and traceback, the chain goes on to its smallest passing fallback, listed after a larger one;
    a target with nothing else fails, and the command exits 1. The error is raised where a kernel
    would raise it, inside quantize (no library is replaced)."""
    import quantkit.quantize
    from quantkit.quantize import plan
    from quantkit.recipes import get_recipe

    real = quantkit.quantize.quantize

    def kernel_fails_on_fp8_block(model_dir, output, recipe, *args, **kwargs):
        if recipe.name == "fp8-block":  # a recipe no other test here builds (none cached)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(model_dir, output, recipe, *args, **kwargs)

    monkeypatch.setattr(quantkit.quantize, "quantize", kernel_fails_on_fp8_block)
    size = {
        name: plan(setup["model"], get_recipe(name), []).checkpoint_bytes for name in ("w4a16", "fp8-dynamic")
    }
    larger, smaller = sorted(size, key=size.__getitem__, reverse=True)
    file = targets_file(
        tmp_path,
        target("smallest", "fp8-block", fallbacks=[larger, smaller]),  # the larger fallback listed first
        target("broken", "fp8-block"),
    )
    args = ["build", "--target", "broken", "--target", "smallest", "--model", str(setup["model"])]
    args += ["--calib", str(setup["calib"]), "--output-root", str(setup["out"]), "--targets-file", str(file)]
    result = runner.invoke(app, [*args, *CLI_OPTIONS])
    assert result.exit_code == 1, result.output  # a target failed; not a crash
    assert "RuntimeError: CUDA error" in result.output and "Traceback" not in result.output
    build = json.loads((setup["out"] / "build.json").read_text())
    (failed,) = [c for c in build["checkpoints"] if c["recipe"] == "fp8-block"]
    assert failed["status"] == "error" and failed["reasons"] == [
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    ]
    assert failed["traceback"].startswith("Traceback") and "kernel_fails_on_fp8_block" in failed["traceback"]
    targets = {t["name"]: t for t in build["targets"]}
    assert targets["broken"]["status"] == "failed" and targets["broken"]["checkpoint"] is None
    chain = targets["smallest"]["chain"]
    # The smaller fallback is tried before the larger one, passes, and the larger is not built.
    assert [(s["recipe"], s["verdict"]) for s in chain] == [("fp8-block", "error"), (smaller, "kept")]
    assert chain[1]["predicted_bytes"] == size[smaller]
    assert targets["smallest"]["status"] == "passed" and "smallest first" in build["order"]
    card = (Path(chain[1]["checkpoint"]) / "README.md").read_text()
    assert "smallest first" in card


def test_build_json_and_cards_merge_by_target_and_stay_honest(setup, tmp_path):
    """A run for one target keeps the other targets' records and card sections; a rerun of a
    target replaces its own; a candidate an earlier run kept that no target keeps now says so."""
    worse, better = setup["worse"], setup["better"]
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    file1 = targets_file(first, target("twin-1", worse.recipe), target("moving", worse.recipe))
    file2 = targets_file(second, target("twin-2", worse.recipe), target("moving", better.recipe))
    common = {"calib": setup["calib"], **OPTIONS}
    build_checkpoints(setup["model"], setup["out"], ["twin-1", "moving"], targets_file=file1, **common)
    build_checkpoints(setup["model"], setup["out"], ["twin-2"], targets_file=file2, **common)

    def records() -> tuple[dict, dict]:
        data = json.loads((setup["out"] / "build.json").read_text())
        names = [t["name"] for t in data["targets"]]
        assert len(names) == len(set(names))  # one record a target
        entries = {c["checkpoint"]: c for c in [*data["checkpoints"], *data["earlier"]]}
        return {t["name"]: t for t in data["targets"]}, entries

    targets, _ = records()
    assert {"twin-1", "twin-2", "moving"} <= set(targets)
    card = (Path(worse.checkpoint) / "README.md").read_text()
    assert "Target `twin-1`" in card and "Target `twin-2`" in card and "Target `moving`" in card
    # moving again, now on the other recipe: its record is replaced, the twins' stay.
    build_checkpoints(setup["model"], setup["out"], ["moving"], targets_file=file2, **common)
    targets, entries = records()
    assert targets["moving"]["checkpoint"] == better.checkpoint
    assert targets["twin-1"]["checkpoint"] == targets["twin-2"]["checkpoint"] == worse.checkpoint
    assert "moving" not in entries[worse.checkpoint]["kept_for"]
    assert {"twin-1", "twin-2"} <= set(entries[worse.checkpoint]["kept_for"])
    assert "moving" in entries[better.checkpoint]["kept_for"]
    card = (Path(worse.checkpoint) / "README.md").read_text()
    assert "Target `moving`" not in card and "Target `twin-1`" in card
    assert "Target `moving`" in (Path(better.checkpoint) / "README.md").read_text()


def test_every_candidate_is_judged_on_the_same_chosen_rows(setup):
    """build.json records the held-out rows, chosen once per build: every row of a task no
    candidate calibrated on; the zoo's random-weight model answers every row under
    drift.ACCURACY_FLOOR, so each task is below_floor; every candidate's drift ran on exactly them,
    its record keeps their hash."""
    from quantkit.verify.drift import ACCURACY_FLOOR

    build = json.loads((setup["out"] / "build.json").read_text())
    held_out = build["held_out"]
    ids = [row["id"] for row in held_out["rows"]]
    tasks = {row["task"] for row in held_out["rows"]}
    assert len(ids) == len(set(ids)) and tasks == set(setup["worse"].losses)
    assert set(held_out["below_floor"]) == tasks and held_out["floor"] == ACCURACY_FLOOR
    w4a16 = setup["out"] / f"{setup['model'].name}-w4a16" / "quantkit.json"  # the one that calibrated
    drawn = set(json.loads(w4a16.read_text())["calibration"]["set"]["sample_ids"])  # dropped ones too
    rows = [json.loads(line) for line in (setup["calib"] / "samples.jsonl").read_text().splitlines()]
    for task in tasks:
        left = {r["id"] for r in rows if r["task"] == task and r["id"] not in drawn}
        assert {row["id"] for row in held_out["rows"] if row["task"] == task} == left
        assert setup["worse"].tasks[task]["n"] == len(left)
    assert all(row["original_accuracy"] < ACCURACY_FLOOR for row in held_out["rows"])
    assert {c["held_out"] for c in build["checkpoints"]} == {held_out["ids_sha256"]}
    for measured in (setup["worse"], setup["better"]):
        samples = json.loads((Path(measured.checkpoint) / "verify.json").read_text())["drift"]["samples"]
        assert [s["id"] for s in samples] == ids
        accuracy = {row["id"]: row["original_accuracy"] for row in held_out["rows"]}
        assert all(
            s["original_accuracy"] == pytest.approx(accuracy[s["id"]], rel=1e-3, abs=1e-9) for s in samples
        )


def test_a_task_below_the_floor_is_judged_and_noted(setup, tmp_path):
    """Every task is below the floor here: a budget under the worst task's loss fails the
    candidate all the same, and the chain (build.json), the card and the summary note the task."""
    worse = setup["worse"]
    budget = between(0.0, fails_below(worse))
    file = targets_file(tmp_path, target("floored", worse.recipe))
    args = ["build", "--target", "floored", "--model", str(setup["model"]), "--calib", str(setup["calib"])]
    args += ["--output-root", str(setup["out"]), "--max-loss", str(budget), "--targets-file", str(file)]
    result = runner.invoke(app, [*args, *CLI_OPTIONS])
    assert result.exit_code == 1, result.output
    build = json.loads((setup["out"] / "build.json").read_text())
    (floored,) = [t for t in build["targets"] if t["name"] == "floored"]
    (step,) = floored["chain"]
    assert (step["verdict"], step["cached"]) == ("over budget", True)
    (task,) = [t for t, r in step["tasks"].items() if r["ci_low"] == fails_below(worse)][:1]
    assert task in build["held_out"]["below_floor"]
    note = f"the original answers {task}'s held-out rows at "
    assert note in step["detail"] and "its loss can hardly show" in step["detail"]
    assert note in (Path(worse.checkpoint) / "README.md").read_text()
    assert note in " ".join(result.output.split())


def test_the_cache_key_changes_with_the_chosen_rows(setup):
    from quantkit.build.record import build_key
    from quantkit.recipes import get_recipe
    from quantkit.verify.drift import HeldOutChoice, HeldOutRow

    recipe = get_recipe(setup["worse"].recipe)
    one, other = (HeldOutChoice([HeldOutRow(i, "qa", 0.5)], 0.2, 4, 0) for i in ("r1", "r2"))
    keys = {
        build_key("m", "c", recipe, None, False, drift_samples=3, held_out=c.digest()) for c in (one, other)
    }
    assert len(keys) == 2
    same = HeldOutChoice([HeldOutRow("r1", "qa", 0.9)], 0.2, 4, 0)  # the ids alone count
    assert build_key("m", "c", recipe, None, False, drift_samples=3, held_out=same.digest()) in keys


def test_a_library_error_choosing_the_rows_fails_every_target_recorded(setup, tmp_path, monkeypatch):
    """The original's forward failing while the rows are chosen is recorded for every target of
    the run (build.json), exit 1, nothing quantized."""
    from quantkit.verify import drift

    def broken(*args, **kwargs):
        raise RuntimeError("forward broke")

    monkeypatch.setattr(drift, "original_accuracy", broken)
    out = tmp_path / "out"
    file = targets_file(tmp_path, target("one", "w4a16"), target("two", "fp8-dynamic"))
    args = ["build", "--target", "one", "--target", "two", "--model", str(setup["model"])]
    args += ["--calib", str(setup["calib"]), "--output-root", str(out), "--targets-file", str(file)]
    result = runner.invoke(app, [*args, *CLI_OPTIONS])
    assert result.exit_code == 1, result.output
    build = json.loads((out / "build.json").read_text())
    assert [t["name"] for t in build["targets"]] == ["one", "two"] and not build["checkpoints"]
    for record in build["targets"]:
        assert record["status"] == "failed" and "RuntimeError: forward broke" in record["error"]
        assert "choosing the held-out rows" in record["error"] and "forward broke" in record["traceback"]


def test_drift_limits_fail_a_candidate_unless_reported_then_the_gate_alone_decides(setup, tmp_path, monkeypatch):
    """fp8-dynamic with drift limits no quantized model meets (KL at most 1e-12): by default its
    candidate fails its checks and the target fails; with `--drift-limits report` the same breaches
    are recorded (build.json, the card, the output), not judged, and the per-task gate keeps it.
    The two modes are separate cache entries: a candidate passed with its limits reported is not
    reused by a build that judges them."""
    import shutil

    from quantkit.recipes import registry

    recipes = tmp_path / "recipes"
    shutil.copytree(registry.RECIPES_DIR, recipes)
    strict = yaml.safe_load((recipes / "fp8-dynamic.yaml").read_text())
    strict["drift_thresholds"] = {"max_kl": 1e-12, "min_top1": 0.0, "min_cosine": -1.0}
    (recipes / "fp8-dynamic.yaml").write_text(yaml.safe_dump(strict, sort_keys=False))
    monkeypatch.setattr(registry, "RECIPES_DIR", recipes)
    file = targets_file(tmp_path, target("strict", "fp8-dynamic"))
    out = tmp_path / "out"

    judged = build_checkpoints(setup["model"], out, ["strict"], calib=setup["calib"], targets_file=file, **OPTIONS)
    (candidate,) = judged.checkpoints
    assert not judged.passed and candidate.status == "failed"
    assert any(r.startswith("drift: overall all: KL") for r in candidate.reasons), candidate.reasons
    assert candidate.drift_reported == []

    args = ["build", "--target", "strict", "--model", str(setup["model"]), "--calib", str(setup["calib"])]
    args += ["--output-root", str(out), "--targets-file", str(file), *CLI_OPTIONS, "--drift-limits", "report"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "reported, not judged" in result.output
    data = json.loads((out / "build.json").read_text())
    assert data["drift_limits"]["mode"] == "report" and data["passed"]
    (entry,) = data["checkpoints"]
    assert entry["status"] == "passed" and not any(r.startswith("drift:") for r in entry["reasons"])
    assert any(b.startswith("overall all: KL") for b in entry["drift_reported"]), entry
    card = (Path(entry["checkpoint"]) / "README.md").read_text()
    assert "reported and not judged" in card and "overall all: KL" in card

    again = build_checkpoints(setup["model"], out, ["strict"], calib=setup["calib"], targets_file=file, **OPTIONS)
    assert not again.passed and again.checkpoints[0].status == "failed"  # measured again, judged
