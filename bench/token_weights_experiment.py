"""Issues 18 and 35: plain GPTQ vs token-weighted GPTQ vs llmcompressor's imatrix observer on a
skills model (tiny-omni-skills, or smol-omni-skills: SmolLM2-135M's real weights, the suite its
skills.json names), the same calibration samples per seed, per-task accuracy over seeds.

Arms (``ARMS``) are variants of one recipe, each naming its weight observer (the shipped w4a16
picks imatrix_mse, so no arm leaves it to the recipe): ``plain`` (plain GPTQ: ``weight_observer:
memoryless_minmax``, the library's range), token-weighted GPTQ (a ``token_weights`` section:
H = sum_t w_t x_t x_t^T, with plain's observer, so that only the weighting differs) and
``imatrix`` (``weight_observer: imatrix_mse``: each group's scale chosen by an MSE search weighted
by the input channels' E[x^2]).
Settings (``SETTINGS``) are the recipe's overrides and the number of calibration samples: w4a16 as
shipped, and a harsher one vLLM still serves (symmetric int4, no zero points, 10 samples: the
fewest that cover the pool's 10 strata). Every arm of a setting and seed calibrates on the same
drawn samples (the stratified set of bench/skills_experiment.py's pool, with its task labels), then
is scored with ``quantkit.eval.skills.score_model`` on the same held-out items as the original
(paired: each row keeps its per-item scores). An arm differs from plain, and loses against the
original, where the gate's paired bootstrap 95% interval on the same items (each item's score
averaged over the arm's seeds) excludes 0. A task is judged only where the original's score clears
the task's chance level (the best score of an answer that ignores the input: derived from
quantkit/synthetic/skills_tasks.py's task definitions for tiny-omni-skills, estimated from
``CHANCE_DRAWS`` answers the generator draws for another suite: ``chance_level``) by ``JUDGED_SD``
binomial standard errors over the held-out items and by at least ``JUDGED_ITEMS`` items (see
``judged_tasks``).

    python bench/token_weights_experiment.py --model DIR --work /tmp/tw-exp \
        --settings w4a16,w4a16-sym-10 --seeds 0,1,2 --items 24 --write-results bench/RESULTS.md

On smol-omni-skills (issue 35; its rows in bench/token_weights_skills_smol.json, its own RESULTS.md
section), w4a16 on 256 samples as bench/skills_experiment.py's CPU run calibrates it:

    python bench/token_weights_experiment.py --model DIR --work /tmp/tw-smol-skills \
        --settings w4a16-256 --seeds 0,1 --items 200 --pool-per-task 256 --write-results bench/RESULTS.md

The tiny-omni-skills part keeps its rows in ``--results`` (default bench/token_weights_skills.json,
in the repository; a file of its own, not a section of bench/token_weights.json, so that the two
parts can measure at once without one process's write dropping the other's rows; their RESULTS.md
renderings must not be written at the same moment: see ``write_part``): the plan last asked
for, the original's scores and one row per run (its scores, the digests of its quantized tensors,
what its quantkit.json recorded). Rows are keyed as bench/skills_experiment.py keys its rows
(its ``model_identity``: a hash of the model folder's weights, tokenizer, config and processor
config files and skills.json with the zoo record's key; ``row_key``: bench/mixed_precision.py's
provenance over the quantkit modules the run imported, the measuring code of both scripts and
the constants it reads (``SKILLS_MEASURING``, ``SKILLS_VALUES``), the library versions, the
setting x arm recipe, the sample count and the settings: held-out items, pool size and seed) and
stamped with the commit that made them. A stored row is reused only while its key matches; a
row of another model, other code or other settings is measured again. ``--work`` is scratch only
(the pool, written anew by the first measurement of each invocation, calibration sets and
checkpoints).

``--smollm2`` runs the SmolLM2-135M part instead (plain vs answer-weighted GPTQ vs imatrix,
perplexity and KL on held-out Jargon File windows, its own subsection): ``--smol-settings``
(w4a16 as shipped; w4a16-sym, no zero points), ``--smol-size`` calibration windows of 512 tokens
per seed, ``--smol-eval`` evaluation windows; each run's JSON records them. One run (16 windows)
takes about 4-5 minutes on one thread of the shared 2-core machine.

    python bench/token_weights_experiment.py --smollm2 --work /tmp/tw-smol --smol-settings w4a16,w4a16-sym \
        --seeds 0,1,2 --smol-size 16 --smol-eval 16 --write-results bench/RESULTS.md

The SmolLM2 part keeps its rows in ``--results`` (default bench/token_weights.json), each keyed
by bench/mixed_precision.py's key function (quantkit's source the measuring process loaded, the
recipe, the measuring code, the window settings, library versions) and stamped with its commit.

In both parts a row is current while its key matches the code (and model) as they are; a stale
row keeps its last figures, marked stale with the commit that measured it; a planned run with no
row is said missing; the verdicts count the current rows only. ``--render-only`` renders from the file's
plan and rows and measures nothing.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.append(str(path))

import skills_experiment as se  # noqa: E402  (bench/, on the path above)

SECTION = "## Token-weighted calibration (issue 18)"
# A suite other than tiny-omni-skills renders into a section of its own (SECTION holds
# tiny-omni-skills' part and SmolLM2's text subsection).
SUITE_SECTIONS = {"smol-omni-skills": "## Token-weighted calibration on smol-omni-skills (issue 35)"}
RECIPE = "w4a16"
# One results file per suite (rows are named by setting, arm and seed, not by model).
SKILLS_RESULTS_FILES = {
    "tiny-omni-skills": ROOT / "bench" / "token_weights_skills.json",
    "smol-omni-skills": ROOT / "bench" / "token_weights_skills_smol.json",
}
SKILLS_RESULTS = SKILLS_RESULTS_FILES["tiny-omni-skills"]
# The observer of plain GPTQ (the library's default for weights): plain and the token-weighted
# arms name it, since the shipped w4a16 picks imatrix_mse.
PLAIN_OBSERVER = {"weight_observer": "memoryless_minmax"}
IMATRIX_OBSERVER = {"weight_observer": "imatrix_mse"}
# arm -> recipe overrides
ARMS: dict[str, dict] = {
    "plain": PLAIN_OBSERVER,
    "answer-up": {**PLAIN_OBSERVER, "token_weights": {"role": {"answer": 4.0}}},
    "vision-down": {**PLAIN_OBSERVER, "token_weights": {"modality": {"image": 0.25, "video": 0.25}}},
    "tier": {**PLAIN_OBSERVER, "token_weights": {"task_tier": True}},
    "imatrix": IMATRIX_OBSERVER,
}
# setting -> (recipe overrides, calibration samples)
SETTINGS: dict[str, tuple[dict, int]] = {
    "w4a16": ({}, 32),
    "w4a16-sym-10": ({"symmetric": True}, 10),
    # smol-omni-skills' size: bench/skills_experiment.py's CPU run calibrates w4a16 on 256 samples
    "w4a16-256": ({}, 256),
}
# A task is judged where the original's score clears the task's chance level c (``chance_level``:
# what an answer that ignores the input scores) by JUDGED_SD binomial standard errors over the n
# held-out items, sqrt(c (1 - c) / n), and by at least JUDGED_ITEMS items: nearer chance, a
# quantized checkpoint has next to nothing to lose and no arm can show a difference.
JUDGED_SD = 2.0
JUDGED_ITEMS = 2
# A suite whose answers are not enumerated here (``answer_distribution``) gets its chance levels
# from this many answers its generator draws, the most frequent CHANCE_CANDIDATES of them tried as
# the constant answer (with their one- and two-word prefixes where the metric is wer).
CHANCE_DRAWS = 2000
CHANCE_SEED = 4243
CHANCE_CANDIDATES = 64
TINY = "tiny-omni-skills"
# Scores are multiples of 1/items: two figures closer than this are equal (float rounding decides
# no comparison).
TOLERANCE = 1e-9
# The precision tasks (OCR, Markdown, grounding, temporal grounding), by taxonomy family.
PRECISION_FAMILIES = ("ocr", "ocr_markdown", "visual_grounding", "temporal_grounding")
QUANTIZED = ("weight_packed", "weight_scale")  # the tensors compared with plain's checkpoint


def variant(setting: str, arm: str):
    from quantkit.recipes.registry import resolve_recipe
    from quantkit.recipes.schema import Recipe

    base = resolve_recipe(RECIPE).model_dump(exclude_unset=True)
    return Recipe.model_validate({**base, **SETTINGS[setting][0], **ARMS[arm]})


# ---------------------------------------------------------------------- keys


def run_name(setting: str, arm: str, seed: int) -> str:
    return f"{setting}/{arm}/{seed}"


def run_spec(setting: str, arm: str, identity: dict) -> dict:
    """What one run does beyond the shared code: its recipe (setting x arm), sample count, model."""
    return {
        "recipe": variant(setting, arm).model_dump(mode="json"),
        "setting": setting,
        "arm": arm,
        "size": SETTINGS[setting][1],
        "model": {k: identity[k] for k in ("hash", "record")},
    }


def run_settings(plan: dict) -> dict:
    """The settings every run of ``plan`` shares (in each row's key)."""
    return {"items": plan["items"], "pool_per_task": plan["pool_per_task"], "pool_seed": se.POOL_SEED}


def expected_run(row: dict, identity: dict, state: dict, settings: dict | None = None) -> dict:
    """The provenance the code and model as they are give ``row``'s run (over the files the stored
    row was made with), with ``settings`` (default: the row's own)."""
    name = run_name(row["setting"], row["arm"], row["seed"])
    files = (row.get("provenance") or {}).get("files")
    spec = run_spec(row["setting"], row["arm"], identity)
    return se.row_key(name, spec, row["settings"] if settings is None else settings, state, files)


# ---------------------------------------------------------------------- measuring


def drawn_samples(model: Path, pool: Path, work: Path, size: int, seed: int, built: set):
    """The seed's stratified calibration set with its task labels (what the ``tier`` arm weighs
    by): every arm of a setting gets these same samples. Built once per invocation (``built``)."""
    from quantkit.calibset import CalibrateOptions, build_calibration_set
    from quantkit.models.samples import samples_from_set

    calib = work / f"calib-{size}-{seed}"
    if (size, seed) not in built:
        options = CalibrateOptions(size=size, seed=seed, model=model, allow_missing_tasks=True, force=True)
        build_calibration_set([pool], calib, options)
        built.add((size, seed))
    return samples_from_set(calib, model_kinds={"image", "video", "audio"}, num_samples=size, seed=seed)


def tensor_digests(checkpoint: Path) -> dict[str, str]:
    """A digest of each quantized tensor's bytes (``QUANTIZED``): what a row keeps of its
    checkpoint, so that an arm is compared with plain's without plain's checkpoint at hand."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(checkpoint / "model.safetensors")
    return {
        name: hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
        for name, t in sorted(tensors.items())
        if name.endswith(QUANTIZED)
    }


def measure_run(
    model: Path, pool: Path, work: Path, setting: str, arm: str, seed: int, items: int, built: set, suite
) -> dict:
    """Quantize one arm's checkpoint and score it on ``suite``'s held-out items (per task and per
    item: the pairing with plain and the original): the row, without its key and settings."""
    from quantkit.quantize import quantize

    size = SETTINGS[setting][1]
    drawn = drawn_samples(model, pool, work, size, seed, built)
    checkpoint = work / f"ckpt-{setting}-{arm}-{seed}"
    started = time.monotonic()
    quantize(
        model,
        checkpoint,
        variant(setting, arm),
        list(drawn.samples),
        sample_labels=drawn.labels,
        force=True,
        progress=False,
    )
    quantized = time.monotonic()
    scores = se.scored(checkpoint, suite, items, suite_from=model)  # a checkpoint has no skills.json
    meta = json.loads((checkpoint / "quantkit.json").read_text())
    card = (checkpoint / "README.md").read_text() if (checkpoint / "README.md").is_file() else ""
    return {
        "setting": setting,
        "arm": arm,
        "seed": seed,
        "size": size,
        "items": items,
        "quantize_seconds": round(quantized - started, 1),
        "score_seconds": round(time.monotonic() - quantized, 1),
        "sample_ids": meta["calibration"]["sample_ids"],  # the same for every arm of a setting and seed
        "recorded_token_weights": meta.get("calibration", {}).get("token_weights"),
        "card_token_weights": "GPTQ token weights" in card,
        "recorded_weight_observer": (meta.get("recipe") or {}).get("weight_observer"),
        "tensors": tensor_digests(checkpoint),
        **scores,
    }


# What the tiny-omni-skills rows' figures depend on in this script (judging and rendering are
# left out on purpose): the functions whose source is hashed into every row's key, beside
# bench/skills_experiment.py's MEASURING (its original_row measures the original here too), ...
SKILLS_MEASURING = (variant, drawn_samples, tensor_digests, measure_run)
# ... and the module-level values they read, by name (inspect.getsource sees only their bodies).
SKILLS_VALUES = ("RECIPE", "ARMS", "SETTINGS", "QUANTIZED")


def skills_state() -> dict:
    """The code state every tiny-omni-skills row's key shares (bench/mixed_precision.py's
    code_state): bench/skills_experiment.py's measuring code and values with this part's, the
    library versions, the commit."""
    import mixed_precision as mp

    values = {**mp.values_of(se, se.MEASURED_VALUES), **mp.values_of(sys.modules[__name__], SKILLS_VALUES)}
    return mp.code_state((*se.MEASURING, *SKILLS_MEASURING), values)


# ---------------------------------------------------------------------- judging and rendering


def cell(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), max(values) - min(values)


def suite_of(name: str):
    """The task module of the suite ``name`` (quantkit.synthetic's tiny- or smol-omni-skills)."""
    from quantkit.synthetic.skills_tasks import suite_module

    return suite_module({"suite": name})


def tasks_of(name: str) -> list:
    return suite_of(name).TASKS


def answer_distribution(task: str, suite: str = TINY) -> dict[str, float] | None:
    """The probability of each reference answer of ``suite``'s ``task``: enumerated from how
    quantkit/synthetic/skills_tasks.py draws tiny-omni-skills' items (None for a task not
    enumerated here); for another suite, the frequencies of CHANCE_DRAWS answers its generator
    draws (seed CHANCE_SEED, not the held-out items' seed)."""
    import itertools
    import math

    from quantkit.synthetic import skills_tasks as st

    if suite != TINY:
        from collections import Counter

        drawn = Counter(item.answer for item in suite_of(suite).make_items(task, CHANCE_DRAWS, CHANCE_SEED))
        return {answer: drawn[answer] / CHANCE_DRAWS for answer in sorted(drawn)}

    def uniform(answers) -> dict[str, float]:
        answers = list(answers)
        return dict.fromkeys(answers, 1 / len(answers))

    digits = "0123456789"
    if task == "ocr_digits":  # three digits, each uniform
        return uniform("".join(d) for d in itertools.product(digits, repeat=3))
    if task == "ocr_table":  # four digits, each uniform
        return uniform(f"| {a} | {b} |\n| --- | --- |\n| {c} | {d} |" for a, b, c, d in itertools.product(digits, repeat=4))
    if task == "grounding":  # the target lies in one of the 3 x 3 cells of 56 pixels, each equally likely
        return uniform(f"[{56 * (c % 3) + 7}, {56 * (c // 3) + 7}, {56 * (c % 3) + 49}, {56 * (c // 3) + 49}]" for c in range(9))
    if task == "caption":
        return uniform(f"a {c} {s}" for c in st.COLOURS for s in st.SHAPES)
    if task == "video_caption":
        return uniform(st.COLOURS)
    if task == "temporal_grounding":  # 3 s: start uniform in 0..2, end uniform in start+1..3
        return {f"{a} to {b}": (1 / 3) / (3 - a) for a in range(3) for b in range(a + 1, 4)}
    if task == "asr":  # 2 or 3 different tone words, either count equally likely
        words = list(st.TONE_WORDS)
        return {
            " ".join(w): 0.5 / math.perm(len(words), k) for k in (2, 3) for w in itertools.permutations(words, k)
        }
    if task == "speaker_count":
        return uniform(["1", "2", "3"])
    if task == "audio_image_qa":  # the colour said matches the one shown half the time
        return uniform(["yes", "no"])
    if task == "arithmetic":  # a + b, a and b uniform digits
        out: dict[str, float] = {}
        for a, b in itertools.product(range(10), repeat=2):
            out[str(a + b)] = out.get(str(a + b), 0) + 1 / 100
        return out
    return None


@functools.cache
def chance_level(task: str, suite: str = TINY) -> tuple[float, str] | None:
    """The best mean score of one constant answer over ``task``'s answer distribution, scored by the
    task's own metric, with that answer: what a model that ignores the input can score. None for a
    task whose answers are not enumerated here."""
    from quantkit.eval.skills import SCORERS

    answers = answer_distribution(task, suite)
    if answers is None:
        return None
    metric = suite_of(suite).TASKS_BY_NAME[task].metric
    if metric == "exact":  # a constant scores the probability of its own answer
        best = max(answers, key=answers.get)
        return answers[best], best
    candidates = set(sorted(answers, key=answers.get, reverse=True)[:CHANCE_CANDIDATES])
    if metric == "wer":  # shorter constants too: one word, two words
        candidates |= {" ".join(a.split()[:k]) for a in answers for k in (1, 2)}
    scored = {c: sum(p * SCORERS[metric](c, a) for a, p in answers.items()) for c in sorted(candidates)}
    best = max(scored, key=scored.get)
    return scored[best], best


def judged_threshold(task: str, items: int, suite: str = TINY) -> float | None:
    """The score the original must reach on ``items`` held-out items for ``task`` to be judged:
    chance + max(JUDGED_SD standard errors, JUDGED_ITEMS items). None without a chance level."""
    level = chance_level(task, suite)
    if level is None:
        return None
    chance = level[0]
    return chance + max(JUDGED_SD * math.sqrt(chance * (1 - chance) / items), JUDGED_ITEMS / items)


def judged_tasks(original: dict | None, items: int | None = None, suite: str = TINY) -> list[str]:
    """The tasks the original answers clearly above chance (``judged_threshold``) on its held-out
    items (``items``, default the original row's own count)."""
    if original is None:
        return []
    items = items or original["items"]
    out = []
    for t in tasks_of(suite):
        threshold = judged_threshold(t.name, items, suite)
        if threshold is not None and original["scores"][t.name] >= threshold - TOLERANCE:
            out.append(t.name)
    return out


def unmoved_tasks(original: dict | None, runs: list[dict], tasks: list[str]) -> list[str]:
    """Those of ``tasks`` where every run's checkpoint scores as the original: nothing to judge."""
    if original is None or not runs:
        return []
    return [
        t for t in tasks if all(abs(r["scores"][t] - original["scores"][t]) <= TOLERANCE for r in runs)
    ]


def original_losses(original: dict, rows: list[dict], tasks: list[str]) -> list[str]:
    """The tasks where ``rows`` (one arm's seeds, each item's score averaged over them) lose against
    the original beyond the paired bootstrap 95% interval of original - arm on the same items (the
    gate's rule, bench/skills_experiment.py's ``paired``), each with the loss in points and its
    interval. A task without per-item scores on either side is left out."""
    out = []
    for task in tasks:
        base, mine = se.seed_mean_items([original], task), se.seed_mean_items(rows, task)
        if base and mine:
            figure = se.paired(base, mine)
            if se.side(figure) == 1:
                out.append(f"{task} {se.interval_text(figure)}")
    return out


def against_plain(runs: list[dict], run: dict) -> dict[str, list[int]] | None:
    """How many quantized tensors of ``run`` differ from plain's of the same setting and seed, per
    kind (``QUANTIZED``) with the count: whether the arm reached the solve at all. None without a
    plain row."""
    plain = next(
        (r for r in runs if r["arm"] == "plain" and (r["setting"], r["seed"]) == (run["setting"], run["seed"])),
        None,
    )
    if plain is None or "tensors" not in plain or "tensors" not in run:
        return None
    out = {}
    for kind in QUANTIZED:
        names = [n for n in plain["tensors"] if n.endswith(kind)]
        out[kind] = [sum(plain["tensors"][n] != run["tensors"].get(n) for n in names), len(names)]
    return out


def differences(setting: str, runs: list[dict], tasks: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Each arm against plain on ``tasks``: (better, worse) task lists, each with arm - plain in
    points and its paired bootstrap 95% interval on the same items (each item's score averaged over
    the seeds first); a difference counts where the interval excludes 0 (the gate's rule). The
    interval covers the items, not the calibration draw: where both arms have two seeds or more,
    the larger of their seed spreads (max - min, in points) is said beside it. A task without
    per-item scores on either side is neither."""
    mine = [r for r in runs if r["setting"] == setting]
    plain = [r for r in mine if r["arm"] == "plain"]
    out = {}
    for arm in [a for a in ARMS if a != "plain" and any(r["arm"] == a for r in mine)]:
        rows = [r for r in mine if r["arm"] == arm]
        better, worse = [], []
        for task in tasks:
            other, base = se.seed_mean_items(rows, task), se.seed_mean_items(plain, task)
            if other and base:
                figure = se.paired(other, base)
                side = se.side(figure)
                if side:
                    said = f"{task} {se.interval_text(figure)}"
                    if min(len(rows), len(plain)) > 1:
                        spread = max(cell([r["scores"][task] for r in group])[1] for group in (rows, plain))
                        said += f" (seed spread {100 * spread:.1f})"
                    (better if side > 0 else worse).append(said)
        out[arm] = (better, worse)
    return out


def shipped_calibration(recipes=None) -> str:
    """What the built-in recipes (or ``recipes``) ship with, in one sentence, read from the recipes
    themselves: the weight observer of each that names one, and which turn token weights on."""
    from quantkit.recipes.registry import list_recipes, resolve_recipe

    if recipes is None:
        recipes = [resolve_recipe(info.name) for info in list_recipes()]
    observers = [f"{r.name} ships with weight_observer: {r.weight_observer}" for r in recipes if r.weight_observer]
    weighted = [r.name for r in recipes if r.token_weights is not None]
    observed = (
        "; ".join(observers) + " (every other built-in recipe leaves it unset: the library's memoryless_minmax)"
        if observers
        else "Every built-in recipe leaves weight_observer unset (the library's memoryless_minmax)"
    )
    weights = (
        f"token_weights are on in {words(weighted)} and absent (off) in every other built-in recipe"
        if weighted
        else "token_weights are absent (off) in every built-in recipe"
    )
    return f"{observed}; {weights}."


def words(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def shown_path(path: Path) -> str:
    """``path`` relative to the repository when inside it, else as given."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def judged_rule(items: int, suite: str = TINY) -> str:
    """The judged rule in words, from the constants, with each task's chance level and threshold."""
    levels = []
    for t in tasks_of(suite):
        level = chance_level(t.name, suite)
        levels.append(
            f"{t.name} not derived"
            if level is None
            else f"{t.name} {level[0]:.3f} (`{level[1]}`{', ' + t.metric if t.metric != 'exact' else ''}) "
            f"-> {judged_threshold(t.name, items, suite):.3f}"
        )
    source = (
        "enumerated from the answers quantkit/synthetic/skills_tasks.py draws"
        if suite == TINY
        else f"over {CHANCE_DRAWS} answers {suite_of(suite).__name__.replace('.', '/')}.py draws "
        f"(seed {CHANCE_SEED}; its {CHANCE_CANDIDATES} most frequent tried)"
    )
    tail = (
        " (temporal_grounding: 3 s, start uniform in 0-2 s, end uniform after it; the best constant span's "
        "mean tIoU; grounding: one of the nine 56-pixel cells, each equally likely to hold the target)"
        if suite == TINY
        else ""
    )
    return (
        "A task is judged only where the original's score reaches its chance level c (the best mean "
        f"score of one constant answer, {source}: what a "
        f"model ignoring the input scores) plus the larger of {JUDGED_SD:g} binomial standard errors "
        f"over the {items} items, {JUDGED_SD:g}·sqrt(c(1 - c)/{items}), and {JUDGED_ITEMS} items "
        f"({JUDGED_ITEMS}/{items} = {JUDGED_ITEMS / items:.3f}); a judged task where every checkpoint "
        "of every run scores as the original shows no movement and has nothing to judge. Chance levels "
        "(the constant answer, the metric where not exact match) -> the score the original must reach: "
        + "; ".join(levels).replace("\n", " ")
        + tail
    )


def intro(
    plan: dict, identity: dict, original: dict | None, runs: list[dict], results: Path = SKILLS_RESULTS, suite: str = TINY
) -> str:
    """The paragraph before the tables, from the plan, the model's identity and the rows."""
    arms = "; ".join(
        f"**{arm}** ("
        + (", ".join(f"`{k}: {json.dumps(v)}`" for k, v in ARMS[arm].items()) or "the recipe as it is")
        + ")"
        for arm in plan["arms"]
    )
    settings = "; ".join(
        f"{s}: {RECIPE} " + (", ".join(f"{k}: {v}" for k, v in SETTINGS[s][0].items()) or "as shipped")
        + f" on {SETTINGS[s][1]} samples"
        for s in plan["settings"]
    )
    by_draw: dict[tuple, set] = {}
    for r in runs:
        by_draw.setdefault((r["setting"], r["seed"]), set()).add(json.dumps(r["sample_ids"]))
    same = (
        "quantkit.json's `sample_ids` are identical across the arms of every setting and seed shown"
        if by_draw and all(len(ids) == 1 for ids in by_draw.values())
        else "quantkit.json's `sample_ids` differ between arms of some setting and seed"
        if by_draw
        else "no run is measured at this code yet"
    )
    record = f"; zoo record key {identity['record'][:12]}" if identity.get("record") else ""
    made = (
        f"measured by {original['provenance']['commit']}" if original else "not measured at this code"
    )
    return (
        f"Rendered by bench/token_weights_experiment.py from {shown_path(results)}. Model: "
        f"{suite} {identity['hash']} (a hash of its weights, tokenizer, config files and "
        f"skills.json{record}); its "
        f"original scores {made}. Calibration pool: bench/skills_experiment.py's skills pool, "
        f"{plan['pool_per_task']} records a task (`quantkit demo-pool --skills --suite {suite} --per-task "
        f"{plan['pool_per_task']}`). Arms, every one on the same stratified calibration samples per "
        f"seed (`quantkit calibrate --size N --seed S`; {same}): {arms}. Settings: {settings}. Every "
        f"checkpoint and the original are scored on the same {plan['items']} held-out items a task; "
        f"mean ± spread (max - min) over seeds. {judged_rule(plan['items'], suite)}. A difference "
        "from plain (arm - plain) and a loss against the original (original - arm) are in points, "
        "paired on the same items (each item's score averaged over an arm's seeds first) with the "
        "gate's bootstrap 95% interval, and count only where that interval excludes 0; the interval "
        "covers the items, not the calibration draw, so a difference from plain names the larger seed "
        "spread of the two arms (points) where both have two seeds or more. Rows are keyed by the model's identity, "
        "the quantkit modules the run imported, the measuring code, the recipe and the settings "
        "(bench/skills_experiment.py's keys); a row whose key no longer matches keeps its last figures in a table marked stale; "
        '"made by": the commits that measured them. Command: `python bench/token_weights_experiment.py '
        f"--model MODEL --work DIR --settings {','.join(plan['settings'])} --arms {','.join(plan['arms'])} "
        f"--seeds {','.join(map(str, plan['seeds']))} --items {plan['items']} --pool-per-task "
        f"{plan['pool_per_task']} --write-results bench/RESULTS.md`."
    )


def render(
    plan: dict,
    identity: dict,
    original: dict | None,
    runs: list[dict],
    pending: list[dict] = (),
    results: Path = SKILLS_RESULTS,
    stale_original: dict | None = None,
    suite: str = TINY,
) -> str:
    """The part of ``suite`` from the current rows ``runs`` and the current original row (None
    when it is not measured at this code) over ``plan``; ``pending``: the planned runs without a
    current row (missing, or stale: made by another model or other code, with its ``row``). Stale
    rows (and ``stale_original``, the stored original when it is not current) keep their last
    figures in a table marked stale, left out of every verdict."""
    from _shared import row_mark

    tasks = tasks_of(suite)
    judged = judged_tasks(original, plan["items"], suite)
    unmoved = unmoved_tasks(original, runs, judged)
    lines = [intro(plan, identity, original, runs, results, suite), ""]
    better_any, worse_any, settled, plain_loses, arm_loses = [], [], [], [], []
    for setting in [s for s in SETTINGS if s in plan["settings"]]:
        mine = [r for r in runs if r["setting"] == setting]
        arms = [a for a in ARMS if a in plan["arms"]]
        seeds = sorted({r["seed"] for r in mine})
        overrides = ", ".join(f"{k}: {v}" for k, v in SETTINGS[setting][0].items()) or "as shipped"
        lines += [
            f"### {setting} ({RECIPE} {overrides}; {SETTINGS[setting][1]} calibration samples, "
            f"{plan['items']} held-out items a task, seeds {', '.join(map(str, seeds)) or 'none measured at this code'}; "
            "mean ± spread (max - min) over seeds)",
            "",
            "| group | task | original | " + " | ".join(arms) + " |",
            "|---|---|---|" + "---|" * len(arms),
        ]
        for task in tasks if mine or original else ():
            cells = []
            for arm in arms:
                values = [r["scores"][task.name] for r in mine if r["arm"] == arm]
                if values:
                    mean, spread = cell(values)
                    cells.append(f"{mean:.3f} ± {spread:.3f} (n={len(values)})")
                else:
                    cells.append("not measured")
            first = f"{original['scores'][task.name]:.3f}" if original else "not measured"
            threshold = judged_threshold(task.name, plan["items"], suite)
            mark = (
                " (original not measured: not judged)"
                if not original
                else " (no chance level derived: not judged)"
                if threshold is None
                else f" (chance {chance_level(task.name, suite)[0]:.3f}, original below {threshold:.3f}: not judged)"
                if task.name not in judged
                else " (no movement: nothing to judge)"
                if task.name in unmoved
                else ""
            )
            lines.append(f"| {task.group} | {task.name}{mark} | {first} | " + " | ".join(cells) + " |")
        commits = sorted({r["provenance"]["commit"] for r in mine} | ({original["provenance"]["commit"]} if original else set()))
        if not mine and not original:
            lines = lines[:-3]  # no figures at all: no table
        lines += ["", f"- {setting}: made by {', '.join(row_mark(c, True) for c in commits)}" if commits else f"- {setting}: nothing measured at this code"]
        waiting: dict[str, list[str]] = {}
        for p in [p for p in pending if p["setting"] == setting]:
            waiting.setdefault(p["status"], []).append(f"{p['arm']} seed {p['seed']}")
        for status, which in waiting.items():
            lines.append(f"- {setting}, not measured at this code ({status}): {', '.join(which)}")
        stale = [p["row"] for p in pending if p["setting"] == setting and p.get("row")]
        if stale:
            made = sorted({r["provenance"]["commit"] for r in stale} | (
                {stale_original["provenance"]["commit"]} if stale_original else set()))
            stale_arms = [a for a in arms if any(r["arm"] == a for r in stale)]
            lines += [
                "",
                f"Runs of {setting}, {row_mark(', '.join(made), False)}: their last figures, not at this "
                "code, left out of every verdict (original: " + ("the stored one, stale too" if stale_original
                else "the current one" if original else "not measured") + "):",
                "",
                "| group | task | original | " + " | ".join(stale_arms) + " |",
                "|---|---|---|" + "---|" * len(stale_arms),
            ]
            compared = stale_original or original
            for task in tasks:
                cells = []
                for arm in stale_arms:
                    values = [r["scores"][task.name] for r in stale if r["arm"] == arm]
                    mean, spread = cell(values)
                    cells.append(f"{mean:.3f} ± {spread:.3f} (n={len(values)})")
                first = f"{compared['scores'][task.name]:.3f}" if compared else "not measured"
                lines.append(f"| {task.group} | {task.name} | {first} | " + " | ".join(cells) + " |")
        for arm in arms[1:]:
            counts = [c for c in (against_plain(runs, r) for r in mine if r["arm"] == arm) if c]
            if counts:
                packed, scales = (
                    f"{min(c[k][0] for c in counts)}-{max(c[k][0] for c in counts)} of {counts[0][k][1]}"
                    for k in QUANTIZED
                )
                lines.append(
                    f"- {setting}, {arm}: tensors that differ from plain's checkpoint (range over seeds): "
                    f"packed weights {packed}, scales {scales}"
                )
        lines.append("")
        if not any(r["arm"] == "plain" for r in mine) or not judged:
            lines += [f"- {setting}: no run of plain, or no judged task: nothing judged", ""]
            continue
        settled.append(setting)
        for arm in arms:  # is there a loss against the original (for a weighting to recover)?
            rows = [r for r in mine if r["arm"] == arm]
            if not rows:
                continue
            lost = original_losses(original, rows, judged)
            (plain_loses if arm == "plain" else arm_loses).extend(
                f"{task} ({setting})" if arm == "plain" else f"{arm} on {task} ({setting})" for task in lost
            )
            lines.append(
                f"- {setting}, {arm} against the original beyond the paired interval: lost on "
                f"{'; '.join(lost) or 'no judged task'}"
            )
        for arm, (better, worse) in differences(setting, mine, judged).items():
            better_any += [f"{arm} on {t} ({setting})" for t in better]
            worse_any += [f"{arm} on {t} ({setting})" for t in worse]
            lines.append(
                f"- {setting}, {arm} against plain beyond the paired interval: better on "
                f"{', '.join(better) or 'no task'}; worse on {', '.join(worse) or 'no task'}"
            )
        lines.append("")
    lines.append(
        closing(original, runs, pending, judged, settled, better_any, worse_any, plain_loses, arm_loses, unmoved, suite)
    )
    return "\n".join(lines)


def closing(
    original, runs, pending, judged, settled, better_any, worse_any, plain_loses, arm_loses=(), unmoved=(), suite=TINY
) -> str:
    """The paragraph after the tables: every statement computed from the rows."""
    tasks = tasks_of(suite)
    precision = [t.name for t in tasks if t.family in PRECISION_FAMILIES]
    tested = [t for t in precision if t in judged and t not in unmoved]
    still = [t for t in precision if t in unmoved]
    below = [t for t in precision if t not in judged]
    out = []
    if pending:
        out.append(
            f"{len(pending)} of {len(pending) + len(runs)} planned runs are not measured at this code "
            "(missing, or stale: made by another model or other code, shown with their last figures in "
            "tables marked stale); the verdicts count the current runs only."
        )
    if original is None:
        out.append("The original's scores are not measured at this code, so no task is judged.")
    else:
        left = [t.name for t in tasks if t.name not in judged]
        moved = [t for t in judged if t not in unmoved]
        out.append(
            f"Judged (original clearly above chance) with movement: {words(moved) or 'no task'}"
            + (f"; judged but no movement (every checkpoint of every run scores as the original): "
               f"{words(list(unmoved))}, nothing to judge" if unmoved else "")
            + (f"; not judged (original not clearly above chance): {words(left)}." if left else ".")
        )
        out.append(
            (
                f"Of the issue's precision tasks ({words(precision)}), {words(tested)} "
                f"{'is' if len(tested) == 1 else 'are'} judged here"
                if tested
                else f"None of the issue's precision tasks ({words(precision)}) is judged with movement "
                "here, so its goal (precision tasks gaining beyond the paired interval) cannot be tested on this model"
            )
            + (f"; {words(still)} did not move in any run (nothing to judge)" if still and tested else "")
            + (f"; {words(below)} not judged (original not clearly above chance)" if below and tested else "")
            + "."
        )
    if not settled:
        out.append("No setting has a run of plain and a judged task: nothing is judged.")
    else:
        out.append(
            f"Better than plain beyond the paired interval: {'; '.join(better_any)}."
            if better_any
            else "No token weighting and not imatrix helped any judged task beyond the paired interval."
        )
        out.append(
            f"Plain GPTQ itself lost against the original beyond the paired interval on: {'; '.join(plain_loses)}."
            if plain_loses
            else "But plain GPTQ loses nothing against the original beyond the paired interval on any judged task here, so there "
            "was no loss for a weighting to recover: the experiment is inconclusive there."
        )
        out.append(
            f"Worse than plain beyond the paired interval: {'; '.join(worse_any)}."
            if worse_any
            else "No arm was worse than plain beyond the paired interval on any judged task."
        )
        out.append(
            f"Against the original, the other arms lost beyond the paired interval on: {'; '.join(arm_loses)}."
            if arm_loses
            else "No other arm lost against the original beyond the paired interval on any judged task."
        )
    out.append(shipped_calibration())
    weighted = [r for r in runs if ARMS[r["arm"]].get("token_weights")]
    if weighted:
        recorded = sum(r["recorded_token_weights"] is not None and r["card_token_weights"] for r in weighted)
        out.append(f"{recorded} of {len(weighted)} weighted runs recorded their weights in quantkit.json and the model card.")
    imatrix = [r for r in runs if r["arm"] == "imatrix"]
    if imatrix:
        observed = sum(r["recorded_weight_observer"] == "imatrix_mse" for r in imatrix)
        out.append(f"{observed} of {len(imatrix)} imatrix runs recorded weight_observer: imatrix_mse in quantkit.json.")
    return " ".join(out)


def note(data: dict) -> str:
    """The results file's ``history`` (free text someone wrote into it), labelled as such."""
    if not data.get("history"):
        return ""
    return "\n\nHand-written note kept in the results file (`history`; not a measurement): " + data["history"]


def skills_main(args) -> str:
    """Measure the planned runs (and the original) whose stored row is not current (none with
    --render-only) and render from the current rows of ``args.results``."""
    from _shared import loaded_sources

    identity = se.model_identity(args.model)
    suite = se.model_suite(args.model)
    state = skills_state()
    data = se.load(args.results)
    if not args.render_only:
        data["plan"] = {
            "settings": se.csv(args.settings),
            "arms": se.csv(args.arms) if args.arms else list(ARMS),
            "seeds": [int(s) for s in se.csv(args.seeds)],
            "items": args.items,
            "pool_per_task": args.pool_per_task,
        }
    plan = data.get("plan")
    if plan is None:
        raise SystemExit(f"{args.results} holds no tiny-omni-skills plan: run without --render-only first")
    settings = run_settings(plan)
    print(f"model {identity['hash']} (record {identity['record']}); code git {state['commit']}", flush=True)

    checked_machine = []

    def measuring_here() -> None:
        """skills_experiment's rule, checked before the first thing measured: rows are keyed
        without the machine, so one measured here is never paired with another machine's."""
        if not checked_machine:
            other = se.other_device_rows(data, se.this_machine())
            if other:
                print(
                    f"{args.results} holds rows measured on {', '.join(other)}, not here "
                    f"({se.this_machine()}): pass another --results",
                    file=sys.stderr,
                )
                raise SystemExit(2)
            checked_machine.append(True)

    name = se.original_name(identity, plan["items"])
    original = stale_original = data["original"].get(name)
    if not se.current(original, se.expected_original(original, identity, state) if original else None):
        original = None
        if not args.render_only:
            measuring_here()
            original = se.original_row(args.model, identity, state, plan["items"]) | se.machine_fields()
            data["original"][name] = original
            se.save(args.results, data)
    runs, pending, pool, built = [], [], None, set()
    for seed in plan["seeds"]:
        for setting in plan["settings"]:
            for arm in plan["arms"]:
                key = run_name(setting, arm, seed)
                row = data["runs"].get(key)
                if row and se.current(row, expected_run(row, identity, state, settings)):
                    runs.append(row)
                    continue
                if args.render_only:
                    commit = ((row or {}).get("provenance") or {}).get("commit") or "unknown"
                    status = f"stale: made by {commit} with another model, code or settings" if row else "missing"
                    pending.append({"setting": setting, "arm": arm, "seed": seed, "status": status, "row": row})
                    continue
                measuring_here()
                if pool is None:
                    pool = se.write_pool(args.work, plan["pool_per_task"], suite)
                row = measure_run(args.model, pool, args.work, setting, arm, seed, plan["items"], built, suite)
                row |= se.machine_fields()
                row["settings"] = settings
                row["model"] = identity
                row["provenance"] = se.row_key(key, run_spec(setting, arm, identity), settings, state, loaded_sources())
                data["runs"][key] = row
                se.save(args.results, data)
                runs.append(row)
                print(json.dumps({k: v for k, v in row.items() if k not in ("sample_ids", "tensors", "provenance")}), flush=True)
    if original is None and stale_original is None:  # the stale rows' own model's original
        models = [p["row"]["model"] for p in pending if p.get("row") and p["row"].get("model")]
        stale_original = data["original"].get(se.original_name(models[0], plan["items"])) if models else None
    stale_original = stale_original if original is None else None
    return render(plan, identity, original, runs, pending, args.results, stale_original, suite.SUITE) + note(data)


# ---------------------------------------------------------------------- SmolLM2-135M (real weights)

SMOL_SECTION = "### SmolLM2-135M: perplexity and KL on held-out Jargon File text"
# arm -> overrides of the shipped w4a16 recipe (zero points, group 64 chosen for SmolLM2's 576)
SMOL_ARMS: dict[str, dict] = {
    "plain": PLAIN_OBSERVER,
    "answer-up": {**PLAIN_OBSERVER, "token_weights": {"role": {"answer": 4.0}}},
    "imatrix": IMATRIX_OBSERVER,
}
# setting -> recipe overrides: w4a16 as shipped, and without zero points (symmetric int4, which
# vLLM serves too), the harsher setting where differences between the arms are easier to see.
SMOL_SETTINGS: dict[str, dict] = {"w4a16": {}, "w4a16-sym": {"symmetric": True}}
ANSWER_SHARE = 0.25  # the last quarter of each calibration window is the assistant's turn
SMOL_POOL = 64  # calibration windows to draw from, evenly spread over the first 60% of the text


def smol_folder(work: Path) -> Path:
    """SmolLM2 as the runs quantize it: bench/mixed_precision.py's bf16 folder (converted once into
    ``work``), with a chat template that takes content parts."""
    import mixed_precision as mp

    return mp.with_parts_template(mp.smollm2_folder(work / "smollm2"), work)


def smol_inputs(work: Path, calib_pool: int, eval_windows: int):
    """SmolLM2 (:func:`smol_folder`, its adapter) and its window split of the Jargon File:
    calibration windows from the first 60%, evaluation windows from the rest."""
    import mixed_precision as mp
    from transformers import AutoTokenizer

    folder = smol_folder(work)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    calib, evals = mp.windows(tokenizer, calib_pool, eval_windows)
    return folder, mp.llama_adapter(folder), tokenizer, calib, evals


def smol_samples(tokenizer, calib, size: int, seed: int):
    """``size`` windows drawn by ``seed``, each as a user turn followed by an assistant turn (its
    last quarter), so answer weighting has answers to weigh."""
    import random

    from quantkit.models.inputs import Sample

    chosen = random.Random(seed).sample(range(len(calib)), size)
    cut = int(len(calib[0]) * (1 - ANSWER_SHARE))
    return [
        Sample(
            [
                {"role": "user", "content": tokenizer.decode(calib[i][:cut])},
                {"role": "assistant", "content": tokenizer.decode(calib[i][cut:])},
            ]
        )
        for i in sorted(chosen)
    ]


# Where the SmolLM2 runs are kept, keyed by what made them (as bench/real_weights.json keeps the
# real-weights rows): the plan last asked for and one row per run.
SMOL_RESULTS = ROOT / "bench" / "token_weights.json"


def smol_name(setting: str, arm: str, size: int, seed: int, evals: int) -> str:
    return f"smol-{setting}-{arm}-{size}-{seed}-{evals}"


def smol_recipe(setting: str, arm: str):
    from quantkit.recipes.registry import resolve_recipe
    from quantkit.recipes.schema import Recipe

    overrides = {**SMOL_SETTINGS[setting], **SMOL_ARMS[arm]}
    return Recipe.model_validate({**resolve_recipe(RECIPE).model_dump(exclude_unset=True), **overrides})


def smol_provenance(plan: dict, setting: str, arm: str, seed: int, state: dict, files: list[str] | None) -> dict:
    """A run's key, by bench/mixed_precision.py's own key function: its recipe (setting x arm),
    seed and window split, the plan's window settings, the measuring code (``state``), the library
    versions and the bytes of ``files`` (the quantkit modules the measuring process had loaded)."""
    import mixed_precision as mp

    spec = {
        "recipe": smol_recipe(setting, arm).model_dump(mode="json"),
        "seed": seed,
        "answer_share": ANSWER_SHARE,
        "calib_pool": SMOL_POOL,
    }
    settings = {
        "size": plan["size"],
        "eval_windows": plan["eval_windows"],
        "window": mp.WINDOW,
        "inputs": plan.get("inputs"),  # the text's and the model folder's digests (mp.input_digests)
    }
    name = smol_name(setting, arm, plan["size"], seed, plan["eval_windows"])
    return mp.provenance(name, spec, settings, state, files)


def smol_measure(work: Path, plan: dict, setting: str, arm: str, seed: int, inputs, reference) -> dict:
    """Quantize and score one run (minutes of CPU): the row, without its provenance."""
    import mixed_precision as mp

    from quantkit.quantize import quantize

    folder, adapter, tokenizer, calib, evals = inputs
    recipe = smol_recipe(setting, arm)
    checkpoint = work / f"ckpt-smol-{setting}-{arm}-{seed}"
    started = time.monotonic()
    samples = smol_samples(tokenizer, calib, plan["size"], seed)
    quantize(folder, checkpoint, recipe, samples, adapter=adapter, force=True, progress=False)
    seconds = round(time.monotonic() - started, 1)
    scored = time.monotonic()
    scores = mp.score(mp.load_checkpoint(checkpoint), reference())
    meta = json.loads((checkpoint / "quantkit.json").read_text())
    weights = meta["resolved_scheme"]["weights"]
    return {
        "setting": setting,
        "arm": arm,
        "seed": seed,
        "size": plan["size"],
        "window_tokens": len(calib[0]),
        "calib_pool": len(calib),
        "answer_share": ANSWER_SHARE,
        "eval_windows": len(evals),
        "overrides": {**SMOL_SETTINGS[setting], **SMOL_ARMS[arm]},
        "scheme": {k: weights[k] for k in ("num_bits", "symmetric", "group_size")},
        "calibration_tokens": meta["calibration"]["tokens"],
        "quantize_seconds": seconds,
        "score_seconds": round(time.monotonic() - scored, 1),
        "sample_ids": meta["calibration"]["sample_ids"],
        "recorded_token_weights": meta["calibration"].get("token_weights"),
        "recorded_weight_observer": meta["recipe"].get("weight_observer"),
        "original_ppl": reference().result["ppl"],
        **scores,
    }


def spread_cell(values: list[float], digits: int = 4, suffix: str = "") -> str:
    mean, spread = cell(values)
    return f"{mean:.{digits}f}{suffix} ± {spread:.{digits}f}{suffix}"


def ppl_change(run: dict) -> float:
    """Perplexity change against the original's, in percent."""
    return 100 * (run["ppl"] / run["original_ppl"] - 1)


def smol_verdict(plain: list[float], other: list[float], lower_is_better: bool) -> str:
    """``other`` against ``plain``: better / worse when the means differ by more than the larger
    of the two seed spreads, else within them."""
    (p, ps), (m, ms) = cell(plain), cell(other)
    if abs(m - p) <= max(ps, ms):
        return "within the seed spread"
    return "better" if (m < p) == lower_is_better else "worse"


def smol_records(runs: list[dict]) -> str:
    """What the checkpoints' quantkit.json say reached the quantization: the weights, the observer."""
    weighted = [r for r in runs if r["arm"] == "answer-up"]
    imatrix = [r for r in runs if r["arm"] == "imatrix"]
    out = []
    if weighted:
        recorded = [r["recorded_token_weights"] for r in weighted if r["recorded_token_weights"]]
        out.append(
            f"{len(recorded)} of {len(weighted)} answer-up runs recorded their token weights in "
            f"quantkit.json (mean weight {statistics.mean(w['mean_weight'] for w in recorded):.3f} over "
            f"{statistics.mean(w['tokens'] for w in recorded):.0f} tokens a run)"
            if recorded
            else f"none of the {len(weighted)} answer-up runs recorded token weights in quantkit.json"
        )
    if imatrix:
        observed = sum(r["recorded_weight_observer"] == "imatrix_mse" for r in imatrix)
        out.append(f"{observed} of {len(imatrix)} imatrix runs recorded weight_observer: imatrix_mse")
    return "; ".join(out) + "." if out else ""


def plan_of(runs: list[dict]) -> dict:
    """The plan that ``runs`` (rows) cover, where no stored plan is given."""
    return {
        "settings": list(dict.fromkeys(r["setting"] for r in runs)),
        "arms": list(dict.fromkeys(r["arm"] for r in runs)),
        "seeds": sorted({r["seed"] for r in runs}),
        "size": runs[0]["size"],
        "eval_windows": runs[0]["eval_windows"],
    }


def smol_render(runs: list[dict], plan: dict | None = None, pending: list[dict] = ()) -> str:
    """The SmolLM2 subsection from the current rows ``runs`` (made by the code as it is) over
    ``plan``; ``pending``: the planned runs without a current row (missing, or stale: made by
    other code, with its ``row``): a stale run shows its last figures marked stale, a missing one
    says so."""
    import mixed_precision as mp
    from _shared import row_mark

    def made(group: list[dict], current: bool) -> str:
        commits = sorted({r["provenance"]["commit"] if "provenance" in r else r["commit"] for r in group})
        return ", ".join(row_mark(c, current) for c in commits)

    def figures(arm: str, group: list[dict], current: bool) -> str:
        return (
            f"| {arm} | {spread_cell([ppl_change(r) for r in group], 2, '%')} | "
            f"{spread_cell([r['kl'] for r in group])} | {spread_cell([r['top1'] for r in group])} | "
            f"{len(group)} | {statistics.mean(r['quantize_seconds'] for r in group):.0f} s | {made(group, current)} |"
        )

    plan = plan or plan_of(runs)
    original = f"perplexity {runs[0]['original_ppl']:.3f}" if runs else "its perplexity not measured at this code"
    lines = [
        SMOL_SECTION,
        "",
        f"Each seed draws {plan['size']} calibration windows of {mp.WINDOW} tokens from "
        f"{SMOL_POOL} evenly spread over the first 60% of the text, each rendered as a user "
        f"turn followed by an assistant turn (the window's last {ANSWER_SHARE:.0%}: the "
        "answer tokens answer-up weighs 4x); every arm of a setting and seed calibrates on those "
        f"same windows. Scored on {plan['eval_windows']} evaluation windows from the rest against "
        f"the float32 original ({original}): perplexity change, mean "
        "next-token KL(original || quantized), top-1 agreement; mean ± spread (max - min) over "
        "seeds. A difference from plain counts only where the means differ by more than the larger "
        "of the two seed spreads. Time: quantize (calibration, GPTQ, writing) on one thread of "
        "the shared 2-core machine, mean over seeds. Command: `python bench/token_weights_experiment.py "
        f"--smollm2 --work DIR --smol-settings {','.join(plan['settings'])} "
        f"--seeds {','.join(map(str, plan['seeds']))} --smol-size {plan['size']} "
        f"--smol-eval {plan['eval_windows']} --write-results bench/RESULTS.md`. Rows are kept in "
        "`bench/token_weights.json`, each keyed as bench/mixed_precision.py keys its rows (quantkit's "
        "source it loaded, the recipe, the measuring code, the settings, library versions) and stamped with "
        "the commit that made it (\"made by\"): current while its key matches the code as it is, else its last "
        "figures are shown marked stale (measured at that commit) and left out of the verdicts.",
    ]
    verdicts = []
    for setting in [s for s in SMOL_SETTINGS if s in plan["settings"]]:
        mine = [r for r in runs if r["setting"] == setting]
        waiting = [p for p in pending if p["setting"] == setting]
        arms = [a for a in SMOL_ARMS if a in plan["arms"]]
        seeds = sorted({r["seed"] for r in mine})
        overrides = ", ".join(f"{k}: {v}" for k, v in SMOL_SETTINGS[setting].items()) or "as shipped"
        if mine:
            scheme = mine[0]["scheme"]
            overrides += (
                f": int{scheme['num_bits']}, group {scheme['group_size']}, "
                f"{'symmetric' if scheme['symmetric'] else 'zero points'}"
            )
        lines += [
            "",
            f"#### {setting} ({RECIPE} {overrides}; seeds {', '.join(map(str, seeds)) or 'none measured at this code'})",
            "",
            "| arm | ppl change | KL (nats) | top-1 agreement | n | quantize time | made by |",
            "|---|---|---|---|---|---|---|",
        ]
        for arm in arms:
            group = [r for r in mine if r["arm"] == arm]
            if group:
                lines.append(figures(arm, group, True))
            stale = [p["row"] for p in waiting if p["arm"] == arm and p.get("row")]
            if stale:
                seeds_said = ", ".join(str(r["seed"]) for r in stale)
                lines.append(figures(arm, stale, False).replace(f"| {arm} |", f"| {arm} (seeds {seeds_said}) |", 1))
            absent = [p for p in waiting if p["arm"] == arm and not p.get("row")]
            if absent:
                said = "; ".join(f"seed {p['seed']} {p['status']}" for p in absent)
                lines.append(f"| {arm} | not measured: {said} | - | - | 0 | - | - |")
        plain = [r for r in mine if r["arm"] == "plain"]
        lines.append("")
        if len(seeds) < 2 or not plain:
            lines.append(f"- {setting}: fewer than two seeds or no plain run: nothing judged")
            continue
        for arm in arms[1:]:
            group = [r for r in mine if r["arm"] == arm]
            kl = smol_verdict([r["kl"] for r in plain], [r["kl"] for r in group], lower_is_better=True)
            ppl = smol_verdict([ppl_change(r) for r in plain], [ppl_change(r) for r in group], True)
            top1 = smol_verdict([r["top1"] for r in plain], [r["top1"] for r in group], False)
            diff = cell([r["kl"] for r in group])[0] - cell([r["kl"] for r in plain])[0]
            points = cell([ppl_change(r) for r in group])[0] - cell([ppl_change(r) for r in plain])[0]
            verdicts.append((setting, arm, kl, ppl, top1))
            lines.append(
                f"- {setting}, {arm} against plain: KL {diff:+.4f} ({kl}), perplexity change "
                f"{points:+.2f} points ({ppl}), top-1 {top1}"
            )
    if pending:
        lines += [
            "",
            f"{len(pending)} of {len(pending) + len(runs)} planned runs are not measured at this code (missing, "
            "or stale: made by other code, shown with their last figures marked stale); the verdicts count the "
            "current runs only. The command above measures them (minutes of CPU each).",
        ]
    if verdicts:
        helped = [f"{arm} ({setting})" for setting, arm, kl, ppl, _ in verdicts if "better" in (kl, ppl)]
        hurt = [f"{arm} ({setting})" for setting, arm, kl, ppl, _ in verdicts if "worse" in (kl, ppl)]
        lines += [
            "",
            (
                f"Better than plain GPTQ beyond the seed spread (KL or perplexity): {', '.join(helped)}. "
                if helped
                else "Neither answer-token weighting nor imatrix beat plain GPTQ beyond the seed spread, "
                "in KL or perplexity, in any setting measured here. "
            )
            + (f"Worse than plain beyond the seed spread: {', '.join(hurt)}. " if hurt else "None was worse. ")
            + smol_records(runs)
            + " "
            + shipped_calibration(),
        ]
    return "\n".join(lines)


def smol_main(args) -> str:
    """Measure the planned runs whose stored row is not current (none with --render-only) and
    render from the current rows of ``args.results``."""
    import functools

    import mixed_precision as mp
    from _shared import loaded_sources

    from quantkit.fsutil import write_file_atomic

    saved = json.loads(args.results.read_text()) if args.results.is_file() else {}
    saved.setdefault("runs", {})
    if not args.render_only:
        saved["plan"] = {
            "settings": args.smol_settings.split(","),
            "arms": args.arms.split(",") if args.arms else list(SMOL_ARMS),
            "seeds": [int(s) for s in args.seeds.split(",")],
            "size": args.smol_size,
            "eval_windows": args.smol_eval,
        }
    plan = saved.get("plan")
    if plan is None:
        raise SystemExit(f"{args.results} holds no SmolLM2 plan: run --smollm2 without --render-only first")
    state = smol_state()

    @functools.cache
    def inputs():
        return smol_inputs(args.work, SMOL_POOL, plan["eval_windows"])

    if not args.render_only:  # rows are current only on the text and the weights they were made on
        plan["inputs"] = mp.input_digests(smol_folder(args.work))

    @functools.cache
    def reference():
        return mp.Reference(mp.load_checkpoint(inputs()[0]), inputs()[4])

    runs, pending = [], []
    for setting in plan["settings"]:
        for seed in plan["seeds"]:
            for arm in plan["arms"]:
                name = smol_name(setting, arm, plan["size"], seed, plan["eval_windows"])
                row = saved["runs"].get(name)
                made = (row or {}).get("provenance") or {}
                expected = smol_provenance(plan, setting, arm, seed, state, made.get("files"))
                if row and made.get("key") == expected["key"]:
                    runs.append(row)
                    continue
                if args.render_only:
                    status = "stale" if row else "missing"
                    pending.append({"setting": setting, "arm": arm, "seed": seed, "status": status, "row": row})
                    continue
                row = smol_measure(args.work, plan, setting, arm, seed, inputs(), reference)
                row["provenance"] = smol_provenance(plan, setting, arm, seed, state, loaded_sources())
                row["commit"] = state["commit"]
                saved["runs"][name] = row
                write_file_atomic(args.results, json.dumps(saved, indent=1) + "\n")
                runs.append(row)
                print(json.dumps({k: v for k, v in row.items() if k not in ("sample_ids", "provenance")}), flush=True)
    return smol_render(runs, plan, pending) + note(saved)


# The SmolLM2 part's measuring functions and the values they read, as SKILLS_MEASURING and
# SKILLS_VALUES are the tiny-omni-skills part's; beside bench/mixed_precision.py's.
SMOL_MEASURING = (smol_folder, smol_inputs, smol_samples, smol_recipe, smol_measure)
SMOL_VALUES = ("RECIPE", "SMOL_ARMS", "SMOL_SETTINGS", "ANSWER_SHARE", "SMOL_POOL")


def smol_state() -> dict:
    """The code state a SmolLM2 run's key shares (bench/mixed_precision.py's code_state): its
    measuring code and values, with this part's own, the library versions, the commit."""
    import mixed_precision as mp

    values = {**mp.values_of(mp, mp.MEASURED_VALUES), **mp.values_of(sys.modules[__name__], SMOL_VALUES)}
    return mp.code_state((*mp.MEASURING, *SMOL_MEASURING), values)


# Said in RESULTS.md until the SmolLM2 part has been run (issue 18 asks for it).
SMOL_PENDING = (
    "SmolLM2-135M (perplexity and KL on held-out Jargon File windows, answer-token weighting) has no "
    "figures here yet: `--smollm2` is written and was smoke-run only (one GPTQ run did not finish in "
    "13 minutes on the loaded 2-core machine)."
)


def write_part(results: Path, text: str, *, smol: bool) -> None:
    """Replace one part of the RESULTS.md section (tiny-omni-skills, or SmolLM2's subsection)
    and keep the other. This reads, edits and writes RESULTS.md without a lock: the two parts may
    measure at the same time (their rows are in separate JSON files), but they must not render
    into RESULTS.md at the same moment, or the later write drops the other's new text."""
    from _shared import read_section, replace_section

    tiny, _, rest = (read_section(results, SECTION) or "").partition(SMOL_SECTION)
    tiny = tiny.replace(SMOL_PENDING, "")  # said only while the SmolLM2 part has no figures
    parts = (
        [tiny.rstrip(), text] if smol else [text, (SMOL_SECTION + rest).rstrip() if rest else SMOL_PENDING]
    )
    replace_section(results, SECTION, "\n\n".join(p for p in parts if p))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="a tiny-omni-skills folder (not with --smollm2)")
    parser.add_argument("--work", type=Path, required=True, help="scratch: pool, calibration sets, checkpoints")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--arms", help=f"default: {','.join(ARMS)}; with --smollm2 {','.join(SMOL_ARMS)}")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--items", type=int, default=24, help="held-out items per task")
    parser.add_argument("--pool-per-task", type=int, default=12, help="skills pool records per task")
    parser.add_argument("--render-only", action="store_true", help="render from the stored rows, measure nothing")
    parser.add_argument("--write-results", type=Path)
    parser.add_argument("--smollm2", action="store_true", help="the SmolLM2-135M part instead")
    parser.add_argument("--smol-size", type=int, default=16, help="SmolLM2 calibration windows")
    parser.add_argument("--smol-eval", type=int, default=8, help="SmolLM2 evaluation windows")
    parser.add_argument("--smol-settings", default="w4a16", help=f"SmolLM2 settings: {','.join(SMOL_SETTINGS)}")
    parser.add_argument(
        "--results",
        type=Path,
        help="the stored rows, keyed by the code that made them (default bench/token_weights_skills.json; "
        "with --smollm2 bench/token_weights.json)",
    )
    args = parser.parse_args(argv)
    if args.smollm2:
        unknown = [s for s in args.smol_settings.split(",") if s not in SMOL_SETTINGS]
        unknown += [a for a in (args.arms or "").split(",") if a and a not in SMOL_ARMS]
        if unknown:
            parser.error(f"unknown SmolLM2 setting or arm: {', '.join(unknown)}")
    else:
        if args.model is None:
            parser.error("--model is required (or --smollm2)")
        unknown = [s for s in se.csv(args.settings) if s not in SETTINGS]
        unknown += [a for a in se.csv(args.arms or "") if a not in ARMS]
        if unknown:
            parser.error(f"unknown setting or arm: {', '.join(unknown)}")
    suite = None
    if not args.smollm2:
        from quantkit.errors import QuantkitError

        try:
            suite = se.model_suite(args.model).SUITE
        except QuantkitError as err:  # no skills.json: not a skills model
            parser.error(f"--model {args.model}: {err}")
    if args.results is None:
        args.results = SMOL_RESULTS if args.smollm2 else SKILLS_RESULTS_FILES.get(suite, SKILLS_RESULTS)
    args.work.mkdir(parents=True, exist_ok=True)
    text = smol_main(args) if args.smollm2 else skills_main(args)
    print(text)
    if args.write_results and suite in SUITE_SECTIONS:
        from _shared import replace_section

        replace_section(args.write_results, SUITE_SECTIONS[suite], text)
    elif args.write_results:
        write_part(args.write_results, text, smol=args.smollm2)


if __name__ == "__main__":
    main()
