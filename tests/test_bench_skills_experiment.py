"""bench/skills_experiment.py: its stored rows, the keys that decide whether a row is reused, the
renderer and its plain-words summary (fake rows: the measuring needs tiny-omni-skills; bench only)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]

import skills_experiment as se  # noqa: E402

from quantkit.synthetic.skills_tasks import TASKS  # noqa: E402

TASK_NAMES = [t.name for t in TASKS]
IDENTITY = {"hash": "0123456789abcdef", "record": None, "files": ["model.safetensors"]}
STATE = {"bench": "b" * 64, "versions": {"torch": "1"}, "commit": "abc1234"}
SETTINGS = {"items": 8, "pool_per_task": 4, "pool_seed": se.POOL_SEED}


def fake_row(
    recipe: str, arm: str, size: int, seed: int, scores: dict[str, float], identity=IDENTITY
) -> dict:
    """A row as main() stores it, keyed as the code and ``identity`` key it."""
    row = {
        "recipe": recipe,
        "arm": arm,
        "size": size,
        "seed": seed,
        "settings": SETTINGS,
        "model": identity,
        "calibration": f"{arm}, seed {seed}",
        "quantize_s": 10.0 + seed,
        "score_s": 5.0,
        "items": SETTINGS["items"],
        "scores": {name: scores.get(name, 0.5) for name in TASK_NAMES},
    }
    row["provenance"] = se.expected_run(
        row | {"provenance": {"files": ["quantkit/errors.py"]}}, identity, STATE
    )
    return row


def fake_data(per_arm: dict[str, list[dict[str, float]]], recipe="w4a16", size=32) -> dict:
    """Stored rows: per arm, one score dict per seed."""
    runs = {}
    for arm, seeds in per_arm.items():
        for seed, scores in enumerate(seeds):
            runs[se.run_name(recipe, arm, size, seed)] = fake_row(recipe, arm, size, seed, scores)
    return {"original": {}, "runs": runs}


def test_summary_names_the_better_arm_and_by_how_much_beyond_the_spread():
    task = TASK_NAMES[0]
    stratified, uniform = [0.9, 0.8], [0.5, 0.6]
    data = fake_data({"stratified": [{task: v} for v in stratified], "uniform": [{task: v} for v in uniform]})
    lines = se.summary(list(data["runs"].values()), TASK_NAMES)
    diff = statistics.mean(stratified) - statistics.mean(uniform)
    assert len(lines) == 1
    assert f"{task}: stratified better by {diff:.3f}" in lines[0]
    assert f"no difference beyond the seed spread on the other {len(TASK_NAMES) - 1} tasks" in lines[0]

    flipped = fake_data(
        {"stratified": [{task: v} for v in uniform], "uniform": [{task: v} for v in stratified]}
    )
    (line,) = se.summary(list(flipped["runs"].values()), TASK_NAMES)
    assert f"{task}: uniform better by {diff:.3f}" in line


def test_an_arm_above_the_original_is_labelled_and_losses_against_it_reported():
    task = TASK_NAMES[1]
    data = fake_data({"stratified": [{task: 7 / 24}, {task: 6 / 24}], "uniform": [{task: 5 / 24}, {task: 5 / 24}]})
    original = {"scores": dict.fromkeys(TASK_NAMES, 0.5) | {task: 6 / 24}}
    lines = se.summary(list(data["runs"].values()), TASK_NAMES, original)
    assert f"- uniform vs the original: lost beyond its seed spread on {task} {5 / 24:.3f} ± 0.000 vs {6 / 24:.3f}" in lines
    assert "- stratified vs the original: no loss beyond its seed spread on any task" in lines
    (versus,) = [line for line in lines if line.startswith("- uniform vs stratified")]
    mean = statistics.mean([7 / 24, 6 / 24])
    assert f"{task}: stratified {mean:.3f} vs uniform {5 / 24:.3f}, original {6 / 24:.3f} (stratified above the original: item noise" in versus
    tally = {"cells": dict.fromkeys(se.ARMS, 0), "lost": dict.fromkeys(se.ARMS, 0), "compared": 0, "found": 0, "above": 0}
    se.count(tally, list(data["runs"].values()), TASK_NAMES, original)
    text = se.overall(tally, 1)
    assert f"stratified 0 of {len(TASK_NAMES)}; uniform 1 of {len(TASK_NAMES)}" in text
    assert f"1 of {len(TASK_NAMES)} (arm, recipe, size, task) comparisons, 1 of them with the better arm above the original" in text


def test_a_tie_at_the_spread_is_no_difference_whatever_the_float_rounding():
    task = TASK_NAMES[0]
    stratified, uniform = [0 / 24, 1 / 24], [1 / 24, 2 / 24]  # means 1/24 apart, spreads 1/24
    assert statistics.mean(uniform) - statistics.mean(stratified) > 1 / 24 - 0 / 24  # float rounding
    data = fake_data({"stratified": [{task: v} for v in stratified], "uniform": [{task: v} for v in uniform]})
    (line,) = se.summary(list(data["runs"].values()), TASK_NAMES)
    assert line == "- uniform vs stratified: no difference beyond the seed spread on any task"


def test_a_difference_within_the_larger_spread_is_no_difference():
    task = TASK_NAMES[0]
    # means differ by 0.05, stratified's spread is 0.2: within it
    data = fake_data({"stratified": [{task: 0.9}, {task: 0.7}], "text-only": [{task: 0.75}, {task: 0.75}]})
    (line,) = se.summary(list(data["runs"].values()), TASK_NAMES)
    assert line == "- text-only vs stratified: no difference beyond the seed spread on any task"


def test_one_seed_is_not_judged():
    data = fake_data({"stratified": [{TASK_NAMES[0]: 1.0}], "uniform": [{TASK_NAMES[0]: 0.0}]})
    (line,) = se.summary(list(data["runs"].values()), TASK_NAMES)
    assert "fewer than two seeds" in line and "better" not in line


def test_render_one_table_per_recipe_and_size_from_the_rows_only():
    task = TASK_NAMES[0]
    data = fake_data({"stratified": [{task: 0.9}, {task: 0.8}], "uniform": [{task: 0.5}, {task: 0.6}]})
    data["runs"].update(
        fake_data({"stratified": [{}, {}], "captions-only": [{}, {}]}, size=128)["runs"]
        | fake_data({"stratified": [{}, {}]}, recipe="fp8")["runs"]
    )
    original = {"items": SETTINGS["items"], "model": IDENTITY, "scores": dict.fromkeys(TASK_NAMES, 1.0)}
    original["provenance"] = se.expected_original(original | {"provenance": {"files": None}}, IDENTITY, STATE)
    data["original"][se.original_name(IDENTITY, SETTINGS["items"])] = original
    text = se.render(data, *se.expected_keys(data, IDENTITY, STATE))

    headings = [line for line in text.splitlines() if line.startswith("### ")]
    assert headings == [
        "### w4a16, 32 calibration samples",
        "### w4a16, 128 calibration samples",
        "### fp8, 32 calibration samples",
    ]
    first = text.split("### ")[1]
    assert "| group | task | original | stratified | uniform |" in first
    mean, spread = statistics.mean([0.9, 0.8]), 0.9 - 0.8
    assert f"| {TASKS[0].group} | {task} | 1.000 | {mean:.3f} ± {spread:.3f} (n=2) |" in first
    assert f"made by {STATE['commit']} (current)." in first and "stale" not in text
    assert "In plain words (w4a16, 32 samples):" in first
    assert f"{task}: stratified {mean:.3f} vs uniform 0.550, original 1.000 (stratified better by 0.300)" in first
    assert "- uniform vs the original: lost beyond its seed spread on" in first
    assert "Over all 3 tables (recipe x size):" in text
    # the 128 table has no uniform arm and says so by its columns
    assert "| group | task | original | stratified | captions-only |" in text.split("### ")[2]
    assert "No rows yet" in se.render({"original": {}, "runs": {}})


def test_a_changed_model_identity_settings_or_code_invalidates_a_row():
    row = fake_row("w4a16", "stratified", 32, 0, {})
    assert se.current(row, se.expected_run(row, IDENTITY, STATE))
    other_model = IDENTITY | {"hash": "fedcba9876543210"}
    assert not se.current(row, se.expected_run(row, other_model, STATE))
    assert not se.current(row, se.expected_run(row, IDENTITY | {"record": "r" * 64}, STATE))
    assert not se.current(row, se.expected_run(row, IDENTITY, STATE, SETTINGS | {"items": 16}))
    assert not se.current(row, se.expected_run(row, IDENTITY, STATE | {"bench": "c" * 64}))
    assert not se.current(row, se.expected_run(row, IDENTITY, STATE | {"versions": {"torch": "2"}}))
    assert not se.current(row | {"recipe": "fp8"}, se.expected_run(row | {"recipe": "fp8"}, IDENTITY, STATE))
    # the commit is for display only: another commit with the same code keeps the row
    assert se.current(row, se.expected_run(row, IDENTITY, STATE | {"commit": "def5678"}))
    # rendered against another model, the row keeps its figures, marked stale with its commit
    data = {"original": {}, "runs": {se.run_name("w4a16", "stratified", 32, 0): row}}
    stale = se.render(data, *se.expected_keys(data, other_model, STATE))
    assert "### w4a16, 32 calibration samples, stale (measured at abc1234)" in stale
    assert "made by stale (measured at abc1234)." in stale
    assert "| group | task |" in stale and "(n=1)" in stale  # its figures, not blanks
    assert "Over the 1 stale tables" in stale and "Over all" not in stale  # kept apart from current tables
    current = se.render(data, *se.expected_keys(data, IDENTITY, STATE))
    assert "| group | task |" in current and "stale" not in current


def test_model_identity_follows_the_weights_tokenizer_configs_and_skills_manifest(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "tokenizer.json").write_text("{}")
    first = se.model_identity(tmp_path)  # every optional file but one missing: counted, no crash
    assert first["files"] == ["model.safetensors", "tokenizer.json"]
    assert {"config.json", "generation_config.json", "processor_config.json", "skills.json"} <= set(first["missing"])
    assert se.model_identity(tmp_path) == first
    seen = {first["hash"]}
    for name in ("config.json", "generation_config.json", "processor_config.json", "preprocessor_config.json",
                 "video_preprocessor_config.json", "skills.json", "chat_template.jinja"):  # fmt: skip
        (tmp_path / name).write_text("{}")  # added: a new identity
        added = se.model_identity(tmp_path)
        assert name in added["files"] and name not in added["missing"] and added["hash"] not in seen, name
        (tmp_path / name).write_text('{"x": 1}')  # changed: another
        changed = se.model_identity(tmp_path)["hash"]
        assert changed not in seen | {added["hash"]}, name
        seen |= {added["hash"], changed}
    (tmp_path / "README.md").write_text("notes")  # not part of what the model answers with
    assert se.model_identity(tmp_path)["hash"] == changed
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    assert se.model_identity(tmp_path)["hash"] not in seen
    record = json.loads(se.ZOO_RECORD.read_text())["key"] if se.ZOO_RECORD.is_file() else None
    assert first["record"] == record


def test_render_only_writes_the_section_and_marks_rows_of_another_model_stale(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    identity = se.model_identity(model)
    state = se.code_state()
    row = fake_row("w4a16", "stratified", 32, 0, {}, identity=identity)
    row["provenance"] = se.expected_run(row, identity, state)
    results = tmp_path / "rows.json"
    results.write_text(json.dumps({"original": {}, "runs": {se.run_name("w4a16", "stratified", 32, 0): row}}))
    readme = tmp_path / "RESULTS.md"
    readme.write_text("# Benchmark results\n\n## Other\n\nkept\n")
    argv = ["--model", str(model), "--results", str(results), "--render-only", "--write-results", str(readme)]
    se.main(argv)
    text = readme.read_text()
    assert se.SECTION in text and "## Other\n\nkept" in text and "stale" not in text
    assert f"made by {state['commit']} (current)" in text

    (model / "model.safetensors").write_bytes(b"retrained")
    se.main(argv)
    assert f"stale (measured at {state['commit']})" in readme.read_text()
    assert readme.read_text().count(se.SECTION) == 1
    capsys.readouterr()


@pytest.mark.slow
def test_a_run_is_measured_once_then_reused(zoo_model, tmp_path, capsys):
    """One tiny quantize of the zoo's random Omni thinker: the row is stored with its keys, and a
    second invocation with the same model, code and settings reuses it."""
    model = zoo_model("tiny-qwen2.5-omni")
    results = tmp_path / "rows.json"
    argv = [
        "--model", str(model), "--work", str(tmp_path / "work"), "--results", str(results),
        "--recipes", "w4a16", "--arms", "text-only", "--sizes", "2", "--seeds", "0",
        "--items", "1", "--pool-per-task", "2",
    ]  # fmt: skip
    se.main(argv)
    out = capsys.readouterr().out
    assert "[1/1] w4a16/text-only/2/0: measuring" in out and "done in" in out
    data = json.loads(results.read_text())
    (row,) = data["runs"].values()
    assert row["items"] == 1 and set(row["scores"]) == set(TASK_NAMES)
    assert row["model"]["hash"] == se.model_identity(model)["hash"]
    assert row["provenance"]["files"] and "quantkit/quantize/__init__.py" in row["provenance"]["files"]
    (original,) = data["original"].values()
    assert set(original["scores"]) == set(TASK_NAMES)

    se.main(argv)
    out = capsys.readouterr().out
    assert "[1/1] w4a16/text-only/2/0: cached" in out and "original: cached" in out
    assert json.loads(results.read_text()) == data
