"""Benchmark `quantkit calibrate` on a big pool (issue 3).

Builds a pool of N records (default 100,000) in the pool format, all referencing one shared set of
real media files (the demo pool's ~230 images, videos and audio clips), with varied text, task
names (aliases included), modality combinations, text-only records, records without an id and
some exact duplicates. Then, alternately and each in a fresh subprocess:

  (a) read + JSON-parse the pool (`for line in f: json.loads(line)`): the floor any reader pays;
  (b) `build_calibration_set(pool, out, CalibrateOptions(size=...))`: wall time of the call, the
      child's peak RSS (VmHWM), and whether torch / transformers got imported.

  (c) `python -m quantkit calibrate POOL --output SET --size ...`: the whole command as a user runs
      it, interpreter start and imports included, against (a) run the same way: a process that does
      nothing else (`python -c` of that loop).

The processes run with a bytecode cache (PYTHONPYCACHEPREFIX in the work folder, filled by a
warm-up run), as an installed package runs: pip writes every module's .pyc when it installs. (c) is
also measured without one (PYTHONDONTWRITEBYTECODE=1 and a fresh empty PYTHONPYCACHEPREFIX, so no
existing .pyc is read either): where the environment has no
__pycache__ (this project's venv on the bench machines), every module is compiled on each start.

Prints the medians, the ratios and whether the goals hold (b/a <= 3, c/a as processes <= 3,
peak RSS < 1 GB).

    .venv/bin/python bench/calibrate_bench.py [--records 100000] [--size 5000] [--repeats 3] [--json OUT]
    .venv/bin/python bench/calibrate_bench.py --records 10000000 --make-pool /tmp/p10m   # once, then
    .venv/bin/python bench/calibrate_bench.py --pool /tmp/p10m/pool.jsonl --code ../main --repeats 1

Standalone: nothing in the package imports this file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _shared import ROOT, peak_rss_mb  # noqa: E402

GOAL_RATIO = 3.0
# The same goal for the whole command as a user runs it: `quantkit calibrate` as a process against
# the parse as a process (both pay the interpreter's start; the command also its imports).
GOAL_COMMAND_RATIO = 3.0
GOAL_RSS_MB = 1000.0

# Words to vary the text of reused templates (every record gets different messages).
WORD_TEXT = (
    "red blue green silver black white compact large foldable wireless leather cotton steel glass "
    "bamboo ceramic portable waterproof premium classic vintage smart quiet bright soft warm"
)
WORDS = WORD_TEXT.split()
PRODUCT_TEXT = "kettle scarf lamp blender teapot backpack watch speaker jacket mug sneaker phone case"
PRODUCTS = PRODUCT_TEXT.split()


def _alias_table() -> dict[str, list[str]]:
    import yaml

    data = yaml.safe_load((ROOT / "calibration" / "taxonomy.yaml").read_text(encoding="utf-8"))
    return {task["name"]: [task["name"], *task.get("aliases", [])] for task in data["tasks"]}


def _vary(text: str, rng: random.Random) -> str:
    extra = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
    return f"{text} ({extra} {rng.choice(PRODUCTS)} #{rng.randint(0, 10**6)})"


def make_pool(folder: Path, records: int, *, per_task: int = 12, seed: int = 0) -> dict:
    """Write ``folder/pool.jsonl`` (``records`` lines) over the demo pool's media in ``folder/media``."""
    sys.path.insert(0, str(ROOT))
    from quantkit.zoo.demo_pool import write_demo_pool

    demo = write_demo_pool(folder / "demo", per_task=per_task, seed=seed)
    templates = [json.loads(line) for line in demo.jsonl.read_text(encoding="utf-8").splitlines() if line]
    for template in templates:  # media paths relative to the big pool's folder
        for key in ("images", "videos", "audios"):
            template[key] = [f"demo/{p}" for p in template.get(key) or []]
    aliases = _alias_table()
    text_tasks = [t for t in templates if not (t["images"] or t["videos"] or t["audios"])]
    rng = random.Random(seed)
    written: list[str] = []
    counts = {"records": 0, "text_only": 0, "duplicates": 0, "without_id": 0, "sharegpt": 0}
    pool = folder / "pool.jsonl"
    with open(pool, "w", encoding="utf-8") as handle:
        for index in range(records):
            if written and rng.random() < 0.02:  # an exact duplicate of an earlier record
                line = rng.choice(written)
                counts["duplicates"] += 1
            else:
                template = rng.choice(text_tasks) if rng.random() < 0.1 else rng.choice(templates)
                messages = [dict(turn) for turn in template["messages"]]
                messages[-1]["content"] = _vary(messages[-1]["content"], rng)
                if rng.random() < 0.3:
                    messages[0]["content"] = _vary(messages[0]["content"], rng)
                record: dict = {
                    "task": rng.choice(aliases[template["task"]]),
                    "images": template["images"],
                    "videos": template["videos"],
                    "audios": template["audios"],
                }
                if rng.random() < 0.8:
                    record["id"] = f"rec-{index:07d}"
                else:
                    counts["without_id"] += 1
                if rng.random() < 0.1:  # LLaMA-Factory's ShareGPT spelling
                    back = {"user": "human", "assistant": "gpt", "system": "system"}
                    record["conversations"] = [
                        {"from": back[t["role"]], "value": t["content"]} for t in messages
                    ]
                    counts["sharegpt"] += 1
                else:
                    record["messages"] = messages
                counts["text_only"] += not (template["images"] or template["videos"] or template["audios"])
                line = json.dumps(record, ensure_ascii=False)
                if len(written) < 5000:
                    written.append(line)
                elif rng.random() < 0.05:
                    written[rng.randrange(len(written))] = line
            handle.write(line + "\n")
            counts["records"] += 1
    media = [p for p in (folder / "demo" / "media").rglob("*") if p.is_file()]
    counts.update(
        {
            "media_files": len(media),
            "media_mb": round(sum(p.stat().st_size for p in media) / 2**20, 1),
            "pool_mb": round(pool.stat().st_size / 2**20, 1),
        }
    )
    return counts


# --- the measured children ------------------------------------------------------------------

# (a): the floor, as a process importing nothing else (the bench's own modules would add theirs).
PARSE_SCRIPT = """\
import json, sys, time
started = time.perf_counter()
n = 0
with open(sys.argv[1], "rb") as handle:
    for line in handle:
        json.loads(line)
        n += 1
print(json.dumps({"wall_s": time.perf_counter() - started, "lines": n}))
"""


def _env(code: Path, pycache: Path, *, cached: bool = True) -> dict:
    """The children's environment: ``code`` on the path, bytecode read from ``pycache`` only (no
    __pycache__ beside the sources); ``cached``: written there too, else nothing written (the
    caller passes a fresh empty folder, so every module is compiled)."""
    env = {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1", "PYTHONPYCACHEPREFIX": str(pycache)}
    if cached:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _timed(
    command: list[str], env: dict, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``command``: the finished process, its wall seconds and its CPU seconds (user + system,
    from the kernel's accounting of the reaped child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall, cpu


def child_build(pool: str, output: str, size: int) -> dict:
    import_started = time.perf_counter()
    from quantkit.calibset import CalibrateOptions, build_calibration_set

    import_s = time.perf_counter() - import_started
    probe_s = _time_media_probes()
    per_kind = _time_probes_per_kind()
    marks: list[tuple[str, float]] = []
    rss_before = peak_rss_mb()
    started = time.perf_counter()
    result = build_calibration_set(
        [Path(pool)],
        Path(output),
        CalibrateOptions(size=size, force=True),
        on_phase=lambda phase: marks.append((phase, time.perf_counter())),
    )
    wall = time.perf_counter() - started
    ends = [t for _, t in marks[1:]] + [started + wall]
    return {
        "wall_s": wall,
        "phases_s": {"taxonomy and setup": (marks[0][1] if marks else started + wall) - started}
        | {phase: end - t for (phase, t), end in zip(marks, ends, strict=True)},
        "media_probes_s": probe_s[0],
        "probes_per_kind": per_kind,
        "import_s": import_s,
        "peak_rss_mb": peak_rss_mb(),
        "rss_after_imports_mb": rss_before,
        "size": result.report["size"],
        "pool_records": result.report["pool_records"],
        "duplicates_dropped": result.report["duplicates_dropped"],
        "strata": result.report["coverage"]["strata_in_pool"],
        "heavy_imports": sorted(
            m for m in ("torch", "transformers", "datasets", "llmcompressor") if m in sys.modules
        ),
    }


def _time_media_probes() -> list[float]:
    """Accumulate the time spent probing media headers (once per file) in the returned cell."""
    spent = [0.0]
    from quantkit.pool import parse

    probe = getattr(parse, "MediaProbe", None)
    if probe is None:
        return spent
    original = probe.__call__

    def call(self, kind, path):
        started = time.perf_counter()
        try:
            return original(self, kind, path)
        finally:
            spent[0] += time.perf_counter() - started

    probe.__call__ = call
    return spent


def _time_probes_per_kind() -> dict[str, list[float]]:
    """Seconds and count of the header probes per media kind (each file is probed once)."""
    from quantkit.pool import parse as reader  # where the probes are looked up at call time

    spent: dict[str, list[float]] = {}
    for kind in ("image", "video", "audio"):
        name = f"probe_{kind}"
        original = getattr(reader, name, None)
        if original is None:
            continue
        cell = spent.setdefault(kind, [0.0, 0])

        def probe(*args, _original=original, _cell=cell, **kwargs):
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                _cell[0] += time.perf_counter() - started
                _cell[1] += 1

        setattr(reader, name, probe)
    return spent


def _run_command(
    pool: str, output: str, size: int, code: Path, pycache: Path, *, cached: bool = True
) -> tuple[float, float]:
    """Whole-process wall and CPU seconds of `python -m quantkit calibrate`, as a user runs it."""
    pool, output = str(Path(pool).resolve()), str(Path(output).resolve())
    command = [sys.executable, "-m", "quantkit", "calibrate", pool, "--output", output, "--size", str(size)]
    # In ``code``: `python -m` puts the working folder first on sys.path, so from any other
    # checkout it would run that checkout's quantkit, not ``code``'s (PYTHONPATH comes after it).
    proc, wall, cpu = _timed([*command, "--force"], _env(code, pycache, cached=cached), cwd=code)
    if proc.returncode != 0:
        raise RuntimeError(f"quantkit calibrate failed:\n{proc.stderr[-3000:]}")
    return wall, cpu


def _run_parse(pool: str, pycache: Path) -> dict:
    """(a) as a process: its own wall time of the loop, and the whole process's wall and CPU."""
    proc, wall, cpu = _timed([sys.executable, "-c", PARSE_SCRIPT, pool], _env(ROOT, pycache))
    if proc.returncode != 0:
        raise RuntimeError(f"the parse failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"process_wall_s": wall, "process_cpu_s": cpu}


def _run_child(*args: str, code: Path, pycache: Path) -> dict:
    proc, wall, _ = _timed([sys.executable, __file__, "--child", *args], _env(code, pycache))
    if proc.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"process_wall_s": wall}


def run(
    records: int,
    size: int,
    repeats: int,
    *,
    workdir: Path | None = None,
    code: Path = ROOT,
    per_task: int = 12,
    existing: Path | None = None,
) -> dict:
    with tempfile.TemporaryDirectory(prefix="qk-calib-bench-", dir=workdir) as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        if existing is not None:  # a pool make_pool wrote before (its media beside it)
            pool = str(existing)
            pool_info = json.loads(Path(existing).with_suffix(".json").read_text())
        else:
            pool_info = make_pool(folder, records, per_task=per_task)
            pool = str(folder / "pool.jsonl")
        make_s = time.perf_counter() - started
        pycache = folder / "pycache"
        # Warm-up (not counted): fills the bytecode cache and the page cache.
        _run_parse(pool, pycache)
        _run_command(pool, str(folder / "set-command"), size, code, pycache)
        parses, builds, commands, uncached = [], [], [], []
        for _ in range(repeats):  # alternate: a b c c' a b c c' ...
            parses.append(_run_parse(pool, pycache))
            builds.append(_run_child("build", pool, str(folder / "set"), str(size), code=code, pycache=pycache))
            commands.append(_run_command(pool, str(folder / "set-command"), size, code, pycache))
            # a fresh empty prefix: PYTHONDONTWRITEBYTECODE alone would still read existing .pyc
            empty = Path(tempfile.mkdtemp(prefix="empty-pycache-", dir=folder))
            uncached.append(_run_command(pool, str(folder / "set-command"), size, code, empty, cached=False))
        parse_s = statistics.median(p["wall_s"] for p in parses)
        build_s = statistics.median(b["wall_s"] for b in builds)
        parse_process_s = statistics.median(p["process_wall_s"] for p in parses)
        command_s = statistics.median(wall for wall, _ in commands)
        command_uncached_s = statistics.median(wall for wall, _ in uncached)
        # CPU seconds, pair by pair (each command against the parse run just before it): what load
        # on the machine does not inflate as it does wall time.
        cpu_ratios = [c[1] / p["process_cpu_s"] for c, p in zip(commands, parses, strict=True)]
        kinds = sorted({k for b in builds for k in b["probes_per_kind"]})
        per_probe_ms = {
            kind: {
                "files": builds[-1]["probes_per_kind"][kind][1],
                "ms_per_file": round(
                    1000
                    * statistics.median(
                        b["probes_per_kind"][kind][0] / max(b["probes_per_kind"][kind][1], 1) for b in builds
                    ),
                    3,
                ),
            }
            for kind in kinds
        }
        peak = max(b["peak_rss_mb"] for b in builds)
        last = builds[-1]
        return {
            "records": records,
            "size": size,
            "repeats": repeats,
            "code": str(code),
            "pool": pool_info,
            "make_pool_s": round(make_s, 1),
            "parse_s": round(parse_s, 3),
            "build_s": round(build_s, 3),
            "ratio": round(build_s / parse_s, 2),
            "parse_runs_s": [round(p["wall_s"], 3) for p in parses],
            "build_runs_s": [round(b["wall_s"], 3) for b in builds],
            "build_import_s": round(statistics.median(b["import_s"] for b in builds), 3),
            "parse_process_s": round(parse_process_s, 3),
            "command_s": round(command_s, 3),
            "command_runs_s": [round(wall, 3) for wall, _ in commands],
            "ratio_command": round(command_s / parse_process_s, 2),
            "goal_command_met": command_s / parse_process_s <= GOAL_COMMAND_RATIO,
            "bytecode_cache": "PYTHONPYCACHEPREFIX in the work folder, filled by a warm-up run",
            "parse_process_cpu_s": round(statistics.median(p["process_cpu_s"] for p in parses), 3),
            "command_cpu_s": round(statistics.median(cpu for _, cpu in commands), 3),
            "parse_process_cpu_runs_s": [round(p["process_cpu_s"], 3) for p in parses],
            "command_cpu_runs_s": [round(cpu, 3) for _, cpu in commands],
            "ratio_command_cpu": round(statistics.median(cpu_ratios), 2),
            "command_uncached_s": round(command_uncached_s, 3),
            "command_uncached_runs_s": [round(wall, 3) for wall, _ in uncached],
            "ratio_command_uncached": round(command_uncached_s / parse_process_s, 2),
            "probe_ms_per_file": per_probe_ms,
            "build_phases_s": {
                phase: round(statistics.median(b["phases_s"].get(phase, 0.0) for b in builds), 3)
                for phase in builds[0]["phases_s"]
            },
            "media_probes_s": round(statistics.median(b["media_probes_s"] for b in builds), 3),
            "peak_rss_mb": round(peak, 1),
            "rss_after_imports_mb": round(last["rss_after_imports_mb"], 1),
            "selected": last["size"],
            "pool_records_usable": last["pool_records"],
            "duplicates_dropped": last["duplicates_dropped"],
            "strata": last["strata"],
            "heavy_imports": last["heavy_imports"],
            "goal_ratio_met": build_s / parse_s <= GOAL_RATIO,
            "goal_rss_met": peak < GOAL_RSS_MB,
        }


def report(result: dict) -> str:
    pool = result["pool"]
    ok = {True: "met", False: "NOT met"}
    lines = [
        f"pool: {result['records']:,} records ({pool['pool_mb']} MB JSONL; {pool['text_only']:,} text-only, "
        f"{pool['duplicates']:,} exact duplicates, {pool['without_id']:,} without id, {pool['sharegpt']:,} ShareGPT) "
        f"over {pool['media_files']} real media files ({pool['media_mb']} MB)",
        f"(a) read + json.loads every line (its own time in a bare python -c process): median {result['parse_s']:.3f} s  runs {result['parse_runs_s']}",
        f"(b) build_calibration_set(size={result['size']}): median {result['build_s']:.3f} s  "
        f"runs {result['build_runs_s']}  (+{result['build_import_s']:.2f} s imports, not counted; "
        "the child runs with the bytecode cache, as (c) does)",
        "    phases: "
        + ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in result["build_phases_s"].items())
        + f"; media header probes (once per file, inside reading) {result['media_probes_s']:.2f} s",
        f"    selected {result['selected']:,} of {result['pool_records_usable']:,} usable records, "
        f"{result['duplicates_dropped']:,} duplicates dropped, {result['strata']} strata",
        f"calibrate wall: {result['build_s']:.2f} s",
        f"peak RSS: {result['peak_rss_mb']:.0f} MB (after imports: {result['rss_after_imports_mb']:.0f} MB)",
        f"ratio b/a: {result['ratio']:.2f}",
        f"(c) `python -m quantkit calibrate` as a process, with the bytecode cache (the goal's verdict): median {result['command_s']:.3f} s "
        f"runs {result['command_runs_s']}; (a) as a process: {result['parse_process_s']:.3f} s; "
        f"ratio c/a: {result['ratio_command']:.2f} (goal <= {GOAL_COMMAND_RATIO:g}: {ok[result['goal_command_met']]}); "
        f"CPU: {result['command_cpu_s']:.3f} s against {result['parse_process_cpu_s']:.3f} s, "
        f"median of the pairs' ratios {result['ratio_command_cpu']:.2f} (bytecode cache: {result['bytecode_cache']})",
        f"(c) without a bytecode cache (PYTHONDONTWRITEBYTECODE=1, an empty PYTHONPYCACHEPREFIX): median {result['command_uncached_s']:.3f} s "
        f"runs {result['command_uncached_runs_s']}; ratio c/a: {result['ratio_command_uncached']:.2f}",
        "media probes per file: "
        + (
            ", ".join(f"{k} {v['ms_per_file']:.2f} ms ({v['files']} files)" for k, v in result["probe_ms_per_file"].items())
            or "not measured"
        ),
        f"heavy imports during calibrate: {', '.join(result['heavy_imports']) or 'none'}",
        f"goal ratio <= {GOAL_RATIO:g}: {ok[result['goal_ratio_met']]}; "
        f"goal peak RSS < {GOAL_RSS_MB:g} MB: {ok[result['goal_rss_met']]}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        _kind, pool, output, size = argv[1:]  # "build": the one child this script runs of itself
        out = child_build(pool, output, int(size))
        print(json.dumps(out))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-task", type=int, default=12, help="demo-pool records per task: the media set")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    parser.add_argument(
        "--make-pool", type=Path, help="only write a pool of --records records into this folder (and its figures)"
    )
    parser.add_argument(
        "--pool", type=Path, help="measure this pool (one --make-pool wrote) instead of writing one: "
        "the same pool for two --code checkouts"
    )
    parser.add_argument(
        "--code", type=Path, default=ROOT, help="the quantkit checkout to measure (default: this one)"
    )
    args = parser.parse_args(argv)
    if args.make_pool is not None:
        args.make_pool.mkdir(parents=True, exist_ok=True)
        info = make_pool(args.make_pool, args.records, per_task=args.per_task)
        (args.make_pool / "pool.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(info))
        return 0
    result = run(
        args.records, args.size, args.repeats, code=args.code.resolve(), per_task=args.per_task, existing=args.pool
    )
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
