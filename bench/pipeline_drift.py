"""Drift of the sequential pipeline on captured decoder inputs against the whole-model pipeline
it replaced (issue 16: "the outputs are at least as close to the original as today's").

"Today's" is the code before commit c5e211f ("towers once, decoder many"): c5e211f^, checked
out as a git worktree under ``--work`` and run with its own PYTHONPATH (its own CLI, recipes and
pipelines; the same virtual environment, so the same libraries). For every zoo model (built
once, by this checkout, seed 0) x every recipe that reads calibration data: one calibration set
per model (``quantkit calibrate`` on the demo pool, ``--model``), quantized by both codes with
``quantize --calib SET --num-samples N --seed 0``; then this checkout's ``verify`` drift
(``measure_drift``) of both checkpoints on the same held-out rows (the set's rows neither
checkpoint calibrated on, the same stratified draw: the ids are recorded and compared). A recipe
c5e211f^ does not have is quantized by this checkout only (no baseline: said in its row).

Per pair and modality: KL (original || quantized) and top-1 agreement of both, and the paired
per-sample KL difference (new - old) with its standard error: "worse" when the new KL is higher
by more than t(0.975, n-1) standard errors of that difference (and top-1 likewise lower), "better"
the other way, else "same"; "n/a" for a group of fewer than 3 samples (no spread to judge by).

Run: nice -n 5 python bench/pipeline_drift.py [--models A,B] [--recipes X,Y] [--work DIR]
     [--render-only]
Measurements are cached per pair in WORK/results.json (keyed by both commits: a run at another
commit measures again); the section
"Pipeline drift (issue 16)" of bench/RESULTS.md is rendered from every cached pair.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import ROOT, child_env, git_commit, replace_section, run_child, write_json  # noqa: E402

SCRIPT = Path(__file__).resolve()
BASE = "c5e211f^"  # the whole-model (basic pipeline) calibration, before "towers once, decoder many"
HEADING = "## Pipeline drift (issue 16)"
CALIB_SIZE, NUM_SAMPLES, HELD_OUT = 48, 16, 12
TEXT_PER_TASK = 48  # demo-pool records per task for the text-only model's pool
GREEDY_TOKENS = 1  # the greedy-prefix metric is not compared here; one token keeps drift cheap
RESULTS = ROOT / "bench" / "RESULTS.md"
MIN_SAMPLES = 3  # a group judged on fewer paired samples is "n/a": its standard error is 1 dof or none
# Known changes on main after which the new side's checkpoints differ (rows measured before them
# are said to predate them): (commit, what changed).
LATER_CHANGES = (
    (
        "ec95551",
        "capture runs the towers under llmcompressor's calibration context, eager attention: "
        "the new side's checkpoints differ since",
    ),
)


def base_worktree(work: Path) -> tuple[Path, str]:
    """A detached worktree of BASE under ``work`` (created once); (its path, its short hash)."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", BASE], capture_output=True, text=True, check=True
    ).stdout.strip()
    folder = work / f"code-{commit}"
    if not (folder / "quantkit").is_dir():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), commit], check=True
        )
    return folder, commit


class CliFailed(RuntimeError):
    """``quantkit`` exited non-zero: the command, the code that ran it, its exit code."""

    def __init__(self, message: str, command: str, code: Path, returncode: int) -> None:
        super().__init__(message)
        self.command, self.code, self.returncode = command, code, returncode


def cli(code: Path, *args: str, log: Path) -> float:
    """``python -m quantkit ARGS`` with ``code`` first on PYTHONPATH; the seconds it took. Its
    output goes to ``log``; a failure raises ``CliFailed`` with the log's tail."""
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "quantkit", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(code),
            cwd=code,
            check=False,
        )
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        message = f"quantkit {' '.join(args[:3])} (code {code}) exited {proc.returncode}:\n{tail}"
        raise CliFailed(message, args[0], code, proc.returncode)
    return time.perf_counter() - started


def zoo_names() -> list[str]:
    from quantkit.zoo.models import TRAINED, ZOO

    return [*ZOO, *TRAINED]  # what `quantkit zoo list` lists


def data_recipes(code: Path = ROOT) -> list[str]:
    from quantkit.recipes.registry import list_recipes

    return [entry.name for entry in list_recipes() if entry.needs_data]


def base_recipes(code: Path) -> set[str]:
    return {path.stem for path in (code / "recipes").glob("*.yaml") if path.stem != "targets"}


def takes_media(name: str) -> bool:
    from quantkit.zoo.models import TRAINED, ZOO

    return bool({**ZOO, **TRAINED}[name].modalities)


def text_pool(work: Path) -> Path:
    """The text records of a demo pool of TEXT_PER_TASK records per task (for text-only models:
    a held-out set is left after calibrating on NUM_SAMPLES)."""
    pool = work / "pool-text" / "pool.jsonl"
    if not pool.is_file():
        source = work / f"pool-{TEXT_PER_TASK}"
        if not (source / "pool.jsonl").is_file():
            args = ["demo-pool", "--per-task", str(TEXT_PER_TASK), "--output", str(source), "--force"]
            cli(ROOT, *args, log=work / "logs" / "demo-pool-text.log")
        rows = [json.loads(line) for line in (source / "pool.jsonl").read_text(encoding="utf-8").splitlines()]
        text = [row for row in rows if not (row.get("images") or row.get("videos") or row.get("audios"))]
        from quantkit.fsutil import write_file_atomic

        pool.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(pool, "".join(json.dumps(row) + "\n" for row in text))
    return pool


def prepare_model(work: Path, name: str) -> tuple[Path, Path]:
    """The zoo model and its calibration set (built by this checkout, once)."""
    model = work / "models" / name
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not (model / "config.json").is_file():
        cli(ROOT, "zoo", "build", name, "--output", str(model), "--force", log=logs / f"zoo-{name}.log")
    pool = work / "pool" / "pool.jsonl"
    if not pool.is_file():
        cli(ROOT, "demo-pool", "--output", str(pool.parent), "--force", log=logs / "demo-pool.log")
    if not takes_media(name):  # the demo pool holds 12 text records: a text-only pool of its own
        pool = text_pool(work)
    calib = work / "calib" / name
    if not (calib / "report.json").is_file():
        cli(
            ROOT,
            "calibrate",
            str(pool),
            "--model",
            str(model),
            "--size",
            str(CALIB_SIZE),
            "--output",
            str(calib),
            "--force",
            *([] if takes_media(name) else ["--allow-missing-tasks"]),  # text tasks only
            log=logs / f"calibrate-{name}.log",
        )
    return model, calib


def checkpoint_dir(work: Path, tag: str, commit: str, model: str, recipe: str) -> Path:
    """Where ``tag`` (base / new / new-seed1) quantized at ``commit`` writes: keyed by the commit,
    so a checkpoint is only ever compared with the one its row measured."""
    return work / "out" / f"{tag}-{commit}" / model / recipe


def quantize(
    code: Path, tag: str, commit: str, work: Path, model: Path, calib: Path, recipe: str
) -> tuple[Path, float]:
    out = checkpoint_dir(work, tag, commit, model.name, recipe)
    log = work / "logs" / f"quantize-{tag}-{model.name}-{recipe}.log"
    args = ["quantize", str(model), "--recipe", recipe, "--calib", str(calib)]
    args += ["--num-samples", str(NUM_SAMPLES), "--seed", "0", "-o", str(out), "--force"]
    return out, cli(code, *args, log=log)


def child_drift(reference: str, calib: str, *checkpoints: str) -> dict:
    """This checkout's drift of each checkpoint on the same held-out rows: the set's rows none of
    them calibrated on, drawn once (seed 1) and kept in that order for all."""
    from quantkit.models.adapters import adapter_for
    from quantkit.models.inputs import processor_capabilities
    from quantkit.verify import drift as drift_module
    from quantkit.verify.drift import _used_ids, held_out_rows, measure_drift

    # measure_drift rounds each sample's KL to 1e-6; the comparison it makes per row (once, in row
    # order) is wrapped to keep the unrounded mean, which the samples then carry.
    compare, exact = drift_module._compare_logits, []

    def keep_exact(*args, **kwargs):
        compared = compare(*args, **kwargs)
        exact.append(float(compared.kl))
        return compared

    drift_module._compare_logits = keep_exact
    exclude = set().union(*(_used_ids(Path(c)) for c in checkpoints))
    kinds = processor_capabilities(adapter_for(Path(reference)).load_processor(Path(reference)))
    rows = held_out_rows(Path(calib), exclude_ids=exclude, count=HELD_OUT, seed=1, kinds=kinds)
    ids = [row["id"] for row in rows]
    reports = {}
    for checkpoint in checkpoints:
        exact.clear()
        report = measure_drift(
            Path(reference),
            Path(checkpoint),
            Path(calib),
            num_samples=HELD_OUT,
            seed=1,
            greedy_tokens=GREEDY_TOKENS,
            exclude_ids=exclude,
        )
        if [s.id for s in report.samples] != ids:
            raise RuntimeError(f"{checkpoint}: drift ran on other rows than those drawn")
        if len(exact) != len(report.samples):
            raise RuntimeError(f"{checkpoint}: {len(exact)} comparisons for {len(report.samples)} samples")
        reports[checkpoint] = {
            "samples": [
                {"id": s.id, "modality": s.modality, "kl": kl, "top1": s.top1}
                for s, kl in zip(report.samples, exact, strict=True)
            ],
            "calibrated_on": len(_used_ids(Path(checkpoint))),
        }
    return {"held_out_ids": ids, "excluded": len(exclude), "reports": reports, "kl_unrounded": True}


def measure_pair(work: Path, base: Path, base_commit: str, new_commit: str, name: str, recipe: str) -> dict:
    model, calib = prepare_model(work, name)
    row: dict = {"model": name, "recipe": recipe, "base_commit": base_commit, "new_commit": new_commit}
    checkpoints = {}
    new_out, row["new_quantize_s"] = quantize(ROOT, "new", new_commit, work, model, calib, recipe)
    checkpoints["new"] = new_out
    if recipe in base_recipes(base):
        base_out, row["base_quantize_s"] = quantize(base, "base", base_commit, work, model, calib, recipe)
        checkpoints["base"] = base_out
    else:
        row["base_missing"] = f"{BASE} ({base_commit}) has no recipe {recipe}"
    started = time.perf_counter()
    drift = run_child(SCRIPT, "drift", str(model), str(calib), *(str(p) for p in checkpoints.values()))
    row["drift_s"] = round(time.perf_counter() - started, 1)
    row["held_out_ids"] = drift["held_out_ids"]
    row["kl_unrounded"] = drift.get("kl_unrounded", False)
    row["checkpoints"] = {tag: str(path) for tag, path in checkpoints.items()}
    for tag, path in checkpoints.items():
        report = drift["reports"][str(path)]
        row[f"{tag}_samples"] = report["samples"]
        row[f"{tag}_calibrated_on"] = report["calibrated_on"]
        meta = json.loads((path / "quantkit.json").read_text(encoding="utf-8"))
        row[f"{tag}_pipeline"] = meta.get("pipeline") or (meta.get("calibration") or {}).get("pipeline")
    return row


def measure_noise(work: Path, base_commit: str, new_commit: str, name: str, recipe: str) -> dict:
    """The seed spread: this checkout quantizes the pair again on another stratified subsample
    (``--seed 1``); drift of the old, the new and the reseeded checkpoint on the same held-out rows
    (none calibrated any of the three). Needs the pair measured first (its checkpoints)."""
    model, calib = prepare_model(work, name)
    base_out = checkpoint_dir(work, "base", base_commit, name, recipe)
    new_out = checkpoint_dir(work, "new", new_commit, name, recipe)
    seeded = checkpoint_dir(work, "new-seed1", new_commit, name, recipe)
    if not (seeded / "quantkit.json").is_file():
        args = ["quantize", str(model), "--recipe", recipe, "--calib", str(calib)]
        args += ["--num-samples", str(NUM_SAMPLES), "--seed", "1", "-o", str(seeded), "--force"]
        cli(ROOT, *args, log=work / "logs" / f"quantize-new-seed1-{name}-{recipe}.log")
    drift = run_child(SCRIPT, "drift", str(model), str(calib), str(base_out), str(new_out), str(seeded))
    reports = drift["reports"]
    return {
        "model": name,
        "recipe": recipe,
        "base_commit": base_commit,
        "new_commit": new_commit,
        "held_out_ids": drift["held_out_ids"],
        "kl_unrounded": drift.get("kl_unrounded", False),
        **{
            f"{tag}_samples": reports[str(path)]["samples"]
            for tag, path in (("base", base_out), ("new", new_out), ("seed1", seeded))
        },
    }


def render_noise(noise: list[dict]) -> list[str]:
    lines = []
    for row in noise:
        base, new, seeded = (groups(row[f"{tag}_samples"]) for tag in ("base", "new", "seed1"))
        lines += [
            "",
            f"Seed spread, {row['model']} x {row['recipe']} ({row['base_commit']} → {row['new_commit']}): "
            f"the new code again on another calibration subsample (`--seed 1`), all three on the same "
            f"{len(row['held_out_ids'])} held-out rows, none of which calibrated any of them: the seed-1 "
            "checkpoint's calibration samples are left out too, so these rows, and the old → new column "
            "here, differ from the main table's:",
            "",
            "| modality (samples) | old → new (seed 0) | new seed 0 → new seed 1 |",
            "|---|---|---|",
        ]
        for name, items in new.items():
            lines.append(
                f"| {name} ({len(items)}) | {verdict(base[name], items)} | {verdict(items, seeded[name])} |"
            )
        pipeline = [paired(base["all"], new["all"], m) for m in ("kl", "top1")]
        seed = [paired(new["all"], seeded["all"], m) for m in ("kl", "top1")]
        smaller = all(abs(p[0]) <= abs(q[0]) for p, q in zip(pipeline, seed, strict=True))
        lines += [
            "",
            f"Over all {len(new['all'])} rows, old → new moves KL by {pipeline[0][0]:+.2g} ± {pipeline[0][1]:.1g} "
            f"and top-1 by {pipeline[1][0]:+.3f} ± {pipeline[1][1]:.3f}; one reseed of the same code moves them "
            f"by {seed[0][0]:+.2g} ± {seed[0][1]:.1g} and {seed[1][0]:+.3f} ± {seed[1][1]:.3f} (paired means ± "
            "standard errors): the pipeline's change is "
            + ("smaller than one reseed's shift" if smaller else "not smaller than one reseed's shift")
            + " (one reseed: a single draw of the seed spread, not its size).",
        ]
    return lines


def weights_differ(base: Path, new: Path) -> dict[str, float]:
    """Per decoder layer index: the share of quantized weight elements (packed words for int4,
    the tensors themselves otherwise) that differ between the two checkpoints."""
    import re

    from safetensors.torch import load_file

    def tensors(folder: Path) -> dict:
        found: dict = {}
        for file in sorted(folder.glob("*.safetensors")):
            found.update(load_file(file))
        return found

    a, b = tensors(base), tensors(new)
    counts: dict[str, list[int]] = {}
    for name, tensor in a.items():
        layer = re.search(r"\.layers\.(\d+)\.", name)
        if layer is None or not name.endswith(("weight_packed", "weight")) or name not in b:
            continue
        if (
            tensor.dtype.is_floating_point
            and not name.endswith("weight_packed")
            and tensor.dtype.itemsize > 1
        ):
            continue  # a 16-bit weight is not quantized
        other = b[name]
        total = counts.setdefault(layer.group(1), [0, 0])
        total[0] += int((tensor != other).sum()) if tensor.shape == other.shape else tensor.numel()
        total[1] += tensor.numel()
    return {layer: round(d / n, 4) for layer, (d, n) in sorted(counts.items(), key=lambda kv: int(kv[0]))}


# ---------------------------------------------------------------------- rendering


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def paired(base: list[dict], new: list[dict], metric: str) -> tuple[float, float]:
    """Mean and standard error of the per-sample difference new - base of ``metric``."""
    diffs = [n[metric] - b[metric] for b, n in zip(base, new, strict=True)]
    mean = _mean(diffs)
    if len(diffs) < 2:
        return mean, math.inf
    var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
    return mean, math.sqrt(var / len(diffs))


def t_critical(samples: int) -> float:
    """Two-sided 95% critical value of Student's t at ``samples - 1`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, samples - 1))


def verdict(base: list[dict], new: list[dict]) -> str:
    """worse / better / same / mixed by the paired per-sample differences beyond t(0.975, n-1)
    standard errors, with the figures; "n/a" under MIN_SAMPLES samples."""
    kl, kl_se = paired(base, new, "kl")
    top1, top1_se = paired(base, new, "top1")
    if len(new) < MIN_SAMPLES:
        return f"n/a ({len(new)} sample{'s' * (len(new) > 1)}: too few; ΔKL {kl:+.2g}, Δtop-1 {top1:+.3f})"
    crit = t_critical(len(new))
    worse = kl > crit * kl_se or top1 < -crit * top1_se
    better = kl < -crit * kl_se or top1 > crit * top1_se
    word = "mixed" if worse and better else "**worse**" if worse else "better" if better else "same"
    return f"{word} (ΔKL {kl:+.2g} ± {kl_se:.1g}, Δtop-1 {top1:+.3f} ± {top1_se:.3f})"


def groups(samples: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {"all": samples}
    for sample in samples:
        found.setdefault(sample["modality"], []).append(sample)
    return found


def predates(change: str, commit: str) -> bool | None:
    """Whether ``commit`` (a row's, "+" for local changes) is not a descendant of ``change``;
    None when git does not know either."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "--is-ancestor", change, commit.rstrip("+")],
        capture_output=True,
        check=False,
    )
    return {0: False, 1: True}.get(proc.returncode)


def provenance(rows: list[dict]) -> str:
    """Which commits made the new side's rows, and the known later changes that they predate."""
    commits = sorted({row["new_commit"] for row in rows})
    text = f"The new side's rows were made at commit{'s' * (len(commits) > 1)} {', '.join(commits)} (each row names its own)"
    for change, what in LATER_CHANGES:
        before = [commit for commit in commits if predates(change, commit)]
        if before:
            text += (
                f", {'all' if len(before) == len(commits) else ', '.join(before)} before main's {change} "
                f"({what}): these rows do not measure the code after it. Re-running "
                "`bench/pipeline_drift.py` measures them again (a row's key includes the commit)"
            )
    return text + "."


def render(rows: list[dict], noise: list[dict] | None = None) -> str:
    rounded = [row for row in [*rows, *(noise or [])] if "refused" not in row and not row.get("kl_unrounded")]
    lines = [
        f"Rendered by `bench/pipeline_drift.py` from its measurements. Each zoo model (seed 0) x each "
        f"recipe that reads calibration data, quantized on the same calibration set (demo pool, "
        f"`calibrate --model --size {CALIB_SIZE}`, `quantize --num-samples {NUM_SAMPLES} --seed 0`) "
        f'by the code before "towers once, decoder many" ({BASE}, the whole model through the '
        "pipeline its adapter named) and by the new code (the decoder alone on its captured inputs), on "
        f"CPU; the pipelines each used are in the table (quantkit.json). {provenance(rows)} Drift by the new side's `verify` code (`measure_drift`) on the "
        f"same {HELD_OUT} held-out rows for both (none calibrated either checkpoint). KL: mean next-token "
        "KL(original || quantized) over each sample's positions, then over the samples; top-1: agreement. "
        "Verdict per modality: the paired per-sample difference (new - old) of KL or top-1 beyond "
        f"t(0.975, n-1) standard errors ({t_critical(MIN_SAMPLES):.1f} at n = {MIN_SAMPLES}, "
        f"{t_critical(HELD_OUT):.1f} at n = {HELD_OUT}; one seed, one draw: a coarse bound); n/a for a "
        f'group of fewer than {MIN_SAMPLES} samples, left out of the counts below. The "all" group '
        "holds its modality groups' samples, so the verdicts of a pair are not independent."
        + (
            f" Per-sample KL of {len(rounded)} stored measurement{'s' * (len(rounded) > 1)} is `verify`'s "
            "figure, rounded to 1e-6 (quantkit/verify/drift.py): a difference below that reads as 0 (the "
            '"ΔKL +0 ± 0" verdicts rest on top-1 alone); those rows stay as measured, and the bench '
            "keeps the unrounded KL of what it measures from now on."
            if rounded
            else ""
        ),
        "",
        "| model | recipe | modality (samples) | KL old | KL new | top-1 old | top-1 new | verdict "
        "| pipelines, commits (old → new) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    refused = [row for row in rows if "refused" in row]
    rows = [row for row in rows if "refused" not in row]
    for row in rows:
        new = groups(row["new_samples"])
        base = groups(row["base_samples"]) if "base_samples" in row else {}
        commits = f"{row.get('base_pipeline') or '-'} {row['base_commit']} → {row['new_pipeline']} {row['new_commit']}"
        for name, items in new.items():
            old = base.get(name)
            kl_old = f"{_mean([s['kl'] for s in old]):.3g}" if old else "-"
            top_old = f"{_mean([s['top1'] for s in old]):.3f}" if old else "-"
            judged = (
                verdict(old, items)
                if old
                else f"no baseline ({row['base_missing'].split(' has ')[0]} has no {row['recipe']})"
            )
            lines.append(
                f"| {row['model']} | {row['recipe']} | {name} ({len(items)}) | {kl_old} "
                f"| {_mean([s['kl'] for s in items]):.3g} | {top_old} | {_mean([s['top1'] for s in items]):.3f} "
                f"| {judged} | {commits} |"
            )
    verdicts = [line.split(" | ")[7].split(" (")[0] for line in lines[4:]]
    unjudged = verdicts.count("n/a")
    worse = [" x ".join(line.split(" | ")[:3]).lstrip("| ") for line in lines[4:] if "**worse**" in line]
    differ = [
        f"{row['model']} x {row['recipe']}: "
        + ", ".join(f"{layer} {share:.1%}" for layer, share in row["weights_differ"].items())
        for row in rows
        if row.get("weights_differ")
    ]
    if differ:
        lines += [
            "",
            "Quantized weights (int4 packed words, int8 / fp8 values) that differ between the old and "
            "the new checkpoint, by decoder layer (layer 0 sees the same hidden states in both; later "
            "layers also see what the layers before them became):",
            "",
            *(f"- {line}" for line in differ),
        ]
    lines += [
        "",
        f"{len(rows)} pairs, {len(verdicts)} groups, {unjudged} n/a (too few samples), "
        f'{len(verdicts) - unjudged} judged (the "all" groups overlap the others): '
        + ", ".join(f"{verdicts.count(v)} {v.strip('*')}" for v in ("**worse**", "mixed", "same", "better"))
        + (f"; worse: {'; '.join(worse)}." if worse else "; none worse."),
    ]
    for row in refused:
        side = row.get("refused_by")
        who = (
            f"the {side} code, {row[f'{side}_commit']}"
            if side
            else f"{row['new_commit']}; which side: not recorded"
        )
        lines += ["", f"Refused by `quantize` ({who}): {row['model']} x {row['recipe']}: {row['refused']}"]
    lines += render_noise(noise or [])
    measured = {(row["model"], row["recipe"]) for row in [*rows, *refused]}
    left = [f"{m} x {r}" for r in data_recipes() for m in zoo_names() if (m, r) not in measured]
    if left:
        lines.append("")
        lines.append(f"Not measured yet ({len(left)} pairs, left for lack of time): {', '.join(left)}.")
    return "\n".join(lines)


def load_results(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantkit-bench-pipeline-drift"))
    parser.add_argument("--models", help="comma-separated zoo names (default: every zoo model)")
    parser.add_argument("--recipes", help="comma-separated recipes (default: every data-driven recipe)")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--noise", help="MODEL/RECIPE of a measured pair: also measure the seed spread there")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs="+")
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        print(json.dumps({"drift": child_drift}[kind](*rest)))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    cache = args.work / "results.json"
    results = load_results(cache)
    if not args.render_only:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        base, base_commit = base_worktree(args.work)
        new_commit = git_commit()
        names = args.models.split(",") if args.models else zoo_names()
        recipes = args.recipes.split(",") if args.recipes else data_recipes()
        # Pairs with a baseline first (the comparison asked for), then this branch's new recipes.
        have = base_recipes(base)
        pairs = [(m, r) for r in recipes if r in have for m in names]
        pairs += [(m, r) for r in recipes if r not in have for m in names]
        for name, recipe in pairs:
            key = f"{name}/{recipe}/{base_commit}/{new_commit}"
            if key in results:
                continue
            started = time.perf_counter()
            try:
                results[key] = measure_pair(args.work, base, base_commit, new_commit, name, recipe)
            except RuntimeError as error:
                print(f"{name} x {recipe}: FAILED\n{error}", flush=True)
                refusal = next((line for line in str(error).splitlines() if line.startswith("error: ")), None)
                if (
                    isinstance(error, CliFailed)
                    and error.command == "quantize"
                    and error.returncode == 2
                    and refusal
                ):  # quantize refused the pair (bad input, exit 2): recorded, not retried
                    side = "new" if error.code == ROOT else "base"
                    results[key] = {"model": name, "recipe": recipe, "base_commit": base_commit}
                    results[key].update(
                        new_commit=new_commit, refused=refusal.removeprefix("error: "), refused_by=side
                    )
                    write_json(cache, results)
                continue
            print(f"{name} x {recipe}: {time.perf_counter() - started:.0f} s", flush=True)
            write_json(cache, results)
    if args.noise and not args.render_only:
        name, recipe = args.noise.split("/")
        key = f"noise/{name}/{recipe}/{base_commit}/{new_commit}"
        if key not in results:
            results[key] = measure_noise(args.work, base_commit, new_commit, name, recipe)
            write_json(cache, results)
    noise = [row for key, row in results.items() if key.startswith("noise/")]
    measured = [row for key, row in results.items() if not key.startswith("noise/")]
    for row in measured:  # the checkpoints the row measured (keyed by commit), never later ones
        if "refused" in row:
            continue
        paths = row.get("checkpoints") or {
            tag: checkpoint_dir(args.work, tag, row[f"{tag}_commit"], row["model"], row["recipe"])
            for tag in ("base", "new")
        }
        base_out, new_out = (Path(paths.get(tag, "")) for tag in ("base", "new"))
        if "weights_differ" not in row and "base_samples" in row and base_out.is_dir() and new_out.is_dir():
            row["weights_differ"] = weights_differ(base_out, new_out)
    if results:
        write_json(cache, results)
    rows = sorted(measured, key=lambda r: (r["recipe"], r["model"]))
    if rows:
        replace_section(args.results, HEADING, render(rows, noise))
        print(f"wrote {HEADING!r} ({len(rows)} pairs) into {args.results}")


if __name__ == "__main__":
    main()
