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
from _shared import cpu_model  # noqa: E402

from quantkit.synthetic.skills_tasks import TASKS  # noqa: E402

TASK_NAMES = [t.name for t in TASKS]
IDENTITY = {"hash": "0123456789abcdef", "record": None, "files": ["model.safetensors"]}
STATE = {"bench": "b" * 64, "versions": {"torch": "1"}, "commit": "abc1234"}
SETTINGS = {"items": 8, "pool_per_task": 4, "pool_seed": se.POOL_SEED, "score_batch": se.SCORE_BATCH}


def fake_row(
    recipe: str,
    arm: str,
    size: int,
    seed: int,
    scores: dict[str, float],
    identity=IDENTITY,
    items: dict[str, list[float]] | None = None,
) -> dict:
    """A row as main() stores it, keyed as the code and ``identity`` key it; ``items``: per task,
    its per-item scores (the task's score is their mean), without them the row has none (as rows
    made before they were kept)."""
    items = items or {}
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
        "scores": {
            name: statistics.mean(items[name]) if name in items else scores.get(name, 0.5)
            for name in TASK_NAMES
        },
    }
    if items:
        row["suite"] = "tiny-omni-skills"
        row["item_scores"] = {name: se.item_text(items.get(name, [0.5] * ITEMS)) for name in TASK_NAMES}
    row["provenance"] = se.expected_run(
        row | {"provenance": {"files": ["quantkit/errors.py"]}}, identity, STATE
    )
    return row


def fake_data(per_arm: dict[str, list[dict]], recipe="w4a16", size=32, *, per_item=False) -> dict:
    """Stored rows: per arm, one dict per seed (task -> score, or with ``per_item`` task -> its
    per-item scores)."""
    runs = {}
    for arm, seeds in per_arm.items():
        for seed, values in enumerate(seeds):
            if per_item:
                row = fake_row(recipe, arm, size, seed, {}, items=values)
            else:
                row = fake_row(recipe, arm, size, seed, values)
            runs[se.run_name(recipe, arm, size, seed)] = row
    return {"original": {}, "runs": runs}


ITEMS = 60
# stratified right on every other item; the arm wrong on 8 of those: 8 / 60 points behind, on the
# same items, while the two scores' own item spreads are far wider than that
STRATIFIED_ITEMS = [float(i % 2) for i in range(ITEMS)]
ARM_ITEMS = [0.0 if i % 2 and i < 16 else v for i, v in enumerate(STRATIFIED_ITEMS)]


def tiny_run_argv(model: Path, tmp_path: Path, arms: str) -> list[str]:
    """main()'s arguments for one w4a16 run per arm of tiny-omni-skills: 2 samples, 2 items."""
    return [
        "--model", str(model), "--work", str(tmp_path / "work"), "--results", str(tmp_path / "rows.json"),
        "--recipes", "w4a16", "--arms", arms, "--sizes", "2", "--seeds", "0",
        "--items", "2", "--pool-per-task", "2", "--threads", "1",
    ]  # fmt: skip


def suite_model(tmp_path: Path, suite: str = "smol-omni-skills") -> Path:
    """A folder that names ``suite`` in its skills.json (enough for arms and options to be checked)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "skills.json").write_text(json.dumps({"suite": suite}))
    return model


def test_the_difference_from_stratified_pairs_the_same_items():
    """arm - stratified on the same items, with the gate's paired bootstrap: stratified's lead of
    8 items in 60 is beyond the interval; the same scores with the arm's items in another order
    (pairing lost) are not."""
    from quantkit.eval.gate import paired_interval, paired_loss

    task = TASK_NAMES[0]
    data = fake_data(
        {"stratified": [{task: STRATIFIED_ITEMS}], "uniform": [{task: ARM_ITEMS}]}, per_item=True
    )
    rows = list(data["runs"].values())
    figures = se.judge(rows, TASK_NAMES, None)
    difference = figures["difference"]["uniform"][task]
    assert (
        difference["diff"]
        == paired_loss(ARM_ITEMS, STRATIFIED_ITEMS)
        == pytest.approx(-100 * 8 / ITEMS, abs=1e-4)
    )
    assert (difference["low"], difference["high"]) == paired_interval(ARM_ITEMS, STRATIFIED_ITEMS)
    assert difference["high"] < 0 and se.outcome(difference) == "wins"
    assert figures["difference"]["uniform"][TASK_NAMES[1]]["diff"] == 0  # 0.5 everywhere on both sides

    unpaired = fake_data(
        {"stratified": [{task: STRATIFIED_ITEMS}], "uniform": [{task: ARM_ITEMS[::-1]}]}, per_item=True
    )
    moved = se.judge(list(unpaired["runs"].values()), TASK_NAMES, None)["difference"]["uniform"][task]
    assert moved["diff"] == difference["diff"] and se.outcome(moved) == "ties"
    # the same held-out items on both sides or none: a row scored on other items is refused
    other = fake_data(
        {"stratified": [{task: STRATIFIED_ITEMS}], "uniform": [{task: ARM_ITEMS[:-1]}]}, per_item=True
    )
    with pytest.raises(ValueError, match="paired"):
        se.judge(list(other["runs"].values()), TASK_NAMES, None)


def test_seeds_are_averaged_item_by_item_before_pairing():
    task = TASK_NAMES[0]
    first, second = ARM_ITEMS, [1.0] * ITEMS
    data = fake_data(
        {"stratified": [{task: STRATIFIED_ITEMS}] * 2, "uniform": [{task: first}, {task: second}]},
        per_item=True,
    )
    figures = se.judge(list(data["runs"].values()), TASK_NAMES, None)
    averaged = [(a + b) / 2 for a, b in zip(first, second, strict=True)]
    assert figures["difference"]["uniform"][task] == se.paired(averaged, STRATIFIED_ITEMS)
    original = {"scores": {}, "item_scores": {t: se.item_text([1.0] * ITEMS) for t in TASK_NAMES}}
    loss = se.judge(list(data["runs"].values()), TASK_NAMES, original)["loss"]["uniform"][task]
    assert loss == se.paired([1.0] * ITEMS, averaged) and loss["diff"] > 0


@pytest.mark.parametrize(
    ("low", "high", "said"),
    [(-3.0, -0.1, "wins"), (0.1, 3.0, "loses"), (-1.0, 0.0, "ties"), (0.0, 2.0, "ties"), (-1.0, 1.0, "ties")],
)
def test_stratified_wins_loses_or_ties_by_the_interval_ends(low, high, said):
    assert se.outcome({"n": ITEMS, "diff": (low + high) / 2, "low": low, "high": high}) == said


def test_too_few_items_are_not_judged_and_the_verdict_names_the_tasks():
    from quantkit.eval.gate import MIN_ITEMS

    assert se.outcome({"n": MIN_ITEMS - 1, "diff": -5.0, "low": -9.0, "high": -1.0}) == "not judged"
    figure = {"wins": (-3.0, -1.0), "loses": (1.0, 3.0), "ties": (-1.0, 1.0)}
    tasks = ["a", "b", "c", "d"]
    differences = {
        t: {"n": ITEMS, "diff": 0.0, "low": figure[w][0], "high": figure[w][1]}
        for t, w in zip(tasks, ["wins", "ties", "loses", "wins"], strict=True)
    }
    assert se.verdict("uniform", differences, tasks) == "vs uniform: wins on a, d; loses on c; ties on b"
    assert (
        se.verdict("uniform", dict.fromkeys(tasks), tasks)
        == "vs uniform: not judged (rows without per-item scores)"
    )


def test_the_best_single_task_arm_is_the_highest_mean_over_tasks():
    """Not the arm with the best single task: single:caption tops one task, single:asr the mean
    over all; a tie goes to the arm first in the suite's task order."""
    first, second = TASK_NAMES[0], TASK_NAMES[1]
    rows = list(
        fake_data(
            {
                "single:caption": [{first: 1.0}, {first: 0.9}],
                "single:asr": [{first: 0.7, second: 0.8}, {first: 0.7, second: 0.8}],
                "stratified": [{first: 1.0, second: 1.0}],
            }
        )["runs"].values()
    )
    best, means, seeds = se.best_single(rows, TASK_NAMES)
    assert best == "single:asr" and set(means) == {"single:caption", "single:asr"} and seeds == [0, 1]
    assert means["single:asr"] > means["single:caption"]
    assert se.compared_arms(rows, TASK_NAMES) == [
        ("stratified", "stratified"),
        ("best single-task (single:asr)", "single:asr"),
    ]
    tied = [r | {"scores": dict.fromkeys(TASK_NAMES, 0.5)} for r in rows if r["arm"].startswith("single:")]
    assert se.best_single(tied, TASK_NAMES)[0] == "single:caption"  # caption comes before asr in the suite
    assert TASK_NAMES.index("caption") < TASK_NAMES.index("asr")
    assert se.best_single([r for r in rows if r["arm"] == "stratified"], TASK_NAMES) is None


def test_best_single_resolves_per_table_from_the_current_screen_rows_only():
    """``--arms best-single`` measures, per recipe and size, the best single-task arm of the
    stored screen: rows of another table or made by other code do not decide it."""
    first = TASK_NAMES[0]
    data = fake_data({"single:caption": [{first: 0.6}], "single:asr": [{first: 0.7}], "uniform": [{first: 1.0}]})
    assert se.screened_single(data, "w4a16", 32, IDENTITY, STATE, SETTINGS) == ("single:asr", [0])
    other_table = fake_data({"single:caption": [{first: 0.9}]}, recipe="fp8")["runs"]
    data["runs"] |= other_table | fake_data({"single:caption": [{first: 0.9}]}, size=128)["runs"]
    assert se.screened_single(data, "w4a16", 32, IDENTITY, STATE, SETTINGS) == ("single:asr", [0])
    assert se.screened_single(data, "fp8", 32, IDENTITY, STATE, SETTINGS) == ("single:caption", [0])
    stale = {name: row | {"provenance": {**row["provenance"], "key": "x"}} for name, row in data["runs"].items()}
    assert se.screened_single({"runs": stale}, "w4a16", 32, IDENTITY, STATE, SETTINGS) is None
    assert se.screened_single(data, "w4a16", 64, IDENTITY, STATE, SETTINGS) is None


def test_best_single_without_a_screen_is_refused_before_anything_runs(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "skills.json").write_text(json.dumps({"suite": "tiny-omni-skills"}))
    argv = ["--model", str(model), "--results", str(tmp_path / "rows.json"), "--work", str(tmp_path / "work")]
    with pytest.raises(SystemExit) as raised:
        se.main([*argv, "--recipes", "w4a16", "--sizes", "32", "--seeds", "1", "--arms", "stratified,best-single"])
    assert raised.value.code == 2
    assert "no current single-task row of w4a16 at 32 samples; measure a screen first" in capsys.readouterr().err
    assert not (tmp_path / "work").exists() and not (tmp_path / "rows.json").exists()


def test_best_single_measures_the_screens_winner(tmp_path, capsys):
    """With a screen stored (current rows of this code, model, settings and machine), ``--arms
    stratified,best-single`` plans stratified and the screen's best single-task arm: here every
    planned run is stored already, so both are reported cached and nothing is measured."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "skills.json").write_text(json.dumps({"suite": "tiny-omni-skills"}))
    identity, state, first = se.model_identity(model), se.code_state(), TASK_NAMES[0]
    here = {"device": "cpu", "cpu": cpu_model()}
    data = fake_data(
        {"stratified": [{first: 0.9}], "single:caption": [{first: 0.6}], "single:asr": [{first: 0.7}]}
    )
    for row in data["runs"].values():
        row |= here | {"model": identity}
        row["provenance"] = se.expected_run(row, identity, state, SETTINGS)
    original = here | {"items": SETTINGS["items"], "model": identity, "scores": dict.fromkeys(TASK_NAMES, 1.0)}
    original["provenance"] = se.expected_original(original | {"provenance": {"files": None}}, identity, state)
    data["original"][se.original_name(identity, SETTINGS["items"])] = original
    results = tmp_path / "rows.json"
    results.write_text(json.dumps(data))
    se.main([
        "--model", str(model), "--results", str(results), "--work", str(tmp_path / "work"), "--recipes", "w4a16",
        "--sizes", "32", "--seeds", "0", "--arms", "stratified,best-single", "--items", "8", "--pool-per-task", "4",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert "best-single of w4a16 at 32 samples: single:asr (chosen on seeds 0)" in out
    assert "[1/2] w4a16/stratified/32/0: cached" in out and "[2/2] w4a16/single:asr/32/0: cached" in out
    assert json.loads(results.read_text()) == data


def test_the_best_single_task_arm_is_chosen_on_the_seeds_every_single_task_arm_shares():
    """A screen: every single-task arm on seed 0, the chosen one then on seeds 1 and 2. Seed 0
    alone decides: single:caption's later seeds (better than single:asr's seed 0) do not turn the
    choice, which a mean over each arm's own seeds would."""
    first = TASK_NAMES[0]
    rows = list(
        fake_data(
            {
                "single:caption": [{first: 0.6}, {first: 1.0}, {first: 1.0}],
                "single:asr": [{first: 0.7}],
            }
        )["runs"].values()
    )
    best, means, seeds = se.best_single(rows, TASK_NAMES)
    assert best == "single:asr" and seeds == [0]
    assert means["single:caption"] < means["single:asr"]
    disjoint = [r | {"seed": 5} if r["arm"] == "single:asr" else r for r in rows]  # no shared seed: all
    assert se.best_single(disjoint, TASK_NAMES)[2] == [0, 1, 2, 5]


def test_render_tables_intervals_and_a_verdict_line_per_recipe_and_size():
    task = TASK_NAMES[0]
    per_arm = {
        "stratified": [{task: STRATIFIED_ITEMS}, {task: STRATIFIED_ITEMS}],
        "uniform": [{task: ARM_ITEMS}, {task: ARM_ITEMS}],
        "single:caption": [{task: [1.0] * ITEMS}, {task: [1.0] * ITEMS}],
        "single:asr": [{}, {}],
    }
    data = fake_data(per_arm, per_item=True)
    data["runs"].update(fake_data(per_arm, size=128, per_item=True)["runs"])
    data["runs"].update(
        fake_data({"stratified": [{}], "uniform": [{}]}, recipe="fp8")["runs"]
    )  # no per-item scores
    original = {
        "items": SETTINGS["items"], "model": IDENTITY, "scores": dict.fromkeys(TASK_NAMES, 0.5),
        "item_scores": {t: se.item_text([0.5] * ITEMS) for t in TASK_NAMES} | {task: se.item_text(STRATIFIED_ITEMS)},
    }  # fmt: skip
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
    columns = "stratified | uniform | best single-task (single:caption) |"
    assert f"| group | task | original | {columns}" in first
    assert f"| group | task | {columns}" in first  # the loss table
    assert "| group | task | uniform | best single-task (single:caption) |" in first  # the difference table
    assert f"| {TASKS[0].group} | {task} | 0.500 | 0.500 ± 0.000 (n=2) |" in first
    assert "Single-task arms, mean score over the tasks (seeds 0, 1): single:caption " in first
    assert "best single-task: single:caption." in first
    uniform = se.paired(ARM_ITEMS, STRATIFIED_ITEMS)
    loss = se.paired(STRATIFIED_ITEMS, ARM_ITEMS)
    assert (
        f"| {TASKS[0].group} | {task} | +0.0 [+0.0, +0.0] | {loss['diff']:+.1f} [{loss['low']:+.1f}, {loss['high']:+.1f}] | -50.0 ["
        in first
    )
    assert f"| {uniform['diff']:+.1f} [{uniform['low']:+.1f}, {uniform['high']:+.1f}] wins |" in first
    rest = ", ".join(TASK_NAMES[1:])
    assert (
        f"**Verdict, w4a16 at 32 samples:** stratified vs uniform: wins on {task}; ties on {rest}. Stratified vs "
        f"best single-task (single:caption): loses on {task}; ties on {rest}."
    ) in first
    assert f"made by {STATE['commit']} (current); measured on cpu (model not recorded), torch 1." in first and "stale" not in text
    fp8 = text.split("### ")[3]
    assert "No loss or difference intervals: these rows hold no per-item scores" in fp8 and "| - |" not in fp8
    assert "stratified vs uniform: not judged (rows without per-item scores)." in fp8
    assert (
        "Over all 3 tables (recipe x size): (recipe, size, task) cells where an arm lost against the original "
        f"beyond its interval: stratified 0 of {2 * len(TASK_NAMES)}; uniform 2 of {2 * len(TASK_NAMES)}; "
        f"best single-task 0 of {2 * len(TASK_NAMES)}."
    ) in text
    assert (
        f"uniform: stratified wins 2, ties {2 * len(TASK_NAMES) - 2}, loses 0; best single-task: stratified "
        f"wins 0, ties {2 * len(TASK_NAMES) - 2}, loses 2."
    ) in text
    assert "No rows yet" in se.render({"original": {}, "runs": {}})
    assert se.render(data, *se.expected_keys(data, IDENTITY, STATE)) == text  # seeded: the same bytes


def test_rows_of_another_suite_render_that_suites_tasks():
    from quantkit.synthetic import smol_tasks

    row = fake_row("w4a16", "stratified", 32, 0, {})
    row |= {"suite": smol_tasks.SUITE, "scores": {t.name: 0.5 for t in smol_tasks.TASKS}}
    text = se.render({"original": {}, "runs": {se.run_name("w4a16", "stratified", 32, 0): row}})
    assert "| text | capitals | not measured | 0.500 ± 0.000 (n=1) |" in text and "arithmetic" not in text


def test_every_arm_draws_from_its_own_records_for_either_suite(tmp_path):
    """The single-task, text-only and captions-only arms pick their records by the suite's tasks:
    tiny-omni-skills' arithmetic and caption, smol-omni-skills' capitals and caption."""
    from quantkit.synthetic import skills_tasks, smol_tasks

    for suite, text_task in ((skills_tasks, "arithmetic"), (smol_tasks, "capitals")):
        assert se.suite_arms(suite)[: len(se.ARMS)] == list(se.ARMS)
        assert se.suite_arms(suite)[len(se.ARMS) :] == [f"single:{t.name}" for t in suite.TASKS]
        assert se.arm_families("text-only", suite) == {suite.TASKS_BY_NAME[text_task].family}
        assert se.arm_families("captions-only", suite) == {suite.TASKS_BY_NAME["caption"].family}
    pool = se.write_pool(tmp_path / "smol", 2, smol_tasks)
    for arm, task in (
        ("single:ocr_table", "ocr_table"),
        ("captions-only", "caption"),
        ("text-only", "capitals"),
    ):
        samples, label = se.arm_samples(arm, pool, tmp_path, 3, 0, tmp_path, set(), smol_tasks)
        assert len(samples) == 3 and label == f"{arm}, seed 0"  # 2 records repeated to 3
        prompts = {s.messages[0]["content"] for s in samples}
        expected = {
            r["messages"][0]["content"] for r in se.pool_records(pool) if r["id"].startswith(task + "-")
        }
        assert prompts <= expected, arm


def test_a_skewed_pool_keeps_the_first_records_of_the_named_tasks_and_every_arm_draws_from_it(tmp_path):
    """--pool-keep precision=2: each precision task of smol-omni-skills keeps its first 2 records,
    the other tasks all 4; the uniform arm draws from that pool, never from a record left out."""
    from quantkit.synthetic import smol_tasks

    keep = se.parse_pool_keep("precision=2", smol_tasks, 4)
    precision = [t.name for t in smol_tasks.TASKS if t.precision]
    assert keep == dict.fromkeys(precision, 2) and len(precision) == 5
    pool = se.experiment_pool(tmp_path / "work", 4, smol_tasks, keep)
    assert pool.name == se.KEPT_POOL
    records = se.pool_records(pool)
    for task in smol_tasks.TASKS:
        ids = [r["id"] for r in records if r["task"] == task.family]
        count = 2 if task.precision else 4
        assert ids == [f"{task.name}-{i:04d}" for i in range(count)], task.name
    for record in records:
        for path in record["images"] + record["videos"] + record["audios"]:
            assert (pool.parent / path).is_file()
    samples, _ = se.arm_samples("uniform", pool, tmp_path, len(records), 0, tmp_path, set(), smol_tasks)
    kept = {r["messages"][0]["content"] for r in records}
    assert {s.messages[0]["content"] for s in samples} == kept
    # tasks named one by one
    assert se.parse_pool_keep("ocr_table=1,asr=3", smol_tasks, 4) == {"ocr_table": 1, "asr": 3}


@pytest.mark.parametrize(
    "text, said",
    [
        ("ocr_table", "'ocr_table' is not TASK=N"),
        ("ocr_table=x", "'ocr_table=x' is not TASK=N"),
        ("arithmetic=2", "unknown task 'arithmetic'"),
        ("ocr_table=4", "ocr_table=4: keep between 1 and 3 records"),
        ("ocr_table=0", "ocr_table=0: keep between 1 and 3 records"),
    ],
)
def test_a_pool_keep_that_cannot_be_done_is_refused_with_the_reason(tmp_path, capsys, text, said):
    model = suite_model(tmp_path)
    argv = ["--model", str(model), "--results", str(tmp_path / "rows.json"), "--pool-per-task", "4"]
    with pytest.raises(SystemExit) as raised:
        se.main([*argv, "--pool-keep", text])
    assert raised.value.code == 2
    assert f"--pool-keep: {said}" in capsys.readouterr().err
    assert not (tmp_path / "rows.json").exists()


def test_tiny_omni_skills_marks_no_precision_task_so_the_group_is_refused():
    from quantkit.synthetic import skills_tasks

    with pytest.raises(ValueError, match="marks no task as precision; name the tasks"):
        se.parse_pool_keep("precision=2", skills_tasks, 4)


def test_a_skewed_pool_is_a_setting_of_its_rows_and_of_their_table(monkeypatch):
    """A skewed run's row is keyed with the tasks kept and the code that keeps them: other counts
    or changed code make it stale; its table says how its pool was made."""
    # stored as JSON with sorted keys; shown in the suite's task order
    kept = {"arithmetic": 2, "caption": 2}
    skewed = SETTINGS | {"pool_keep": {"tasks": kept, "code": se.kept_code()}}
    row = fake_row("w4a16", "uniform", 32, 0, {}) | {"settings": skewed}
    row["provenance"] = se.expected_run(row | {"provenance": {"files": ["quantkit/errors.py"]}}, IDENTITY, STATE)
    assert se.current(row, se.expected_run(row, IDENTITY, STATE))
    assert not se.current(row, se.expected_run(row, IDENTITY, STATE, SETTINGS))
    fewer = skewed | {"pool_keep": {**skewed["pool_keep"], "tasks": {"caption": 1}}}
    assert not se.current(row, se.expected_run(row, IDENTITY, STATE, fewer))
    data = {"original": {}, "runs": {se.run_name("w4a16", "uniform", 32, 0): row}}
    text = se.render(data, *se.expected_keys(data, IDENTITY, STATE))
    first, second = sorted(kept, key=TASK_NAMES.index)
    said = f"pool 4 records a task but {first}, {second} 2 each (skewed: `--pool-keep`)"
    assert said in text and "stale" not in text
    monkeypatch.setattr(se, "kept_code", lambda: "0" * 16)  # kept_pool's code changed since
    assert not se.current(row, se.expected_run(row, IDENTITY, STATE))
    assert "stale" in se.render(data, *se.expected_keys(data, IDENTITY, STATE))


def test_arms_come_from_the_models_suite_and_unknown_ones_are_refused(tmp_path, capsys):
    model = suite_model(tmp_path)
    argv = ["--model", str(model), "--results", str(tmp_path / "rows.json"), "--render-only"]
    with pytest.raises(SystemExit) as raised:
        se.main([*argv, "--arms", "stratified,single:arithmetic"])
    assert raised.value.code == 2
    assert "unknown arms: single:arithmetic (known for smol-omni-skills:" in capsys.readouterr().err
    se.main([*argv, "--arms", "stratified,single"])  # every task's single arm: known
    (model / "skills.json").unlink()
    with pytest.raises(SystemExit) as raised:
        se.main(argv)
    assert raised.value.code == 2 and "skills.json" in capsys.readouterr().err


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
    assert "made by stale (measured at abc1234); measured on cpu (model not recorded), torch 1." in stale
    assert "| group | task |" in stale and "(n=1)" in stale  # its figures, not blanks
    assert "Over the 1 stale tables" in stale and "Over all" not in stale  # kept apart from current tables
    current = se.render(data, *se.expected_keys(data, IDENTITY, STATE))
    assert "| group | task |" in current and "stale" not in current


def test_a_gpu_row_is_checked_with_its_own_machines_libraries():
    """A row measured on a GPU machine (its CUDA torch is not the one here) stays current while the
    code, model and settings match; a CPU row with other library versions is stale."""
    gpu = {"torch": "2.11.0+cu130"}
    row = fake_row("w4a16", "stratified", 32, 0, {}) | {"device": "NVIDIA H200"}
    row["provenance"] = se.row_key(
        se.run_name("w4a16", "stratified", 32, 0), se.run_spec("w4a16", "stratified", 32, IDENTITY), SETTINGS,
        STATE | {"versions": gpu}, ["quantkit/errors.py"],
    )  # fmt: skip
    assert se.current(row, se.expected_run(row, IDENTITY, STATE))
    assert not se.current(row, se.expected_run(row, IDENTITY, STATE | {"bench": "c" * 64}))
    assert not se.current(row, se.expected_run(row, IDENTITY | {"hash": "fedcba9876543210"}, STATE))
    on_cpu = row | {"device": "cpu"}
    assert not se.current(on_cpu, se.expected_run(on_cpu, IDENTITY, STATE))
    data = {"original": {}, "runs": {se.run_name("w4a16", "stratified", 32, 0): row}}
    text = se.render(data, *se.expected_keys(data, IDENTITY, STATE))
    assert "measured on NVIDIA H200, torch 2.11.0+cu130." in text and "stale" not in text


def test_model_identity_follows_the_weights_tokenizer_configs_and_skills_manifest(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "tokenizer.json").write_text("{}")
    first = se.model_identity(tmp_path)  # every optional file but one missing: counted, no crash
    assert first["files"] == ["model.safetensors", "tokenizer.json"]
    assert {"config.json", "generation_config.json", "processor_config.json", "skills.json"} <= set(
        first["missing"]
    )
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


@pytest.mark.parametrize(
    "device, cpu, shown",
    [
        ("NVIDIA H200", None, "NVIDIA H200"),
        ("cpu", f"{cpu_model()} (another model)", f"cpu ({cpu_model()} (another model))"),
        ("cpu", None, "cpu (model not recorded)"),
    ],
)
def test_measuring_into_a_file_of_another_machines_rows_is_refused(tmp_path, capsys, device, cpu, shown):
    """Runs and the original are keyed without the machine: a CPU run added to the H200's rows
    would be paired with the H200's original (whose scores differ: 0.865 against 0.88 on
    smol's ocr_digits), and another CPU model's kernels differ too (the demo's figures moved
    between an Intel Xeon and an AMD EPYC). Measuring is refused before anything runs;
    rendering still works."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "skills.json").write_text(json.dumps({"suite": "tiny-omni-skills"}))
    row = fake_row("w4a16", "stratified", 32, 0, {}, identity=se.model_identity(model))
    row |= {"device": device} | ({"cpu": cpu} if cpu else {})
    results = tmp_path / "rows.json"
    results.write_text(json.dumps({"original": {}, "runs": {se.run_name("w4a16", "stratified", 32, 0): row}}))
    argv = ["--model", str(model), "--results", str(results), "--work", str(tmp_path / "work")]
    with pytest.raises(SystemExit) as raised:
        se.main([*argv, "--recipes", "w4a16", "--sizes", "32", "--seeds", "0"])
    assert raised.value.code == 2
    assert f"holds rows measured on {shown}, not here" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()
    se.main([*argv, "--render-only"])


def test_render_only_writes_the_section_and_marks_rows_of_another_model_stale(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "skills.json").write_text(json.dumps({"suite": "tiny-omni-skills"}))
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
    title = se.section_title("tiny-omni-skills", results)  # rows of a file not the suite's own
    assert title == f"{se.SECTION_TITLE} (tiny-omni-skills, rows of rows.json)"
    assert title + "\n" in text and "## Other\n\nkept" in text and "stale" not in text
    assert f"made by {state['commit']} (current)" in text

    (model / "model.safetensors").write_bytes(b"retrained")
    se.main(argv)
    assert f"stale (measured at {state['commit']})" in readme.read_text()
    assert readme.read_text().count(title) == 1
    capsys.readouterr()


def test_a_cpu_run_beside_the_gpu_grid_gets_a_section_of_its_own():
    """The suite's own rows file renders under the suite's heading; another file (the smol CPU
    run's) under a heading naming it, so that RESULTS.md shows both instead of one replacing the
    other."""
    own = se.section_title("smol-omni-skills", se.RESULTS_FILES["smol-omni-skills"])
    cpu = se.section_title("smol-omni-skills", se.ROOT / "bench" / "skills_experiment_smol_cpu.json")
    assert own == f"{se.SECTION_TITLE} (smol-omni-skills)" and se.section_title("tiny-omni-skills", se.RESULTS) == se.SECTION
    assert cpu == f"{se.SECTION_TITLE} (smol-omni-skills, rows of skills_experiment_smol_cpu.json)"


@pytest.mark.slow
def test_a_run_is_measured_once_then_reused(zoo_model, tmp_path, capsys):
    """Two tiny quantizes of tiny-omni-skills (text only and one single-task arm): each row keeps
    its per-item scores on the suite's held-out items, the section shows the best single-task arm,
    and a second invocation with the same model, code and settings reuses every row."""
    model = zoo_model("tiny-omni-skills")
    results = tmp_path / "rows.json"
    argv = [
        "--model", str(model), "--work", str(tmp_path / "work"), "--results", str(results),
        "--recipes", "w4a16", "--arms", "text-only,single:caption", "--sizes", "2", "--seeds", "0",
        "--items", "2", "--pool-per-task", "2",
    ]  # fmt: skip
    se.main(argv)
    out = capsys.readouterr().out
    assert (
        "[1/2] w4a16/text-only/2/0: measuring" in out and "[2/2] w4a16/single:caption/2/0: measuring" in out
    )
    data = json.loads(results.read_text())
    assert set(data["runs"]) == {"w4a16/text-only/2/0", "w4a16/single:caption/2/0"}
    (original,) = data["original"].values()
    for row in [*data["runs"].values(), original]:
        assert row["suite"] == "tiny-omni-skills" and set(row["scores"]) == set(TASK_NAMES)
        for task in TASK_NAMES:
            values = [float(v) for v in row["item_scores"][task].split()]
            assert len(values) == 2 and statistics.mean(values) == pytest.approx(
                row["scores"][task], abs=1e-6
            )
    row = data["runs"]["w4a16/single:caption/2/0"]
    assert row["items"] == 2 and row["model"]["hash"] == se.model_identity(model)["hash"]
    assert row["provenance"]["files"] and "quantkit/quantize/__init__.py" in row["provenance"]["files"]
    # scored on the original's suite (above) though a checkpoint carries no skills.json of its own
    assert not (tmp_path / "work" / "ckpt-w4a16-single-caption-2-0" / "skills.json").exists()
    assert "| text-only | best single-task (single:caption) |" in out

    se.main(argv)
    out = capsys.readouterr().out
    assert "[2/2] w4a16/single:caption/2/0: cached" in out and "original: cached" in out
    assert json.loads(results.read_text()) == data

    # a size calibrate refuses (fewer samples than strata) is a usage error, not a traceback
    with pytest.raises(SystemExit) as raised:
        se.main(["stratified" if a == "text-only,single:caption" else a for a in argv])
    assert raised.value.code == 2
    assert "w4a16/stratified/2/0: " in capsys.readouterr().err
    assert json.loads(results.read_text()) == data


def test_runs_measured_in_parallel_are_the_rows_a_sequential_run_reuses(zoo_model, tmp_path, capsys):
    """``--workers 2``: the original and two runs in spawned processes, each saved with its
    per-item scores and where it was measured; the sequential path then finds every row current."""
    results = tmp_path / "rows.json"
    argv = tiny_run_argv(zoo_model("tiny-omni-skills"), tmp_path, "uniform,text-only")
    se.main([*argv, "--workers", "2"])
    assert "measuring 2 in 2 processes" in capsys.readouterr().out
    data = json.loads(results.read_text())
    assert set(data["runs"]) == {"w4a16/uniform/2/0", "w4a16/text-only/2/0"} and len(data["original"]) == 1
    for row in [*data["runs"].values(), *data["original"].values()]:
        assert row["device"] == "cpu" and row["cpu"] == cpu_model()
        assert len(row["item_scores"][TASK_NAMES[0]].split()) == 2
    se.main(argv)
    out = capsys.readouterr().out
    assert "original: cached" in out and out.count(": cached (made by") == 3
    assert json.loads(results.read_text()) == data


@pytest.mark.slow
def test_a_skewed_run_measures_on_the_kept_pool_and_is_another_row_than_the_whole_pools(
    zoo_model, tmp_path, capsys
):
    """--pool-keep caption=1: the run draws from the kept pool, its row records what was kept and
    is reused with the same option; without it the same run is another measurement."""
    results = tmp_path / "rows.json"
    argv = tiny_run_argv(zoo_model("tiny-omni-skills"), tmp_path, "captions-only")
    se.main([*argv, "--pool-keep", "caption=1"])
    kept = se.pool_records(tmp_path / "work" / "pool" / se.KEPT_POOL)
    assert [r["id"] for r in kept if r["task"] == "short_caption"] == ["caption-0000"]
    assert len(kept) == 2 * len(TASK_NAMES) - 1
    (row,) = json.loads(results.read_text())["runs"].values()
    assert row["settings"]["pool_keep"] == {"tasks": {"caption": 1}, "code": se.kept_code()}
    assert "pool 2 records a task but caption 1 each" in capsys.readouterr().out
    se.main([*argv, "--pool-keep", "caption=1"])
    assert "w4a16/captions-only/2/0: cached" in capsys.readouterr().out
    se.main(argv)
    assert "w4a16/captions-only/2/0: stored row made with another model, code or settings" in (
        capsys.readouterr().out
    )
