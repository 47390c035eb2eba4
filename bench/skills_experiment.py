"""The seed article's claim, measured on tiny-omni-skills: does a stratified, sensitivity-weighted
calibration set (``quantkit calibrate``) keep per-task accuracy better than a generic one?

Arms, each of ``--sizes`` samples drawn from the same pool (the skills pool, ``demo-pool --skills``):
stratified (``quantkit calibrate``, seed s), uniform random (seed s), text only (the arithmetic
records), image captions only (the caption records: what llm-compressor's examples calibrate on).
The pool holds only 12 distinct captions (4 colours x 3 shapes), so the captions arm repeats
records to reach the size. Each recipe x size x seed x arm is quantized, then scored with
``quantkit.eval.skills.score_model`` on the same held-out items as the original (paired).

    python bench/skills_experiment.py --model DIR --work /tmp/skills-exp \
        --recipes w4a16,w8a8-sq-gptq,fp8 --sizes 32,128 --seeds 0,1 --items 24 \
        --write-results bench/RESULTS.md

Every finished run is a row of ``--results`` (default bench/skills_experiment.json), written after
each run: its scores, seconds, the held-out item count, the model's identity (a hash of the model
folder's weights, tokenizer, config and processor config files and skills.json, with the zoo
record's key when there is one) and its provenance (a key over the quantkit modules the run
imported, the recipes, this script's measuring code and the constants it reads, the library
versions (bench/_shared.py's LIBRARIES), the recipe, arm, size and settings; the git commit for
display: the machinery of bench/mixed_precision.py). A stored row is reused only while its key matches; a row
made with another model, other code or other settings is measured again. ``--work`` holds only
scratch (the pool, calibration sets and checkpoints), rebuilt by each invocation that measures.

``--render-only`` writes the RESULTS.md section from the stored rows without measuring; rows whose
key no longer matches the code and model as they are are marked stale.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.append(str(_path))

ARMS = ("stratified", "uniform", "text-only", "captions-only")
SECTION = "## Calibration data vs per-task accuracy (tiny-omni-skills)"
RESULTS = ROOT / "bench" / "skills_experiment.json"
ZOO_RECORD = ROOT / "quantkit" / "zoo" / "weights" / "tiny-omni-skills.json"
POOL_SEED = 7
# What, beside the weights, decides what a model answers: its tokenizer and chat template, its
# configs (architecture, generation defaults, how media become inputs) and, for tiny-omni-skills,
# the skills manifest (quantkit/zoo/skills.py: the tasks it was trained on). Each is hashed when
# the folder holds it and recorded as missing when not, so adding or removing one changes the key.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
CONFIG_FILES = ("config.json", "generation_config.json", "processor_config.json", "preprocessor_config.json")
# Any other processor config a folder holds (video_preprocessor_config.json, ...), found by name.
PROCESSOR_CONFIG_GLOB = "*processor_config.json"


# ---------------------------------------------------------------------- identity and keys


def identity_files(model: Path) -> tuple[list[str], list[str]]:
    """(the files of ``model`` its identity hashes, the named optional ones it lacks)."""
    from quantkit.zoo.skills import SKILLS_FILE

    named = [*TOKENIZER_FILES, *CONFIG_FILES, SKILLS_FILE]
    found = sorted({p.name for p in model.glob(PROCESSOR_CONFIG_GLOB) if p.is_file()} - set(named))
    weights = sorted(p.name for p in model.glob("model*.safetensors"))
    present = [n for n in named if (model / n).is_file()]
    return weights + present + found, [n for n in named if n not in present]


def model_identity(model: Path) -> dict:
    """A hash over the model folder's ``model*.safetensors``, tokenizer, config and processor
    config files and skills.json (names and bytes; each named file it lacks counted as missing),
    with the key of quantkit/zoo/weights/tiny-omni-skills.json when that record is there."""
    from quantkit.fsutil import sha256_file

    model = Path(model)
    names, missing = identity_files(model)
    if not any(n.endswith(".safetensors") for n in names):
        raise SystemExit(f"{model}: no model*.safetensors to identify the model by")
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0" + sha256_file(model / name).encode() + b"\0")
    for name in missing:
        digest.update(name.encode() + b"\0<missing>\0")
    record = json.loads(ZOO_RECORD.read_text(encoding="utf-8")).get("key") if ZOO_RECORD.is_file() else None
    return {"hash": digest.hexdigest()[:16], "record": record, "files": names, "missing": missing}


def code_state() -> dict:
    """What every row's key shares (bench/mixed_precision.py's code_state): this script's
    measuring code and the values it reads, the libraries, the commit."""
    import mixed_precision as mp

    return mp.code_state(MEASURING, mp.values_of(sys.modules[__name__], MEASURED_VALUES))


def run_name(recipe: str, arm: str, size: int, seed: int) -> str:
    return f"{recipe}/{arm}/{size}/{seed}"


def original_name(identity: dict, items: int) -> str:
    """The original's scores are keyed by the model and the held-out item count."""
    return f"{identity['hash']}/{items}"


def run_spec(recipe: str, arm: str, size: int, identity: dict) -> dict:
    from quantkit.recipes.registry import resolve_recipe

    return {
        "recipe": resolve_recipe(recipe).model_dump(mode="json"),
        "arm": arm,
        "size": size,
        "model": {k: identity[k] for k in ("hash", "record")},
    }


def row_key(name: str, spec: dict, settings: dict, state: dict, files: list[str] | None) -> dict:
    """bench/mixed_precision.py's provenance: the key, commit, source hash and versions."""
    from mixed_precision import provenance

    return provenance(name, spec, settings, state, files)


def expected_run(row: dict, identity: dict, state: dict, settings: dict | None = None) -> dict:
    """The provenance the code and model as they are now give ``row``'s run (over the files the
    stored row was made with), with ``settings`` (default: the row's own)."""
    name = run_name(row["recipe"], row["arm"], row["size"], row["seed"])
    spec = run_spec(row["recipe"], row["arm"], row["size"], identity)
    files = (row.get("provenance") or {}).get("files")
    return row_key(name, spec, settings if settings is not None else row["settings"], state, files)


def expected_original(row: dict, identity: dict, state: dict) -> dict:
    files = (row.get("provenance") or {}).get("files")
    spec = {"model": {k: identity[k] for k in ("hash", "record")}}
    return row_key("original", spec, {"items": row["items"]}, state, files)


def original_row(model: Path, identity: dict, state: dict, items: int) -> dict:
    """Measure the original's scores: its stored row, keyed as :func:`expected_original` checks
    it (``state``: the code state of the bench that stores it)."""
    from _shared import loaded_sources

    clock = time.monotonic()
    scores = original_scores(model, items=items)
    spec = {"model": {k: identity[k] for k in ("hash", "record")}}
    return {
        "items": items,
        "model": identity,
        "seconds": round(time.monotonic() - clock, 1),
        "scores": scores,
        "provenance": row_key("original", spec, {"items": items}, state, loaded_sources()),
    }


def current(row: dict | None, expected: dict | None) -> bool:
    """Whether a stored row still stands for the code, model and settings it is checked against."""
    return bool(row and expected and (row.get("provenance") or {}).get("key") == expected["key"])


# ---------------------------------------------------------------------- measuring


def pool_records(pool: Path) -> list[dict]:
    return [json.loads(line) for line in pool.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_pool(work: Path, per_task: int) -> Path:
    """The skills pool, written anew (its generators are quantkit code a stored copy could predate)."""
    from quantkit.synthetic.skills_tasks import write_skills_pool

    write_skills_pool(work / "pool", per_task=per_task, seed=POOL_SEED, force=True)
    return work / "pool" / "pool.jsonl"


def arm_samples(arm: str, pool: Path, work: Path, size: int, seed: int, model: Path, built: set):
    """The ``size`` calibration samples of ``arm`` and a label saying how they were drawn. The
    stratified set of a (size, seed) is built once per invocation (``built``) and shared by the
    recipes."""
    from quantkit.calibset import CalibrateOptions, build_calibration_set
    from quantkit.models.inputs import Sample
    from quantkit.models.samples import samples_from_set

    if arm == "stratified":
        calib = work / f"calib-{size}-{seed}"
        if (size, seed) not in built:
            options = CalibrateOptions(
                size=size, seed=seed, model=model, allow_missing_tasks=True, force=True
            )
            build_calibration_set([pool], calib, options)
            built.add((size, seed))
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


def measure_run(
    model: Path, pool: Path, work: Path, recipe: str, arm: str, size: int, seed: int, items: int, built: set
) -> dict:
    """Quantize one arm's checkpoint and score it on the held-out items (the original's)."""
    from quantkit.eval.skills import score_model
    from quantkit.quantize import quantize
    from quantkit.recipes.registry import resolve_recipe
    from quantkit.synthetic.skills_tasks import TASKS

    samples, label = arm_samples(arm, pool, work, size, seed, model, built)
    checkpoint = work / f"ckpt-{recipe}-{arm}-{size}-{seed}"
    started = time.monotonic()
    quantize(model, checkpoint, resolve_recipe(recipe), samples, force=True, progress=False)
    quantized = time.monotonic()
    scores = score_model(checkpoint, [t.name for t in TASKS], items=items)
    return {
        "calibration": label,
        "quantize_s": round(quantized - started, 1),
        "score_s": round(time.monotonic() - quantized, 1),
        "items": items,
        "scores": {t.task: t.score for t in scores.tasks},
    }


def original_scores(model: Path, work: Path | None = None, items: int = 24) -> dict:
    """The original's per-task scores on the held-out items every checkpoint is scored on. Measured
    on each call (``work`` is not used: callers keep their own keyed records)."""
    from quantkit.eval.skills import score_model
    from quantkit.synthetic.skills_tasks import TASKS

    return {t.task: t.score for t in score_model(model, [t.name for t in TASKS], items=items).tasks}


MEASURING = (pool_records, write_pool, arm_samples, measure_run, original_scores, original_row)
# The module-level values those functions read, by name (inspect.getsource sees only their bodies).
MEASURED_VALUES = ("POOL_SEED",)


# ---------------------------------------------------------------------- rendering


# Scores are multiples of 1/items: figures closer than this are equal (float rounding decides no
# comparison).
TOLERANCE = 1e-9


def cell(values: list[float]) -> tuple[float, float]:
    """Mean and spread (max - min) over seeds."""
    return statistics.mean(values), max(values) - min(values)


def original_losses(rows: list[dict], original: dict | None, tasks: list[str]) -> list[tuple[str, float, float, float]] | None:
    """Per task where ``rows``' mean lies below the original's score by more than their seed spread
    (beyond TOLERANCE): (task, mean, spread, original). None without an original or two seeds."""
    if original is None or len({r["seed"] for r in rows}) < 2:
        return None
    out = []
    for task in tasks:
        mean, spread = cell([r["scores"][task] for r in rows])
        if original["scores"][task] - mean > spread + TOLERANCE:
            out.append((task, mean, spread, original["scores"][task]))
    return out


def arm_differences(stratified: list[dict], other: list[dict], tasks: list[str]) -> tuple[list, int] | None:
    """Per task where ``other``'s mean differs from stratified's by more than the larger of the two
    seed spreads (beyond TOLERANCE): (task, other mean - stratified mean, stratified mean, other mean); with the
    count of tasks that do not differ. None when either arm has fewer than two seeds (no spread)."""
    if len(stratified) < 2 or len(other) < 2:
        return None
    found = []
    for task in tasks:
        (mine, mine_spread), (theirs, their_spread) = (
            cell([r["scores"][task] for r in rows]) for rows in (stratified, other)
        )
        if abs(theirs - mine) > max(mine_spread, their_spread) + TOLERANCE:
            found.append((task, theirs - mine, mine, theirs))
    return found, len(tasks) - len(found)


def versus(task: str, better: str, worse: str, high: float, low: float, original: dict | None) -> str:
    """One difference between two arms in words, with the original's score; a better arm above the
    original is said to be so (item noise: quantization does not improve on the model)."""
    if original is None:
        return f"{task}: {better} better by {high - low:.3f} ({high:.3f} vs {low:.3f})"
    base = original["scores"][task]
    said = f"{task}: {better} {high:.3f} vs {worse} {low:.3f}, original {base:.3f}"
    if high > base + TOLERANCE:
        return f"{said} ({better} above the original: item noise, not {better} keeping more)"
    return f"{said} ({better} better by {high - low:.3f})"


def summary(rows: list[dict], tasks: list[str], original: dict | None = None) -> list[str]:
    """Plain words for one table: each arm against the original (when given) and against
    stratified, task by task."""
    by_arm = {a: [r for r in rows if r["arm"] == a] for a in ARMS}
    lines = []
    for arm in [a for a in ARMS if by_arm[a]] if original is not None else ():
        lost = original_losses(by_arm[arm], original, tasks)
        if lost is None:
            lines.append(f"- {arm} vs the original: fewer than two seeds, so no spread to judge a loss by")
            continue
        said = "; ".join(f"{t} {m:.3f} ± {s:.3f} vs {o:.3f}" for t, m, s, o in lost)
        lines.append(f"- {arm} vs the original: " + (f"lost beyond its seed spread on {said}" if lost else "no loss beyond its seed spread on any task"))
    if not by_arm["stratified"]:
        return [*lines, "- the stratified arm was not measured here: nothing to compare against"]
    for arm in [a for a in ARMS if a != "stratified" and by_arm[a]]:
        found = arm_differences(by_arm["stratified"], by_arm[arm], tasks)
        if found is None:
            lines.append(
                f"- {arm} vs stratified: fewer than two seeds in an arm, so no spread to judge a difference by"
            )
            continue
        differing, same = found
        if not differing:
            lines.append(f"- {arm} vs stratified: no difference beyond the seed spread on any task")
            continue
        parts = [
            versus(task, "stratified", arm, mine, theirs, original)
            if diff < 0
            else versus(task, arm, "stratified", theirs, mine, original)
            for task, diff, mine, theirs in differing
        ]
        rest = (
            f"; no difference beyond the seed spread on the other {same} task{'s' * (same != 1)}"
            if same
            else ""
        )
        lines.append(f"- {arm} vs stratified: " + "; ".join(parts) + rest)
    return lines


UNCHECKED = object()


def checked(expected: dict | None, name: str):
    """The expected provenance of ``name``, or UNCHECKED when the renderer was given none."""
    return UNCHECKED if expected is None else expected.get(name)


def made_by(row: dict, expected) -> str:
    """The commit that made a row, marked current or stale (_shared.row_mark) when checked."""
    from _shared import row_mark

    commit = (row.get("provenance") or {}).get("commit") or "unknown"
    if expected is UNCHECKED:
        return commit
    return row_mark(commit, current(row, expected))


def render(data: dict, expected_runs: dict | None = None, expected_originals: dict | None = None) -> str:
    """The RESULTS.md section body from the stored rows only: one table per recipe x size (x model
    x held-out items, where the file holds more than one), mean ± spread over seeds with n, the
    commits that made the rows (stale ones marked when ``expected_*`` are given: name -> key) and
    the plain-words comparison with the stratified arm."""
    from quantkit.synthetic.skills_tasks import TASKS

    runs = data.get("runs") or {}
    originals = data.get("original") or {}
    lines = [
        "Rendered by bench/skills_experiment.py from bench/skills_experiment.json. Arms, each the same number "
        "of calibration samples from the skills pool: stratified (`quantkit calibrate`, sensitivity "
        "weighted, seed s), uniform random (seed s), text only (the arithmetic records), image captions "
        "only (what llm-compressor's examples calibrate on). Every checkpoint and the original are scored "
        "on the same held-out items. Score: mean ± spread (max - min) over seeds, n seeds. A difference "
        "counts when two arms' means differ by more than the larger of their spreads; an arm loses "
        "against the original where its mean lies below the original's score by more than its spread "
        f"(both beyond a tolerance of {TOLERANCE:g}: scores are multiples of 1/items). A better arm "
        "whose mean is above the original's is marked so: quantization does not improve on the model, "
        "so that difference is item noise.",
        "",
    ]
    tallies = {
        stale: {"cells": dict.fromkeys(ARMS, 0), "lost": dict.fromkeys(ARMS, 0), "compared": 0, "found": 0, "above": 0}
        for stale in (False, True)
    }
    # Rows (and original scores) other code, another model or other settings made keep their
    # figures, in tables of their own marked stale with the commits that measured them; the
    # tallies keep the two apart.
    stale = set() if expected_runs is None else {n for n, r in runs.items() if not current(r, expected_runs.get(n))}
    if stale:
        lines += [
            f"{len(stale)} stored row(s) are stale (another model, other code or other settings than now): their "
            "tables are marked stale and show the figures measured at the commits they name. `make bench-skills` "
            "measures them again.",
            "",
        ]
    stale_originals = set()
    if expected_originals is not None:
        stale_originals = {k for k, v in originals.items() if not current(v, expected_originals.get(k))}
    if not runs:
        return "\n".join([*lines, "No rows yet: run `python bench/skills_experiment.py --model DIR`."])
    groups: dict[tuple, list[tuple[str, dict]]] = {}
    for name, row in runs.items():
        groups.setdefault((row["recipe"], row["size"], row["model"]["hash"], row["items"], name in stale), []).append(
            (name, row)
        )
    models = {key[2] for key in groups}
    recipes = list(dict.fromkeys(key[0] for key in groups))
    for recipe, size, model, items, is_stale in sorted(
        groups, key=lambda k: (k[4], recipes.index(k[0]), k[1], k[2], k[3])
    ):
        named = groups[(recipe, size, model, items, is_stale)]
        rows = [row for _, row in named]
        arms = [a for a in ARMS if any(r["arm"] == a for r in rows)]
        seeds = sorted({r["seed"] for r in rows})
        # a current table compares with the current original only; a stale one with the stored one
        original = originals.get(f"{model}/{items}")
        if original is not None and not is_stale and f"{model}/{items}" in stale_originals:
            original = None
        marks = [made_by(row, checked(expected_runs, name)) for name, row in named]
        if original is not None:
            marks.append(made_by(original, checked(expected_originals, f"{model}/{items}")))
        record = rows[0]["model"].get("record")
        lines += [
            f"### {recipe}, {size} calibration samples"
            + (f" (model {model})" if len(models) > 1 else "")
            + (", stale (measured at " + ", ".join(sorted({(r.get('provenance') or {}).get('commit') or 'unknown' for r in rows})) + ")" if is_stale else ""),
            "",
            f"Seeds {', '.join(map(str, seeds))}; {items} held-out items a task; model {model}"
            + (f" (zoo record {record[:12]})" if record else "")
            + f"; made by {', '.join(sorted(set(marks)))}.",
            "",
            "| group | task | original | " + " | ".join(arms) + " |",
            "|---|---|---|" + "---|" * len(arms),
        ]
        for task in TASKS:
            cells = []
            for arm in arms:
                mean, spread = cell([r["scores"][task.name] for r in rows if r["arm"] == arm])
                cells.append(f"{mean:.3f} ± {spread:.3f} (n={sum(r['arm'] == arm for r in rows)})")
            first = f"{original['scores'][task.name]:.3f}" if original else "not measured"
            lines.append(f"| {task.group} | {task.name} | {first} | " + " | ".join(cells) + " |")
        seconds = []
        for arm in arms:
            mean, spread = cell([r["quantize_s"] for r in rows if r["arm"] == arm])
            seconds.append(f"{mean:.0f} ± {spread:.0f}")
        lines += ["| | quantize seconds | | " + " | ".join(seconds) + " |", ""]
        lines += [
            f"In plain words ({recipe}, {size} samples{', stale figures' if is_stale else ''}):",
            "",
            *summary(rows, [t.name for t in TASKS], original),
            "",
        ]
        count(tallies[is_stale], rows, [t.name for t in TASKS], original)
    fresh = sum(not key[4] for key in groups)
    if fresh:
        lines.append(overall(tallies[False], fresh))
    if len(groups) > fresh:
        lines += [""] * bool(fresh) + [overall(tallies[True], len(groups) - fresh, stale=True)]
    if data.get("history"):
        lines += ["", f"Hand-written note kept in the results file (`history`; not a measurement): {data['history']}"]
    return "\n".join(lines)


def count(tally: dict, rows: list[dict], tasks: list[str], original: dict | None) -> None:
    """Add one table's losses against the original and arm-vs-stratified differences to ``tally``."""
    by_arm = {a: [r for r in rows if r["arm"] == a] for a in ARMS}
    for arm, mine in by_arm.items():
        lost = original_losses(mine, original, tasks) if mine else None
        if lost is not None:
            tally["cells"][arm] += len(tasks)
            tally["lost"][arm] += len(lost)
    for arm in [a for a in ARMS if a != "stratified" and by_arm[a]]:
        found = arm_differences(by_arm["stratified"], by_arm[arm], tasks) if by_arm["stratified"] else None
        if found is None:
            continue
        tally["compared"] += len(tasks)
        tally["found"] += len(found[0])
        if original is not None:
            tally["above"] += sum(max(a, b) > original["scores"][t] + TOLERANCE for t, _, a, b in found[0])


def overall(tally: dict, tables: int, *, stale: bool = False) -> str:
    """The paragraph over every current table (or, ``stale``, every stale one): losses against the
    original, differences between arms."""
    judged = [a for a in ARMS if tally["cells"][a]]
    losses = "; ".join(f"{a} {tally['lost'][a]} of {tally['cells'][a]}" for a in judged)
    return (
        (f"Over the {tables} stale tables (figures measured at earlier commits)" if stale else f"Over all {tables} tables")
        + " (recipe x size): (recipe, size, task) cells where an arm lost against "
        "the original beyond its seed spread: "
        + (losses if judged else "none judged (no original, or fewer than two seeds)")
        + f". Differences from stratified beyond the seed spread: {tally['found']} of {tally['compared']} "
        "(arm, recipe, size, task) comparisons"
        + (f", {tally['above']} of them with the better arm above the original (item noise)" if tally["found"] else "")
        + "."
    )


# ---------------------------------------------------------------------- main


def load(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data.setdefault("original", {})
    data.setdefault("runs", {})
    return data


def save(path: Path, data: dict) -> None:
    from quantkit.fsutil import write_file_atomic

    write_file_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def expected_keys(data: dict, identity: dict, state: dict) -> tuple[dict, dict]:
    """name -> the provenance each stored row would have if made now with this model (its own
    settings): what the renderer's stale marks compare against."""
    runs = {name: expected_run(row, identity, state) for name, row in data["runs"].items()}
    originals = {name: expected_original(row, identity, state) for name, row in data["original"].items()}
    return runs, originals


def csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="a tiny-omni-skills folder")
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantkit-skills-exp"), help="scratch")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the stored rows (JSON)")
    parser.add_argument("--recipes", default="w4a16,w8a8-sq-gptq,fp8")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--sizes", default="32,128", help="calibration set sizes, comma separated")
    parser.add_argument("--items", type=int, default=24, help="held-out items per task")
    parser.add_argument("--pool-per-task", type=int, default=24)
    parser.add_argument("--write-results", type=Path, help="RESULTS.md to write the section into")
    parser.add_argument("--render-only", action="store_true", help="render the stored rows, measure nothing")
    args = parser.parse_args(argv)
    arms = csv(args.arms)
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"unknown arms: {', '.join(sorted(unknown))} (known: {', '.join(ARMS)})")
    import torch

    torch.set_num_threads(2)

    identity = model_identity(args.model)
    state = code_state()
    data = load(args.results)
    settings = {"items": args.items, "pool_per_task": args.pool_per_task, "pool_seed": POOL_SEED}
    plan = [
        (recipe, arm, int(size), int(seed))
        for recipe in csv(args.recipes)
        for size in csv(args.sizes)
        for seed in csv(args.seeds)
        for arm in arms
    ]
    print(f"model {identity['hash']} (record {identity['record']}); code git {state['commit']}", flush=True)
    if not args.render_only:
        started = time.monotonic()
        name = original_name(identity, args.items)
        row = data["original"].get(name)
        if current(row, expected_original(row, identity, state) if row else None):
            print(f"original: cached (made by {row['provenance']['commit']})", flush=True)
        else:
            data["original"][name] = original_row(args.model, identity, state, args.items)
            save(args.results, data)
            print(f"original: scored in {data['original'][name]['seconds']:.0f} s", flush=True)
        pool, built, took = None, set(), []
        for index, (recipe, arm, size, seed) in enumerate(plan, 1):
            name = run_name(recipe, arm, size, seed)
            head = f"[{index}/{len(plan)}] {name}"
            row = data["runs"].get(name)
            if row and current(row, expected_run(row, identity, state, settings)):
                print(f"{head}: cached (made by {row['provenance']['commit']})", flush=True)
                continue
            if row:
                print(
                    f"{head}: stored row made with another model, code or settings: measuring again",
                    flush=True,
                )
            else:
                print(f"{head}: measuring", flush=True)
            clock = time.monotonic()
            if pool is None:
                pool = write_pool(args.work, args.pool_per_task)
            measured = measure_run(args.model, pool, args.work, recipe, arm, size, seed, args.items, built)
            from _shared import loaded_sources

            spec = run_spec(recipe, arm, size, identity)
            data["runs"][name] = {
                "recipe": recipe,
                "arm": arm,
                "size": size,
                "seed": seed,
                "settings": settings,
                "model": identity,
                **measured,
                "provenance": row_key(name, spec, settings, state, loaded_sources()),
            }
            save(args.results, data)
            took.append(time.monotonic() - clock)
            left = (len(plan) - index) * statistics.mean(took)
            print(
                f"{head}: done in {took[-1]:.0f} s (quantize {measured['quantize_s']:.0f} s, score "
                f"{measured['score_s']:.0f} s); {time.monotonic() - started:.0f} s elapsed, "
                f"at most ~{left:.0f} s to go",
                flush=True,
            )
    text = render(data, *expected_keys(data, identity, state))
    print(text)
    if args.write_results:
        from _shared import replace_section

        replace_section(args.write_results, SECTION, text)


if __name__ == "__main__":
    main()
