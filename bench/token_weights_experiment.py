"""Issue 18 (skeleton; not run yet): plain GPTQ vs token-weighted GPTQ on tiny-omni-skills, same
calibration samples, per-task accuracy over several seeds.

Arms are recipe variants of one base recipe (``--recipe``, default w4a16): ``plain`` (no
``token_weights``) and each entry of ``WEIGHTINGS`` (the recipe's ``token_weights`` section).
Samples are the stratified calibration set of bench/skills_experiment.py, with their task labels
(``task_tier`` needs them). Still to do: llmcompressor's ``imatrix`` observer as a third arm,
SmolLM2-135M perplexity / KL with answer-token weighting, and the RESULTS.md section.

    python bench/token_weights_experiment.py --model DIR --pool POOL.jsonl --work /tmp/tw-exp --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

WEIGHTINGS: dict[str, dict | None] = {
    "plain": None,
    "vision-down": {"modality": {"image": 0.25, "video": 0.25}},
    "answer-up": {"role": {"answer": 4.0}},
    "tier": {"task_tier": True},
    "tier+answer+vision-down": {
        "task_tier": True,
        "role": {"answer": 4.0},
        "modality": {"image": 0.25, "video": 0.25},
    },
}


def run_one(model: Path, pool: Path, work: Path, recipe: str, arm: str, seed: int, size: int, items: int):
    out = work / f"tw-{recipe}-{arm}-{size}-{seed}.json"
    if out.is_file():
        return json.loads(out.read_text())
    from quantkit.calibset import CalibrateOptions, build_calibration_set
    from quantkit.eval.skills import score_model
    from quantkit.quantize import quantize
    from quantkit.quantize.calibration_set import samples_from_set
    from quantkit.recipes.registry import resolve_recipe
    from quantkit.recipes.schema import Recipe
    from quantkit.zoo.skills_tasks import TASKS

    calib = work / f"calib-{size}-{seed}"
    if not (calib / "samples.jsonl").is_file():
        options = CalibrateOptions(size=size, seed=seed, model=model, allow_missing_tasks=True, force=True)
        build_calibration_set([pool], calib, options)
    drawn = samples_from_set(calib, model_kinds={"image", "video", "audio"}, num_samples=size, seed=seed)
    base = resolve_recipe(recipe).model_dump()
    weights = WEIGHTINGS[arm]
    variant = Recipe.model_validate({**base, **({"token_weights": weights} if weights else {})})
    checkpoint = work / f"ckpt-tw-{recipe}-{arm}-{size}-{seed}"
    quantize(
        model,
        checkpoint,
        variant,
        list(drawn.samples),
        sample_labels=drawn.labels,
        force=True,
        progress=False,
    )
    scores = score_model(checkpoint, [t.name for t in TASKS], items=items)
    result = {"recipe": recipe, "arm": arm, "seed": seed, "size": size, "items": items}
    result["scores"] = {t.task: t.score for t in scores.tasks}
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--pool", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--recipe", default="w4a16")
    parser.add_argument("--arms", default=",".join(WEIGHTINGS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--items", type=int, default=24)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in args.arms.split(","):
            result = run_one(args.model, args.pool, args.work, args.recipe, arm, seed, args.size, args.items)
            print(json.dumps(result))


if __name__ == "__main__":
    main()
