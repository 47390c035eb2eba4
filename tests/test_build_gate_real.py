"""The accuracy gate on a model that quantization hurts: smol-omni-skills (SmolLM2-135M-Instruct's
real weights, trained towers). nvfp4-a16 loses most of its ocr_table score (docs/eval.md); a tight
budget rejects it beyond its interval and keeps the fallback that passes, and a budget above its
interval keeps it, judged on the same held-out items.

The random-weight zoo models lose nothing to any recipe, so the gate's other tests cannot show a
rejection of a real loss; this one can. Slow (about 6 minutes on 2 cores): one smol build, two
candidates, 32 ocr_table items scored three times.
"""

from __future__ import annotations

import pytest
import yaml

from quantkit.build import build_checkpoints, load_targets
from quantkit.calibset import CalibrateOptions, build_calibration_set

pytestmark = pytest.mark.slow
# The budget the real loss must break (percent of ocr_table's score, drift points): nvfp4-a16 loses
# about 70 [54, 84] there; fp8-dynamic about 5 with an interval reaching 16 on 32-40 items, so a
# budget of 15 left it unresolved on some machines (threads change which items flip).
TIGHT = 25.0
OPTIONS = {
    "num_samples": 32,
    "eval_tasks": ["ocr_table"],
    "gate_items": 32,
    # SmolLM2-135M's next-token KL breaks limits set for large models even in fp8 (docs/commands/
    # build.md): the per-task gate alone decides here.
    "drift_limits": "report",
}


@pytest.fixture(scope="module")
def smol(zoo_model, tmp_path_factory) -> dict:
    from quantkit.synthetic import smol_tasks
    from quantkit.synthetic.skills_tasks import write_skills_pool

    root = tmp_path_factory.mktemp("gate-real")
    model = zoo_model("smol-omni-skills")
    write_skills_pool(root / "pool", per_task=24, seed=7, suite=smol_tasks)
    calib = root / "calib"
    options = CalibrateOptions(size=120, seed=0, model=model, allow_missing_tasks=True)
    build_calibration_set([root / "pool" / "pool.jsonl"], calib, options)
    targets = root / "targets.yaml"
    target = {
        "name": "proof",
        "hardware": ["test GPU"],
        "recipe": "nvfp4-a16",
        "why": "the 4-bit recipe that loses on OCR",
        "max_loss": TIGHT,
        "fallbacks": [{"recipe": "fp8-dynamic", "when": {"task_loss_above": "max_loss"}, "why": "8 bits"}],
    }
    targets.write_text(yaml.safe_dump({"version": 1, "targets": [target]}, sort_keys=False))
    load_targets(targets)
    return {"model": model, "calib": calib, "targets": targets, "out": root / "out"}


def test_a_tight_budget_rejects_a_real_loss_and_a_budget_above_it_keeps_it(smol):
    tight = build_checkpoints(
        smol["model"], smol["out"], ["proof"], calib=smol["calib"], targets_file=smol["targets"], **OPTIONS
    )
    (target,) = tight.targets
    first, kept = target.chain
    lost = first.tasks["eval ocr_table"]
    assert first.recipe == "nvfp4-a16" and first.verdict == "over budget", first
    assert lost["n"] == 32 and lost["ci_low"] > TIGHT, lost  # the whole interval beyond the budget
    assert target.status == "passed" and kept.recipe == "fp8-dynamic" and kept.verdict == "kept"
    assert target.checkpoint == kept.checkpoint
    assert all(r["ci_high"] <= TIGHT for r in kept.tasks.values()), kept.tasks
    assert kept.tasks["eval ocr_table"]["loss"] < lost["ci_low"]

    # A budget above nvfp4-a16's interval keeps it; the candidate is reused: the same items.
    loose_budget = float(f"{lost['ci_high'] + 1:.4g}")
    loose = build_checkpoints(
        smol["model"],
        smol["out"],
        ["proof"],
        calib=smol["calib"],
        targets_file=smol["targets"],
        max_loss=loose_budget,
        **OPTIONS,
    )
    (target,) = loose.targets
    (step,) = target.chain
    assert (step.recipe, step.verdict, step.cached) == ("nvfp4-a16", "kept", True)
    assert step.tasks["eval ocr_table"]["loss"] == lost["loss"]
    assert step.tasks["eval ocr_table"]["items"] == lost["items"]
