"""bench/token_weights_experiment.py's SmolLM2 part: how its runs are judged and rendered into
RESULTS.md (the measuring itself needs SmolLM2's weights and the Jargon File: bench only)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]

import token_weights_experiment as tw  # noqa: E402
from _shared import cpu_model  # noqa: E402


def smol_runs(kl_by_arm: dict[str, list[float]], setting: str = "w4a16") -> list[dict]:
    """Run records as smol_run writes them, one per seed, perplexity following KL."""
    original = 40.0
    return [
        {
            "setting": setting,
            "arm": arm,
            "seed": seed,
            "size": 16,
            "window_tokens": 512,
            "calib_pool": tw.SMOL_POOL,
            "answer_share": tw.ANSWER_SHARE,
            "eval_windows": 16,
            "overrides": {**tw.SMOL_SETTINGS[setting], **tw.SMOL_ARMS[arm]},
            "scheme": {"num_bits": 4, "symmetric": bool(tw.SMOL_SETTINGS[setting]), "group_size": 64},
            "commit": f"c{arm}",
            "quantize_seconds": 100.0 + seed,
            "original_ppl": original,
            "ppl": original * (1 + kl),
            "kl": kl,
            "top1": 1 - kl,
            "recorded_token_weights": {"mean_weight": 1.75, "tokens": 8000} if arm == "answer-up" else None,
            "recorded_weight_observer": tw.SMOL_ARMS[arm]["weight_observer"],
        }
        for arm, values in kl_by_arm.items()
        for seed, kl in enumerate(values)
    ]


def test_smol_verdicts_count_only_differences_beyond_the_seed_spread():
    plain = [0.20, 0.22, 0.21]
    runs = smol_runs({"plain": plain, "answer-up": [0.205, 0.215, 0.23], "imatrix": [0.15, 0.16, 0.155]})
    text = tw.smol_render(runs)
    lines = {line.split(",")[1].split()[0]: line for line in text.splitlines() if line.startswith("- w4a16,")}
    assert "(within the seed spread)" in lines["answer-up"]
    assert "(better)" in lines["imatrix"] and "top-1 better" in lines["imatrix"]
    diff = statistics.mean([0.15, 0.16, 0.155]) - statistics.mean(plain)
    assert f"KL {diff:+.4f}" in lines["imatrix"]
    assert "Better than plain GPTQ beyond the seed spread (KL or perplexity): imatrix (w4a16)." in text
    assert "None was worse." in text
    assert "3 of 3 answer-up runs recorded their token weights" in text
    assert "3 of 3 imatrix runs recorded weight_observer: imatrix_mse" in text
    # each row: mean ± spread over the seeds, and the commit that made it
    row = next(line for line in text.splitlines() if line.startswith("| plain |"))
    assert f"{statistics.mean(plain):.4f} ± {max(plain) - min(plain):.4f}" in row and "cplain" in row


@pytest.mark.parametrize(
    "arms, variant",
    [
        (tw.ARMS, lambda arm: tw.variant("w4a16", arm)),
        (tw.SMOL_ARMS, lambda arm: tw.smol_recipe("w4a16", arm)),
    ],
)
def test_every_arm_names_its_observer_so_plain_stays_plain_gptq(arms, variant):
    """The shipped w4a16 picks imatrix_mse, so plain and the token-weighted arms must name the
    library's memoryless_minmax: each weighted arm differs from plain by its token weights alone,
    and imatrix by its observer alone."""
    from quantkit.recipes.registry import get_recipe

    assert get_recipe(tw.RECIPE).weight_observer == "imatrix_mse"  # why the arms cannot leave it unset
    plain = variant("plain")
    assert plain.weight_observer == "memoryless_minmax" and plain.token_weights is None
    imatrix = variant("imatrix")
    assert imatrix.weight_observer == "imatrix_mse"
    assert imatrix.model_dump(exclude={"weight_observer"}) == plain.model_dump(exclude={"weight_observer"})
    weighted = [arm for arm in arms if arms[arm].get("token_weights")]
    assert weighted and set(arms) == {"plain", "imatrix", *weighted}
    for arm in weighted:
        recipe = variant(arm)
        assert recipe.token_weights is not None
        assert recipe.model_dump(exclude={"token_weights"}) == plain.model_dump(exclude={"token_weights"})


def test_the_shipped_defaults_sentence_is_read_from_the_recipes():
    from quantkit.recipes.registry import get_recipe, list_recipes

    recipes = [get_recipe(info.name) for info in list_recipes()]
    text = tw.shipped_calibration()
    for recipe in recipes:
        named = f"{recipe.name} ships with weight_observer: {recipe.weight_observer}"
        assert (named in text) == (recipe.weight_observer is not None), recipe.name
    assert "w4a16 ships with weight_observer: imatrix_mse" in text
    assert "token_weights are absent (off) in every built-in recipe." in text
    assert all(r.token_weights is None for r in recipes)
    weighted = tw.variant("w4a16", "answer-up").model_copy(update={"name": "w4a16-answers"})
    plain = get_recipe("fp8").model_copy(update={"weight_observer": None})
    text = tw.shipped_calibration([weighted, plain])
    assert text == (
        "w4a16-answers ships with weight_observer: memoryless_minmax (every other built-in recipe leaves "
        "it unset: the library's memoryless_minmax); token_weights are on in w4a16-answers and absent "
        "(off) in every other built-in recipe."
    )
    assert tw.shipped_calibration([plain]).startswith("Every built-in recipe leaves weight_observer unset")
    assert tw.shipped_calibration() in tw.smol_render(
        smol_runs({"plain": [0.2, 0.21], "imatrix": [0.1, 0.11]})
    )


def test_smol_render_judges_nothing_on_one_seed():
    text = tw.smol_render(smol_runs({"plain": [0.2], "imatrix": [0.1]}))
    assert "nothing judged" in text and "Better than plain" not in text


def test_smol_render_says_so_when_no_arm_helps():
    text = tw.smol_render(smol_runs({"plain": [0.2, 0.21], "imatrix": [0.25, 0.26]}, setting="w4a16-sym"))
    assert "#### w4a16-sym (w4a16 symmetric: True: int4, group 64, symmetric" in text
    assert "Neither answer-token weighting nor imatrix beat plain GPTQ" in text
    assert "Worse than plain beyond the seed spread: imatrix (w4a16-sym)." in text


def test_smol_figures_replace_the_pending_note_and_keep_the_tiny_part(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Other\n\nkept\n", encoding="utf-8")
    tw.write_part(results, "tiny figures", smol=False)
    assert tw.SMOL_PENDING in results.read_text(encoding="utf-8")  # nothing measured yet: says so
    tw.write_part(results, tw.smol_render(smol_runs({"plain": [0.2, 0.21]})), smol=True)
    text = results.read_text(encoding="utf-8")
    assert tw.SMOL_PENDING not in text and tw.SMOL_SECTION in text
    assert "tiny figures" in text and "## Other\n\nkept" in text
    tw.write_part(results, "tiny figures again", smol=False)  # the tiny part re-rendered alone
    text = results.read_text(encoding="utf-8")
    assert "tiny figures again" in text and tw.SMOL_SECTION in text and tw.SMOL_PENDING not in text


@pytest.mark.parametrize(
    "args",
    [
        ["--work", "W"],  # the tiny-omni-skills part needs --model
        ["--model", "W", "--work", "W", "--settings", "w3a16"],
        ["--model", "W", "--work", "W"],  # a folder with no skills.json is not a skills model
        ["--smollm2", "--work", "W", "--smol-settings", "w3a16"],
        ["--smollm2", "--work", "W", "--arms", "vision-down"],  # no vision in SmolLM2
    ],
)
def test_bad_arguments_exit_2(tmp_path, args):
    args = [str(tmp_path / a) if a == "W" else a for a in args]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "token_weights_experiment.py"), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr


def keyed_results(
    path: Path, kl_by_seed: dict[int, float], stale_seeds=(), seeds=(0, 1, 2), inputs: dict | None = None
) -> dict:
    """A results file as smol_main writes it: the plan (with ``inputs``, the text's and the model's
    digests, where given), rows keyed by the code as it is now (or, for ``stale_seeds``, by other
    measuring code and another commit)."""
    import json

    state = tw.smol_state()
    other = {**state, "bench": "c" * 64, "commit": "89abcde"}
    plan = {"settings": ["w4a16"], "arms": ["plain"], "seeds": list(seeds), "size": 16, "eval_windows": 16}
    if inputs is not None:
        plan["inputs"] = inputs
    runs = {}
    for row in smol_runs({"plain": list(kl_by_seed.values())}):
        row["seed"] = list(kl_by_seed)[row["seed"]]
        made = other if row["seed"] in stale_seeds else state
        row["provenance"] = tw.smol_provenance(
            plan, "w4a16", "plain", row["seed"], made, ["quantkit/quantize/run.py"]
        )
        runs[tw.smol_name("w4a16", "plain", 16, row["seed"], 16)] = row
    saved = {"plan": plan, "runs": runs}
    path.write_text(json.dumps(saved), encoding="utf-8")
    return saved


def test_smol_rows_are_keyed_by_the_code_and_stale_ones_keep_their_figures_marked_stale(tmp_path, capsys):
    """The SmolLM2 rows carry bench/mixed_precision.py's key (recipe, seed, settings, measuring
    code, library versions, quantkit's source): a row made by other code keeps its last figures,
    marked stale with the commit that measured it, and stays out of the verdicts; a planned run
    with no row says so; a current row is marked current. --render-only measures nothing (no
    SmolLM2 here)."""
    import mixed_precision as mp

    results = tmp_path / "token_weights.json"
    saved = keyed_results(results, {0: 0.2111, 1: 0.9876}, stale_seeds=(1,))
    current = saved["runs"][tw.smol_name("w4a16", "plain", 16, 0, 16)]["provenance"]
    assert current["commit"] == mp.code_state()["commit"]
    tw.main(["--smollm2", "--work", str(tmp_path / "work"), "--render-only", "--results", str(results)])
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| plain | 21.11%"))
    assert f"{current['commit']} (current)" in row and "| 1 |" in row  # seed 0 alone: seed 1 has its own row
    stale = next(line for line in text.splitlines() if line.startswith("| plain (seeds 1) |"))
    assert (
        "98.76%" in stale
        and "0.9876" in stale
        and stale.endswith("| 1 | 101 s | stale (measured at 89abcde) |")
    )
    assert "| plain | not measured: seed 2 missing |" in text
    assert "2 of 3 planned runs are not measured at this code" in text


def test_smol_key_follows_recipe_seed_and_measuring_code():
    plan = {"size": 16, "eval_windows": 16}
    state = tw.smol_state()
    files = ["quantkit/quantize/run.py"]
    key = tw.smol_provenance(plan, "w4a16", "plain", 0, state, files)["key"]
    assert key == tw.smol_provenance(plan, "w4a16", "plain", 0, state, files)["key"]
    assert key != tw.smol_provenance(plan, "w4a16", "imatrix", 0, state, files)["key"]
    assert key != tw.smol_provenance(plan, "w4a16-sym", "plain", 0, state, files)["key"]
    assert key != tw.smol_provenance(plan, "w4a16", "plain", 1, state, files)["key"]
    assert key != tw.smol_provenance({**plan, "eval_windows": 8}, "w4a16", "plain", 0, state, files)["key"]
    assert key != tw.smol_provenance(plan, "w4a16", "plain", 0, {**state, "bench": "d" * 64}, files)["key"]
    other_text = {**plan, "inputs": {"text": "e" * 64, "model": "f" * 64}}
    assert key != tw.smol_provenance(other_text, "w4a16", "plain", 0, state, files)["key"]
    import mixed_precision as mp  # this part's measuring code is in its key beside the shared one

    assert state["bench"] != mp.code_state()["bench"] and state["versions"] == mp.code_state()["versions"]


def stand_in_smollm2(work: Path, zoo_model) -> Path:
    """``work`` laid out as smol_folder finds a SmolLM2 converted earlier, with a tiny zoo
    model's files in its place: what the rows' input digests are taken over."""
    import shutil

    from quantkit.zoo.real import DONE_MARKER, FOLDER_NAME

    folder = work / "smollm2" / FOLDER_NAME
    shutil.copytree(zoo_model("tiny-qwen3"), folder)
    (folder / DONE_MARKER).write_text("stand-in\n")
    return folder


def test_smol_current_rows_are_reused_not_measured(tmp_path, capsys, zoo_model):
    """Measuring mode reuses every row whose key matches (here all of them: nothing is measured,
    so no Jargon File and no GPTQ run is needed; the model folder is read for its digest) and
    records the plan asked for."""
    import json

    import mixed_precision as mp

    work = tmp_path / "work"
    stand_in_smollm2(work, zoo_model)
    results = tmp_path / "token_weights.json"
    keyed_results(results, {0: 0.20, 1: 0.21}, seeds=(0, 1), inputs=mp.input_digests(tw.smol_folder(work)))
    before = json.loads(results.read_text())["runs"]
    args = ["--smollm2", "--work", str(work), "--smol-settings", "w4a16", "--arms", "plain"]
    tw.main([*args, "--seeds", "0,1", "--smol-size", "16", "--smol-eval", "16", "--results", str(results)])
    assert "| plain | 20.50% ± 1.00% |" in capsys.readouterr().out
    assert json.loads(results.read_text())["runs"] == before


# ---------------------------------------------------------------------- tiny-omni-skills part

import skills_experiment as se  # noqa: E402

FILES = ["quantkit/quantize/run.py"]  # the module list a hand-made row claims its process loaded
PLAN = {
    "settings": ["w4a16"],
    "arms": ["plain", "imatrix"],
    "seeds": [0, 1],
    "items": 24,
    "pool_per_task": 12,
}


def fake_model(folder: Path, weights: bytes = b"weights") -> Path:
    """A folder model_identity can hash (it hashes bytes; nothing here loads them as a model)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    (folder / "skills.json").write_text(json.dumps({"suite": tw.TINY}), encoding="utf-8")
    return folder


def task_scores(value: float = 1.0, **scores: float) -> dict:
    from quantkit.synthetic.skills_tasks import TASKS

    return {t.name: scores.get(t.name, value) for t in TASKS}


def item_scores(scores: dict, items: int = PLAN["items"]) -> dict:
    """Per-item scores (as rows store them) whose means are ``scores`` to the nearest item: the
    first round(score x items) items right, the rest wrong."""
    return {t: " ".join("1" if i < round(v * items) else "0" for i in range(items)) for t, v in scores.items()}


def items_of(scores: float, items: int = PLAN["items"]) -> list[float]:
    return [float(v) for v in item_scores({"t": scores}, items)["t"].split()]


def skills_row(setting, arm, seed, scores, identity, state, packed=("a", "b")) -> dict:
    """A run row as skills_main stores it, keyed under ``identity`` and ``state``."""
    settings = tw.run_settings(PLAN)
    name = tw.run_name(setting, arm, seed)
    row = {
        "setting": setting,
        "arm": arm,
        "seed": seed,
        "size": tw.SETTINGS[setting][1],
        "items": PLAN["items"],
        "quantize_seconds": 10.0,
        "score_seconds": 5.0,
        "sample_ids": [f"s{seed}-{i}" for i in range(3)],
        "recorded_token_weights": None,
        "card_token_weights": False,
        "recorded_weight_observer": tw.ARMS[arm]["weight_observer"],
        "tensors": {"l0.weight_packed": packed[0], "l1.weight_packed": packed[1], "l0.weight_scale": "s"},
        "scores": scores,
        "item_scores": item_scores(scores),
        "settings": settings,
        "model": identity,
    }
    row["provenance"] = se.row_key(name, tw.run_spec(setting, arm, identity), settings, state, FILES)
    return row


def original_row(scores: dict, identity: dict, state: dict) -> dict:
    spec = {"model": {k: identity[k] for k in ("hash", "record")}}
    provenance = se.row_key(
        "original", spec, {"items": PLAN["items"], "score_batch": se.SCORE_BATCH}, state, FILES
    )
    return {
        "items": PLAN["items"],
        "model": identity,
        "seconds": 1.0,
        "scores": scores,
        "item_scores": item_scores(scores),
        "provenance": provenance,
    }


def stored(path: Path, original: dict, runs: list[dict], identity: dict) -> dict:
    data = {
        "plan": PLAN,
        "original": {se.original_name(identity, PLAN["items"]): original},
        "runs": {tw.run_name(r["setting"], r["arm"], r["seed"]): r for r in runs},
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return data


def test_judged_tasks_are_those_the_original_scores_clearly_above_chance():
    """The rule replaces a typed-in list: judged where the original clears the task's chance level
    by JUDGED_SD standard errors and JUDGED_ITEMS items; grounding at its chance (one of nine
    cells) is not judged."""
    from quantkit.synthetic.skills_tasks import TASKS

    items = PLAN["items"]
    assert tw.chance_level("grounding")[0] == pytest.approx(1 / 9)
    assert tw.chance_level("ocr_digits")[0] == pytest.approx(1e-3)
    threshold = tw.judged_threshold("ocr_table", items)
    original = {
        "items": items,
        "scores": task_scores(
            1.0,
            ocr_table=threshold - 1 / items,
            asr=0.0,
            grounding=1 / 9,
            caption=tw.judged_threshold("caption", items),
        ),
    }
    judged = tw.judged_tasks(original)
    assert judged == [t.name for t in TASKS if t.name not in ("ocr_table", "asr", "grounding")]
    assert "caption" in judged  # the threshold itself is judged
    assert tw.judged_tasks(None) == []  # no current original: nothing judged
    identity = {"hash": "h" * 16, "record": None}
    original["provenance"] = {"commit": "abc1234"}
    text = tw.render(PLAN, identity, original, [])
    grounding = tw.judged_threshold("grounding", items)
    assert f"grounding (chance {1 / 9:.3f}, original below {grounding:.3f}: not judged)" in text
    assert "| caption |" in text  # judged rows carry no mark
    assert "not judged (original not clearly above chance): ocr_table, grounding and asr." in text
    assert f"{tw.JUDGED_SD:g}·sqrt(c(1 - c)/{items})" in text and f"{tw.JUDGED_ITEMS} items" in text
    assert "one item in ten" not in text


def test_chance_levels_match_the_task_generators():
    """Each derived chance level is what its constant answer scores on items the task draws."""
    from quantkit.eval.skills import SCORERS
    from quantkit.synthetic.skills_tasks import TASKS, make_items

    n = 600
    for task in TASKS:
        chance, answer = tw.chance_level(task.name)
        scores = [SCORERS[task.metric](answer, item.answer) for item in make_items(task.name, n, seed=4242)]
        bound = 4 * max(chance * (1 - chance), 1 / n) ** 0.5 / n**0.5
        assert abs(statistics.mean(scores) - chance) <= bound, task.name


def test_chance_levels_of_smol_tasks_are_estimated_from_what_their_generators_draw():
    """smol-omni-skills' answers are not enumerated: each chance level is estimated from
    CHANCE_DRAWS drawn answers, and its constant answer scores about that on items of another
    seed; the estimates sit far below what the original scores (so every task can be judged)."""
    from quantkit.eval.skills import SCORERS
    from quantkit.synthetic import smol_tasks

    n = 400
    suite = smol_tasks.SUITE
    for task in smol_tasks.TASKS:
        chance, answer = tw.chance_level(task.name, suite)
        scores = [SCORERS[task.metric](answer, item.answer) for item in smol_tasks.make_items(task.name, n, seed=4242)]
        bound = 4 * max(chance * (1 - chance), 1 / n) ** 0.5 / n**0.5
        assert abs(statistics.mean(scores) - chance) <= bound, task.name
        assert tw.judged_threshold(task.name, 200, suite) < 0.6, task.name
    assert tw.chance_level("capitals", suite)[0] < 0.05  # 40 countries
    assert tw.chance_level("audio_image_qa", suite)[0] == pytest.approx(0.5, abs=0.05)  # yes / no


def test_a_smol_model_renders_its_own_section_and_keeps_the_tiny_one(tmp_path, capsys):
    """Rows of a smol-omni-skills model go to its own RESULTS.md section (the tiny-omni-skills
    section, with SmolLM2's text subsection, is left as it was), judged by that suite's tasks."""
    from quantkit.synthetic import smol_tasks

    model = fake_model(tmp_path / "model")
    (model / "skills.json").write_text(json.dumps({"suite": smol_tasks.SUITE}), encoding="utf-8")
    identity = se.model_identity(model)
    state = tw.skills_state()
    scores = {t.name: 1.0 for t in smol_tasks.TASKS}
    results = tmp_path / "rows.json"
    rows = [skills_row("w4a16", arm, 0, dict(scores, capitals=v), identity, state) for arm, v in (("plain", 1.0), ("imatrix", 0.5))]
    stored(results, original_row(scores, identity, state), rows, identity)
    markdown = tmp_path / "RESULTS.md"
    tiny = f"{tw.SECTION}\n\ntiny part\n\n{tw.SMOL_SECTION}\n\ntext part\n"
    markdown.write_text(f"# Benchmark results\n\n{tiny}", encoding="utf-8")
    args = ["--model", str(model), "--work", str(tmp_path / "work"), "--render-only", "--results", str(results)]
    tw.main([*args, "--write-results", str(markdown)])
    written = markdown.read_text(encoding="utf-8")
    assert written.startswith(f"# Benchmark results\n\n{tiny}")
    section = written.split(tw.SUITE_SECTIONS[smol_tasks.SUITE] + "\n", 1)[1]
    assert f"Model: {smol_tasks.SUITE} {identity['hash']}" in section
    assert "| text | capitals |" in section and "arithmetic" not in section  # smol's tasks, not tiny's
    worse = se.interval_text(se.paired(items_of(0.5), items_of(1.0)))
    assert f"worse on capitals {worse}" in section
    assert "over 2000 answers quantkit/synthetic/smol_tasks.py draws" in section


def test_unmoved_tasks_are_named_and_losses_against_the_original_reported():
    """A judged task no checkpoint moves on is 'no movement: nothing to judge', not tested; an arm
    whose paired interval against the original lies wholly above 0 is a loss, reported beside
    plain's; plain one item below the original on one seed is within its interval."""
    identity = {"hash": "h" * 16, "record": None}
    scores = task_scores(1.0, ocr_table=0.25)
    original = {"items": 24, "scores": scores, "item_scores": item_scores(scores), "provenance": {"commit": "abc1234"}}
    state = tw.skills_state()
    rows = [
        skills_row("w4a16", "plain", s, task_scores(1.0, ocr_table=v), identity, state)
        for s, v in ((0, 0.25), (1, 5 / 24))
    ]
    rows += [skills_row("w4a16", "imatrix", s, task_scores(1.0, ocr_table=0.0), identity, state) for s in (0, 1)]
    text = tw.render(PLAN, identity, original, rows)
    assert "ocr_digits (no movement: nothing to judge)" in text and "| image | ocr_table |" in text
    assert (
        "Of the issue's precision tasks (ocr_digits, ocr_table, grounding and temporal_grounding), ocr_table is judged here"
        in text
    )
    assert "- w4a16, plain against the original beyond the paired interval: lost on no judged task" in text
    loss = se.interval_text(se.paired(items_of(0.25), items_of(0.0)))
    assert loss.startswith("+25.0 [") and f"imatrix on ocr_table {loss} (w4a16)" in text
    worse = se.interval_text(se.paired(items_of(0.0), [1.0] * 5 + [0.5] + [0.0] * 18))  # vs plain's seed mean
    # plain's seeds 6 and 5 items of 24 apart: the draw's spread is said beside the item interval
    assert f"Worse than plain beyond the paired interval: imatrix on ocr_table {worse} (seed spread 4.2) (w4a16)." in text


def test_a_difference_from_plain_counts_only_beyond_the_paired_interval():
    """One item of 24 apart is within the paired interval (no difference, whatever the means);
    twelve items apart is beyond it, with the figure the gate's interval gives; a row without
    per-item scores (made before they were kept) is judged neither way."""

    def runs(imatrix: float) -> list[dict]:
        return [
            {"setting": "w4a16", "arm": arm, "seed": 0, "item_scores": item_scores({"ocr_table": v})}
            for arm, v in (("plain", 1.0), ("imatrix", imatrix))
        ]

    assert tw.differences("w4a16", runs(23 / 24), ["ocr_table"]) == {"imatrix": ([], [])}
    figure = se.interval_text(se.paired(items_of(0.5), items_of(1.0)))
    assert figure.startswith("-50.0 [")
    assert tw.differences("w4a16", runs(0.5), ["ocr_table"]) == {"imatrix": ([], [f"ocr_table {figure}"])}
    old = [{k: v for k, v in r.items() if k != "item_scores"} for r in runs(0.5)]
    assert tw.differences("w4a16", old, ["ocr_table"]) == {"imatrix": ([], [])}


def test_the_intro_names_the_results_file_it_was_rendered_from(tmp_path):
    identity = {"hash": "h" * 16, "record": None}
    assert "from bench/token_weights_skills.json." in tw.intro(PLAN, identity, None, [])
    assert f"from {tmp_path / 'rows.json'}." in tw.intro(PLAN, identity, None, [], tmp_path / "rows.json")
    assert tw.note({"history": "old tables"}).endswith("(`history`; not a measurement): old tables")


def test_rows_of_another_model_or_other_code_are_not_current(tmp_path, capsys):
    """A row keyed under another model identity or other measuring code is stale: not reused,
    rendered with its last figures in a table marked stale, out of the verdicts; current rows are
    rendered with theirs. --render-only measures nothing: the stored file and the scratch folder
    stay as they were."""
    model = fake_model(tmp_path / "model")
    identity = se.model_identity(model)
    state = tw.skills_state()
    other_model = {**identity, "hash": "0" * 16}
    other_code = {**state, "bench": "c" * 64, "commit": "89abcde"}
    results = tmp_path / "token_weights_skills.json"
    rows = [
        skills_row("w4a16", "plain", 0, task_scores(1.0), identity, state),
        skills_row("w4a16", "plain", 1, task_scores(0.777), other_model, state),
        skills_row("w4a16", "imatrix", 0, task_scores(0.5), identity, state, packed=("a", "z")),
        skills_row("w4a16", "imatrix", 1, task_scores(0.666), identity, other_code),
    ]
    stored(results, original_row(task_scores(1.0), identity, state), rows, identity)
    settings = tw.run_settings(PLAN)
    assert [se.current(r, tw.expected_run(r, identity, state, settings)) for r in rows] == [
        True,
        False,
        True,
        False,
    ]
    before = results.read_bytes()
    work = tmp_path / "work"
    tw.main(["--model", str(model), "--work", str(work), "--render-only", "--results", str(results)])
    text = capsys.readouterr().out
    assert results.read_bytes() == before and list(work.iterdir()) == []
    current_part, stale_part = text.split("Runs of w4a16, ")
    assert "0.777" not in current_part and "0.666" not in current_part
    assert stale_part.startswith("stale (measured at ") and "89abcde" in stale_part.split(")")[0]
    caption_then = next(line for line in stale_part.splitlines() if line.startswith("| image | caption |"))
    assert "| 0.777 ± 0.000 (n=1) | 0.666 ± 0.000 (n=1) |" in caption_then  # plain, imatrix seed 1
    stale = [
        line for line in text.splitlines() if line.startswith("- w4a16, not measured at this code (stale")
    ]
    assert any(line.endswith("): plain seed 1") for line in stale)  # another model
    assert any(
        "made by 89abcde" in line and line.endswith("): imatrix seed 1") for line in stale
    )  # other code
    assert "2 of 4 planned runs are not measured at this code" in text
    caption = next(line for line in current_part.splitlines() if line.startswith("| image | caption |"))
    assert "| 1.000 ± 0.000 (n=1) | 0.500 ± 0.000 (n=1) |" in caption
    assert "seeds 0;" in text  # seed 1 has no current row
    assert f"- w4a16: made by {state['commit']} (current)" in current_part
    # one current seed a side is enough for the paired interval: imatrix (0.5) worse than plain (1.0)
    worse = se.interval_text(se.paired(items_of(0.5), items_of(1.0)))
    assert f"- w4a16, imatrix against plain beyond the paired interval: better on no task; worse on ocr_digits {worse}" in text
    assert "packed weights 1-1 of 2, scales 0-0 of 1" in text  # from the rows' digests


def test_stale_original_judges_nothing(tmp_path, capsys):
    model = fake_model(tmp_path / "model")
    identity = se.model_identity(model)
    state = tw.skills_state()
    results = tmp_path / "token_weights_skills.json"
    old = original_row(task_scores(0.888), {**identity, "hash": "1" * 16}, state)
    stored(
        results,
        old,
        [skills_row("w4a16", "plain", s, task_scores(1.0), identity, state) for s in (0, 1)],
        identity,
    )
    data = json.loads(results.read_text())
    data["original"] = {se.original_name(identity, PLAN["items"]): old}  # stored under this model's name
    results.write_text(json.dumps(data), encoding="utf-8")
    tw.main(
        ["--model", str(model), "--work", str(tmp_path / "work"), "--render-only", "--results", str(results)]
    )
    text = capsys.readouterr().out
    assert "original scores not measured at this code" in text
    assert "0.888" not in text  # no stale run to show the stale original beside
    assert "The original's scores are not measured at this code, so no task is judged." in text


def test_current_rows_are_reused_and_judged_not_measured(tmp_path, capsys):
    """Measuring mode reuses every current row and the current original (the fake model could not
    be quantized: nothing is measured, no pool is written) and judges by the paired interval."""
    model = fake_model(tmp_path / "model")
    identity = se.model_identity(model)
    state = tw.skills_state()
    results = tmp_path / "token_weights_skills.json"
    rows = [skills_row("w4a16", "plain", s, task_scores(1.0), identity, state) for s in (0, 1)]
    rows += [
        skills_row("w4a16", "imatrix", s, task_scores(1.0, caption=v), identity, state)
        for s, v in ((0, 0.5), (1, 0.6))
    ]
    data = stored(results, original_row(task_scores(1.0, asr=0.0), identity, state), rows, identity)
    work = tmp_path / "work"
    args = ["--model", str(model), "--work", str(work), "--settings", "w4a16", "--arms", "plain,imatrix"]
    tw.main([*args, "--seeds", "0,1", "--items", "24", "--pool-per-task", "12", "--results", str(results)])
    text = capsys.readouterr().out
    after = json.loads(results.read_text())
    assert (
        after["runs"] == data["runs"] and after["original"] == data["original"] and list(work.iterdir()) == []
    )
    imatrix = [statistics.mean(pair) for pair in zip(items_of(0.5), items_of(0.6), strict=True)]
    worse = se.interval_text(se.paired(imatrix, items_of(1.0)))
    assert worse.startswith("-45.8 [")  # 13 of 24 items right on average over the two seeds
    assert f"- w4a16, imatrix against plain beyond the paired interval: better on no task; worse on caption {worse}" in text
    assert f"Worse than plain beyond the paired interval: imatrix on caption {worse} (seed spread 10.0) (w4a16)." in text
    lost = se.interval_text(se.paired(items_of(1.0), imatrix))
    assert f"imatrix on caption {lost} (w4a16)" in text
    assert "2 of 2 imatrix runs recorded weight_observer: imatrix_mse" in text
    assert "model.safetensors" not in text and identity["hash"] in text


def test_the_skills_key_follows_model_setting_arm_and_code():
    identity = {"hash": "h" * 16, "record": "r" * 64}
    state = tw.skills_state()
    settings = tw.run_settings(PLAN)

    def key(setting="w4a16", arm="plain", ident=identity, st=state, sets=settings):
        return se.row_key(tw.run_name(setting, arm, 0), tw.run_spec(setting, arm, ident), sets, st, FILES)[
            "key"
        ]

    base = key()
    assert base == key()
    assert base != key(setting="w4a16-sym-10") and base != key(arm="tier")
    assert base != key(ident={**identity, "record": "s" * 64}) and base != key(
        ident={**identity, "hash": "g" * 16}
    )
    assert base != key(st={**state, "bench": "d" * 64}) and base != key(sets={**settings, "items": 8})
    assert state["bench"] != se.code_state()["bench"]  # this part's measuring code is in its key too


def test_tensor_digests_tell_which_quantized_tensors_differ(tmp_path):
    """A row keeps digests of its checkpoint's quantized tensors (safetensors, as quantize writes
    them), so an arm is compared with plain's without plain's checkpoint at hand."""
    import torch
    from safetensors.torch import save_file

    def checkpoint(name: str, scale: float) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        tensors = {
            "l0.weight_packed": torch.arange(8, dtype=torch.int32).reshape(2, 4),
            "l0.weight_scale": torch.full((2, 1), scale, dtype=torch.bfloat16),
            "l0.bias": torch.zeros(2),
        }
        save_file(tensors, str(folder / "model.safetensors"))
        return folder

    plain, other = tw.tensor_digests(checkpoint("plain", 0.5)), tw.tensor_digests(checkpoint("other", 0.25))
    assert sorted(plain) == ["l0.weight_packed", "l0.weight_scale"]  # only the quantized tensors
    runs = [
        {"setting": "w4a16", "seed": 0, "arm": "plain", "tensors": plain},
        {"setting": "w4a16", "seed": 0, "arm": "imatrix", "tensors": other},
    ]
    assert tw.against_plain(runs, runs[1]) == {"weight_packed": [0, 1], "weight_scale": [1, 1]}
    assert tw.against_plain(runs[1:], runs[1]) is None  # no plain row of that setting and seed


# ---------------------------------------------------------------------- what the keys cover


def default_names(function) -> set[str]:
    """The names in ``function``'s default arguments (``def f(n=WINDOW)``): evaluated where the
    function is defined, so its own code object never reads them."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
                names |= {n.id for n in ast.walk(default) if isinstance(n, ast.Name)}
    return names


def global_names(function) -> set[str]:
    """The global names ``function`` (or each method of a class) reads, nested code and default
    arguments included."""
    members = (
        [function]
        if hasattr(function, "__code__")
        else [member for member in vars(function).values() if hasattr(member, "__code__")]
    )
    codes = [member.__code__ for member in members]
    names = set().union(*(default_names(member) for member in members))
    while codes:
        code = codes.pop()
        names |= set(code.co_names)
        codes += [const for const in code.co_consts if isinstance(const, type(code))]
    return names


DEFAULT_WINDOW = 512


def _draw(n=DEFAULT_WINDOW):
    return n


def test_global_names_sees_a_constant_used_only_as_a_default_argument():
    assert "DEFAULT_WINDOW" not in _draw.__code__.co_names  # what the code object alone misses
    assert "DEFAULT_WINDOW" in global_names(_draw)


# Names the measuring functions read that are rightly not hashed, with why.
NOT_HASHED = {
    "JARGON": "where the Jargon File is looked for (a path, not what is read)",
    "JARGON_MISSING": "the message when it is not there",
    "row_key": "the key itself",
}


@pytest.mark.parametrize("part", ["skills", "smol"])
def test_every_module_value_and_function_the_measuring_code_reads_is_in_the_key(part):
    """inspect.getsource hashes a function's body only: each module-level constant and same-module
    function the hashed functions read must be hashed too (by name in the values lists), or a
    change to it would keep a stale row current."""
    import inspect

    import mixed_precision as mp

    if part == "skills":
        groups = [(se, se.MEASURING, se.MEASURED_VALUES), (tw, tw.SKILLS_MEASURING, tw.SKILLS_VALUES)]
    else:
        groups = [(mp, mp.MEASURING, mp.MEASURED_VALUES), (tw, tw.SMOL_MEASURING, tw.SMOL_VALUES)]
    hashed = {f for _, functions, _ in groups for f in functions}
    for module, functions, values in groups:
        read = set().union(*(global_names(f) for f in functions)) - set(NOT_HASHED)
        read = {n for n in read if not n.startswith("__")}  # __name__ and the like: not the module's
        found = {name: vars(module)[name] for name in read if name in vars(module)}
        constants = {n for n, v in found.items() if not callable(v) and not inspect.ismodule(v)}
        assert constants <= set(values), (module.__name__, sorted(constants - set(values)))
        own = {
            n for n, v in found.items()
            if inspect.isfunction(v) and v.__module__ == module.__name__ and v not in hashed
        }  # fmt: skip
        assert not own, (module.__name__, sorted(own))
    assert set(tw.SKILLS_VALUES) >= {"QUANTIZED"} and se.original_row in se.MEASURING


def render_only(model: Path, results: Path, work: Path, capsys) -> str:
    tw.main(["--model", str(model), "--work", str(work), "--render-only", "--results", str(results)])
    return capsys.readouterr().out


def test_a_change_to_anything_the_skills_key_covers_makes_the_rows_stale(
    zoo_model, tmp_path, capsys, monkeypatch
):
    """Rows keyed now, then each input the key must cover changed on disk (every config file of a
    copy of the real tiny-omni-skills folder, skills.json, the tokenizer, a processor config
    added, one removed), a library version and a constant the measuring code reads: the rows and
    the original are stale (rendered without figures) after each change, current again once it
    is undone; a README in the model folder or a judging constant changes nothing."""
    import importlib.metadata
    import shutil

    model = tmp_path / "model"
    shutil.copytree(zoo_model("tiny-omni-skills"), model)
    identity = se.model_identity(model)
    covered = ["config.json", "generation_config.json", "processor_config.json", "skills.json"]
    covered += ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
    assert set(covered) <= set(identity["files"]) and "preprocessor_config.json" in identity["missing"]
    state = tw.skills_state()
    rows = [
        skills_row("w4a16", a, s, task_scores(0.777), identity, state)
        for a in PLAN["arms"]
        for s in PLAN["seeds"]
    ]
    results = tmp_path / "rows.json"
    stored(results, original_row(task_scores(0.888), identity, state), rows, identity)
    work = tmp_path / "work"

    def stale() -> bool:
        text = render_only(model, results, work, capsys)
        original = "original scores not measured at this code" in text
        runs = f"{len(rows)} of {len(rows)} planned runs are not measured at this code" in text
        assert original == runs, text  # the original and the runs share the model and code
        assert "0.777" in text and "0.888" in text  # the last figures, current or stale
        assert ("stale (measured at" in text) == runs
        return runs

    assert not stale()
    for name in covered:
        before = (model / name).read_bytes()
        (model / name).write_bytes(before + b"\n")
        assert stale(), name
        (model / name).write_bytes(before)
        assert not stale(), name
    kept = (model / "generation_config.json").read_bytes()
    (model / "generation_config.json").unlink()  # an optional file missing: counted, no crash
    assert "generation_config.json" in se.model_identity(model)["missing"] and stale()
    (model / "generation_config.json").write_bytes(kept)
    (model / "video_preprocessor_config.json").write_text("{}")  # a processor config the folder gains
    assert stale()
    (model / "video_preprocessor_config.json").unlink()
    (model / "README.md").write_text("# notes\n")  # not what the model answers with
    assert not stale()

    version = importlib.metadata.version
    for library in ("numpy", "pillow"):
        monkeypatch.setattr(
            importlib.metadata, "version", lambda n, _l=library: "0.0" if n == _l else version(n)
        )
        assert stale(), library
        monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(tw, "QUANTIZED", ("weight_packed",))  # what tensor_digests keeps
    assert stale()
    monkeypatch.undo()
    monkeypatch.setattr(tw, "JUDGED_SD", 3.0)  # judging, not measuring: the rows stand
    assert not stale()


@pytest.mark.slow
def test_a_real_run_is_reused_while_its_inputs_stand_and_remeasured_after_a_config_change(
    zoo_model, tmp_path, capsys
):
    """The real measuring path on a copy of tiny-omni-skills (one quantize of 10 samples, one item
    a task: seconds): measured once, reused by a second invocation, measured again (run and
    original) once the folder's generation_config.json changes."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(zoo_model("tiny-omni-skills"), model)
    results = tmp_path / "rows.json"
    argv = [
        "--model", str(model), "--work", str(tmp_path / "work"), "--results", str(results),
        "--settings", "w4a16-sym-10", "--arms", "plain", "--seeds", "0", "--items", "1", "--pool-per-task", "2",
    ]  # fmt: skip
    tw.main(argv)
    first = json.loads(results.read_text())
    (run,) = first["runs"].values()
    (original,) = first["original"].values()
    capsys.readouterr()

    assert run["device"] == original["device"] == "cpu" and run["cpu"] == original["cpu"] == cpu_model()

    tw.main(argv)  # nothing changed: the stored rows stand, nothing is measured
    assert json.loads(results.read_text()) == first
    assert '"arm": "plain"' not in capsys.readouterr().out  # a measured row is printed as JSON

    config = model / "generation_config.json"
    config.write_text(config.read_text() + "\n")
    # rows of another CPU model: nothing is measured into their file (it would pair two machines)
    elsewhere = json.loads(results.read_text())
    for row in [*elsewhere["runs"].values(), *elsewhere["original"].values()]:
        row["cpu"] = f"{cpu_model()} (another model)"
    results.write_text(json.dumps(elsewhere))
    with pytest.raises(SystemExit) as refused:
        tw.main(argv)
    assert refused.value.code == 2 and "(another model)), not here" in capsys.readouterr().err
    assert json.loads(results.read_text()) == elsewhere
    results.write_text(json.dumps(first))
    tw.main(argv)
    after = json.loads(results.read_text())
    (remeasured,) = after["runs"].values()
    assert remeasured["provenance"]["key"] != run["provenance"]["key"]
    assert remeasured["model"]["hash"] != run["model"]["hash"] == original["model"]["hash"]
    assert se.original_name(remeasured["model"], 1) in after["original"]  # the original measured again
    assert '"arm": "plain"' in capsys.readouterr().out
