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
c5e211f^ does not have is quantized by this checkout only (no baseline: said in its row). Where
c5e211f^ has the recipe, both sides quantize with its recipe file (``--recipe PATH``): the pair then
measures the pipeline, not a recipe changed since (w4a16 ships the imatrix observer now).

Per pair and modality: KL (original || quantized) and top-1 agreement of both, and the paired
per-sample KL difference (new - old) with its standard error: "worse" when the new KL is higher
by more than t(0.975, n-1) standard errors of that difference (and top-1 likewise lower), "better"
the other way, else "same"; "n/a" for a group of fewer than 3 samples (no spread to judge by).

Run: nice -n 5 python bench/pipeline_drift.py [--models A,B] [--recipes X,Y] [--work DIR]
     [--pairs JSON] [--render-only] [--noise MODEL/RECIPE]
Every measured pair is a row of ``--pairs`` (default bench/pipeline_drift.json, written atomically
after each pair), stamped with the commit that made it and keyed the way bench/mixed_precision.py
keys its rows (its ``provenance`` / ``code_state``): the quantkit modules the new side's processes
imported (zoo build, calibrate, quantize, this checkout's drift; each records what it loaded) and
the recipe files, the model and the recipe, the base commit, the settings, this script's measuring
code and the library versions. A stored pair is reused only while its key matches; a pair made by
other code is measured again. ``--render-only`` measures nothing: stored pairs whose key no longer
matches are rendered as stale, without figures, and the pairs with no row as not measured at this
code. ``--work`` holds only scratch (the base worktree, models, calibration sets, checkpoints). The
section "Pipeline drift (issue 16)" of bench/RESULTS.md is rendered from the stored pairs.
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
from _shared import ROOT, child_env, replace_section, row_mark, run_child, write_json  # noqa: E402

SCRIPT = Path(__file__).resolve()
BASE = "c5e211f^"  # the whole-model (basic pipeline) calibration, before "towers once, decoder many"
HEADING = "## Pipeline drift (issue 16)"
CALIB_SIZE, NUM_SAMPLES, HELD_OUT = 48, 16, 12
TEXT_PER_TASK = 48  # demo-pool records per task for the text-only model's pool
GREEDY_TOKENS = 1  # the greedy-prefix metric is not compared here; one token keeps drift cheap
RESULTS = ROOT / "bench" / "RESULTS.md"
MIN_SAMPLES = 3  # a group judged on fewer paired samples is "n/a": its standard error is 1 dof or none
PAIRS = ROOT / "bench" / "pipeline_drift.json"


def base_commit() -> str:
    """BASE's short hash."""
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", BASE], capture_output=True, text=True, check=True
    ).stdout.strip()


def base_worktree(work: Path) -> tuple[Path, str]:
    """A detached worktree of BASE under ``work`` (created once); (its path, its short hash)."""
    commit = base_commit()
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


def sources_of(log: Path) -> Path:
    """Where a run of this checkout's CLI logged to ``log`` records the quantkit files it loaded."""
    return log.with_name(log.name + ".sources.json")


def as_cli(sources: Path, args: list[str]) -> None:
    """``python -m quantkit ARGS`` in this process, then the quantkit modules it imported and the
    recipe files (``loaded_sources``) written to ``sources``, exit or not."""
    import runpy

    from _shared import loaded_sources

    sys.argv = ["quantkit", *args]
    try:
        runpy.run_module("quantkit", run_name="__main__", alter_sys=True)
    finally:
        write_json(sources, loaded_sources())


def cli(code: Path, *args: str, log: Path) -> float:
    """``python -m quantkit ARGS`` with ``code`` first on PYTHONPATH; the seconds it took. Its
    output goes to ``log``; a failure raises ``CliFailed`` with the log's tail. This checkout's
    CLI (``code`` is ROOT) records the files it loaded beside the log (``sources_of``)."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "quantkit", *args]
    if code == ROOT:
        sources_of(log).unlink(missing_ok=True)
        command = [sys.executable, str(SCRIPT), "--as-cli", str(sources_of(log)), *args]
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.run(
            command,
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


def base_recipe_text(recipe: str) -> str | None:
    """BASE's ``recipes/RECIPE.yaml`` (None where BASE has no such recipe). Both sides quantize
    with it, so a pair measures the pipeline and not a recipe changed since BASE (w4a16 has
    shipped weight_observer: imatrix_mse since)."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BASE}:recipes/{recipe}.yaml"], capture_output=True, text=True, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


def takes_media(name: str) -> bool:
    from quantkit.zoo.models import TRAINED, ZOO

    return bool({**ZOO, **TRAINED}[name].modalities)


def loaded(log: Path) -> set[str]:
    """The files a finished run of this checkout's CLI logged to ``log`` loaded."""
    return set(json.loads(sources_of(log).read_text(encoding="utf-8")))


def built(made: Path, log: Path) -> bool:
    """Whether ``made`` is there with the record of the files that made it (else: made again)."""
    return made.is_file() and sources_of(log).is_file()


def text_pool(work: Path, files: set[str]) -> Path:
    """The text records of a demo pool of TEXT_PER_TASK records per task (for text-only models:
    a held-out set is left after calibrating on NUM_SAMPLES)."""
    pool = work / "pool-text" / "pool.jsonl"
    source, log = work / f"pool-{TEXT_PER_TASK}", work / "logs" / "demo-pool-text.log"
    if not built(pool, log):
        if not built(source / "pool.jsonl", log):
            args = ["demo-pool", "--per-task", str(TEXT_PER_TASK), "--output", str(source), "--force"]
            cli(ROOT, *args, log=log)
        rows = [json.loads(line) for line in (source / "pool.jsonl").read_text(encoding="utf-8").splitlines()]
        text = [row for row in rows if not (row.get("images") or row.get("videos") or row.get("audios"))]
        pool.parent.mkdir(parents=True, exist_ok=True)
        pool.write_text("".join(json.dumps(row) + "\n" for row in text), encoding="utf-8")
    files.update(loaded(log))
    return pool


def prepare_model(work: Path, name: str, files: set[str]) -> tuple[Path, Path]:
    """The zoo model and its calibration set (built by this checkout, once); the files the runs
    that built them loaded go into ``files``."""
    model = work / "models" / name
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"zoo-{name}.log"
    if not built(model / "config.json", log):
        cli(ROOT, "zoo", "build", name, "--output", str(model), "--force", log=log)
    files.update(loaded(log))
    if takes_media(name):
        pool, log = work / "pool" / "pool.jsonl", logs / "demo-pool.log"
        if not built(pool, log):
            cli(ROOT, "demo-pool", "--output", str(pool.parent), "--force", log=log)
        files.update(loaded(log))
    else:  # the demo pool holds 12 text records: a text-only pool of its own
        pool = text_pool(work, files)
    calib, log = work / "calib" / name, logs / f"calibrate-{name}.log"
    if not built(calib / "report.json", log):
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
            log=log,
        )
    files.update(loaded(log))
    return model, calib


def checkpoint_dir(work: Path, tag: str, commit: str, model: str, recipe: str) -> Path:
    """Where ``tag`` (base / new / new-seed1) quantized at ``commit`` writes: keyed by the commit,
    so a checkpoint is only ever compared with the one its row measured."""
    return work / "out" / f"{tag}-{commit}" / model / recipe


def recipe_argument(base: Path, recipe: str) -> str:
    """What ``quantize --recipe`` gets: BASE's recipe file where BASE has the recipe (both sides
    then read the same file; ``base`` is BASE's worktree), else the built-in name."""
    return str(base / "recipes" / f"{recipe}.yaml") if recipe in base_recipes(base) else recipe


def quantize(
    code: Path, tag: str, commit: str, work: Path, model: Path, calib: Path, recipe: str, files: set[str],
    recipe_arg: str | None = None,
) -> tuple[Path, float]:
    """``quantize`` by ``code`` (seed 0) with ``recipe_arg`` (default: the name ``recipe``); this
    checkout's loaded files go into ``files``, also when it fails."""
    out = checkpoint_dir(work, tag, commit, model.name, recipe)
    log = work / "logs" / f"quantize-{tag}-{model.name}-{recipe}.log"
    args = ["quantize", str(model), "--recipe", recipe_arg or recipe, "--calib", str(calib)]
    args += ["--num-samples", str(NUM_SAMPLES), "--seed", "0", "-o", str(out), "--force"]
    try:
        return out, cli(code, *args, log=log)
    finally:
        if code == ROOT and sources_of(log).is_file():
            files.update(loaded(log))


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
    from _shared import loaded_sources

    return {
        "held_out_ids": ids,
        "excluded": len(exclude),
        "reports": reports,
        "kl_unrounded": True,
        "sources": loaded_sources(),
    }


def measure_pair(
    work: Path, base: Path, base_commit: str, new_commit: str, name: str, recipe: str, files: set[str]
) -> dict:
    """One pair's row, without its provenance; the files the new side loaded go into ``files``."""
    model, calib = prepare_model(work, name, files)
    row: dict = {"model": name, "recipe": recipe, "base_commit": base_commit, "new_commit": new_commit}
    checkpoints = {}
    new_out, row["new_quantize_s"] = quantize(
        ROOT, "new", new_commit, work, model, calib, recipe, files, recipe_argument(base, recipe)
    )
    checkpoints["new"] = new_out
    if recipe in base_recipes(base):
        base_out, row["base_quantize_s"] = quantize(
            base, "base", base_commit, work, model, calib, recipe, files, recipe_argument(base, recipe)
        )
        checkpoints["base"] = base_out
    else:
        row["base_missing"] = f"{BASE} ({base_commit}) has no recipe {recipe}"
    started = time.perf_counter()
    drift = run_child(SCRIPT, "drift", str(model), str(calib), *(str(p) for p in checkpoints.values()))
    row["drift_s"] = round(time.perf_counter() - started, 1)
    files.update(drift["sources"])
    row["held_out_ids"] = drift["held_out_ids"]
    row["kl_unrounded"] = drift.get("kl_unrounded", False)
    row["checkpoints"] = {tag: str(path) for tag, path in checkpoints.items()}
    for tag, path in checkpoints.items():
        report = drift["reports"][str(path)]
        row[f"{tag}_samples"] = report["samples"]
        row[f"{tag}_calibrated_on"] = report["calibrated_on"]
        meta = json.loads((path / "quantkit.json").read_text(encoding="utf-8"))
        row[f"{tag}_pipeline"] = meta.get("pipeline") or (meta.get("calibration") or {}).get("pipeline")
    if "base" in checkpoints:
        row["weights_differ"] = weights_differ(checkpoints["base"], checkpoints["new"])
    return row


def measure_noise(
    work: Path, base_commit: str, new_commit: str, name: str, recipe: str, files: set[str]
) -> dict:
    """The seed spread: this checkout quantizes the pair again on another stratified subsample
    (``--seed 1``); drift of the old, the new and the reseeded checkpoint on the same held-out rows
    (none calibrated any of the three). Needs the pair measured first, in this ``work`` (its
    checkpoints)."""
    model, calib = prepare_model(work, name, files)
    base_out = checkpoint_dir(work, "base", base_commit, name, recipe)
    new_out = checkpoint_dir(work, "new", new_commit, name, recipe)
    seeded = checkpoint_dir(work, "new-seed1", new_commit, name, recipe)
    log = work / "logs" / f"quantize-new-seed1-{name}-{recipe}.log"
    if not built(seeded / "quantkit.json", log):
        text = base_recipe_text(recipe)  # the recipe the pair's new checkpoint was made with
        recipe_file = work / "recipes" / f"{recipe}.yaml"
        if text is not None:
            recipe_file.parent.mkdir(parents=True, exist_ok=True)
            recipe_file.write_text(text, encoding="utf-8")
        args = ["quantize", str(model), "--recipe", str(recipe_file) if text is not None else recipe]
        args += ["--calib", str(calib)]
        args += ["--num-samples", str(NUM_SAMPLES), "--seed", "1", "-o", str(seeded), "--force"]
        cli(ROOT, *args, log=log)
    files.update(loaded(log))
    drift = run_child(SCRIPT, "drift", str(model), str(calib), str(base_out), str(new_out), str(seeded))
    files.update(drift["sources"])
    reports = drift["reports"]
    return {
        "model": name,
        "recipe": recipe,
        "seed_spread": True,
        "base_commit": base_commit,
        "new_commit": new_commit,
        "held_out_ids": drift["held_out_ids"],
        "kl_unrounded": drift.get("kl_unrounded", False),
        **{
            f"{tag}_samples": reports[str(path)]["samples"]
            for tag, path in (("base", base_out), ("new", new_out), ("seed1", seeded))
        },
    }


def render_noise(noise: list[dict], *, current: bool = True) -> list[str]:
    lines = []
    for row in noise:
        base, new, seeded = (groups(row[f"{tag}_samples"]) for tag in ("base", "new", "seed1"))
        lines += [
            "",
            ("" if current else f"{row_mark(made_by(row), False).capitalize()}: ")
            + f"Seed spread, {row['model']} x {row['recipe']} ({row['base_commit']} → {row['new_commit']}): "
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


# ---------------------------------------------------------------------- keys

# The functions whose code makes a pair's figures (rendering is left out on purpose).
MEASURING = (
    as_cli,
    cli,
    base_recipes,
    base_recipe_text,
    recipe_argument,
    takes_media,
    loaded,
    built,
    checkpoint_dir,
    sources_of,
    text_pool,
    prepare_model,
    quantize,
    child_drift,
    measure_pair,
    measure_noise,
    weights_differ,
)


def settings() -> dict:
    """What every pair's key shares beside the code: the sizes and seeds of the measurement."""
    return {
        "calib_size": CALIB_SIZE,
        "num_samples": NUM_SAMPLES,
        "held_out": HELD_OUT,
        "text_per_task": TEXT_PER_TASK,
        "greedy_tokens": GREEDY_TOKENS,
        "quantize_seed": 0,
        "held_out_seed": 1,
    }


def code_state() -> dict:
    """bench/mixed_precision.py's code state over this script's measuring code: its hash, the
    library versions, the commit."""
    import mixed_precision as mp

    return mp.code_state(MEASURING, values={})  # its sizes and seeds are in settings(), BASE in pair_spec


def pair_name(model: str, recipe: str, noise: bool = False) -> str:
    return f"{'noise/' if noise else ''}{model}/{recipe}"


def pair_spec(model: str, recipe: str, base: str) -> dict:
    """What one pair measures beyond the shared code: the zoo model, the recipe both sides
    quantized with as this checkout resolves it (BASE's file where BASE has the recipe, else the
    built-in one), the base commit."""
    import tempfile

    from quantkit.recipes.registry import load_recipe_file, resolve_recipe

    text = base_recipe_text(recipe)
    if text is None:
        return {"model": model, "recipe": resolve_recipe(recipe).model_dump(mode="json"), "base": base}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{recipe}.yaml"
        path.write_text(text, encoding="utf-8")
        resolved = load_recipe_file(path).model_dump(mode="json")
    return {"model": model, "recipe": resolved, "recipe_file": f"{BASE}:recipes/{recipe}.yaml", "base": base}


def pair_key(name: str, spec: dict, state: dict, files: list[str] | None) -> dict:
    """bench/mixed_precision.py's provenance: the key, commit, source hash, versions, files."""
    import mixed_precision as mp

    return mp.provenance(name, spec, settings(), state, files)


def expected(row: dict, state: dict, base: str) -> dict:
    """The provenance the code as it is now (and BASE, ``base``) gives ``row``'s pair, over the
    files its stored row was made with."""
    files = (row.get("provenance") or {}).get("files")
    name = pair_name(row["model"], row["recipe"], noise=bool(row.get("seed_spread")))
    return pair_key(name, pair_spec(row["model"], row["recipe"], base), state, files)


def current(row: dict | None, state: dict, base: str) -> bool:
    """Whether a stored pair still stands for the code it is checked against."""
    made = (row or {}).get("provenance") or {}
    return bool(made.get("key")) and made["key"] == expected(row, state, base)["key"]


def made_by(row: dict) -> str:
    return ((row.get("provenance") or {}).get("commit")) or "unknown"


def load(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return {"pairs": data.get("pairs", {}), "noise": data.get("noise", {})}


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


def provenance(rows: list[dict], stale: list[dict], state: dict | None) -> str:
    """Which commits made the shown pairs, what their key covers, and what is left stale."""
    commits = sorted({made_by(row) for row in rows})
    if rows:
        text = (
            f"The {len(rows)} pair{'s' * (len(rows) > 1)} shown {'were' if len(rows) > 1 else 'was'} measured at "
            f"commit{'s' * (len(commits) > 1)} {', '.join(commits)} (each row names its own) and still "
            f"stand{'s' * (len(rows) == 1)} for the code as it is"
        )
    else:
        text = "No pair stands for the code as it is"
    text += (
        ": a pair's key (bench/mixed_precision.py's provenance, stored in bench/pipeline_drift.json) covers "
        "the quantkit modules the new side's processes imported and the recipe files, the model and "
        f"the recipe, {BASE}, the settings, this script's measuring code and the library versions"
    )
    if state:
        text += (
            " (" + ", ".join(f"{name} {version}" for name, version in sorted(state["versions"].items())) + ")"
        )
    text += "; a stored pair whose key no longer matches keeps its last figures, in a table marked stale"
    if stale:
        text += f" ({len(stale)} below)"
    return text + "."


TABLE_HEAD = [
    "| model | recipe | modality (samples) | KL old | KL new | top-1 old | top-1 new | verdict "
    "| pipelines, commits (old → new) |",
    "|---|---|---|---|---|---|---|---|---|",
]


def pair_table(rows: list[dict], *, current: bool) -> list[str]:
    """The table lines of ``rows`` (pairs with figures), each group's last cell naming the
    pipelines and the commits, the new side's marked current or stale (_shared.row_mark)."""
    lines = []
    for row in rows:
        new = groups(row["new_samples"])
        base = groups(row["base_samples"]) if "base_samples" in row else {}
        commits = (
            f"{row.get('base_pipeline') or '-'} {row['base_commit']} → {row['new_pipeline']} "
            f"{row_mark(made_by(row), current)}"
        )
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
    return lines


def refusals(rows: list[dict], *, current: bool) -> list[str]:
    lines = []
    for row in rows:
        side = row.get("refused_by")
        made = row_mark(made_by(row), current)
        commit = row["base_commit"] if side == "base" else made
        who = f"the {side} code, {commit}" if side else f"{made}; which side: not recorded"
        lines += ["", f"Refused by `quantize` ({who}): {row['model']} x {row['recipe']}: {row['refused']}"]
    return lines


def render(
    rows: list[dict],
    noise: list[dict] | None = None,
    stale: list[dict] | None = None,
    state: dict | None = None,
) -> str:
    """The section from the pairs that stand for the code (``rows``, ``noise``); ``stale``: stored
    pairs made by other code, named without figures; ``state``: the code state they were checked
    against (its library versions are named)."""
    stale = stale or []
    rounded = [row for row in [*rows, *(noise or [])] if "refused" not in row and not row.get("kl_unrounded")]
    lines = [
        f"Rendered by `bench/pipeline_drift.py` from its measurements. Each zoo model (seed 0) x each "
        f"recipe that reads calibration data, quantized on the same calibration set (demo pool, "
        f"`calibrate --model --size {CALIB_SIZE}`, `quantize --num-samples {NUM_SAMPLES} --seed 0`) "
        f'by the code before "towers once, decoder many" ({BASE}, the whole model through the '
        "pipeline its adapter named) and by the new code (the decoder alone on its captured inputs), on "
        f"CPU, both with {BASE}'s recipe file where it has the recipe (a recipe changed since, such as "
        f"w4a16's imatrix observer, would otherwise count as drift); the pipelines each used are in the table (quantkit.json). {provenance(rows, stale, state)} Drift by the new side's `verify` code (`measure_drift`) on the "
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
        *TABLE_HEAD,
    ]
    refused = [row for row in rows if "refused" in row]
    rows = [row for row in rows if "refused" not in row]
    lines += pair_table(rows, current=True)
    verdicts = [line.split(" | ")[7].split(" (")[0] for line in lines[4:]]
    unjudged, unpaired = verdicts.count("n/a"), verdicts.count("no baseline")
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
        f"{len(rows)} pairs, {len(verdicts)} groups, {unjudged} n/a (too few samples), {unpaired} without a "
        f'baseline, {len(verdicts) - unjudged - unpaired} judged (the "all" groups overlap the others): '
        + ", ".join(f"{verdicts.count(v)} {v.strip('*')}" for v in ("**worse**", "mixed", "same", "better"))
        + (f"; worse: {'; '.join(worse)}." if worse else "; none worse."),
    ]
    lines += refusals(refused, current=True)
    lines += render_noise(noise or [])
    if stale:
        stale_pairs = [row for row in stale if not row.get("seed_spread") and "refused" not in row]
        lines += [
            "",
            f"Stale ({len(stale)}: measured by other code, or before pairs were keyed; not re-measured at "
            "this code): their last figures, each marked with the commit that measured it, left out of the "
            "counts above: "
            + "; ".join(
                f"{'seed spread, ' if row.get('seed_spread') else ''}{row['model']} x {row['recipe']}, "
                f"{row_mark(made_by(row), False)}"
                for row in stale
            )
            + ".",
        ]
        if stale_pairs:
            lines += ["", *TABLE_HEAD, *pair_table(stale_pairs, current=False)]
        lines += refusals([row for row in stale if "refused" in row], current=False)
        lines += render_noise([row for row in stale if row.get("seed_spread")], current=False)
    measured = {(row["model"], row["recipe"]) for row in [*rows, *refused]}
    left = [f"{m} x {r}" for r in data_recipes() for m in zoo_names() if (m, r) not in measured]
    if left:
        lines.append("")
        lines.append(
            f"Not measured at this code ({len(left)} pairs, stale ones included): {', '.join(left)}."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1 and argv[0] == "--as-cli":  # this checkout's CLI, recording its files
        as_cli(Path(argv[1]), argv[2:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantkit-bench-pipeline-drift"))
    parser.add_argument("--models", help="comma-separated zoo names (default: every zoo model)")
    parser.add_argument("--recipes", help="comma-separated recipes (default: every data-driven recipe)")
    parser.add_argument("--pairs", type=Path, default=PAIRS, help="the stored pairs (JSON)")
    parser.add_argument("--render-only", action="store_true", help="render the stored pairs, measure nothing")
    parser.add_argument("--noise", help="MODEL/RECIPE of a measured pair: also measure the seed spread there")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs="+")
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        print(json.dumps({"drift": child_drift}[kind](*rest)))
        return
    data = load(args.pairs)
    state, base_hash = code_state(), base_commit()
    if not args.render_only:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        args.work.mkdir(parents=True, exist_ok=True)
        base, base_hash = base_worktree(args.work)
        names = args.models.split(",") if args.models else zoo_names()
        recipes = args.recipes.split(",") if args.recipes else data_recipes()
        # Pairs with a baseline first (the comparison asked for), then this branch's new recipes.
        have = base_recipes(base)
        pairs = [(m, r) for r in recipes if r in have for m in names]
        pairs += [(m, r) for r in recipes if r not in have for m in names]
        for name, recipe in pairs:
            key = pair_name(name, recipe)
            if current(data["pairs"].get(key), state, base_hash):
                print(
                    f"{name} x {recipe}: stored (made by {made_by(data['pairs'][key])}, same key)", flush=True
                )
                continue
            started, files = time.perf_counter(), set()
            try:
                row = measure_pair(args.work, base, base_hash, state["commit"], name, recipe, files)
            except RuntimeError as error:
                print(f"{name} x {recipe}: FAILED\n{error}", flush=True)
                refusal = next((line for line in str(error).splitlines() if line.startswith("error: ")), None)
                if not (
                    isinstance(error, CliFailed)
                    and error.command == "quantize"
                    and error.returncode == 2
                    and refusal
                ):
                    continue
                # quantize refused the pair (bad input, exit 2): recorded, not retried at this key
                side = "new" if error.code == ROOT else "base"
                row = {
                    "model": name,
                    "recipe": recipe,
                    "base_commit": base_hash,
                    "new_commit": state["commit"],
                }
                row.update(refused=refusal.removeprefix("error: "), refused_by=side)
            row["seconds"] = round(time.perf_counter() - started, 1)
            row["provenance"] = pair_key(key, pair_spec(name, recipe, base_hash), state, sorted(files))
            data["pairs"][key] = row
            write_json(args.pairs, data, sort_keys=True)
            print(f"{name} x {recipe}: {row['seconds']:.0f} s", flush=True)
    if args.noise and not args.render_only:
        name, recipe = args.noise.split("/")
        key = pair_name(name, recipe, noise=True)
        if not current(data["noise"].get(key), state, base_hash):
            pair = data["pairs"].get(pair_name(name, recipe))
            if not current(pair, state, base_hash) or "refused" in pair:
                print(
                    f"--noise {args.noise}: no pair measured at this code to reseed; run without --noise first",
                    file=sys.stderr,
                )
                raise SystemExit(2)
            files = set()
            # the pair's checkpoints are where the commit that measured it wrote them (a later commit
            # with the same key, such as one that only touched docs, reuses the pair, not re-measures it)
            row = measure_noise(args.work, base_hash, pair["new_commit"], name, recipe, files)
            row["provenance"] = pair_key(key, pair_spec(name, recipe, base_hash), state, sorted(files))
            data["noise"][key] = row
            write_json(args.pairs, data, sort_keys=True)
    stored = [*data["pairs"].values(), *data["noise"].values()]
    stale = [row for row in stored if not current(row, state, base_hash)]
    rows = sorted(
        (row for row in data["pairs"].values() if current(row, state, base_hash)),
        key=lambda r: (r["recipe"], r["model"]),
    )
    noise = [row for row in data["noise"].values() if current(row, state, base_hash)]
    replace_section(args.results, HEADING, render(rows, noise, stale, state))
    print(f"wrote {HEADING!r} ({len(rows)} current pairs, {len(stale)} stale) into {args.results}")


if __name__ == "__main__":
    main()
