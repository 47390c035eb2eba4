"""Hardware targets and `quantkit build`: one checkpoint per target, failures isolated, re-runs skip."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from quantkit.build import build_checkpoints, load_targets
from quantkit.calibset import CalibrateOptions, build_calibration_set
from quantkit.cli import app
from quantkit.errors import InputError
from quantkit.recipes import get_recipe, list_recipes

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def omni_calib(zoo_model, demo_pool, tmp_path_factory) -> Path:
    calib = tmp_path_factory.mktemp("build-calib") / "set"
    model = zoo_model("tiny-qwen2.5-omni")
    build_calibration_set([demo_pool], calib, CalibrateOptions(size=40, model=model, max_seq_len=1024))
    return calib


def test_targets_file_follows_the_seed_and_names_real_recipes():
    targets = {t.name: t for t in load_targets().targets}
    assert targets["h20"].recipe == "fp8"  # seed: H20 -> FP8
    assert targets["rtx4090"].recipe == "w4a16"  # seed: 4090 -> W4A16
    assert targets["ampere"].recipe in ("w8a8-sq-gptq", "w4a16")  # no FP8 tensor cores before Ada
    assert targets["cpu"].recipe == "w8a8-sq-gptq"
    for target in targets.values():
        for name in (target.recipe, *(f.recipe for f in target.fallbacks)):
            get_recipe(name)
    # Together the targets exercise every built-in recipe (first choices or fallbacks).
    assert {t.recipe for t in targets.values()} == {"fp8", "fp8-dynamic", "w4a16", "w8a8-sq-gptq", "nvfp4"}
    reached = {t.recipe for t in targets.values()} | {f.recipe for t in targets.values() for f in t.fallbacks}
    assert reached == {info.name for info in list_recipes()}


def test_targets_cli_prints_table_and_unknown_target_suggests():
    result = runner.invoke(app, ["targets"])
    assert result.exit_code == 0 and "rtx4090" in result.output and "w4a16" in result.output
    with pytest.raises(InputError, match="did you mean 'rtx4090'"):
        load_targets().get("rtx4080x")


def test_invalid_targets_file_names_field(tmp_path):
    bad = tmp_path / "targets.yaml"
    bad.write_text("version: 1\ntargets:\n  - {name: x, hardware: [A], recipe: w5a5, why: test}\n")
    with pytest.raises(InputError, match="unknown recipe 'w5a5'") as err:
        load_targets(bad)
    assert err.value.line == 3


@pytest.mark.slow
def test_build_two_targets_then_rerun_skips(zoo_model, omni_calib, tmp_path):
    model = zoo_model("tiny-qwen2.5-omni")
    out = tmp_path / "checkpoints"  # the workflow's output root
    args = ["build", "--target", "rtx4090", "--target", "l40s", "--model", str(model)]
    args += [
        "--calib",
        str(omni_calib),
        "--output-root",
        str(out),
        "--num-samples",
        "12",
        "--drift-samples",
        "4",
        "--accept-unresolved",  # a few held-out rows per task: unresolved tasks kept, with a warning
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "Build summary" in first.output
    build = json.loads((out / "build.json").read_text())
    assert build["passed"] is True
    by_recipe = {c["recipe"]: c for c in build["checkpoints"]}
    assert set(by_recipe) == {"w4a16", "fp8-dynamic"}
    for recipe, entry in by_recipe.items():
        checkpoint = Path(entry["checkpoint"])
        assert checkpoint == out / f"{model.name}-{recipe}"
        assert (checkpoint / "quantkit.json").is_file() and (checkpoint / "verify.json").is_file()
        assert entry["status"] == "passed" and entry["drift"]["kl"] > 0
    assert by_recipe["w4a16"]["size_ratio"] < 0.3  # int4 plus group scales
    # The CI workflow uploads each target's kept checkpoint only.
    kept = {t["name"]: t["checkpoint"] for t in build["targets"]}
    assert (
        run_kept_checkpoint_step(tmp_path, "rtx4090") == kept["rtx4090"] == by_recipe["w4a16"]["checkpoint"]
    )
    assert run_kept_checkpoint_step(tmp_path, "h20") == "checkpoints/build.json"  # not built here
    # Same inputs: both are skipped.
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    again = json.loads((out / "build.json").read_text())
    assert [c["status"] for c in again["checkpoints"]] == ["up-to-date", "up-to-date"]
    # --force rebuilds.
    forced = build_checkpoints(
        model,
        out,
        ["l40s"],
        calib=omni_calib,
        num_samples=12,
        drift_samples=4,
        force=True,
        accept_unresolved=True,
    )
    assert [c.status for c in forced.checkpoints] == ["passed"]


@pytest.mark.slow
def test_failing_target_leaves_the_other_complete(zoo_model, demo_pool, tmp_path):
    """Qwen3-Omni-MoE's W8A8 output cannot be reloaded by transformers: the ampere target is
    refused up front, the l40s target (fp8-dynamic) completes, the exit code says one failed."""
    model = zoo_model("tiny-qwen3-omni-moe")
    calib = tmp_path / "calib"
    build_calibration_set([demo_pool], calib, CalibrateOptions(size=40, model=model, max_seq_len=1024))
    out = tmp_path / "out"
    args = ["build", "--target", "ampere", "--target", "l40s", "--model", str(model), "--calib", str(calib)]
    result = runner.invoke(
        app, [*args, "--output-root", str(out), "--num-samples", "8", "--accept-unresolved"]
    )
    assert result.exit_code == 1, result.output
    build = json.loads((out / "build.json").read_text())
    status = {c["recipe"]: c for c in build["checkpoints"]}
    assert status["w8a8-sq-gptq"]["status"] == "error"
    assert "cannot reload" in status["w8a8-sq-gptq"]["reasons"][0]
    assert status["fp8-dynamic"]["status"] == "passed"
    assert (out / f"{model.name}-fp8-dynamic" / "quantkit.json").is_file()
    assert not (out / f"{model.name}-w8a8-sq-gptq").exists()


def test_build_needs_calib_for_data_recipes(zoo_model, tmp_path):
    result = runner.invoke(
        app,
        [
            "build",
            "--target",
            "rtx4090",
            "--model",
            str(zoo_model("tiny-qwen3")),
            "--output-root",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2 and "--calib" in result.output


def test_workflow_is_valid_and_runs_the_tested_commands():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "checkpoints.yml").read_text())
    job = workflow["jobs"]["build"]
    targets = {t.name for t in load_targets().targets}
    assert set(job["strategy"]["matrix"]["target"]) == targets
    assert job["strategy"]["fail-fast"] is False
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs[0] == "make install"
    calibrate, build = (shlex.split(run) for run in runs[1:3])
    # The same commands the tests drive through the CLI above.
    assert calibrate[:2] == [".venv/bin/quantkit", "calibrate"] and "--model" in calibrate
    assert build[:2] == [".venv/bin/quantkit", "build"]
    assert "--target ${{ matrix.target }}" in runs[2]
    for option in ("--model", "--calib", "--output-root"):
        assert option in build
    uploads = [step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and "checkpoints/build.json" in uploads[0]["with"]["path"]
    # Only the kept checkpoint, as build.json names it (test_build_two_targets_then_rerun_skips
    # runs the step on a real build.json), not every candidate folder.
    assert uploads[0]["with"]["path"].splitlines() == [
        "${{ steps.kept.outputs.path }}",
        "checkpoints/build.json",
    ]
    assert "build.json" in kept_checkpoint_step(workflow)
    # A build that exits 2 before writing build.json: neither step runs (the job shows the build's
    # error, not a missing-file error of its own).
    (kept,) = [s for s in job["steps"] if s.get("id") == "kept"]
    for step in (kept, uploads[0]):
        assert step["if"] == "always() && hashFiles('checkpoints/build.json') != ''"


def kept_checkpoint_step(workflow: dict) -> str:
    (step,) = [s for s in workflow["jobs"]["build"]["steps"] if s.get("id") == "kept"]
    return step["run"]


def run_kept_checkpoint_step(folder: Path, target: str) -> str:
    """The workflow's step that finds the kept checkpoint, run in ``folder`` (which holds
    checkpoints/build.json) for ``target``: the path it hands the upload step."""
    import subprocess
    import sys

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "checkpoints.yml").read_text())
    command = kept_checkpoint_step(workflow).replace("${{ matrix.target }}", target)
    command = command.replace(".venv/bin/python", shlex.quote(sys.executable))
    output = folder / "github-output"
    output.write_text("")
    subprocess.run(["bash", "-c", command], cwd=folder, env={"GITHUB_OUTPUT": str(output)}, check=True)
    (line,) = output.read_text().splitlines()
    assert line.startswith("path=")
    return line.removeprefix("path=")


@pytest.mark.parametrize(
    ("fallback", "message"),
    [
        ("{recipe: fp8, when: a task loses accuracy, why: x}", "a condition, not prose"),
        (
            "{recipe: fp8, when: {on_request: true, no_calibration_data: true}, why: x}",
            "on_request: true alone",
        ),
        ("{recipe: fp8, when: {task_loss_above: 1.5, sometimes: true}, why: x}", "sometimes"),
        (
            "{recipe: fp8, when: {task_loss_above: 150}, why: x}",
            r"150.0: a loss in \[0, 100\] \(pts of drift loss",
        ),
        # Strict types: YAML's true is not the number 1, nor 1 the boolean true.
        ("{recipe: fp8, when: {task_loss_above: true}, why: x}", "a valid number"),
        ("{recipe: fp8, when: {no_calibration_data: 1}, why: x}", "a valid boolean"),
    ],
)
def test_fallback_when_is_a_checked_condition(tmp_path, fallback, message):
    bad = tmp_path / "targets.yaml"
    bad.write_text(
        f"version: 1\ntargets:\n  - name: x\n    hardware: [A]\n    recipe: w4a16\n    why: test\n"
        f"    fallbacks:\n      - {fallback}\n"
    )
    with pytest.raises(InputError, match=message) as err:
        load_targets(bad)
    assert err.value.line == 8 and "fallbacks.0.when" in str(err.value)
    assert str(err.value).startswith(f"{bad}:8: target 'x': ")  # the file, its line, the target


def test_a_recipe_twice_in_a_chain_is_refused_naming_the_target(tmp_path):
    bad = tmp_path / "targets.yaml"
    bad.write_text(
        "version: 1\ntargets:\n  - {name: a, hardware: [A], recipe: fp8, why: t}\n"
        "  - name: b\n    hardware: [A]\n    recipe: w4a16\n    why: t\n    fallbacks:\n"
        "      - {recipe: fp8, when: {task_loss_above: max_loss}, why: x}\n"
        "      - {recipe: fp8, when: {on_request: true}, why: y}\n"
    )
    with pytest.raises(InputError, match="fp8 more than once") as err:
        load_targets(bad)
    assert str(err.value).startswith(f"{bad}:4: target 'b': ")
    bad.write_text(
        bad.read_text()
        .replace("recipe: w4a16", "recipe: fp8")
        .replace("recipe: fp8, when: {on", "recipe: fp8-dynamic, when: {on")
    )
    with pytest.raises(InputError, match="fp8 more than once"):  # a fallback repeating the recipe
        load_targets(bad)


def test_avg_bits_steps_only_for_4bit_group_recipes_and_rising(tmp_path):
    bad = tmp_path / "targets.yaml"
    for recipe, steps, message in (
        ("fp8", "[4.5]", "avg_bits promotes"),
        ("w4a16", "[5.0, 4.5]", "must rise"),
    ):
        bad.write_text(
            f"version: 1\ntargets:\n  - {{name: x, hardware: [A], recipe: {recipe}, why: t, avg_bits: {steps}}}\n"
        )
        with pytest.raises(InputError, match=message):
            load_targets(bad)


def test_every_target_has_a_budget_and_a_machine_readable_chain():
    for target in load_targets().targets:
        assert 0 < target.max_loss <= 100
        for fallback in target.fallbacks:
            assert fallback.why and fallback.when.describe()
    rtx4090 = load_targets().get("rtx4090")
    assert rtx4090.avg_bits and rtx4090.avg_bits == sorted(rtx4090.avg_bits)


def test_build_without_calib_takes_the_data_free_fallback(zoo_model, tmp_path):
    """h20's fp8 calibrates on data; its fp8-dynamic fallback is for "no calibration data"."""
    model = zoo_model("tiny-qwen3")
    report = build_checkpoints(model, tmp_path / "out", ["h20"])
    (h20,) = report.targets
    assert h20.status == "passed" and [s.recipe for s in h20.chain] == ["fp8-dynamic"]
    assert h20.chain[0].why == "no calibration data" and "loss not measured" in h20.chain[0].detail
    assert any("fp8 not tried" in note for note in h20.notes)


def test_build_refuses_bad_gate_options_before_building(zoo_model, tmp_path):
    model = str(zoo_model("tiny-qwen3"))
    base = ["build", "--target", "l40s", "--model", model, "--output-root", str(tmp_path / "out")]
    no_skills = runner.invoke(app, [*base, "--eval-tasks", "caption"])
    assert no_skills.exit_code == 2 and "skills.json" in no_skills.output
    too_much = runner.invoke(app, [*base, "--max-loss", "150"])
    assert too_much.exit_code == 2 and "--max-loss 150" in too_much.output
    assert not (tmp_path / "out" / "build.json").exists()


def test_loss_positions_are_the_answer_or_else_the_text():
    """`build`'s loss mask: the positions predicting the answer's tokens; without an answer (the
    prompt rendering covers the whole sample), those predicting text, not media placeholders."""
    from quantkit.verify.drift import ANSWER_SCOPE, TEXT_SCOPE, loss_positions

    ids = [1, 9, 9, 9, 2, 5, 6, 7]  # 9: an image placeholder; the answer starts at index 5
    mask, scope = loss_positions(ids, 5, {9})
    assert scope == ANSWER_SCOPE and mask.tolist() == [False] * 4 + [True] * 3 + [False]
    mask, scope = loss_positions(ids, len(ids), {9})
    assert scope == TEXT_SCOPE
    assert mask.tolist() == [False, False, False, True, True, True, True, False]


def _data_free_targets(folder: Path, *names: str) -> Path:
    """Targets on fp8-dynamic (data-free: no --calib, the cheapest build)."""
    entries = [
        {"name": n, "hardware": ["test GPU"], "recipe": "fp8-dynamic", "why": "test", "max_loss": 100.0}
        for n in names
    ]
    path = folder / "targets.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "targets": entries}, sort_keys=False))
    return path


def test_a_target_whose_kept_checkpoint_a_later_run_rebuilt_is_stale(zoo_model, tmp_path):
    """Target A keeps a folder; a later run for B rebuilds that folder (--force): A's record no
    longer says "passed" with that folder, build.json's kept_for and the card follow."""
    model, out = zoo_model("tiny-qwen3"), tmp_path / "out"
    file = _data_free_targets(tmp_path, "a", "b")
    (a,) = build_checkpoints(model, out, ["a"], targets_file=file).targets
    folder = a.checkpoint
    assert a.status == "passed" and folder
    build_checkpoints(model, out, ["b"], targets_file=file, force=True)
    data = json.loads((out / "build.json").read_text())
    targets = {t["name"]: t for t in data["targets"]}
    assert targets["a"]["status"] == "stale" and targets["a"]["checkpoint"] is None
    assert any("rebuilt by a later run (for target b)" in note for note in targets["a"]["notes"])
    assert targets["b"]["status"] == "passed" and targets["b"]["checkpoint"] == folder
    # The file's verdict covers every record in it: a's stale one too; this run's is this_run.
    assert data["passed"] is False and data["complete"] is False
    assert data["this_run"] == {"targets": ["b"], "passed": True, "complete": True}
    (entry,) = [c for c in [*data["checkpoints"], *data["earlier"]] if c["checkpoint"] == folder]
    assert entry["kept_for"] == ["b"]
    card = (Path(folder) / "README.md").read_text()
    assert "Target `b`" in card and "Target `a` kept an earlier build of this folder" in card
    # A later run that does not rebuild the folder leaves a stale record stale.
    build_checkpoints(model, out, ["b"], targets_file=file)
    again = {t["name"]: t for t in json.loads((out / "build.json").read_text())["targets"]}
    assert again["a"]["status"] == "stale" and again["a"]["checkpoint"] is None


def test_the_same_model_by_another_path_keeps_records_another_model_does_not_merge(
    zoo_model, tmp_path, monkeypatch
):
    """ "The same model" is its bytes (build.json's model_hash), not the path it was given by."""
    model, out = zoo_model("tiny-qwen3"), tmp_path / "out"
    file = _data_free_targets(tmp_path, "a", "b", "c")
    build_checkpoints(model, out, ["a"], targets_file=file)
    data = json.loads((out / "build.json").read_text())
    assert data["model_hash"] and data["model"] == str(model)
    # The same model and output root by relative paths: the record of a is kept, its folder reused.
    monkeypatch.chdir(model.parent)
    relative = build_checkpoints(Path(model.name), Path(os.path.relpath(out)), ["b"], targets_file=file)
    assert [c.status for c in relative.checkpoints] == ["up-to-date"]
    names = [t["name"] for t in json.loads((out / "build.json").read_text())["targets"]]
    assert names == ["a", "b"]
    # Another model (its config's bytes differ) built into the same root: nothing merged, and the
    # first model's card is left as it was.
    other = tmp_path / "other"
    shutil.copytree(model, other)
    config = json.loads((other / "config.json").read_text())
    config["rope_theta"] = 2 * config.get("rope_theta", 10000)
    (other / "config.json").write_text(json.dumps(config))
    card = Path(relative.checkpoints[0].checkpoint).resolve() / "README.md"
    before = card.read_text()
    build_checkpoints(other, out, ["c"], targets_file=file)
    data = json.loads((out / "build.json").read_text())
    assert [t["name"] for t in data["targets"]] == ["c"] and data["earlier"] == []
    assert data["model_hash"] != relative.model_hash
    assert card.read_text() == before


@pytest.mark.parametrize("error", [MemoryError, RecursionError, "torch.OutOfMemoryError"])
def test_out_of_memory_in_a_candidate_is_raised_not_recorded(zoo_model, tmp_path, monkeypatch, error):
    """Out of memory (or stack) is the machine's state: the build stops with it instead of
    recording a failed candidate and judging the next on the same machine."""
    import torch

    import quantkit.quantize

    if error == "torch.OutOfMemoryError":  # what a CUDA allocation raises (a RuntimeError)
        error = torch.OutOfMemoryError

    def exhausted(*args, **kwargs):
        raise error("exhausted")

    monkeypatch.setattr(quantkit.quantize, "quantize", exhausted)
    file = _data_free_targets(tmp_path, "a")
    with pytest.raises(error, match="exhausted"):
        build_checkpoints(zoo_model("tiny-qwen3"), tmp_path / "out", ["a"], targets_file=file)


def _no_calib_targets(
    folder: Path, chains: dict[str, list[str]], recipes: dict[str, str] | None = None
) -> Path:
    """Targets on fp8 (which calibrates: not tried without --calib), or on ``recipes[name]``, whose
    fallbacks, for "no calibration data", are ``chains[name]`` in that order."""
    entries = [
        {
            "name": name,
            "hardware": ["test GPU"],
            "recipe": (recipes or {}).get(name, "fp8"),
            "why": "test",
            "max_loss": 100.0,
            "fallbacks": [
                {"recipe": r, "when": {"no_calibration_data": True}, "why": "test"} for r in fallbacks
            ],
        }
        for name, fallbacks in chains.items()
    ]
    path = folder / "targets.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "targets": entries}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def wide_mlp_qwen3(zoo_model, tmp_path_factory) -> Path:
    """tiny-qwen3 with an MLP width of 576 (SmolLM2's: 4.5 x 128): fp8-block's 128x128 blocks do
    not divide down_proj's input, so quantize's plan refuses that recipe from the config."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from quantkit.export.files import copy_sidecar_files

    source = zoo_model("tiny-qwen3")
    output = tmp_path_factory.mktemp("wide") / "wide-qwen3"
    config = json.loads((source / "config.json").read_text())
    config.update(intermediate_size=576)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in config.items() if k != "architectures"}))
    model.to(torch.bfloat16).save_pretrained(output)
    copy_sidecar_files(source, output)
    return output


def test_a_candidate_the_plan_cannot_size_is_tried_last_and_says_why(wide_mlp_qwen3, tmp_path):
    """The plan refuses fp8-block for this model (a QuantkitError): that candidate is ordered
    after those it can size, and when it is tried its record and the screen say its size was
    unknown and why."""
    file = _no_calib_targets(tmp_path, {"ordered": ["fp8-block", "fp8-dynamic"], "blocky": ["fp8-block"]})
    out = tmp_path / "out"
    args = ["build", "--target", "ordered", "--target", "blocky", "--model", str(wide_mlp_qwen3)]
    result = runner.invoke(app, [*args, "--output-root", str(out), "--targets-file", str(file)])
    assert result.exit_code == 1, result.output  # blocky has nothing that builds
    targets = {t["name"]: t for t in json.loads((out / "build.json").read_text())["targets"]}
    (kept,) = targets["ordered"]["chain"]  # fp8-dynamic first, though listed second; then kept
    assert (kept["recipe"], kept["verdict"], kept["size_unknown"]) == ("fp8-dynamic", "kept", None)
    assert kept["predicted_bytes"] > 0
    (tried,) = targets["blocky"]["chain"]
    assert (tried["recipe"], tried["verdict"], tried["predicted_bytes"]) == ("fp8-block", "error", None)
    assert (
        tried["size_unknown"].startswith("size unknown, tried last")
        and "128x128 blocks" in tried["size_unknown"]
    )
    assert "fp8-block: size unknown, tried last" in " ".join(result.output.split())
    # A run for ordered alone passes (its exit code); the file still records blocky's failure.
    again = runner.invoke(app, [*args[:3], *args[5:], "--output-root", str(out), "--targets-file", str(file)])
    assert again.exit_code == 0, again.output
    data = json.loads((out / "build.json").read_text())
    assert data["this_run"] == {"targets": ["ordered"], "passed": True, "complete": True}
    assert data["passed"] is False and data["complete"] is True
    assert {t["name"]: t["status"] for t in data["targets"]} == {"ordered": "passed", "blocky": "failed"}


def test_a_library_error_of_the_plan_makes_the_size_unknown_and_the_build_goes_on(
    zoo_model, tmp_path, monkeypatch
):
    """A library's error sizing a candidate (not the plan's own refusal) makes its size unknown:
    the candidate is still tried, last, its record says the plan failed and how, and the later
    targets are built (one target failing keeps the others)."""
    import quantkit.quantize.preflight

    def broken_plan(*args, **kwargs):  # the ordering's resolution only; quantize resolves for itself
        raise KeyError("model_type")

    monkeypatch.setattr(quantkit.quantize.preflight, "resolve_from_config", broken_plan)
    file = _no_calib_targets(tmp_path, {"a": ["fp8-dynamic"], "b": ["fp8-block"]})
    report = build_checkpoints(zoo_model("tiny-qwen3"), tmp_path / "out", ["a", "b"], targets_file=file)
    assert [t.name for t in report.targets] == ["a", "b"]
    for target, recipe in zip(report.targets, ["fp8-dynamic", "fp8-block"], strict=True):
        (step,) = target.chain
        assert (step.recipe, step.predicted_bytes) == (recipe, None)
        assert step.size_unknown == "size unknown, tried last: the plan failed: KeyError: 'model_type'"
        assert target.status == "passed", step.detail


def test_out_of_memory_in_the_plan_is_raised(zoo_model, tmp_path, monkeypatch):
    import quantkit.quantize.preflight

    def exhausted(*args, **kwargs):
        raise MemoryError("exhausted")

    monkeypatch.setattr(quantkit.quantize.preflight, "resolve_from_config", exhausted)
    file = _no_calib_targets(tmp_path, {"a": ["fp8-dynamic"]})
    with pytest.raises(MemoryError, match="exhausted"):
        build_checkpoints(zoo_model("tiny-qwen3"), tmp_path / "out", ["a"], targets_file=file)


def test_a_card_that_cannot_be_rewritten_is_a_warning_and_the_other_cards_are_written(zoo_model, tmp_path):
    """A kept checkpoint's README.md that is not UTF-8 (edited elsewhere): rewriting its build
    section fails with a library's error; the build records and prints a warning, writes the
    other cards, and exits by its targets (0)."""
    model, out = zoo_model("tiny-qwen3"), tmp_path / "out"
    file = _no_calib_targets(tmp_path, {"a": ["fp8-dynamic"], "b": ["fp8-block"]})
    (a,) = build_checkpoints(model, out, ["a"], targets_file=file).targets
    card = Path(a.checkpoint) / "README.md"
    card.write_bytes(b"\xff\xfe a card saved in UTF-16\n")
    args = ["build", "--target", "a", "--target", "b", "--model", str(model), "--output-root", str(out)]
    result = runner.invoke(app, [*args, "--targets-file", str(file)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "build.json").read_text())
    (warning,) = data["warnings"]
    assert warning.startswith(f"{a.checkpoint}: model card not updated: UnicodeDecodeError")
    assert "model card not updated: UnicodeDecodeError" in " ".join(result.output.split())
    assert card.read_bytes() == b"\xff\xfe a card saved in UTF-16\n"  # left as it was
    b = {t["name"]: t for t in data["targets"]}["b"]
    assert b["status"] == "passed" and "Target `b`" in (Path(b["checkpoint"]) / "README.md").read_text()


def test_a_disk_error_rewriting_a_card_exits_1(zoo_model, tmp_path):
    """A card the disk cannot write (here: a folder where README.md goes, as a full disk would
    fail it) is not a warning: the file-system error exits 1, with the file named, no traceback."""
    model, out = zoo_model("tiny-qwen3"), tmp_path / "out"
    file = _no_calib_targets(tmp_path, {"a": ["fp8-dynamic"]})
    (a,) = build_checkpoints(model, out, ["a"], targets_file=file).targets
    card = Path(a.checkpoint) / "README.md"
    card.unlink()
    card.mkdir()
    args = ["build", "--target", "a", "--model", str(model), "--output-root", str(out)]
    result = runner.invoke(app, [*args, "--targets-file", str(file)])
    assert result.exit_code == 1, result.output
    assert "README.md" in result.output and "Traceback" not in result.output


def _skills_model_whose_original_raises(tmp_path: Path, monkeypatch, error: Exception) -> Path:
    """tiny-omni-skills, whose scoring raises ``error`` on the original model (where a kernel
    would raise it: inside score_model; candidates are scored for real)."""
    import quantkit.eval.skills
    from quantkit.zoo import skills
    from quantkit.zoo.models import build_zoo_model

    assert skills.committed_weights() is not None, f"the trained weights are committed: {skills.WEIGHTS}"
    model = build_zoo_model("tiny-omni-skills", tmp_path / "skills")
    real = quantkit.eval.skills.score_model

    def original_fails(model_dir, *args, **kwargs):
        if Path(model_dir) == model:
            raise error
        return real(model_dir, *args, **kwargs)

    monkeypatch.setattr(quantkit.eval.skills, "score_model", original_fails)
    return model


def test_an_error_scoring_the_original_fails_its_targets_and_the_build_goes_on(tmp_path, monkeypatch):
    """--eval-tasks: the original cannot be scored (a library's error): it is scored before any
    quantize (the gate's items are checked up front), so each target fails with that error (its
    traceback in build.json), nothing is built, and the command exits 1 without a traceback on
    screen."""
    error = RuntimeError("CUDA error: device-side assert triggered")
    model = _skills_model_whose_original_raises(tmp_path, monkeypatch, error)
    chains = {"a": ["fp8-dynamic", "fp8-block"], "b": ["fp8-block"], "c": ["fp8-block"]}
    file = _no_calib_targets(tmp_path, chains, recipes={"c": "fp8-dynamic"})
    out = tmp_path / "out"
    args = ["build", "--target", "a", "--target", "b", "--target", "c", "--model", str(model)]
    args += ["--output-root", str(out)]
    args += ["--targets-file", str(file), "--eval-tasks", "caption", "--gate-items", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "original_fails" not in result.output  # its traceback is build.json's, not the screen's
    assert "scoring the original model: RuntimeError: CUDA error" in " ".join(result.output.split())
    data = json.loads((out / "build.json").read_text())
    assert data["complete"] and data["eval_original"] is None
    for target in data["targets"]:
        assert target["status"] == "failed" and target["checkpoint"] is None
        assert (
            target["error"]
            == "scoring the original model: RuntimeError: CUDA error: device-side assert triggered"
        )
        assert "original_fails" in target["traceback"]
        assert target["chain"] == []  # no candidate is built to be judged on nothing
    assert [t["name"] for t in data["targets"]] == ["a", "b", "c"]
    assert data["checkpoints"] == [] and not [p for p in out.iterdir() if p.is_dir() and p.name != ".cache"]


def test_out_of_memory_scoring_the_original_is_raised(tmp_path, monkeypatch):
    model = _skills_model_whose_original_raises(tmp_path, monkeypatch, MemoryError("exhausted"))
    file = _no_calib_targets(tmp_path, {"a": ["fp8-dynamic"]})
    with pytest.raises(MemoryError, match="exhausted"):
        build_checkpoints(
            model, tmp_path / "out", ["a"], targets_file=file, eval_tasks=["caption"], gate_items=2
        )


def test_drift_losses_read_in_points_and_eval_task_losses_in_percent():
    """The drift loss is percentage points of answer-token accuracy; an --eval-tasks loss is
    100% - recovery: each judgement, chain table and card names its own unit and the interval,
    and a budget judged against both says both."""
    from quantkit.build.card import card_section
    from quantkit.build.judge import budget_text, judge
    from quantkit.build.record import CheckpointBuild, TargetBuild

    def judged(losses: dict[str, tuple[float, float, float]], max_loss: float):
        intervals = {
            task: {"n": 8, "loss": loss, "ci_low": low, "ci_high": high, "metric": "m", "items": "h"}
            for task, (loss, low, high) in losses.items()
        }
        drift = {k: v for k, v in intervals.items() if not k.startswith("eval ")}
        scored = {k: v for k, v in intervals.items() if k.startswith("eval ")}
        entry = CheckpointBuild(["t"], "w4a16", "/ckpt", "passed", "key", size_ratio=0.3)
        entry.losses, entry.intervals = {k: v["loss"] for k, v in drift.items()}, drift
        return judge(entry, max_loss, scored, set(drift))

    drift = judged({"caption": (0.094, 0.08, 0.11), "ocr": (0.01, 0.0, 0.02)}, 0.05)
    assert drift.verdict == "over budget"
    assert drift.detail == "caption lost 0.094 [0.08, 0.11] pts (n=8), interval beyond 0.05"
    scored = judged({"caption": (0.01, 0.0, 0.02), "eval caption": (3.1, 2.0, 4.0)}, 1.5)
    assert scored.detail == "eval caption lost 3.1 [2, 4]% (n=8), interval beyond 1.5"
    target = TargetBuild("t", 1.5, "failed", chain=[scored])
    assert budget_text(TargetBuild("t", 0.05, "failed", chain=[drift])) == "0.05 pts"
    assert budget_text(target) == "1.5 (pts of drift loss, % of an eval task's score)"
    kept = judged({"caption": (0.094, 0.05, 0.2)}, 0.5)
    card = card_section("/ckpt", [TargetBuild("k", 0.5, "passed", "/ckpt", chain=[kept])])
    assert "(budget 0.5 pts per task)" in card and "| caption | 0.094 [0.05, 0.2] pts (n=8) |" in card
    assert (
        "budget 0.5 pts per task, 8 items per task; the worst task, caption, lost 0.094 [0.05, 0.2] pts"
        in card
    )


def test_unresolved_counts_as_failed_unless_accepted_and_then_warns():
    """An interval that holds the budget: the candidate is unresolved (the chain goes on) and
    says how many items would resolve it; --accept-unresolved keeps it with a note."""
    from quantkit.build.judge import judge
    from quantkit.build.record import CheckpointBuild

    entry = CheckpointBuild(["t"], "w4a16", "/ckpt", "passed", "key", size_ratio=0.3)
    entry.intervals = {
        "ocr": {"n": 12, "loss": 1.0, "ci_low": 0.2, "ci_high": 1.8, "metric": "m", "items": "h"}
    }
    step = judge(entry, 1.5, {}, {"ocr"})
    assert step.verdict == "unresolved" and step.tasks["ocr"]["verdict"] == "unresolved"
    assert step.tasks["ocr"]["items_to_resolve"] == 31  # 12 x (0.8 / 0.5)**2
    assert "about 31 items would resolve it" in step.detail
    accepted = judge(entry, 1.5, {}, {"ocr"}, accept_unresolved=True)
    assert accepted.verdict == "kept" and accepted.accepted_unresolved == ["ocr"]
    assert accepted.detail.startswith("kept with --accept-unresolved")
    from quantkit.build.record import TargetBuild
    from quantkit.cli.build import target_status

    # The summary's status says so even where the worst task shown passed.
    assert target_status(TargetBuild("t", 1.5, "passed", "/ckpt", chain=[accepted])) == (
        "passed, 1 unresolved accepted"
    )
    entry.intervals["ocr"]["n"] = 3  # under MIN_ITEMS: unresolved whatever its interval
    few = judge(entry, 1.5, {}, {"ocr"})
    assert (
        few.verdict == "unresolved"
        and "ocr lost 1 [0.2, 1.8] pts (n=3), fewer items than an interval needs" in few.detail
    )


@pytest.mark.slow
def test_a_budget_the_items_cannot_resolve_is_refused_before_any_quantize(tmp_path):
    """tiny-omni-skills scored on a few items of a 0-or-1 task: one item's change alone moves the
    loss past 1.5%, so no candidate that changes an answer could pass: exit 2, naming the task and
    what to do, before anything is quantized; --accept-unresolved says it and builds."""
    from quantkit.zoo import skills
    from quantkit.zoo.models import build_zoo_model

    if skills.committed_weights() is None:
        pytest.skip("no trained tiny-omni-skills weights are committed (issue 17)")
    model = build_zoo_model("tiny-omni-skills", tmp_path / "skills")
    file = _no_calib_targets(tmp_path, {"a": []}, recipes={"a": "fp8-dynamic"})
    out = tmp_path / "out"
    args = [
        "build",
        "--target",
        "a",
        "--model",
        str(model),
        "--output-root",
        str(out),
        "--targets-file",
        str(file),
    ]
    args += ["--eval-tasks", "ocr_digits", "--gate-items", "8", "--max-loss", "1.5"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2, refused.output
    said = " ".join(refused.output.split())
    assert "cannot resolve the budget even for a lossless candidate" in said and "eval ocr_digits" in said
    assert "--accept-unresolved" in said and not list(out.glob("*-fp8-dynamic"))
    accepted = runner.invoke(app, [*args, "--accept-unresolved"])
    assert "warning: unresolvable, accepted: eval ocr_digits" in " ".join(accepted.output.split())
    data = json.loads((out / "build.json").read_text())
    assert any(w.startswith("unresolvable, accepted: eval ocr_digits") for w in data["warnings"])
    (step,) = data["targets"][0]["chain"]
    record = step["tasks"]["eval ocr_digits"]
    assert (
        record["n"] == 8
        and record["metric"] == "exact"
        and record["ci_low"] <= record["loss"] <= record["ci_high"]
    )
    assert record["verdict"] in ("passed", "failed", "unresolved") and len(record["items"]) == 16


def test_a_build_loads_the_processor_once_and_reads_the_set_once(
    zoo_model, omni_calib, tmp_path, monkeypatch
):
    """Drawing the calibration samples, choosing the held-out rows and the original's forward on
    them share one processor load and one check of the set's hash (models.samples.open_set):
    counted up to the first candidate's quantize, which is stopped there."""
    import quantkit.calibset
    import quantkit.quantize
    from quantkit.models.adapters import Adapter

    loads, hashes = [], []
    load, sha256_file = Adapter.load_processor, quantkit.calibset.sha256_file

    def counted_load(self, model_dir, *args, **kwargs):
        loads.append(Path(model_dir))
        return load(self, model_dir, *args, **kwargs)

    def counted_hash(path):
        hashes.append(Path(path))
        return sha256_file(path)

    def stopped(*args, **kwargs):
        raise RuntimeError("stopped at the first candidate")

    monkeypatch.setattr(Adapter, "load_processor", counted_load)
    monkeypatch.setattr(quantkit.calibset, "sha256_file", counted_hash)
    monkeypatch.setattr(quantkit.quantize, "quantize", stopped)
    model = zoo_model("tiny-qwen2.5-omni")
    file = _data_free_targets(tmp_path, "a")
    report = build_checkpoints(
        model, tmp_path / "out", ["a"], calib=omni_calib, targets_file=file, accept_unresolved=True
    )
    assert "stopped at the first candidate" in report.checkpoints[0].reasons[0]
    assert loads == [model]
    assert [p for p in hashes if p.name == quantkit.calibset.SAMPLES_FILE] == [omni_calib / "samples.jsonl"]
