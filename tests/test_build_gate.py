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

from quantkit.calibset import CalibrateOptions, build_calibration_set
from quantkit.cli import app
from quantkit.targets import build_checkpoints, load_targets

pytestmark = pytest.mark.slow
runner = CliRunner()
MODEL = "tiny-qwen2.5-omni"
OPTIONS = {"num_samples": 8, "drift_samples": 6}
CLI_OPTIONS = ["--num-samples", "8", "--drift-samples", "6"]


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
    # Every task of the rows w4a16 did not calibrate on has a loss, though --drift-samples is fewer
    # than the tasks: the drift samples are drawn one task at least each.
    used = set(
        json.loads((out / f"{model.name}-w4a16" / "quantkit.json").read_text())["calibration"]["sample_ids"]
    )
    rows = [json.loads(line) for line in (calib / "samples.jsonl").read_text().splitlines()]
    held_out_tasks = {row["task"] for row in rows if row["id"] not in used}
    assert len(held_out_tasks) > OPTIONS["drift_samples"]
    assert set(measured[0].losses) == held_out_tasks
    data = json.loads((out / "build.json").read_text())
    assert data["complete"] and data["requested"] == ["probe-a", "probe-b"]
    worse, better = sorted(measured, key=lambda m: m.worst_loss, reverse=True)
    assert worse.worst_loss > better.worst_loss > 0, (worse.losses, better.losses)
    return {"model": model, "calib": calib, "out": out, "worse": worse, "better": better}


def test_primary_over_budget_ends_on_a_promoted_or_fallback_candidate(setup, tmp_path):
    worse, better = setup["worse"], setup["better"]
    budget = float(f"{(worse.worst_loss + better.worst_loss) / 2:.6g}")
    steps = [5.0] if worse.recipe == "w4a16" else []  # promotion applies to 4-bit group recipes
    file = targets_file(tmp_path, target("gated", worse.recipe, avg_bits=steps, fallbacks=[better.recipe]))
    args = ["build", "--target", "gated", "--model", str(setup["model"]), "--calib", str(setup["calib"])]
    args += ["--output-root", str(setup["out"]), "--max-loss", str(budget), "--targets-file", str(file)]
    result = runner.invoke(app, [*args, *CLI_OPTIONS])
    assert result.exit_code == 0, result.output
    build = json.loads((setup["out"] / "build.json").read_text())
    (gated,) = build["targets"]
    chain = gated["chain"]
    assert chain[0]["recipe"] == worse.recipe and chain[0]["avg_bits"] is None
    assert chain[0]["verdict"] == "over budget" and chain[0]["cached"] is True  # measured above
    assert chain[0]["worst_loss"] == pytest.approx(worse.worst_loss)
    kept = chain[-1]
    assert kept["verdict"] == "kept" and kept["worst_loss"] <= budget
    assert (kept["recipe"], kept["avg_bits"]) in [(worse.recipe, b) for b in steps] + [(better.recipe, None)]
    assert all(step["verdict"] == "over budget" for step in chain[:-1])
    assert gated["status"] == "passed" and gated["checkpoint"] == kept["checkpoint"]
    assert f"Target gated: candidates tried (budget {budget}% per task)" in result.output
    # The card of the kept checkpoint records the chain and what "loss" means.
    card = (Path(kept["checkpoint"]) / "README.md").read_text()
    assert "## Build: accuracy gate" in card and "KL(original || quantized)" in card
    assert f"| 1 | {worse.recipe} | - |" in card and "over budget" in card


def test_a_4bit_recipe_over_budget_is_promoted_before_the_fallbacks(setup, tmp_path):
    four = next(m for m in (setup["worse"], setup["better"]) if m.recipe == "w4a16")
    budget = float(f"{four.worst_loss / 2:.6g}")
    file = targets_file(
        tmp_path, target("promote", "w4a16", budget, avg_bits=[5.0], fallbacks=["fp8-dynamic"])
    )
    report = build_checkpoints(
        setup["model"], setup["out"], ["promote"], calib=setup["calib"], targets_file=file, **OPTIONS
    )
    (built,) = report.targets
    first, promoted = built.chain[:2]
    assert (first.recipe, first.verdict, first.cached) == ("w4a16", "over budget", True)
    assert (promoted.recipe, promoted.avg_bits, promoted.cached) == ("w4a16", 5.0, False)
    assert promoted.size_ratio > first.size_ratio  # the most sensitive layers went to 8 bits
    precision = json.loads((Path(promoted.checkpoint) / "quantkit.json").read_text())["precision"]
    assert precision["avg_bits_requested"] == 5.0
    # Kept if it meets the budget, else the fallback was tried next.
    assert promoted.verdict == ("kept" if promoted.worst_loss <= budget else "over budget")
    if promoted.verdict == "over budget":
        assert built.chain[2].recipe == "fp8-dynamic"


def test_nothing_meets_the_budget_fails_that_target_only(setup, tmp_path):
    worse, better = setup["worse"], setup["better"]
    budget = float(f"{better.worst_loss / 2:.6g}")  # below both candidates
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
    tight, loose = build["targets"]
    assert tight["status"] == "failed" and tight["checkpoint"] is None
    steps = [(s["recipe"], s["verdict"]) for s in tight["chain"]]
    assert steps == [(worse.recipe, "over budget"), (better.recipe, "over budget")]
    for step in tight["chain"]:
        assert step["worst_task"] in step["losses"] and step["worst_loss"] > budget and step["size_ratio"]
        assert f"{step['worst_loss']:.3g}%" in result.output
    # The other target in the same command built.
    assert loose["status"] == "passed" and (Path(loose["checkpoint"]) / "quantkit.json").is_file()
    assert loose["chain"][0]["recipe"] == "fp8" and loose["chain"][0]["cached"] is False
    # The card of a candidate nothing kept says so, and why.
    card = (Path(tight["chain"][0]["checkpoint"]) / "README.md").read_text()
    assert "did not keep this checkpoint" in card and "Not kept for target `tight`" in card


def test_rebuilt_chain_reuses_cached_candidates(setup, tmp_path):
    worse, better = setup["worse"], setup["better"]
    file = targets_file(
        tmp_path, target("again", worse.recipe, worse.worst_loss / 2, fallbacks=[better.recipe])
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

    if skills.committed_weights() is None:
        pytest.skip("no trained tiny-omni-skills weights are committed (issue 17)")
    model = build_zoo_model("tiny-omni-skills", tmp_path / "skills")
    file = targets_file(tmp_path, target("eval", "fp8-dynamic"))
    out = tmp_path / "out"
    args = ["build", "--target", "eval", "--model", str(model), "--output-root", str(out)]
    args += ["--targets-file", str(file), "--eval-tasks", "caption", "--eval-items", "6"]
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
    # A budget below what it lost fails the target; none lost (0%) passes any budget.
    tight = build_checkpoints(
        model, out, ["eval"], targets_file=file, eval_tasks=["caption"], eval_items=6, max_loss=0
    )
    assert tight.targets[0].status == ("passed" if expected <= 0 else "failed")
    assert tight.targets[0].chain[0].cached and tight.checkpoints[0].eval_scores == scores  # from build.json


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--num-samples", "40"], "no held-out sample"),  # the whole set calibrates: nothing to judge on
        (["--drift-samples", "0"], "--drift-samples"),
        (["--eval-items", "0"], "--eval-items"),
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
