"""bench/token_weights_experiment.py's SmolLM2 part: how its runs are judged and rendered into
RESULTS.md (the measuring itself needs SmolLM2's weights and the Jargon File: bench only)."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]

import token_weights_experiment as tw  # noqa: E402


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
            "recorded_weight_observer": "imatrix_mse" if arm == "imatrix" else None,
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
        ["--work", "W"],  # the tiny-omni-skills part needs --model and --pool
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


def keyed_results(path: Path, kl_by_seed: dict[int, float], stale_seeds=(), seeds=(0, 1, 2)) -> dict:
    """A results file as smol_main writes it: the plan, rows keyed by the code as it is now (or,
    for ``stale_seeds``, by other measuring code and another commit)."""
    import json

    state = tw.smol_state()
    other = {**state, "bench": "c" * 64, "commit": "89abcde"}
    plan = {"settings": ["w4a16"], "arms": ["plain"], "seeds": list(seeds), "size": 16, "eval_windows": 16}
    runs = {}
    for row in smol_runs({"plain": list(kl_by_seed.values())}):
        row["seed"] = list(kl_by_seed)[row["seed"]]
        made = other if row["seed"] in stale_seeds else state
        row["provenance"] = tw.smol_provenance(plan, "w4a16", "plain", row["seed"], made, ["quantkit/quantize/run.py"])
        runs[tw.smol_name("w4a16", "plain", 16, row["seed"], 16)] = row
    saved = {"plan": plan, "runs": runs}
    path.write_text(json.dumps(saved), encoding="utf-8")
    return saved


def test_smol_rows_are_keyed_by_the_code_and_only_current_ones_show_figures(tmp_path, capsys):
    """The SmolLM2 rows carry bench/mixed_precision.py's key (recipe, seed, settings, measuring
    code, library versions, quantkit's source): a row made by other code, or a planned run with
    no row, is rendered as not measured at this code, without its figures; a current row shows
    them with the commit that made it. --render-only measures nothing (no SmolLM2 here)."""
    import mixed_precision as mp

    results = tmp_path / "token_weights.json"
    saved = keyed_results(results, {0: 0.2111, 1: 0.9876}, stale_seeds=(1,))
    current = saved["runs"][tw.smol_name("w4a16", "plain", 16, 0, 16)]["provenance"]
    assert current["commit"] == mp.code_state()["commit"]
    tw.main(["--smollm2", "--work", str(tmp_path / "work"), "--render-only", "--results", str(results)])
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| plain | 21.11%"))
    assert current["commit"] in row and "| 1 |" in row  # seed 0 alone: seed 1's figures left out
    assert "0.9876" not in text and "98.76" not in text
    assert "seed 1 stale (made by 89abcde with other code); seed 2 missing" in text
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
    import mixed_precision as mp  # this part's measuring code is in its key beside the shared one

    assert state["bench"] != mp.code_state()["bench"] and state["versions"] == mp.code_state()["versions"]


def test_smol_current_rows_are_reused_not_measured(tmp_path, capsys):
    """Measuring mode reuses every row whose key matches (here all of them: nothing is measured,
    so no SmolLM2 or Jargon File is needed) and records the plan asked for."""
    import json

    results = tmp_path / "token_weights.json"
    keyed_results(results, {0: 0.20, 1: 0.21}, seeds=(0, 1))
    before = json.loads(results.read_text())["runs"]
    args = ["--smollm2", "--work", str(tmp_path / "work"), "--smol-settings", "w4a16", "--arms", "plain"]
    tw.main([*args, "--seeds", "0,1", "--smol-size", "16", "--smol-eval", "16", "--results", str(results)])
    assert "| plain | 20.50% ± 1.00% |" in capsys.readouterr().out
    assert json.loads(results.read_text())["runs"] == before
