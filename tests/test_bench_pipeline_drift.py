"""bench/pipeline_drift.py: the keys that decide whether a stored pair is reused, the record of the
files the new side's CLI loaded, and the renderer's current / stale / not-measured split (hand-built
rows: measuring a pair takes minutes of CPU; bench only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]

import pipeline_drift as pd  # noqa: E402

STATE = {"bench": "b" * 64, "versions": {"torch": "1"}, "commit": "abc1234"}
BASE = "4f617d4"
FILES = ["quantkit/errors.py", "recipes/w4a16.yaml"]


def samples(kls: list[float], top1: list[float], modalities: list[str]) -> list[dict]:
    return [
        {"id": f"s{i}", "modality": m, "kl": kl, "top1": t}
        for i, (kl, t, m) in enumerate(zip(kls, top1, modalities, strict=True))
    ]


def fake_pair(model: str, recipe: str, new_kl: list[float], state: dict = STATE) -> dict:
    """A pair as main() stores it, keyed as the code keys it over FILES."""
    count = len(new_kl)
    modalities = ["image"] * count
    row = {
        "model": model,
        "recipe": recipe,
        "base_commit": BASE,
        "new_commit": state["commit"],
        "base_pipeline": "basic",
        "new_pipeline": "sequential",
        "held_out_ids": [f"s{i}" for i in range(count)],
        "kl_unrounded": True,
        "base_samples": samples([0.01] * count, [0.9] * count, modalities),
        "new_samples": samples(new_kl, [0.9] * count, modalities),
    }
    name = pd.pair_name(model, recipe)
    row["provenance"] = pd.pair_key(name, pd.pair_spec(model, recipe, BASE), state, FILES)
    return row


def test_a_pair_is_current_only_while_its_key_matches(monkeypatch):
    row = fake_pair("tiny-qwen3", "w4a16", [0.01, 0.02, 0.03])
    assert pd.current(row, STATE, BASE)
    assert row["provenance"]["commit"] == STATE["commit"] and row["provenance"]["files"] == FILES
    # the commit is for display only: another commit with the same code keeps the pair
    assert pd.current(row, STATE | {"commit": "def5678"}, BASE)
    # other measuring code, other libraries, another base commit: stale
    assert not pd.current(row, STATE | {"bench": "c" * 64}, BASE)
    assert not pd.current(row, STATE | {"versions": {"torch": "2"}}, BASE)
    assert not pd.current(row, STATE, "0000000")
    # the key names the pair: the same figures filed under another recipe or model are not current
    assert not pd.current(row | {"recipe": "fp8"}, STATE, BASE)
    assert not pd.current(row | {"model": "tiny-qwen3-vl"}, STATE, BASE)
    # another setting of the measurement
    monkeypatch.setattr(pd, "HELD_OUT", pd.HELD_OUT + 1)
    assert not pd.current(row, STATE, BASE)
    monkeypatch.undo()
    assert pd.current(row, STATE, BASE)
    # a row stored before pairs were keyed, or with no row at all
    assert not pd.current(
        {"model": "tiny-qwen3", "recipe": "w4a16", "provenance": {"legacy": True}}, STATE, BASE
    )
    assert not pd.current(None, STATE, BASE)


def test_the_key_covers_the_bytes_of_the_files_the_new_side_loaded():
    row = fake_pair("tiny-qwen3", "w4a16", [0.01, 0.02, 0.03])
    missing = "quantkit/no_such_module.py"
    # the same pair made with another file list (a module that is not there) has another key
    other = pd.pair_key(
        pd.pair_name("tiny-qwen3", "w4a16"),
        pd.pair_spec("tiny-qwen3", "w4a16", BASE),
        STATE,
        [*FILES, missing],
    )
    assert other["key"] != row["provenance"]["key"]
    # the key kept with the old file list does not match what that list hashes to now
    assert not pd.current(row | {"provenance": row["provenance"] | {"files": [*FILES, missing]}}, STATE, BASE)
    # the pair's recipe enters as this checkout resolves it
    assert pd.pair_spec("tiny-qwen3", "w4a16", BASE)["recipe"]["name"] == "w4a16"


def test_the_cli_records_the_quantkit_files_it_loaded(tmp_path):
    log = tmp_path / "help.log"
    pd.cli(pd.ROOT, "--help", log=log)
    files = pd.loaded(log)
    assert "quantkit/cli/__init__.py" in files
    assert all(f.startswith(("quantkit/", "recipes/")) for f in files)
    assert {f for f in files if f.startswith("recipes/")}  # the recipe files count too
    assert pd.built(log, log) and not pd.built(tmp_path / "absent", log)
    pd.sources_of(log).unlink()
    assert not pd.built(log, log)  # made, but with no record of what made it: made again


def test_render_shows_current_pairs_and_stale_ones_with_their_last_figures_marked_stale_and_lists_the_rest():
    current = fake_pair("tiny-qwen3", "w4a16", [0.011, 0.012, 0.013])
    stale = fake_pair("tiny-qwen3-vl", "fp8", [0.5, 0.6, 0.7]) | {
        "provenance": {"commit": "1111111", "legacy": True}
    }
    text = pd.render([current], [], [stale], STATE)
    main_table, stale_part = text.split("Stale (1:")
    table = [line for line in main_table.splitlines() if line.startswith("| tiny-")]
    assert table and all(line.startswith("| tiny-qwen3 | w4a16 |") for line in table)
    assert f"basic {BASE} → sequential {STATE['commit']} (current)" in table[0]
    assert "tiny-qwen3-vl x fp8, stale (measured at 1111111)" in stale_part
    # the stale pair keeps its figures (mean KL 0.6), marked stale, in a table of its own
    stale_rows = [line for line in stale_part.splitlines() if line.startswith("| tiny-qwen3-vl | fp8 | all (3) |")]
    assert stale_rows and "| 0.6 |" in stale_rows[0] and stale_rows[0].endswith("stale (measured at 1111111) |")
    assert "torch 1" in text  # the versions the pairs were checked against
    left = text.split("Not measured at this code (")[1]
    assert "tiny-qwen3-vl x fp8" in left and "tiny-qwen3 x w4a16," not in left
    expected_left = len(pd.data_recipes()) * len(pd.zoo_names()) - 1
    assert left.startswith(f"{expected_left} pairs")


def test_render_only_writes_the_section_from_the_stored_pairs(tmp_path):
    state = pd.code_state()
    row = fake_pair("tiny-qwen3", "w4a16", [0.011, 0.012, 0.013], state=state)
    old = fake_pair("tiny-qwen3", "fp8", [0.02, 0.02, 0.02], state=state | {"bench": "c" * 64})
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps({"pairs": {"tiny-qwen3/w4a16": row, "tiny-qwen3/fp8": old}, "noise": {}}))
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Other\n\nkept\n")
    pd.main(
        ["--pairs", str(pairs), "--results", str(results), "--render-only", "--work", str(tmp_path / "w")]
    )
    text = results.read_text()
    assert text.count(pd.HEADING) == 1 and "## Other\n\nkept" in text
    assert "| tiny-qwen3 | w4a16 | all (3) |" in text and "| tiny-qwen3 | fp8 |" not in text.split("Stale (1:")[0]
    assert f"tiny-qwen3 x fp8, stale (measured at {state['commit']})" in text.split("Stale (1:")[1]
    assert not (tmp_path / "w").exists()  # rendering measures nothing
    # the stored file is written through one rename, and reads back as it was stored
    data = pd.load(pairs)
    pd.write_json(pairs, data)
    assert pd.load(pairs) == data and not list(tmp_path.glob(".pairs.json.partial-*"))


def test_both_sides_quantize_with_the_base_recipe_file_where_the_base_has_the_recipe(tmp_path):
    """w4a16 changed its observer after BASE: a pair must measure the pipeline, not that change."""
    import subprocess

    from quantkit.recipes.registry import resolve_recipe

    known = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{pd.BASE}^{{commit}}"],
        capture_output=True, check=False,
    )
    if known.returncode != 0:
        pytest.skip(f"{pd.BASE} is not in this clone's history (a shallow clone): no base recipe to read")

    shipped = resolve_recipe("w4a16")
    spec = pd.pair_spec("tiny-qwen3", "w4a16", BASE)
    base_text = pd.base_recipe_text("w4a16")
    assert base_text is not None and "imatrix_mse" not in base_text
    assert shipped.weight_observer == "imatrix_mse"
    assert spec["recipe"]["weight_observer"] is None  # BASE's file, resolved by this checkout
    assert spec["recipe_file"] == f"{pd.BASE}:recipes/w4a16.yaml"
    # a recipe BASE lacks is this checkout's own, and named as such (no recipe_file)
    assert pd.base_recipe_text("w4a16-awq") is None
    awq = pd.pair_spec("tiny-qwen3", "w4a16-awq", BASE)
    assert "recipe_file" not in awq and awq["recipe"] == resolve_recipe("w4a16-awq").model_dump(mode="json")
    # the quantize argument: BASE's worktree file where it has the recipe, else the built-in name
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "w4a16.yaml").write_text(base_text, encoding="utf-8")
    assert pd.recipe_argument(tmp_path, "w4a16") == str(tmp_path / "recipes" / "w4a16.yaml")
    assert pd.recipe_argument(tmp_path, "w4a16-awq") == "w4a16-awq"


def test_every_value_and_function_the_drift_measurement_reads_is_in_its_key():
    """A pair's key hashes MEASURING's sources and settings(): every same-module function those
    read must be in MEASURING, and every module constant they read must enter settings() (or be
    the base commit, which pair_spec keys by hash, or a location in this checkout)."""
    import inspect

    from test_bench_token_weights import global_names

    read = set().union(*(global_names(f) for f in pd.MEASURING))
    found = {n: vars(pd)[n] for n in read if n in vars(pd) and not n.startswith("__")}
    own = {n for n, v in found.items() if inspect.isfunction(v) and v.__module__ == pd.__name__}
    assert own <= {f.__name__ for f in pd.MEASURING}, sorted(own - {f.__name__ for f in pd.MEASURING})
    constants = {n for n, v in found.items() if not callable(v) and not inspect.ismodule(v)}
    in_settings = {n for n in constants if n in inspect.getsource(pd.settings)}
    assert constants - in_settings <= {"BASE", "ROOT", "SCRIPT"}, sorted(constants - in_settings)
    assert {getattr(pd, n) for n in in_settings} <= set(pd.settings().values())
