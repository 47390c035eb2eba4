"""The seed article's claim, measured on a skills model (tiny-omni-skills, smol-omni-skills: the
suite its skills.json names): does a stratified, sensitivity-weighted calibration set (``quantkit
calibrate``) keep per-task accuracy better than a generic one, or than the best single-task one?

Arms, each of ``--sizes`` samples drawn from the same pool (the suite's skills pool, ``demo-pool
--skills --suite SUITE``): stratified (``quantkit calibrate``, seed s), uniform random (seed s),
text only (the suite's text-task records), captions only (its short-caption records: what
llm-compressor's examples calibrate on), and ``single:TASK`` per task (that task's records
alone); an arm with fewer records than samples repeats them. Each recipe x size x seed x arm is
quantized, then scored with ``quantkit.eval.skills.score_model`` on the same held-out items as the
original, item by item (the per-item scores are stored: the pairing). ``--pool-keep
precision=16`` (or ``TASK=N,...``) skews the pool as users' data often is: the named tasks keep
only their first N records, the others all ``--pool-per-task``; its rows are keyed with it and
their tables say so (a skewed pool's rows go in a results file of their own).

    python bench/skills_experiment.py --model DIR --work /tmp/skills-exp \
        --recipes w4a16,w8a8-sq-gptq,fp8 --sizes 32,128 --seeds 0,1 --items 24 \
        --write-results bench/RESULTS.md

Judging (rendering only, from the stored rows): per table (recipe x size) the best single-task
arm is the one with the highest mean score over the tasks. Each arm's per-item scores are averaged
over its seeds, then paired item by item with stratified's (and with the original's) and given the
accuracy gate's paired bootstrap 95% interval (quantkit/eval/gate.py). Stratified wins a task where
the interval of arm - stratified lies wholly below 0, loses where it lies above, ties otherwise.

Every finished run is a row of ``--results`` (default: the suite's, bench/skills_experiment.json or
bench/skills_experiment_smol.json), written after each run: its scores, per-item scores, seconds,
the held-out item count, the model's identity (a hash of the model folder's weights, tokenizer,
config and processor config files and skills.json, with the suite's zoo record key when there is
one) and its provenance (a key over the quantkit modules the run imported, the recipes, this
script's measuring code and the constants it reads, the library versions (bench/_shared.py's
LIBRARIES), the recipe, arm, size and settings; the git commit for display: the machinery of
bench/mixed_precision.py). A stored row is reused only while its key matches; a row made with
another model, other code or other settings is measured again. ``--work`` holds only scratch (the
pool, calibration sets and checkpoints), rebuilt by each invocation that measures.

``--render-only`` writes the RESULTS.md section (one per suite) from the stored rows without
measuring; rows whose key no longer matches the code and model as they are are marked stale.
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

from _shared import cpu_model  # noqa: E402

# The arms every suite has; beside them, one single-task arm per task of the model's suite
# (``single:ocr_digits``: that task's pool records alone) and, per table, the best of those.
ARMS = ("stratified", "uniform", "text-only", "captions-only")
SINGLE = "single:"
ALL_SINGLE = "single"  # --arms: every task's single-task arm
SCREENED_SINGLE = "best-single"  # --arms: the best single-task arm of the stored screen, per table
BEST_SINGLE = "best single-task"
TEXT_MODALITY = "text"  # the text-only arm: the suite's tasks of this modality (chat text)
CAPTION_FAMILY = "short_caption"  # the captions-only arm: what llm-compressor's examples calibrate on
SECTION_TITLE = "## Calibration data vs per-task accuracy"
SECTION = f"{SECTION_TITLE} (tiny-omni-skills)"
# One results file per suite: rows are named by recipe, arm, size and seed, not by model.
RESULTS_FILES = {
    "tiny-omni-skills": ROOT / "bench" / "skills_experiment.json",
    "smol-omni-skills": ROOT / "bench" / "skills_experiment_smol.json",
}
RESULTS = RESULTS_FILES["tiny-omni-skills"]
ZOO_WEIGHTS = ROOT / "quantkit" / "zoo" / "weights"
ZOO_RECORD = ZOO_WEIGHTS / "tiny-omni-skills.json"  # a folder whose skills.json names no suite
POOL_SEED = 7
# Held-out items per generate call when scoring (left-padded batches: the size can move a greedy
# answer, so it is a setting of every row). 64 on a GPU machine, where 16 leaves it idle.
SCORE_BATCH = 16
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
    with the key of the suite's zoo record (quantkit/zoo/weights/SUITE.json) when it is there."""
    from quantkit.fsutil import sha256_file
    from quantkit.zoo.skills import SKILLS_FILE

    model = Path(model)
    names, missing = identity_files(model)
    if not any(n.endswith(".safetensors") for n in names):
        raise SystemExit(f"{model}: no model*.safetensors to identify the model by")
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0" + sha256_file(model / name).encode() + b"\0")
    for name in missing:
        digest.update(name.encode() + b"\0<missing>\0")
    suite = (
        json.loads((model / SKILLS_FILE).read_text(encoding="utf-8")).get("suite")
        if SKILLS_FILE in names
        else None
    )
    path = ZOO_WEIGHTS / f"{suite}.json" if suite else ZOO_RECORD
    record = json.loads(path.read_text(encoding="utf-8")).get("key") if path.is_file() else None
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


def row_state(row: dict, state: dict) -> dict:
    """The code state a stored row is checked against. A row measured on a GPU keeps the library
    versions of the machine that measured it (that machine's CUDA build of torch is not the one
    here, and this machine cannot measure it again): its code, model and settings must still
    match. A CPU row is checked against the libraries installed here."""
    versions = (row.get("provenance") or {}).get("versions")
    if row.get("device", "cpu") != "cpu" and versions:
        return {**state, "versions": versions}
    return state


def expected_run(row: dict, identity: dict, state: dict, settings: dict | None = None) -> dict:
    """The provenance the code and model as they are now give ``row``'s run (over the files the
    stored row was made with), with ``settings`` (default: the row's own)."""
    name = run_name(row["recipe"], row["arm"], row["size"], row["seed"])
    spec = run_spec(row["recipe"], row["arm"], row["size"], identity)
    files = (row.get("provenance") or {}).get("files")
    settings = settings if settings is not None else settings_now(row["settings"])
    return row_key(name, spec, settings, row_state(row, state), files)


def expected_original(row: dict, identity: dict, state: dict) -> dict:
    files = (row.get("provenance") or {}).get("files")
    spec = {"model": {k: identity[k] for k in ("hash", "record")}}
    settings = {"items": row["items"], "score_batch": row.get("score_batch", SCORE_BATCH)}
    return row_key("original", spec, settings, row_state(row, state), files)


def current(row: dict | None, expected: dict | None) -> bool:
    """Whether a stored row still stands for the code, model and settings it is checked against."""
    return bool(row and expected and (row.get("provenance") or {}).get("key") == expected["key"])


# ---------------------------------------------------------------------- measuring


def pool_records(pool: Path) -> list[dict]:
    return [json.loads(line) for line in pool.read_text(encoding="utf-8").splitlines() if line.strip()]


def model_suite(model: Path):
    """The task module of the model's skills.json (quantkit.synthetic's tiny- or smol-omni-skills)."""
    from quantkit.eval.skills import read_skills
    from quantkit.synthetic.skills_tasks import suite_module

    return suite_module(read_skills(model))


def write_pool(work: Path, per_task: int, suite=None) -> Path:
    """The skills pool of ``suite`` (tiny-omni-skills by default), written anew (its generators are
    quantkit code a stored copy could predate)."""
    from quantkit.synthetic.skills_tasks import write_skills_pool

    write_skills_pool(work / "pool", per_task=per_task, seed=POOL_SEED, force=True, suite=suite)
    return work / "pool" / "pool.jsonl"


# --pool-keep: a pool skewed as a user's training data often is (captions and chat plenty, the
# precision tasks few). PRECISION_GROUP names every task the suite marks precision.
PRECISION_GROUP = "precision"
KEPT_POOL = "pool-kept.jsonl"


def kept_pool(pool: Path, keep: dict[str, int], suite) -> Path:
    """``pool`` with only the first N records of each task named in ``keep`` (task -> N; a task's
    records are in the order its items were drawn, so the first N are as random as any N), written
    beside it (the media are shared); every other task keeps all its records."""
    families = {suite.TASKS_BY_NAME[name].family: count for name, count in keep.items()}
    seen: dict[str, int] = {}
    lines = []
    for record in pool_records(pool):
        seen[record["task"]] = seen.get(record["task"], 0) + 1
        if seen[record["task"]] <= families.get(record["task"], seen[record["task"]]):
            lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    path = pool.with_name(KEPT_POOL)
    path.write_text("".join(lines), encoding="utf-8")
    return path


def kept_code() -> str:
    """The hash of :func:`kept_pool`'s code: part of a skewed run's settings (only its rows run it)."""
    import inspect

    return hashlib.sha256(inspect.getsource(kept_pool).encode()).hexdigest()[:16]


def parse_pool_keep(text: str, suite, per_task: int) -> dict[str, int]:
    """``--pool-keep`` (``precision=16`` or ``ocr_table=16,asr=8``: TASK or the precision group =
    records kept) as task -> count, in the suite's task order. Raises ValueError saying what is wrong."""
    keep: dict[str, int] = {}
    for part in csv(text):
        name, sep, value = part.partition("=")
        if not sep or not value.strip().isdigit():
            raise ValueError(f"{part!r} is not TASK=N (N a whole number)")
        name, count = name.strip(), int(value)
        if name == PRECISION_GROUP:
            names = [t.name for t in suite.TASKS if getattr(t, "precision", False)]
            if not names:
                raise ValueError(f"{suite.SUITE} marks no task as precision; name the tasks")
        elif name in suite.TASKS_BY_NAME:
            names = [name]
        else:
            raise ValueError(f"unknown task {name!r} (known: {PRECISION_GROUP}, {', '.join(suite.TASKS_BY_NAME)})")
        if not 1 <= count < per_task:
            raise ValueError(f"{part}: keep between 1 and {per_task - 1} records (--pool-per-task is {per_task})")
        keep.update(dict.fromkeys(names, count))
    families = [suite.TASKS_BY_NAME[n].family for n in keep]
    shared = sorted({f for f in families if families.count(f) > 1})
    if shared:
        raise ValueError(f"tasks of one taxonomy family ({', '.join(shared)}) cannot be kept apart")
    return {t.name: keep[t.name] for t in suite.TASKS if t.name in keep}


def experiment_pool(work: Path, per_task: int, suite, keep: dict[str, int] | None) -> Path:
    """The pool every arm draws from: the suite's skills pool, skewed by ``keep`` when given."""
    pool = write_pool(work, per_task, suite)
    return kept_pool(pool, keep, suite) if keep else pool


def kept_tasks(settings: dict) -> dict[str, int] | None:
    """The tasks a run's pool kept fewer records of (task -> N), None for the whole pool."""
    return (settings.get("pool_keep") or {}).get("tasks")


def settings_now(settings: dict) -> dict:
    """``settings`` with a skewed pool's code hash as the code is now (a stored row keeps the
    hash it was measured with: comparing with that would never find it stale)."""
    if "pool_keep" not in settings:
        return settings
    return {**settings, "pool_keep": {**settings["pool_keep"], "code": kept_code()}}


def pool_text(settings: dict, order: list[str]) -> str:
    """How a table's pool was made, in words (tasks named in ``order``: the suite's)."""
    text = f"pool {settings['pool_per_task']} records a task"
    kept = kept_tasks(settings)
    if kept:
        counts: dict[int, list[str]] = {}
        for name, count in sorted(kept.items(), key=lambda item: order.index(item[0])):
            counts.setdefault(count, []).append(name)
        text += " but " + "; ".join(f"{', '.join(names)} {count} each" for count, names in counts.items())
        text += " (skewed: `--pool-keep`)"
    return text


def suite_arms(suite) -> list[str]:
    """Every arm a suite has: the four shared ones, then one single-task arm per task."""
    return [*ARMS, *(SINGLE + task.name for task in suite.TASKS)]


def arm_families(arm: str, suite) -> set[str]:
    """The taxonomy families whose pool records an arm other than stratified and uniform draws
    from (a pool record's ``task`` is its task's family): text only, the suite's text tasks;
    captions only, its short captions; ``single:TASK``, that task's."""
    if arm == "text-only":
        return {t.family for t in suite.TASKS if t.modality == TEXT_MODALITY}
    if arm == "captions-only":
        return {t.family for t in suite.TASKS if t.family == CAPTION_FAMILY}
    return {suite.TASKS_BY_NAME[arm.removeprefix(SINGLE)].family}


def arm_samples(arm: str, pool: Path, work: Path, size: int, seed: int, model: Path, built: set, suite=None):
    """The ``size`` calibration samples of ``arm`` and a label saying how they were drawn. The
    stratified set of a (size, seed) is built once per invocation (``built``) and shared by the
    recipes. An arm whose records are fewer than ``size`` draws them with repeats."""
    from quantkit.calibset import CalibrateOptions, build_calibration_set
    from quantkit.models.inputs import Sample
    from quantkit.models.samples import samples_from_set
    from quantkit.synthetic import skills_tasks

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
        families = arm_families(arm, suite or skills_tasks)
        subset = [r for r in records if r["task"] in families]
        chosen = (
            rng.sample(subset, size) if len(subset) >= size else [rng.choice(subset) for _ in range(size)]
        )

    def sample(record: dict) -> Sample:
        paths = {k: [pool.parent / p for p in record[k]] for k in ("images", "videos", "audios")}
        return Sample(messages=record["messages"], **paths)

    return [sample(r) for r in chosen], f"{arm}, seed {seed}"


def measuring_device() -> str:
    """Where a row is measured: the GPU's name (quantize and score run there), else "cpu"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def machine_of(row: dict) -> str:
    """The machine a row was measured on: its GPU's name, else "cpu (CPU MODEL)" (CPU kernels differ
    between models; rows stored before the model was recorded: "cpu (model not recorded)")."""
    device = row.get("device", "cpu")
    return device if device != "cpu" else f"cpu ({row.get('cpu') or 'model not recorded'})"


def machine_fields() -> dict:
    """What a stored row records of the machine measuring it (every row gets these)."""
    return {"device": measuring_device(), "cpu": cpu_model()}


def this_machine() -> str:
    return machine_of(machine_fields())


def other_device_rows(data: dict, machine: str) -> list[str]:
    """The machines other than ``machine`` (:func:`machine_of`) that stored rows were measured on
    (sorted)."""
    rows = [*data["original"].values(), *data["runs"].values()]
    return sorted({machine_of(row) for row in rows} - {machine})


def item_text(values: list[float]) -> str:
    """Per-item scores as one string (6 significant digits, space separated): a few hundred items
    x tasks x runs stay a line per task in the results file, not a line per item."""
    return " ".join(f"{v:.6g}" for v in values)


def scored(
    model_dir: Path, suite, items: int, suite_from: Path | None = None, batch: int = SCORE_BATCH
) -> dict:
    """``model_dir``'s per-task scores and per-item scores (in the order the items are drawn, the
    same for every model: the pairing) on the suite's held-out items."""
    from quantkit.eval.skills import score_model

    names = [t.name for t in suite.TASKS]
    tasks = score_model(model_dir, names, items=items, batch=batch, suite_from=suite_from).tasks
    return {
        "suite": suite.SUITE,
        "scores": {t.task: t.score for t in tasks},
        "item_scores": {t.task: item_text(t.item_scores) for t in tasks},
    }


def measure_run(
    model: Path,
    pool: Path,
    work: Path,
    recipe: str,
    arm: str,
    size: int,
    seed: int,
    items: int,
    built: set,
    suite=None,
    batch: int = SCORE_BATCH,
) -> dict:
    """Quantize one arm's checkpoint and score it on the held-out items (the original's), ``batch``
    items a generate call."""
    from quantkit.quantize import quantize
    from quantkit.recipes.registry import resolve_recipe
    from quantkit.synthetic import skills_tasks

    suite = suite or skills_tasks
    samples, label = arm_samples(arm, pool, work, size, seed, model, built, suite)
    checkpoint = work / f"ckpt-{recipe}-{arm.replace(':', '-')}-{size}-{seed}"
    started = time.monotonic()
    quantize(model, checkpoint, resolve_recipe(recipe), samples, force=True, progress=False)
    quantized = time.monotonic()
    scores = scored(
        checkpoint, suite, items, suite_from=model, batch=batch
    )  # a checkpoint has no skills.json
    return {
        "device": measuring_device(),
        "calibration": label,
        "quantize_s": round(quantized - started, 1),
        "score_s": round(time.monotonic() - quantized, 1),
        "items": items,
        **scores,
    }


def run_row(entry: tuple, measured: dict, settings: dict, identity: dict, state: dict) -> dict:
    """A measured run (``entry``: recipe, arm, size, seed) as it is stored: its provenance over the
    quantkit files the measuring process loaded."""
    from _shared import loaded_sources

    recipe, arm, size, seed = entry
    spec = run_spec(recipe, arm, size, identity)
    return {
        "recipe": recipe,
        "arm": arm,
        "size": size,
        "seed": seed,
        "settings": settings,
        "model": identity,
        **measured,
        **machine_fields(),
        "provenance": row_key(run_name(*entry), spec, settings, state, loaded_sources()),
    }


def original_row(model: Path, identity: dict, state: dict, items: int, batch: int = SCORE_BATCH) -> dict:
    """Measure the original's scores on its suite: its stored row, keyed as
    :func:`expected_original` checks it (``state``: the code state of the bench that stores it)."""
    from _shared import loaded_sources

    clock = time.monotonic()
    scores = scored(model, model_suite(model), items, batch=batch)
    spec = {"model": {k: identity[k] for k in ("hash", "record")}}
    return {
        "items": items,
        "model": identity,
        "device": measuring_device(),
        "seconds": round(time.monotonic() - clock, 1),
        **scores,
        "score_batch": batch,
        "provenance": row_key(
            "original", spec, {"items": items, "score_batch": batch}, state, loaded_sources()
        ),
    }


MEASURING = (
    pool_records,
    model_suite,
    write_pool,
    arm_families,
    arm_samples,
    measuring_device,
    item_text,
    scored,
    measure_run,
    original_row,
)
# The module-level values those functions read, by name (inspect.getsource sees only their bodies).
MEASURED_VALUES = ("POOL_SEED", "SINGLE", "TEXT_MODALITY", "CAPTION_FAMILY", "SCORE_BATCH")


# ---------------------------------------------------------------------- measuring in parallel


def _in_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def built_stratified(
    model: Path, pool: Path, work: Path, size: int, seed: int, threads: int
) -> tuple[int, int]:
    """A worker's job: the stratified set of (size, seed), built where every run reads it."""
    _in_worker(threads)
    arm_samples("stratified", pool, work, size, seed, model, set(), model_suite(model))
    return size, seed


def measured_row(
    model: Path,
    pool: Path,
    work: Path,
    entry: tuple,
    items: int,
    settings: dict,
    identity: dict,
    state: dict,
    threads: int,
) -> dict:
    """A worker's job: one run (``entry``: recipe, arm, size, seed; its stratified set built)
    measured and made into its stored row (its provenance over the quantkit files this process
    loaded)."""
    _in_worker(threads)
    recipe, arm, size, seed = entry
    built = {(size, seed)}
    measured = measure_run(
        model, pool, work, recipe, arm, size, seed, items, built, model_suite(model), settings["score_batch"]
    )
    return run_row(entry, measured, settings, identity, state)


def scored_original(model: Path, identity: dict, state: dict, items: int, batch: int, threads: int) -> dict:
    """A worker's job: the original's row."""
    _in_worker(threads)
    return {**original_row(model, identity, state, items, batch), **machine_fields()}


def measure_parallel(
    args,
    todo: list[tuple],
    data: dict,
    results: Path,
    identity: dict,
    state: dict,
    settings: dict,
    original: str | None,
) -> list[str]:
    """``--workers N`` (a GPU machine with cores to spare): the original, the stratified sets and
    the runs in N spawned processes, each row saved as it arrives. Runs start in ``todo``'s order,
    at most N at a time (a run cut short by a deadline leaves the earlier ones done), a stratified
    run once its set is built. Returns the failed jobs (a failed one stops no other)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = experiment_pool(args.work, args.pool_per_task, model_suite(args.model), kept_tasks(settings))
    started = time.monotonic()
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as executor:
        jobs: dict = {}
        if original:
            job = executor.submit(
                scored_original, args.model, identity, state, args.items, args.score_batch, args.threads
            )
            jobs[job] = ("original",)
        needed = dict.fromkeys((size, seed) for _, arm, size, seed in todo if arm == "stratified")
        for size, seed in needed:
            job = executor.submit(built_stratified, args.model, pool, args.work, size, seed, args.threads)
            jobs[job] = ("stratified", size, seed)
        waiting, built, failed = list(todo), set(), []

        def start_runs() -> None:
            running = sum(what[0] == "run" for what in jobs.values())
            for entry in list(waiting):
                if running >= args.workers:
                    return
                _, arm, size, seed = entry
                if arm == "stratified" and (size, seed) not in built:
                    continue
                waiting.remove(entry)
                job = executor.submit(
                    measured_row, args.model, pool, args.work, entry, args.items, settings, identity, state,
                    args.threads,
                )  # fmt: skip
                jobs[job] = ("run", run_name(*entry))
                running += 1

        start_runs()
        while jobs:
            done, _ = wait(jobs, return_when=FIRST_COMPLETED)
            for job in done:
                what = jobs.pop(job)
                elapsed = f"{time.monotonic() - started:.0f} s elapsed"
                try:
                    result = job.result()
                except Exception as err:  # one failed job (a size calibrate refuses, ...) stops no other
                    failed.append(f"{' '.join(map(str, what))}: {type(err).__name__}: {err}")
                    print(f"failed: {failed[-1]}; {elapsed}", flush=True)
                    if what[0] == "stratified":  # its runs cannot be measured
                        waiting[:] = [
                            e for e in waiting if not (e[1] == "stratified" and (e[2], e[3]) == what[1:])
                        ]
                    continue
                if what[0] == "original":
                    data["original"][original] = result
                    save(results, data)
                    print(f"original: scored in {result['seconds']:.0f} s; {elapsed}", flush=True)
                elif what[0] == "stratified":
                    built.add(what[1:])
                    print(f"stratified set {what[1]}/{what[2]} built; {elapsed}", flush=True)
                else:
                    name, row = what[1], result
                    data["runs"][name] = row
                    save(results, data)
                    print(
                        f"{name}: done (quantize {row['quantize_s']:.0f} s, score {row['score_s']:.0f} s); "
                        f"{len(waiting)} waiting; {elapsed}",
                        flush=True,
                    )
            start_runs()
    return failed


# ---------------------------------------------------------------------- rendering


def cell(values: list[float]) -> tuple[float, float]:
    """Mean and spread (max - min) over seeds."""
    return statistics.mean(values), max(values) - min(values)


def suite_tasks(rows: list[dict]):
    """The tasks of the suite the rows were scored on (rows made before suites were recorded:
    tiny-omni-skills)."""
    from quantkit.synthetic.skills_tasks import SUITE, suite_module

    return suite_module({"suite": rows[0].get("suite", SUITE)}).TASKS


def seed_mean_items(rows: list[dict], task: str) -> list[float] | None:
    """Per held-out item, its score averaged over the rows (an arm's seeds): how seeds enter the
    paired comparison. None when a row has no per-item scores (made before they were kept)."""
    if not rows or any(task not in (r.get("item_scores") or {}) for r in rows):
        return None
    per_seed = [[float(v) for v in r["item_scores"][task].split()] for r in rows]
    return [statistics.mean(values) for values in zip(*per_seed, strict=True)]


def paired(first: list[float], second: list[float]) -> dict:
    """first - second in points (100 x the mean per-item difference) with the gate's paired
    bootstrap 95% interval: the items resampled together on both sides, seeded (a rerun renders
    the same bytes)."""
    from quantkit.eval.gate import paired_interval, paired_loss

    low, high = paired_interval(first, second)
    return {"n": len(first), "diff": paired_loss(first, second), "low": low, "high": high}


def side(figure: dict) -> int | None:
    """Where a paired interval lies: -1 wholly below 0, 1 wholly above, 0 holding 0; None with
    fewer items than the gate's MIN_ITEMS (no interval to judge by)."""
    from quantkit.eval.gate import MIN_ITEMS, TOLERANCE

    if figure["n"] < MIN_ITEMS:
        return None
    if figure["high"] < -TOLERANCE:
        return -1
    return 1 if figure["low"] > TOLERANCE else 0


def outcome(difference: dict) -> str:
    """Stratified's outcome from ``arm - stratified``'s interval: it wins where the whole interval
    lies below 0, loses where it lies above, ties where the interval holds 0 (or too few items)."""
    return {None: "not judged", -1: "wins", 0: "ties", 1: "loses"}[side(difference)]


def best_single(rows: list[dict], tasks: list[str]) -> tuple[str, dict[str, float], list[int]] | None:
    """(the best single-task arm, every single-task arm's mean score, the seeds it was chosen on):
    the mean over tasks of the per-task mean over the seeds every single-task arm was measured at
    (all its seeds where they share none), highest first; a tie goes to the arm first in the
    suite's task order. So a screen of every single-task arm on seed 0, with the chosen one then
    measured on more seeds, is judged on seed 0 alone, not one arm's three seeds against another's
    one. None without a single-task arm."""
    singles = [SINGLE + t for t in tasks if any(r["arm"] == SINGLE + t for r in rows)]
    if not singles:
        return None
    shared = set.intersection(*({r["seed"] for r in rows if r["arm"] == arm} for arm in singles))
    chosen_on = [r for r in rows if r["seed"] in shared] if shared else rows
    means = {
        arm: statistics.mean(
            statistics.mean(r["scores"][task] for r in chosen_on if r["arm"] == arm) for task in tasks
        )
        for arm in singles
    }
    seeds = sorted({r["seed"] for r in chosen_on if r["arm"] in singles})
    return max(singles, key=lambda arm: (means[arm], -singles.index(arm))), means, seeds


def screened_single(
    data: dict, recipe: str, size: int, identity: dict, state: dict, settings: dict
) -> tuple[str, list[int]] | None:
    """What ``--arms best-single`` measures for (recipe, size): the best single-task arm
    (:func:`best_single`) among the stored rows of that table that stand for the code, model and
    settings as they are, and the seeds it was chosen on; None where none is stored (a screen,
    e.g. ``--seeds 0 --arms single``, comes first)."""
    rows = [
        row
        for row in data["runs"].values()
        if row["recipe"] == recipe
        and row["size"] == size
        and row["arm"].startswith(SINGLE)
        and current(row, expected_run(row, identity, state, settings))
    ]
    if not rows:
        return None
    best, _, seeds = best_single(rows, [t.name for t in suite_tasks(rows)])
    return best, seeds


def compared_arms(rows: list[dict], tasks: list[str]) -> list[tuple[str, str]]:
    """(label, arm) of each column: the shared arms measured, then the best single-task arm."""
    shown = [(a, a) for a in ARMS if any(r["arm"] == a for r in rows)]
    best = best_single(rows, tasks)
    return shown + ([(f"{BEST_SINGLE} ({best[0]})", best[0])] if best else [])


def judge(rows: list[dict], tasks: list[str], original: dict | None) -> dict:
    """The figures of one table, per arm shown and task: its loss against the original (original -
    arm) and its difference from stratified (arm - stratified), each paired on the same items with
    its interval, per-item scores averaged over the arm's seeds first; None where not measurable."""
    items = {
        arm: {task: seed_mean_items([r for r in rows if r["arm"] == arm], task) for task in tasks}
        for _, arm in compared_arms(rows, tasks)
    }
    base = {
        task: [float(v) for v in original["item_scores"][task].split()]
        if original and task in (original.get("item_scores") or {})
        else None
        for task in tasks
    }
    stratified = items.get("stratified", dict.fromkeys(tasks))
    return {
        "loss": {
            arm: {t: paired(base[t], mine[t]) if base[t] and mine[t] else None for t in tasks}
            for arm, mine in items.items()
        },
        "difference": {
            arm: {t: paired(mine[t], stratified[t]) if stratified[t] and mine[t] else None for t in tasks}
            for arm, mine in items.items()
            if arm != "stratified"
        },
    }


def interval_text(figure: dict | None, with_outcome: bool = False) -> str:
    if figure is None:
        return "-"
    said = f"{figure['diff']:+.1f} [{figure['low']:+.1f}, {figure['high']:+.1f}]"
    return f"{said} {outcome(figure)}" if with_outcome else said


def verdict(label: str, differences: dict[str, dict | None], tasks: list[str]) -> str:
    """Where stratified wins, ties and loses against one arm, task by task, beyond the interval."""
    judged = {t: outcome(differences[t]) for t in tasks if differences[t] is not None}
    if not judged:
        return f"vs {label}: not judged (rows without per-item scores)"
    parts = []
    for word in ("wins", "loses", "ties", "not judged"):
        named = [t for t in tasks if judged.get(t) == word]
        if named:
            parts.append(f"{word} on {', '.join(named)}")
    missing = [t for t in tasks if t not in judged]
    if missing:
        parts.append(f"no per-item scores on {', '.join(missing)}")
    return f"vs {label}: " + "; ".join(parts)


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


def measured_on(row: dict) -> str:
    """The machine a row was measured on (:func:`machine_of`), with its torch."""
    machine = machine_of(row)
    torch_version = ((row.get("provenance") or {}).get("versions") or {}).get("torch")
    return f"{machine}, torch {torch_version}" if torch_version else machine


def render(
    data: dict,
    expected_runs: dict | None = None,
    expected_originals: dict | None = None,
    results_name: str = "bench/skills_experiment.json",
) -> str:
    """The RESULTS.md section body from the stored rows only: per recipe x size (x model x
    held-out items, where the file holds more than one) the scores (mean ± spread over seeds,
    n), each arm's loss against the original and its difference from stratified (paired 95%
    intervals), the verdict line, and the commits that made the rows (stale ones marked when
    ``expected_*`` are given: name -> key)."""
    from quantkit.eval.gate import CONFIDENCE, RESAMPLES

    runs = data.get("runs") or {}
    originals = data.get("original") or {}
    lines = [
        f"Rendered by bench/skills_experiment.py from {results_name}. Arms, each the same number of "
        "calibration samples from the skills pool of the model's suite (its skills.json): stratified "
        "(`quantkit calibrate`, sensitivity weighted, seed s), uniform random (seed s), text only (the "
        "suite's text-task records: chat text), captions only (its short-caption records: what "
        "llm-compressor's multimodal examples calibrate on), and one single-task arm per task "
        "(`single:TASK`: that task's records alone; an arm with fewer records than samples repeats "
        f"them). The **{BEST_SINGLE}** arm of a table is its single-task arm with the highest mean "
        "score over the tasks (ties: the first in task order), over the seeds every single-task arm "
        "was measured at (a screen of them on one seed picks the arm then measured on every seed); "
        "it is chosen on the same items it is then compared on, which favours it. Every checkpoint and the original are scored on the "
        "same held-out items. Scores: mean ± spread (max - min) over seeds, n seeds. Loss against "
        "the original (original - arm) and difference from stratified (arm - stratified) are in "
        "points (100 x the mean per-item difference): each arm's per-item scores are first averaged "
        "over its seeds, then paired item by item with the other side, with the accuracy gate's "
        f"paired bootstrap {CONFIDENCE:.0%} interval ({RESAMPLES} resamples of the items, seeded; "
        "quantkit/eval/gate.py). The interval covers the held-out items' noise; the seed spread "
        "beside the scores shows the calibration draw's. Stratified **wins** on a task where the "
        "whole interval of arm - stratified lies below 0, **loses** where it lies above 0, and "
        "**ties** otherwise.",
        "",
    ]
    tallies = {stale: {} for stale in (False, True)}
    # Rows (and original scores) other code, another model or other settings made keep their
    # figures, in tables of their own marked stale with the commits that measured them; the
    # tallies keep the two apart.
    stale = (
        set()
        if expected_runs is None
        else {n for n, r in runs.items() if not current(r, expected_runs.get(n))}
    )
    if stale:
        lines += [
            f"{len(stale)} stored row(s) are stale (another model, other code or other settings than now): their "
            "tables are marked stale and show the figures measured at the commits they name. Running the "
            "experiment again measures them again.",
            "",
        ]
    stale_originals = set()
    if expected_originals is not None:
        stale_originals = {k for k, v in originals.items() if not current(v, expected_originals.get(k))}
    if not runs:
        return "\n".join([*lines, "No rows yet: run `python bench/skills_experiment.py --model DIR`."])
    groups: dict[tuple, list[tuple[str, dict]]] = {}
    for name, row in runs.items():
        groups.setdefault(
            (row["recipe"], row["size"], row["model"]["hash"], row["items"], name in stale), []
        ).append((name, row))
    models = {key[2] for key in groups}
    recipes = list(dict.fromkeys(key[0] for key in groups))
    for recipe, size, model, items, is_stale in sorted(
        groups, key=lambda k: (k[4], recipes.index(k[0]), k[1], k[2], k[3])
    ):
        named = groups[(recipe, size, model, items, is_stale)]
        rows = [row for _, row in named]
        tasks = suite_tasks(rows)
        names = [t.name for t in tasks]
        shown = compared_arms(rows, names)
        seeds = sorted({r["seed"] for r in rows})
        # a current table compares with the current original only; a stale one with the stored one
        original = originals.get(f"{model}/{items}")
        if original is not None and not is_stale and f"{model}/{items}" in stale_originals:
            original = None
        marks = [made_by(row, checked(expected_runs, name)) for name, row in named]
        if original is not None:
            marks.append(made_by(original, checked(expected_originals, f"{model}/{items}")))
        record = rows[0]["model"].get("record")
        figures = judge(rows, names, original)
        lines += [
            f"### {recipe}, {size} calibration samples"
            + (f" (model {model})" if len(models) > 1 else "")
            + (
                ", stale (measured at "
                + ", ".join(sorted({(r.get("provenance") or {}).get("commit") or "unknown" for r in rows}))
                + ")"
                if is_stale
                else ""
            ),
            "",
            f"Seeds {', '.join(map(str, seeds))}; {items} held-out items a task; "
            + ", ".join(sorted({pool_text(r["settings"], names) for r in rows}))
            + f"; model {model}"
            + (f" (zoo record {record[:12]})" if record else "")
            + f"; made by {', '.join(sorted(set(marks)))}; measured on "
            + ", ".join(sorted({measured_on(r) for r in [*rows, *([original] if original else [])]}))
            + ".",
            "",
            "Scores:",
            "",
            "| group | task | original | " + " | ".join(label for label, _ in shown) + " |",
            "|---|---|---|" + "---|" * len(shown),
        ]
        for task in tasks:
            cells = []
            for _, arm in shown:
                mean, spread = cell([r["scores"][task.name] for r in rows if r["arm"] == arm])
                cells.append(f"{mean:.3f} ± {spread:.3f} (n={sum(r['arm'] == arm for r in rows)})")
            first = f"{original['scores'][task.name]:.3f}" if original else "not measured"
            lines.append(f"| {task.group} | {task.name} | {first} | " + " | ".join(cells) + " |")
        seconds = []
        for _, arm in shown:
            mean, spread = cell([r["quantize_s"] for r in rows if r["arm"] == arm])
            seconds.append(f"{mean:.0f} ± {spread:.0f}")
        lines += ["| | quantize seconds | | " + " | ".join(seconds) + " |", ""]
        best = best_single(rows, names)
        if best:
            lines += [
                f"Single-task arms, mean score over the tasks (seeds {', '.join(map(str, best[2]))}): "
                + ", ".join(f"{arm} {mean:.3f}" for arm, mean in best[1].items())
                + f"; {BEST_SINGLE}: {best[0]}.",
                "",
            ]
        measured = any(
            f for kind in figures.values() for per_task in kind.values() for f in per_task.values()
        )
        versus = [(label, arm) for label, arm in shown if arm != "stratified"]
        if not measured:
            lines.append(
                "No loss or difference intervals: these rows hold no per-item scores (measured before "
                "they were kept) or the original was not measured here."
            )
        else:
            lines += [
                "Loss against the original, points (original - arm), paired 95% interval:",
                "",
                "| group | task | " + " | ".join(label for label, _ in shown) + " |",
                "|---|---|" + "---|" * len(shown),
            ]
            for task in tasks:
                cells = [interval_text(figures["loss"][arm][task.name]) for _, arm in shown]
                lines.append(f"| {task.group} | {task.name} | " + " | ".join(cells) + " |")
        if measured and "stratified" in {arm for _, arm in shown} and versus:
            lines += [
                "",
                "Difference from stratified, points (arm - stratified), paired 95% interval, and "
                "stratified's outcome:",
                "",
                "| group | task | " + " | ".join(label for label, _ in versus) + " |",
                "|---|---|" + "---|" * len(versus),
            ]
            for task in tasks:
                cells = [interval_text(figures["difference"][arm][task.name], True) for _, arm in versus]
                lines.append(f"| {task.group} | {task.name} | " + " | ".join(cells) + " |")
        if "stratified" in {arm for _, arm in shown} and versus:
            said = [verdict(label, figures["difference"][arm], names) for label, arm in versus]
        else:
            said = ["and another arm were not both measured: nothing to compare"]
        lines += [
            "",
            f"**Verdict, {recipe} at {size} samples{' (stale figures)' if is_stale else ''}:** stratified "
            + ". Stratified ".join(said)
            + ".",
            "",
        ]
        count(tallies[is_stale], figures, shown, names)
    fresh = sum(not key[4] for key in groups)
    if fresh:
        lines.append(overall(tallies[False], fresh))
    if len(groups) > fresh:
        lines += [""] * bool(fresh) + [overall(tallies[True], len(groups) - fresh, stale=True)]
    if data.get("history"):
        lines += [
            "",
            f"Hand-written note kept in the results file (`history`; not a measurement): {data['history']}",
        ]
    return "\n".join(lines)


def kind(label: str) -> str:
    """The column a tally counts under: the best single-task arm whichever task it is."""
    return BEST_SINGLE if label.startswith(BEST_SINGLE) else label


def count(tally: dict, figures: dict, shown: list[tuple[str, str]], tasks: list[str]) -> None:
    """Add one table's losses against the original beyond the interval and stratified's outcomes
    to ``tally`` (column -> counts)."""
    for label, arm in shown:
        counts = tally.setdefault(kind(label), {"cells": 0, "lost": 0, "wins": 0, "ties": 0, "loses": 0})
        for task in tasks:
            loss = figures["loss"][arm][task]
            if loss is not None:
                counts["cells"] += 1
                counts["lost"] += side(loss) == 1
            difference = (figures["difference"].get(arm) or {}).get(task)
            if difference is not None and outcome(difference) in ("wins", "ties", "loses"):
                counts[outcome(difference)] += 1


def overall(tally: dict, tables: int, *, stale: bool = False) -> str:
    """The paragraph over every current table (or, ``stale``, every stale one): losses against the
    original, and stratified's outcomes against each arm."""
    judged = [c for c, n in tally.items() if n["cells"]]
    losses = "; ".join(f"{c} {tally[c]['lost']} of {tally[c]['cells']}" for c in judged)
    outcomes = [
        f"{c}: stratified wins {n['wins']}, ties {n['ties']}, loses {n['loses']}"
        for c, n in tally.items()
        if c != "stratified" and n["wins"] + n["ties"] + n["loses"]
    ]
    return (
        (
            f"Over the {tables} stale tables (figures measured at earlier commits)"
            if stale
            else f"Over all {tables} tables"
        )
        + " (recipe x size): (recipe, size, task) cells where an arm lost against the original beyond "
        "its interval: "
        + (losses if judged else "none judged (no original, or rows without per-item scores)")
        + ". Stratified against each arm, (recipe, size, task) comparisons: "
        + ("; ".join(outcomes) if outcomes else "none judged")
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
    parser.add_argument(
        "--model",
        type=Path,
        required=True,
        help="a skills model folder (tiny- or smol-omni-skills: its skills.json)",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantkit-skills-exp"), help="scratch")
    parser.add_argument(
        "--results",
        type=Path,
        help="the stored rows (JSON; default: the suite's, "
        + ", ".join(f"{suite} {path.relative_to(ROOT)}" for suite, path in RESULTS_FILES.items())
        + ")",
    )
    parser.add_argument("--recipes", default="w4a16,w8a8-sq-gptq,fp8")
    parser.add_argument(
        "--arms",
        default=",".join([*ARMS, ALL_SINGLE]),
        help=f"comma separated: {', '.join(ARMS)}, {SINGLE}TASK (one task's records alone), "
        f"{ALL_SINGLE} (every task's single-task arm) or {SCREENED_SINGLE} (per recipe and size, the "
        "best single-task arm of the stored rows: a screen measured first, e.g. --seeds 0 --arms single)",
    )
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--sizes", default="32,128", help="calibration set sizes, comma separated")
    parser.add_argument("--items", type=int, default=24, help="held-out items per task")
    parser.add_argument("--pool-per-task", type=int, default=24)
    parser.add_argument(
        "--pool-keep",
        metavar="TASK=N,...",
        help=f"skew the pool as users' data often is: keep only N records of each task named "
        f"({PRECISION_GROUP}=N: every task the suite marks precision), all --pool-per-task of the others",
    )
    parser.add_argument(
        "--score-batch", type=int, default=SCORE_BATCH, help="held-out items per generate call (64 on a GPU)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="measure in N processes at once (a GPU machine: they share the GPU; each takes --threads cores)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads per process")
    parser.add_argument("--write-results", type=Path, help="RESULTS.md to write the section into")
    parser.add_argument("--render-only", action="store_true", help="render the stored rows, measure nothing")
    args = parser.parse_args(argv)
    from quantkit.errors import QuantkitError

    try:
        suite = model_suite(args.model)
    except QuantkitError as err:
        parser.error(f"--model {args.model}: {err}")
    known = suite_arms(suite)
    arms = [a for part in csv(args.arms) for a in (known[len(ARMS) :] if part == ALL_SINGLE else [part])]
    unknown = [a for a in arms if a not in [*known, SCREENED_SINGLE]]
    if unknown:
        parser.error(f"unknown arms: {', '.join(unknown)} (known for {suite.SUITE}: {', '.join(known)})")
    results = args.results or RESULTS_FILES.get(
        suite.SUITE, ROOT / "bench" / f"skills_experiment-{suite.SUITE}.json"
    )
    import torch

    torch.set_num_threads(args.threads)

    identity = model_identity(args.model)
    state = code_state()
    data = load(results)
    settings = {
        "items": args.items,
        "pool_per_task": args.pool_per_task,
        "pool_seed": POOL_SEED,
        "score_batch": args.score_batch,
    }
    if args.pool_keep:
        try:
            keep = parse_pool_keep(args.pool_keep, suite, args.pool_per_task)
        except ValueError as err:
            parser.error(f"--pool-keep: {err}")
        settings["pool_keep"] = {"tasks": keep, "code": kept_code()}
    print(f"model {identity['hash']} (record {identity['record']}); code git {state['commit']}", flush=True)
    table_arms = {}
    for size in csv(args.sizes):
        for recipe in csv(args.recipes):
            table_arms[recipe, int(size)] = list(dict.fromkeys(arms))
            if SCREENED_SINGLE in arms and not args.render_only:
                screened = screened_single(data, recipe, int(size), identity, state, settings)
                if screened is None:
                    parser.error(
                        f"--arms {SCREENED_SINGLE}: {results} holds no current single-task row of {recipe} "
                        f"at {size} samples; measure a screen first (e.g. --seeds 0 --arms single)"
                    )
                best, seeds = screened
                print(f"{SCREENED_SINGLE} of {recipe} at {size} samples: {best} (chosen on seeds "
                      f"{', '.join(map(str, seeds))})", flush=True)  # fmt: skip
                table_arms[recipe, int(size)] = list(
                    dict.fromkeys(best if arm == SCREENED_SINGLE else arm for arm in arms)
                )
    # Seed by seed (a first seed of every table comes before any second one): what a run cut short
    # leaves is a comparison, not one arm's seeds.
    plan = [
        (recipe, arm, int(size), int(seed))
        for seed in csv(args.seeds)
        for size in csv(args.sizes)
        for recipe in csv(args.recipes)
        for arm in table_arms[recipe, int(size)]
    ]
    if not args.render_only:
        other = other_device_rows(data, this_machine())
        if other:
            parser.error(
                f"{results} holds rows measured on {', '.join(other)}, not here: runs and the original "
                "are keyed without the device, so rows from two machines would be paired; pass another "
                "--results"
            )
    if not args.render_only and args.workers > 1:
        name = original_name(identity, args.items)
        row = data["original"].get(name)
        original = None if current(row, expected_original(row, identity, state) if row else None) else name
        todo = []
        for entry in plan:
            row = data["runs"].get(run_name(*entry))
            if not (row and current(row, expected_run(row, identity, state, settings))):
                todo.append(entry)
        print(
            f"{len(plan) - len(todo)} of {len(plan)} runs cached; measuring {len(todo)} in {args.workers} processes"
        )
        failed = measure_parallel(args, todo, data, results, identity, state, settings, original)
        if failed:
            parser.exit(
                2, f"{len(failed)} job(s) failed (the rows measured are saved):\n" + "\n".join(failed) + "\n"
            )
    elif not args.render_only:
        started = time.monotonic()
        name = original_name(identity, args.items)
        row = data["original"].get(name)
        if current(row, expected_original(row, identity, state) if row else None):
            print(f"original: cached (made by {row['provenance']['commit']})", flush=True)
        else:
            row = original_row(args.model, identity, state, args.items, args.score_batch)
            data["original"][name] = {**row, **machine_fields()}
            save(results, data)
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
                pool = experiment_pool(args.work, args.pool_per_task, suite, kept_tasks(settings))
            try:
                measured = measure_run(
                    args.model,
                    pool,
                    args.work,
                    recipe,
                    arm,
                    size,
                    seed,
                    args.items,
                    built,
                    suite,
                    args.score_batch,
                )
            except QuantkitError as err:  # a size calibrate refuses, ...: the rows so far are saved
                parser.exit(2, f"{head}: {err}\n")
            data["runs"][name] = run_row((recipe, arm, size, seed), measured, settings, identity, state)
            save(results, data)
            took.append(time.monotonic() - clock)
            left = (len(plan) - index) * statistics.mean(took)
            print(
                f"{head}: done in {took[-1]:.0f} s (quantize {measured['quantize_s']:.0f} s, score "
                f"{measured['score_s']:.0f} s); {time.monotonic() - started:.0f} s elapsed, "
                f"at most ~{left:.0f} s to go",
                flush=True,
            )
    resolved = results.resolve()
    shown = resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else results
    text = render(data, *expected_keys(data, identity, state), results_name=str(shown))
    print(text)
    if args.write_results:
        from _shared import replace_section

        replace_section(args.write_results, section_title(suite.SUITE, results), text)


def section_title(suite: str, results: Path) -> str:
    """The RESULTS.md heading of ``suite``'s rows in ``results``: a rows file other than the
    suite's own (RESULTS_FILES; a CPU run's beside a GPU grid's) gets a section of its own, named
    by the file, so that both are shown."""
    own = RESULTS_FILES.get(suite)
    if own is None or Path(results).resolve() == own.resolve():
        return f"{SECTION_TITLE} ({suite})"
    return f"{SECTION_TITLE} ({suite}, rows of {Path(results).name})"


if __name__ == "__main__":
    main()
