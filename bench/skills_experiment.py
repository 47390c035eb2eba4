"""The seed article's claim, measured on tiny-omni-skills: does a stratified, sensitivity-weighted
calibration set (``quantkit calibrate``) keep per-task accuracy better than a generic one?

Arms, each ``--size`` samples drawn from the same pool (the skills pool, ``demo-pool --skills``):
stratified (``quantkit calibrate``, seed s), uniform random (seed s), text only (the arithmetic
records), image captions only (the caption records: what llm-compressor's examples calibrate on).
The pool holds only 12 distinct captions (4 colours x 3 shapes), so the captions arm repeats
records to reach the size. Each arm x recipe x seed is quantized, then scored with
``quantkit.eval.skills.score_model`` on the same held-out items as the original (paired).

    python bench/skills_experiment.py --model DIR --work /tmp/skills-exp \
        --recipes w4a16,w8a8-sq-gptq,fp8 --seeds 0,1 --size 32 --items 24 --write-results bench/RESULTS.md

Finished runs are kept in ``--work`` (one JSON per run) and reused.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

ARMS = ("stratified", "uniform", "text-only", "captions-only")
SECTION = "## Calibration data vs per-task accuracy (tiny-omni-skills)"


def pool_records(pool: Path) -> list[dict]:
    return [json.loads(line) for line in pool.read_text(encoding="utf-8").splitlines() if line.strip()]


def arm_samples(arm: str, pool: Path, work: Path, size: int, seed: int, model: Path):
    from quantkit.calibset import CalibrateOptions, build_calibration_set
    from quantkit.models.inputs import Sample
    from quantkit.quantize.calibration_set import samples_from_set

    if arm == "stratified":
        calib = work / f"calib-{size}-{seed}"
        if not (calib / "samples.jsonl").is_file():
            options = CalibrateOptions(
                size=size, seed=seed, model=model, allow_missing_tasks=True, force=True
            )
            build_calibration_set([pool], calib, options)
        drawn = samples_from_set(calib, model_kinds={"image", "video", "audio"}, num_samples=size, seed=seed)
        return list(drawn.samples), f"quantkit calibrate --size {size} --seed {seed}"
    records = pool_records(pool)
    rng = random.Random(seed)
    if arm == "uniform":
        chosen = rng.sample(records, size)
    else:
        task = "text_chat" if arm == "text-only" else "short_caption"
        subset = [r for r in records if r["task"] == task]
        chosen = (
            rng.sample(subset, size) if len(subset) >= size else [rng.choice(subset) for _ in range(size)]
        )

    def sample(record: dict) -> Sample:
        paths = {k: [pool.parent / p for p in record[k]] for k in ("images", "videos", "audios")}
        return Sample(messages=record["messages"], **paths)

    return [sample(r) for r in chosen], f"{arm}, seed {seed}"


def run_one(
    model: Path, pool: Path, work: Path, recipe: str, arm: str, seed: int, size: int, items: int
) -> dict:
    out = work / f"run-{recipe}-{arm}-{size}-{seed}.json"
    if out.is_file():
        return json.loads(out.read_text())
    from quantkit.eval.skills import score_model
    from quantkit.quantize import quantize
    from quantkit.recipes.registry import resolve_recipe
    from quantkit.zoo.skills_tasks import TASKS

    samples, label = arm_samples(arm, pool, work, size, seed, model)
    checkpoint = work / f"ckpt-{recipe}-{arm}-{size}-{seed}"
    started = time.monotonic()
    quantize(model, checkpoint, resolve_recipe(recipe), samples, force=True, progress=False)
    scores = score_model(checkpoint, [t.name for t in TASKS], items=items)
    result = {
        "recipe": recipe,
        "arm": arm,
        "seed": seed,
        "size": size,
        "calibration": label,
        "items": items,
        "seconds": round(time.monotonic() - started, 1),
        "scores": {t.task: t.score for t in scores.tasks},
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def original_scores(model: Path, work: Path, items: int) -> dict:
    out = work / f"original-{items}.json"
    if out.is_file():
        return json.loads(out.read_text())
    from quantkit.eval.skills import score_model
    from quantkit.zoo.skills_tasks import TASKS

    scores = {t.task: t.score for t in score_model(model, [t.name for t in TASKS], items=items).tasks}
    out.write_text(json.dumps(scores, indent=1) + "\n")
    return scores


def render(original: dict, runs: list[dict], note: str) -> str:
    from quantkit.zoo.skills_tasks import TASKS

    lines = [SECTION, "", note, ""]
    recipes = list(dict.fromkeys(r["recipe"] for r in runs))
    for recipe in recipes:
        arms = [a for a in ARMS if any(r["recipe"] == recipe and r["arm"] == a for r in runs)]
        seeds = sorted({r["seed"] for r in runs if r["recipe"] == recipe})
        lines += [
            f"### {recipe} ({runs[0]['size']} calibration samples, seeds {', '.join(map(str, seeds))}; "
            "score as mean ± spread (max - min) over seeds)",
            "",
            "| group | task | original | " + " | ".join(arms) + " |",
            "|---|---|---|" + "---|" * len(arms),
        ]
        for task in TASKS:
            cells = []
            for arm in arms:
                values = [r["scores"][task.name] for r in runs if r["recipe"] == recipe and r["arm"] == arm]
                spread = max(values) - min(values)
                cells.append(f"{statistics.mean(values):.3f} ± {spread:.3f} (n={len(values)})")
            lines.append(
                f"| {task.group} | {task.name} | {original[task.name]:.3f} | " + " | ".join(cells) + " |"
            )
        lines.append("")
    return "\n".join(lines)


def write_section(results: Path, text: str) -> None:
    old = results.read_text(encoding="utf-8") if results.is_file() else ""
    if SECTION in old:
        head, _, rest = old.partition(SECTION)
        tail = rest[rest.find("\n## ") + 1 :] if "\n## " in rest else ""
        old = head.rstrip("\n") + ("\n\n" + tail if tail else "")
    results.write_text(old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="a tiny-omni-skills folder")
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantkit-skills-exp"))
    parser.add_argument("--recipes", default="w4a16,w8a8-sq-gptq,fp8")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--items", type=int, default=24, help="held-out items per task")
    parser.add_argument("--pool-per-task", type=int, default=24)
    parser.add_argument("--note", default="")
    parser.add_argument("--write-results", type=Path)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    from quantkit.zoo.skills_tasks import write_skills_pool

    args.work.mkdir(parents=True, exist_ok=True)
    pool = args.work / "pool" / "pool.jsonl"
    if not pool.is_file():
        write_skills_pool(args.work / "pool", per_task=args.pool_per_task, seed=7, force=True)
    original = original_scores(args.model, args.work, args.items)
    runs = []
    for recipe in args.recipes.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            for arm in args.arms.split(","):
                runs.append(run_one(args.model, pool, args.work, recipe, arm, seed, args.size, args.items))
                print(json.dumps(runs[-1]), flush=True)
    text = render(original, runs, args.note)
    print(text)
    if args.write_results:
        write_section(args.write_results, text)


if __name__ == "__main__":
    main()
