"""Issue 18: plain GPTQ vs token-weighted GPTQ vs llmcompressor's imatrix observer on
tiny-omni-skills, the same calibration samples per seed, per-task accuracy over several seeds.

Arms (``ARMS``) are variants of one recipe: ``plain`` (the recipe as it is), token-weighted GPTQ
(a ``token_weights`` section: H = sum_t w_t x_t x_t^T) and ``imatrix`` (``weight_observer:
imatrix_mse``: each group's scale chosen by an MSE search weighted by the input channels' E[x^2]).
Settings (``SETTINGS``) are the recipe's overrides and the number of calibration samples: w4a16 as
shipped, and a harsher one vLLM still serves (symmetric int4, no zero points, 10 samples: the
fewest that cover the pool's 10 strata). Every arm of a setting and seed calibrates on the same
drawn samples (the stratified set of bench/skills_experiment.py, with its task labels), then is
scored with ``quantkit.eval.skills.score_model`` on the same held-out items as the original (paired).

    python bench/token_weights_experiment.py --model DIR --pool POOL.jsonl --work /tmp/tw-exp \
        --settings w4a16,w4a16-sym-10 --seeds 0,1 --write-results bench/RESULTS.md

``--smollm2`` runs the SmolLM2-135M part instead (plain vs answer-weighted GPTQ vs imatrix,
perplexity and KL on held-out Jargon File windows, its own subsection): ``--smol-settings``
(w4a16 as shipped; w4a16-sym, no zero points), ``--smol-size`` calibration windows of 512 tokens
per seed, ``--smol-eval`` evaluation windows; each run's JSON records them. One run (16 windows)
takes about 4-5 minutes on one thread of the shared 2-core machine.

    python bench/token_weights_experiment.py --smollm2 --work /tmp/tw-smol --smol-settings w4a16,w4a16-sym \
        --seeds 0,1,2 --smol-size 16 --smol-eval 16 --write-results bench/RESULTS.md

The tiny-omni-skills part keeps its finished runs in ``--work`` (one JSON per run, with the git
commit that made it) and reuses them. The SmolLM2 part keeps its rows in ``--results``
(bench/token_weights.json, in the repository), each keyed by bench/mixed_precision.py's key
function (quantkit's source the measuring process loaded, the recipe, the measuring code, the
window settings, library versions) and stamped with its commit; a row is reused and shown with
figures only while its key matches the code as it is; planned runs without such a row are
rendered as not measured at this code (missing or stale). ``--render-only`` renders from the
file's plan and rows and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.append(str(path))

SECTION = "## Token-weighted calibration (issue 18)"
RECIPE = "w4a16"
# arm -> recipe overrides
ARMS: dict[str, dict] = {
    "plain": {},
    "answer-up": {"token_weights": {"role": {"answer": 4.0}}},
    "vision-down": {"token_weights": {"modality": {"image": 0.25, "video": 0.25}}},
    "tier": {"token_weights": {"task_tier": True}},
    "imatrix": {"weight_observer": "imatrix_mse"},
}
# setting -> (recipe overrides, calibration samples)
SETTINGS: dict[str, tuple[dict, int]] = {
    "w4a16": ({}, 32),
    "w4a16-sym-10": ({"symmetric": True}, 10),
}
# Tasks the original answers (docs/eval.md status table); the others score near 0 before
# quantization, so no arm can show a difference on them.
ANSWERABLE = ("caption", "temporal_grounding", "video_caption", "speaker_count", "audio_image_qa")


def variant(setting: str, arm: str):
    from quantkit.recipes.registry import resolve_recipe
    from quantkit.recipes.schema import Recipe

    base = resolve_recipe(RECIPE).model_dump(exclude_unset=True)
    return Recipe.model_validate({**base, **SETTINGS[setting][0], **ARMS[arm]})


def drawn_samples(model: Path, pool: Path, work: Path, size: int, seed: int):
    """The seed's stratified calibration set: every arm of a setting gets these same samples."""
    from quantkit.calibset import CalibrateOptions, build_calibration_set
    from quantkit.quantize.calibration_set import samples_from_set

    calib = work / f"calib-{size}-{seed}"
    if not (calib / "samples.jsonl").is_file():
        options = CalibrateOptions(size=size, seed=seed, model=model, allow_missing_tasks=True, force=True)
        build_calibration_set([pool], calib, options)
    return samples_from_set(calib, model_kinds={"image", "video", "audio"}, num_samples=size, seed=seed)


def run_one(model: Path, pool: Path, work: Path, setting: str, arm: str, seed: int, items: int) -> dict:
    out = work / f"tw-{setting}-{arm}-{seed}-{items}.json"
    if out.is_file():
        return json.loads(out.read_text())
    from _shared import git_commit, write_json

    from quantkit.eval.skills import score_model
    from quantkit.quantize import quantize
    from quantkit.zoo.skills_tasks import TASKS

    size = SETTINGS[setting][1]
    drawn = drawn_samples(model, pool, work, size, seed)
    recipe = variant(setting, arm)
    checkpoint = work / f"ckpt-{setting}-{arm}-{seed}"
    started = time.monotonic()
    quantize(
        model, checkpoint, recipe, list(drawn.samples), sample_labels=drawn.labels, force=True, progress=False
    )
    seconds = round(time.monotonic() - started, 1)
    scores = score_model(checkpoint, [t.name for t in TASKS], items=items)
    meta = json.loads((checkpoint / "quantkit.json").read_text())
    card = (checkpoint / "README.md").read_text() if (checkpoint / "README.md").is_file() else ""
    result = {
        "setting": setting,
        "arm": arm,
        "seed": seed,
        "size": size,
        "items": items,
        "commit": git_commit(),
        "quantize_seconds": seconds,
        "sample_ids": meta["calibration"]["sample_ids"],  # the same for every arm of a setting and seed
        "recorded_token_weights": meta.get("calibration", {}).get("token_weights"),
        "card_token_weights": "GPTQ token weights" in card,
        "recorded_weight_observer": (meta.get("recipe") or {}).get("weight_observer"),
        "scores": {t.task: t.score for t in scores.tasks},
    }
    write_json(out, result)
    return result


def original_scores(model: Path, work: Path, items: int) -> dict:
    """The original's scores on the same held-out items (bench/skills_experiment.py measures
    them), stamped with the commit."""
    out = work / f"original-{items}.json"
    if not out.is_file():
        from _shared import git_commit, write_json
        from skills_experiment import original_scores as measure

        (work / "original").mkdir(exist_ok=True)
        scores = measure(model, work / "original", items)
        write_json(out, {"commit": git_commit(), "scores": scores})
    return json.loads(out.read_text())


def against_plain(work: Path, run: dict) -> dict:
    """How many quantized tensors of the run's checkpoint differ from plain's (same setting and
    seed): whether the arm reached the solve at all."""
    from safetensors.torch import load_file

    def tensors(arm: str) -> dict:
        return load_file(work / f"ckpt-{run['setting']}-{arm}-{run['seed']}" / "model.safetensors")

    plain, mine = tensors("plain"), tensors(run["arm"])
    out = {}
    for kind in ("weight_packed", "weight_scale"):
        names = [n for n in plain if n.endswith(kind)]
        out[kind] = [sum(not plain[n].equal(mine[n]) for n in names), len(names)]
    return out


def cell(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), max(values) - min(values)


def differences(setting: str, runs: list[dict]) -> dict[str, tuple[list[str], list[str]]]:
    """Each arm against plain on the answerable tasks: (better, worse) task lists, a difference
    counting when the means differ by more than the larger of the two seed spreads."""
    mine = [r for r in runs if r["setting"] == setting]
    out = {}
    for arm in [a for a in ARMS if a != "plain" and any(r["arm"] == a for r in mine)]:
        better, worse = [], []
        for task in ANSWERABLE:
            plain = cell([r["scores"][task] for r in mine if r["arm"] == "plain"])
            other = cell([r["scores"][task] for r in mine if r["arm"] == arm])
            diff = other[0] - plain[0]
            if abs(diff) > max(plain[1], other[1]):
                (better if diff > 0 else worse).append(f"{task} {diff:+.3f}")
        out[arm] = (better, worse)
    return out


def shipped_defaults() -> bool:
    """Whether every built-in recipe ships with token weights off and the library's observer."""
    from quantkit.recipes.registry import list_recipes, resolve_recipe

    recipes = [resolve_recipe(info.name) for info in list_recipes()]
    return all(r.token_weights is None and r.weight_observer is None for r in recipes)


def render(original: dict, runs: list[dict], note: str) -> str:
    from quantkit.zoo.skills_tasks import TASKS

    lines = [note, ""] if note else []
    better_any, worse_any, judged, plain_loses = [], [], [], []
    for setting in [s for s in SETTINGS if any(r["setting"] == s for r in runs)]:
        mine = [r for r in runs if r["setting"] == setting]
        arms = [a for a in ARMS if any(r["arm"] == a for r in mine)]
        seeds = sorted({r["seed"] for r in mine})
        overrides = ", ".join(f"{k}: {v}" for k, v in SETTINGS[setting][0].items()) or "as shipped"
        lines += [
            f"### {setting} ({RECIPE} {overrides}; {mine[0]['size']} calibration samples, "
            f"{mine[0]['items']} held-out items a task, seeds {', '.join(map(str, seeds))}; "
            "mean ± spread (max - min) over seeds)",
            "",
            "| group | task | original | " + " | ".join(arms) + " | made by |",
            "|---|---|---|" + "---|" * len(arms) + "---|",
        ]
        commits = ", ".join(sorted({r["commit"] for r in mine} | {original["commit"]}))
        for task in TASKS:
            cells = []
            for arm in arms:
                values = [r["scores"][task.name] for r in mine if r["arm"] == arm]
                mean, spread = cell(values)
                cells.append(f"{mean:.3f} ± {spread:.3f} (n={len(values)})")
            mark = "" if task.name in ANSWERABLE else " (original near 0: not judged)"
            lines.append(
                f"| {task.group} | {task.name}{mark} | {original['scores'][task.name]:.3f} | "
                + " | ".join(cells)
                + f" | {commits} |"
            )
        lines.append("")
        for arm in arms[1:]:
            counts = [r["against_plain"] for r in mine if r["arm"] == arm and "against_plain" in r]
            if counts:
                packed, scales = (
                    f"{min(c[k][0] for c in counts)}-{max(c[k][0] for c in counts)} of {counts[0][k][1]}"
                    for k in ("weight_packed", "weight_scale")
                )
                lines.append(
                    f"- {setting}, {arm}: tensors that differ from plain's checkpoint (range over seeds): "
                    f"packed weights {packed}, scales {scales}"
                )
        lines.append("")
        if len(seeds) < 2:
            lines += ["- one seed: no spread to judge differences by", ""]
            continue
        judged.append(setting)
        for task in ANSWERABLE:  # is there a loss for a weighting to recover?
            plain = [r["scores"][task] for r in mine if r["arm"] == "plain"]
            if plain and original["scores"][task] - cell(plain)[0] > cell(plain)[1] + 1e-9:
                plain_loses.append(f"{task} ({setting})")
        for arm, (better, worse) in differences(setting, runs).items():
            better_any += [f"{arm} on {t} ({setting})" for t in better]
            worse_any += [f"{arm} on {t} ({setting})" for t in worse]
            lines.append(
                f"- {setting}, {arm} against plain beyond the seed spread: better on "
                f"{', '.join(better) or 'no task'}; worse on {', '.join(worse) or 'no task'}"
            )
        lines.append("")
    weighted = [r for r in runs if r["recorded_token_weights"] is not None]
    recorded = bool(weighted) and all(r["card_token_weights"] for r in weighted)
    imatrix = [r for r in runs if r["arm"] == "imatrix"]
    lines.append(
        "Only caption, temporal_grounding, video_caption, speaker_count and audio_image_qa are judged: "
        "the others (the precision tasks OCR and grounding among them) score near 0 in the original, "
        "so no calibration can show a difference there, and the issue's goal (precision tasks gaining "
        "beyond the seed spread) cannot be tested on this model. "
        + (
            "With fewer than two seeds per setting nothing is judged. "
            if not judged
            else (
                f"Beyond the seed spread, better than plain: {'; '.join(better_any)}. "
                if better_any
                else "No token weighting and not imatrix helped any judged task beyond the seed spread. "
            )
            + (
                f"Plain GPTQ itself lost beyond its seed spread on: {'; '.join(plain_loses)}. "
                if plain_loses
                else "But plain GPTQ loses nothing beyond its seed spread on any judged task here, so "
                "there was no loss for a weighting to recover: the experiment is inconclusive, and "
                "the defaults stay off for lack of evidence, not because weighting was shown not to help. "
            )
            + (f"Worse than plain: {'; '.join(worse_any)}. " if worse_any else "No judged task got worse. ")
        )
        + (
            "The built-in recipes ship with token_weights absent (off) and weight_observer unset "
            "(the library's memoryless_minmax). "
            if shipped_defaults()
            else "Some built-in recipe turns token_weights or weight_observer on. "
        )
        + (
            f"All {len(weighted)} weighted runs recorded their weights in quantkit.json and the model card"
            if recorded
            else "Not every weighted run recorded its weights in quantkit.json and the card (see the run JSON)"
        )
        + (
            f"; the {len(imatrix)} imatrix runs recorded weight_observer: imatrix_mse in quantkit.json."
            if imatrix and all(r["recorded_weight_observer"] == "imatrix_mse" for r in imatrix)
            else "."
        )
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------- SmolLM2-135M (real weights)

SMOL_SECTION = "### SmolLM2-135M: perplexity and KL on held-out Jargon File text"
# arm -> overrides of the shipped w4a16 recipe (zero points, group 64 chosen for SmolLM2's 576)
SMOL_ARMS: dict[str, dict] = {
    "plain": {},
    "answer-up": {"token_weights": {"role": {"answer": 4.0}}},
    "imatrix": {"weight_observer": "imatrix_mse"},
}
# setting -> recipe overrides: w4a16 as shipped, and without zero points (symmetric int4, which
# vLLM serves too), the harsher setting where differences between the arms are easier to see.
SMOL_SETTINGS: dict[str, dict] = {"w4a16": {}, "w4a16-sym": {"symmetric": True}}
ANSWER_SHARE = 0.25  # the last quarter of each calibration window is the assistant's turn
SMOL_POOL = 64  # calibration windows to draw from, evenly spread over the first 60% of the text


def smol_inputs(work: Path, calib_pool: int, eval_windows: int):
    """SmolLM2 (bench/mixed_precision.py's bf16 folder, its adapter) and its window split of the
    Jargon File: calibration windows from the first 60%, evaluation windows from the rest."""
    import mixed_precision as mp
    from transformers import AutoTokenizer

    folder = mp.with_parts_template(mp.smollm2_folder(work / "smollm2"), work)
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
    settings = {"size": plan["size"], "eval_windows": plan["eval_windows"], "window": mp.WINDOW}
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
    other code), each shown as not measured at this code, never with figures."""
    import mixed_precision as mp

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
        "the commit that made it (\"made by\"); a run is shown with figures only while its key matches the code "
        "as it is.",
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
                commits = ", ".join(sorted({r["provenance"]["commit"] if "provenance" in r else r["commit"] for r in group}))
                lines.append(
                    f"| {arm} | {spread_cell([ppl_change(r) for r in group], 2, '%')} | "
                    f"{spread_cell([r['kl'] for r in group])} | {spread_cell([r['top1'] for r in group])} | "
                    f"{len(group)} | {statistics.mean(r['quantize_seconds'] for r in group):.0f} s | {commits} |"
                )
            absent = [p for p in waiting if p["arm"] == arm]
            if absent:
                said = "; ".join(f"seed {p['seed']} {p['status']}" for p in absent)
                lines.append(f"| {arm} | not measured at this code: {said} | - | - | 0 | - | - |")
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
            "or stale: made by other code), so they show no figures; the verdicts count the current runs only. "
            "The command above measures them (minutes of CPU each).",
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
            + (
                " The built-in recipes ship with token_weights absent (off) and weight_observer unset "
                "(the library's memoryless_minmax)."
                if shipped_defaults()
                else " Some built-in recipe turns token_weights or weight_observer on."
            ),
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
                    status = f"stale (made by {made.get('commit') or 'unknown'} with other code)" if row else "missing"
                    pending.append({"setting": setting, "arm": arm, "seed": seed, "status": status})
                    continue
                row = smol_measure(args.work, plan, setting, arm, seed, inputs(), reference)
                row["provenance"] = smol_provenance(plan, setting, arm, seed, state, loaded_sources())
                row["commit"] = state["commit"]
                saved["runs"][name] = row
                write_file_atomic(args.results, json.dumps(saved, indent=1) + "\n")
                runs.append(row)
                print(json.dumps({k: v for k, v in row.items() if k not in ("sample_ids", "provenance")}), flush=True)
    text = smol_render(runs, plan, pending)
    return text + ("\n\n" + saved["history"] if saved.get("history") else "")


def smol_state() -> dict:
    """The code state a SmolLM2 run's key shares (bench/mixed_precision.py's code_state): its
    measuring code, with this part's own, the library versions, the commit."""
    import mixed_precision as mp

    return mp.code_state((*mp.MEASURING, smol_inputs, smol_samples, smol_recipe, smol_measure))


# Said in RESULTS.md until the SmolLM2 part has been run (issue 18 asks for it).
SMOL_PENDING = (
    "SmolLM2-135M (perplexity and KL on held-out Jargon File windows, answer-token weighting) has no "
    "figures here yet: `--smollm2` is written and was smoke-run only (one GPTQ run did not finish in "
    "13 minutes on the loaded 2-core machine)."
)


def write_part(results: Path, text: str, *, smol: bool) -> None:
    """Replace one part of the RESULTS.md section (tiny-omni-skills, or SmolLM2's subsection)
    and keep the other."""
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
    parser.add_argument("--pool", type=Path, help="quantkit demo-pool --skills's pool.jsonl (not with --smollm2)")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--arms", help=f"default: {','.join(ARMS)}; with --smollm2 {','.join(SMOL_ARMS)}")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--items", type=int, default=24, help="held-out items per task")
    parser.add_argument("--note", default="")
    parser.add_argument("--render-only", action="store_true", help="render from the stored runs")
    parser.add_argument("--write-results", type=Path)
    parser.add_argument("--smollm2", action="store_true", help="the SmolLM2-135M part instead")
    parser.add_argument("--smol-size", type=int, default=16, help="SmolLM2 calibration windows")
    parser.add_argument("--smol-eval", type=int, default=8, help="SmolLM2 evaluation windows")
    parser.add_argument("--smol-settings", default="w4a16", help=f"SmolLM2 settings: {','.join(SMOL_SETTINGS)}")
    parser.add_argument(
        "--results",
        type=Path,
        default=SMOL_RESULTS,
        help="the SmolLM2 runs, keyed by the code that made them (default bench/token_weights.json)",
    )
    args = parser.parse_args(argv)
    if args.smollm2:
        unknown = [s for s in args.smol_settings.split(",") if s not in SMOL_SETTINGS]
        unknown += [a for a in (args.arms or "").split(",") if a and a not in SMOL_ARMS]
        if unknown:
            parser.error(f"unknown SmolLM2 setting or arm: {', '.join(unknown)}")
    elif args.model is None or args.pool is None:
        parser.error("--model and --pool are required (or --smollm2)")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.smollm2:
        text = smol_main(args)
        print(text)
        if args.write_results:
            write_part(args.write_results, text, smol=True)
        return
    from _shared import write_json

    original = original_scores(args.model, args.work, args.items)
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for setting in args.settings.split(","):
            for arm in (args.arms or ",".join(ARMS)).split(","):
                out = args.work / f"tw-{setting}-{arm}-{seed}-{args.items}.json"
                if args.render_only and not out.is_file():
                    continue
                run = run_one(args.model, args.pool, args.work, setting, arm, seed, args.items)
                if arm != "plain" and "against_plain" not in run:
                    run["against_plain"] = against_plain(args.work, run)
                    write_json(out, run)
                runs.append(run)
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "sample_ids"}), flush=True)
    text = render(original, runs, args.note)
    print(text)
    if args.write_results:
        write_part(args.write_results, text, smol=False)


if __name__ == "__main__":
    main()
