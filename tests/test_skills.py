"""tiny-omni-skills: its tasks, skills.json, deterministic training and the per-task scorers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from quantkit.eval.skills import (
    SCORERS,
    box_iou,
    evaluate_skills,
    exact_match,
    iou_hit,
    temporal_iou,
    word_error_rate,
)
from quantkit.synthetic.skills_tasks import TASKS, TASKS_BY_NAME, make_items, skills_manifest
from quantkit.zoo import skills

# ---------------------------------------------------------------------------------------------- scorers


def test_exact_match_ignores_case_and_spacing_only():
    assert exact_match(" 407 ", "407") == 1.0
    assert exact_match("A Red  Circle", "a red circle") == 1.0
    assert exact_match("408", "407") == 0.0
    assert exact_match("| 1 | 2 |\n| --- | --- |\n| 3 | 4 |", "| 1 | 2 |\n| --- | --- |\n| 3 | 4 |") == 1.0
    assert exact_match("| 1 | 2 |\n| --- | --- |\n| 3 | 5 |", "| 1 | 2 |\n| --- | --- |\n| 3 | 4 |") == 0.0


def test_box_iou_at_the_half_threshold():
    assert box_iou("[0, 0, 10, 10]", "[0, 0, 10, 10]") == 1.0
    assert box_iou("[0, 0, 10, 10]", "[5, 0, 15, 10]") == pytest.approx(50 / 150)
    assert iou_hit("[0, 0, 10, 10]", "[0, 0, 10, 20]") == 1.0  # IoU exactly 0.5
    assert iou_hit("[0, 0, 10, 10]", "[0, 0, 10, 21]") == 0.0
    assert iou_hit("the circle", "[0, 0, 10, 10]") == 0.0  # no box: a miss, not an error


def test_temporal_iou_of_spans():
    assert temporal_iou("1 to 3", "1 to 3") == 1.0
    assert temporal_iou("0 to 2", "1 to 3") == pytest.approx(1 / 3)
    assert temporal_iou("0 to 1", "2 to 3") == 0.0
    assert temporal_iou("3 to 1", "1 to 3") == 0.0  # a reversed span is wrong
    assert temporal_iou("soon", "1 to 3") == 0.0


def test_word_error_rate_counts_substitutions_deletions_insertions():
    assert word_error_rate("red one blue", "red one blue") == 0.0
    assert word_error_rate("red two blue", "red one blue") == pytest.approx(1 / 3)
    assert word_error_rate("red blue", "red one blue") == pytest.approx(1 / 3)
    assert word_error_rate("red one one blue", "red one blue") == pytest.approx(1 / 3)
    assert SCORERS["wer"]("green green green green", "red one") == 0.0  # 1 - WER floored at 0


# ---------------------------------------------------------------------------------------------- tasks


def _pattern(template: str) -> str:
    return "".join(
        r"\S+" if part.startswith("{") else re.escape(part) for part in re.split(r"({\w+})", template) if part
    )


def test_skills_manifest_is_what_training_draws():
    manifest = skills_manifest()
    assert [t["name"] for t in manifest["tasks"]] == [t.name for t in TASKS]
    assert set(skills.SCHEDULE) == set(TASKS_BY_NAME), "every task in skills.json is trained, and only those"
    for entry in manifest["tasks"]:
        for step in range(len(skills.SCHEDULE)):
            if skills.SCHEDULE[step] != entry["name"]:
                continue
            for item in skills.step_batch(seed=0, step=step)[:4]:
                assert item.task == entry["name"]
                assert re.fullmatch(_pattern(entry["prompt_template"]), item.prompt), item.prompt
            break
        assert entry["metric"] in SCORERS


def test_answers_are_true_for_the_media():
    item = make_items("temporal_grounding", 1, seed=3)[0]
    start, end = (int(v) for v in item.answer.split(" to "))
    lit = item.videos[0].reshape(len(item.videos[0]), -1).max(axis=1) != 128
    seconds_on = {i // 2 for i, on in enumerate(lit) if on}
    assert seconds_on == set(range(start, end))
    box = make_items("grounding", 1, seed=3)[0]
    x1, y1, x2, y2 = (int(v) for v in re.findall(r"\d+", box.answer))
    crop = box.images[0].crop((x1, y1, x2, y2)).convert("L")
    assert min(crop.getdata()) < 250  # the shape is inside its box


# ---------------------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_training_is_deterministic_and_reproduces_the_committed_first_steps():
    import torch

    record = skills.committed_record()
    assert record is not None, "quantkit/zoo/weights/tiny-omni-skills.json is part of the checkout"
    torch.set_num_threads(2)  # the thread count the committed run used
    _, _, first = skills.train(record["seed"], 2)
    _, _, again = skills.train(record["seed"], 2)
    assert first == again
    # Exact to the recorded 6 decimals, up to reduction-order noise of a different CPU.
    assert first == pytest.approx(record["first_losses"][:2], abs=2e-5)


@pytest.mark.slow
def test_zoo_build_restores_the_committed_weights_with_skills_json(tmp_path):
    from safetensors.torch import load_file

    from quantkit.zoo.models import build_zoo_model

    record = skills.committed_record()
    assert skills.committed_weights() is not None, f"the trained weights are committed: {skills.WEIGHTS}"
    assert record["key"] == skills.input_key(record["seed"], record["steps"]), "the inputs changed: retrain"
    out = build_zoo_model("tiny-omni-skills", tmp_path / "skills")
    written = load_file(str(out / "model.safetensors"))
    committed = load_file(str(skills.WEIGHTS))
    assert set(written) == set(committed)
    assert all(written[k].equal(committed[k]) for k in committed)
    assert json.loads((out / "skills.json").read_text()) == json.loads(json.dumps(skills_manifest()))

    report = evaluate_skills(out, [out], items=2, tasks=["arithmetic", "caption"], write=True)
    assert [t.task for t in report.original.tasks] == ["caption", "arithmetic"]  # skills.json order
    assert all(row["checkpoints"][0]["score"] == row["original"] for row in report.rows())
    payload = json.loads((out / "eval.json").read_text())
    assert payload["kind"] == "skills" and {r["task"] for r in payload["rows"]} == {"arithmetic", "caption"}
    assert "Evaluation: per-task skills" in (out / "README.md").read_text()


@pytest.mark.slow
def test_the_per_task_table_names_each_checkpoint_by_its_recipe(tmp_path):
    """`quantkit eval ORIG CKPT... --tasks skills` (the demo's last table): checkpoint folders that
    share a long prefix ("tiny-omni-skills-...") were all headed "tiny-omni-sk…"; each column is
    now its checkpoint's recipe, whole, with the folder under the table."""
    from typer.testing import CliRunner

    from quantkit.cli import app
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe
    from quantkit.zoo.models import build_zoo_model

    if skills.committed_weights() is None:
        pytest.skip("no trained tiny-omni-skills weights are committed")
    original = build_zoo_model("tiny-omni-skills", tmp_path / "tiny-omni-skills")
    prefix = "tiny-omni-skills-checkpoint-for-the-serving-fleet-"
    checkpoints = [tmp_path / f"{prefix}{name}" for name in ("fp8-dynamic", "fp8-block")]
    for folder in checkpoints:
        quantize(original, folder, resolve_recipe(folder.name.removeprefix(prefix)), [], progress=False)
    result = CliRunner().invoke(
        app,
        ["eval", str(original), *map(str, checkpoints), "--tasks", "skills", "--limit", "2", "--max-loss", "100"],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    header = result.output[result.output.index("┏") : result.output.index("┡")]  # the header rows
    assert "#1 fp8-dynamic" in header and "#2 fp8-block" in header, result.output
    assert "…" not in header and prefix not in header
    flat = result.output.replace("\n", "")
    assert all(f"#{i} {folder}" in flat for i, folder in enumerate(checkpoints, 1)), result.output


def test_a_checkpoint_is_scored_on_the_originals_suite(tmp_path):
    """quantize writes no skills.json into a checkpoint: eval and build score it on the tasks of the
    original's skills.json (smol-omni-skills' here), not tiny-omni-skills' default suite."""
    import shutil

    from quantkit.synthetic import smol_tasks
    from quantkit.zoo.models import build_zoo_model

    original = build_zoo_model("tiny-omni-skills", tmp_path / "original")
    (original / "skills.json").write_text(json.dumps(skills_manifest(smol_tasks)), encoding="utf-8")
    checkpoint = Path(shutil.copytree(original, tmp_path / "checkpoint"))
    (checkpoint / "skills.json").unlink()
    report = evaluate_skills(original, [checkpoint], items=2, tasks=["capitals"], write=False)
    assert [t.task for t in report.checkpoints[0].tasks] == ["capitals"]
    assert report.checkpoints[0].tasks[0].item_scores == report.original.tasks[0].item_scores
