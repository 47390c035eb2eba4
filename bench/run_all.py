"""Run the CPU benchmarks and write bench/RESULTS.md (issue 7).

  1. calibrate: 100,000-record pool -> 5,000-sample set, against reading + parsing the pool
  2. quantize overhead: quantkit against a plain llmcompressor script, alternated
  3. feature cache and checkpoint sizes: four recipes sharing one cache_dir
  4. GPU serving speed: bench/gpu_vllm.py (skips without CUDA)

Every figure is a ratio of two things measured in the same run (machines are noisy); the load
average before and after is recorded too, and the run's own wall time (5 alternated repeats).

    .venv/bin/python bench/run_all.py [--output bench/RESULTS.md] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import cache_and_size  # noqa: E402
import calibrate_bench  # noqa: E402
import quantize_overhead  # noqa: E402
from _shared import REAL_WEIGHTS_HEADING, ROOT, child_env, cpu_model, library_versions, read_section  # noqa: E402


def machine() -> dict:
    import psutil

    return {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "os": platform.platform(),
    }


def versions() -> dict:
    """_shared.LIBRARIES' versions (the list every bench records and keys by) and quantkit's."""
    found = library_versions()
    import quantkit

    found["quantkit"] = quantkit.__version__
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        found["quantkit"] += f" (git {commit}{', with local changes' if dirty else ''})"
    except (OSError, subprocess.CalledProcessError):
        pass
    return found


def load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def gpu_section() -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_vllm.py")],
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    return (proc.stdout + proc.stderr).strip() or f"exit {proc.returncode}"


def mix(modalities: dict[str, int]) -> str:
    return "(" + ", ".join(f"{n} {kind}" for kind, n in modalities.items()) + ")"


def processor_share(s: dict) -> float:
    """Of the preprocess time the second recipe in the same process saves, the processor load's part."""
    cold, same = s["cold"], s["warm_same_process"]
    saved = cold["preprocess_s"] - same["preprocess_s"]
    return (cold["processor_s"] - same["processor_s"]) / saved if saved > 0 else 0.0


def yes(flag: bool) -> str:
    return "met" if flag else "**not met**"


def render(
    m: dict,
    v: dict,
    started: str,
    wall: float,
    loads: tuple[str, str],
    c: dict,
    q: dict,
    s: dict,
    gpu: str,
    real_weights: str | None = None,
) -> str:
    """RESULTS.md; ``real_weights`` is the section bench/mixed_precision.py wrote (kept as is)."""
    pool = c["pool"]
    command_goal = calibrate_bench.GOAL_COMMAND_RATIO
    lines = [
        "# Benchmark results",
        "",
        f"Written by `bench/run_all.py` on {started} in {wall / 60:.1f} min. Each figure is a ratio of two",
        "things measured in the same run, alternated where it matters, each run in a fresh process.",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM; Python {m['python']}; {m['os']}",
        f"- load average (1/5/15 min) before: {loads[0]}; after: {loads[1]} (other work on the machine inflates",
        "  wall times; ratios of alternated runs cancel most of it)",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "",
        "## Calibrate (issue 3)",
        "",
        f"A pool of {c['records']:,} records ({pool['pool_mb']} MB of JSONL: varied text, task aliases, "
        f"{pool['text_only']:,} text-only, {pool['duplicates']:,} exact duplicates, "
        f"{pool['without_id']:,} without id, {pool['sharegpt']:,} in ShareGPT spelling) over "
        f"{pool['media_files']} real media files ({pool['media_mb']} MB, the demo pool's images, videos and audio).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| (a) read + `json.loads` every line (the loop's own time in a bare `python -c` process), median of "
        f"{c['repeats']} | {c['parse_s']:.3f} s |",
        f"| (b) `build_calibration_set(size={c['size']:,})` (its own time in a child process that runs with the "
        f"bytecode cache, as (c) does; imports not counted), median of {c['repeats']} | {c['build_s']:.3f} s |",
        f"| ratio b/a (goal <= {calibrate_bench.GOAL_RATIO:g}) | **{c['ratio']:.2f}** ({yes(c['goal_ratio_met'])}) |",
        f"| (c) `python -m quantkit calibrate` as a process (interpreter start and imports included), with the "
        f"bytecode cache a pip-installed package has from its first run on (a cache folder a warm-up run filled; "
        f"the second and later runs a user makes), median of {c['repeats']} | {c['command_s']:.3f} s |",
        f"| ratio c/a with that cache, both as processes ((a) as a process, a bare `python -c` of the loop: "
        f"{c['parse_process_s']:.3f} s; goal <= {command_goal:g}; **the goal verdict uses this row**) | "
        f"**{c['ratio_command']:.2f}** ({yes(c['goal_command_met'])}) |",
        f"| the same pairs in CPU seconds (kernel accounting: (c) {c['command_cpu_s']:.3f} s, (a) "
        f"{c['parse_process_cpu_s']:.3f} s), median of the pairs' ratios | {c['ratio_command_cpu']:.2f} |",
        f"| (c) without a bytecode cache (nothing read or written: a first run, or a venv without `__pycache__`; "
        f"every module compiled), median of {c['repeats']} | {c['command_uncached_s']:.3f} s |",
        f"| ratio c/a without the cache (not the goal's verdict) | {c['ratio_command_uncached']:.2f} |",
        f"| of (c), beyond (b): interpreter start, imports, the CLI's progress and tables, (c) - (b) | "
        f"{c['command_s'] - c['build_s']:.2f} s |",
        f"| (b) that c/a <= {command_goal:g} leaves room for, {command_goal:g} x (a as a process) - ((c) - (b)) | "
        f"{command_goal * c['parse_process_s'] - (c['command_s'] - c['build_s']):.2f} s |",
        f"| peak RSS of (b), fresh process (goal < {calibrate_bench.GOAL_RSS_MB:g} MB) | **{c['peak_rss_mb']:.0f} MB** "
        f"({yes(c['goal_rss_met'])}) |",
        f"| of (b): media header probes, once per file ({pool['media_files']} files) | {c['media_probes_s']:.3f} s |",
        f"| ratio without the probes, (b - probes)/a | {(c['build_s'] - c['media_probes_s']) / c['parse_s']:.2f} |",
        f"| torch / transformers imported by a plain calibrate | {', '.join(c['heavy_imports']) or 'neither'} |",
        f"| selected / usable / duplicates dropped / strata | {c['selected']:,} / {c['pool_records_usable']:,} / "
        f"{c['duplicates_dropped']:,} / {c['strata']} |",
        "",
        f"Runs (s): parse {c['parse_runs_s']}, build {c['build_runs_s']}, command {c['command_runs_s']}, "
        f"command without a bytecode cache {c['command_uncached_runs_s']}. "
        "Phases of (b) (median s): "
        + ", ".join(f"{k} {val:.2f}" for k, val in c["build_phases_s"].items())
        + f". (b) leaves out the build's own imports ({c['build_import_s']:.2f} s); (c) counts them, and the "
        "CLI's. The imports of PyAV and Pillow the first probes trigger are in both. Probes scale with distinct "
        "media files, the rest with records: a pool whose every record has its own media is dominated by probes"
        + (
            " (measured in (b), median per file: "
            + ", ".join(f"{kind} {v['ms_per_file']:.2f} ms" for kind, v in c["probe_ms_per_file"].items())
            + ")."
            if c.get("probe_ms_per_file")
            else "."
        ),
        "",
        "## Quantize overhead (issue 7)",
        "",
        f"`quantkit.quantize.quantize` against a plain llmcompressor script on {q['model']}, recipe {q['recipe']}, "
        f"{q['samples']} samples {mix(q['modalities'])} turned into the same processor inputs, same GPTQ settings, "
        "same ignore list, same pipeline, both calibrating in float32; each includes model load, calibration "
        f"and save; {q['repeats']} runs each, alternated, fresh processes.",
        "",
        "| measure | quantkit | plain | ratio |",
        "|---|---|---|---|",
        f"| wall, whole process (median) | {q['quantkit_process_s']:.2f} s | {q['plain_process_s']:.2f} s | "
        f"**{q['ratio_process']:.3f}** (goal <= {quantize_overhead.GOAL_RATIO:g}: {yes(q['goal_met'])}) |",
        f"| wall after the script's imports | {q['quantkit_work_s']:.2f} s | {q['plain_work_s']:.2f} s | "
        f"{q['ratio_work']:.3f} |",
        f"| peak RSS | {q['quantkit_peak_rss_mb']} MB | {q['plain_peak_rss_mb']} MB | {q['ratio_rss']:.3f} |",
        f"| difference of the medians (whole process) | {q['quantkit_process_s'] - q['plain_process_s']:+.2f} s | | |",
        "",
        f"quantkit's own steps (timed below) are {q['quantkit_checks_total_s']:.2f} s, "
        f"{100 * q['quantkit_checks_total_s'] / q['plain_process_s']:.1f}% of the plain run: the overhead the checks "
        "cost, measured directly. The run-to-run spread of both (below) is wider than the 5% the ratio goal "
        "resolves on a loaded machine, so read the ratio together with that figure.",
        "",
        f"Runs (s): quantkit {q['quantkit_runs_s']}, plain {q['plain_runs_s']}. The plain script imports "
        f"llmcompressor and transformers' processor code up front ({q['plain_import_s']:.1f} s of imports); quantkit "
        f"imports them when first used ({q['quantkit_import_s']:.1f} s before `quantize` starts), so only the "
        "whole-process ratio compares like with like.",
        "",
        f"quantkit's stages (median s): {q['quantkit_stage_times_s']}. Its own steps, timed inside its runs "
        f"(median), {q['quantkit_checks_total_s']:.2f} s in all:",
        "",
        "| step | seconds |",
        "|---|---|",
        *[f"| {k} | {val:.3f} |" for k, val in q["quantkit_checks_s"].items()],
        f"| (the library's `save_pretrained` inside quantkit's write, not quantkit's) | {q['library_save_s']:.3f} |",
        "",
        f"Both checkpoints hold the same int4 packed weights: {q['same_packed_weights']} "
        f"({q['packed_tensors']} tensors"
        + (
            "), i.e. the library did the same work in both."
            if q["same_packed_weights"]
            else f"; {len(q.get('differing_packed', []))} differ, the first "
            f"`{(q.get('differing_packed') or ['?'])[0]}`), so the two runs did not compute the same "
            "thing and the time ratio compares different work: compare what GPTQ sees layer by layer."
        ),
        "",
        "Both calibrate layer by layer through llmcompressor's sequential pipeline (each layer on the "
        "outputs of the already-quantized layers before it): the plain script on the whole model, quantkit "
        "on the decoder alone, with the decoder's inputs captured once per sample. "
        + (
            "The two differed from "
            "issue 16's capture (the towers ran under the model's own sdpa attention, the library runs every "
            "calibration forward with eager attention: the vision tower's outputs differed in the last float32 "
            "bit at the image and video positions, the text positions were identical, GPTQ rounded a few "
            "layer-0 weights the other way and each later layer inherited it) until the capture ran under the "
            "library's `calibration_forward_context`; `tests/test_capture.py` holds quantkit's int4 weights "
            "to a plain whole-model `oneshot`'s, bit for bit."
            if q["same_packed_weights"]
            else "In this run their int4 weights do NOT agree, although `tests/test_capture.py` holds "
            "quantkit's to a plain whole-model `oneshot`'s bit for bit on the tiny models: something in this "
            "bench's setup (model, samples, settings) differs from what that test covers; find it before "
            "reading the time ratio."
        ),
        "",
        "## Feature cache (issue 7)",
        "",
        f"`stage_times_s['preprocess']` of `quantize` calls sharing one `cache_dir` ({s['model']}, "
        f"{s['samples']} samples {mix(s['modalities'])}). The stage loads the processor, then prepares features "
        "(decode media, run the processor) or reads them from the cache.",
        "",
        "| call | preprocess stage | processor load | prepare_features | processed / from cache |",
        "|---|---|---|---|---|",
    ]
    for label, key in (
        ("cold, fresh process", "cold"),
        ("second recipe, same process", "warm_same_process"),
        ("another recipe, fresh process", "warm_fresh_process"),
    ):
        x = s[key]
        lines.append(
            f"| {label} ({x['recipe']}) | {x['preprocess_s']:.2f} s | {x['processor_s']:.2f} s | "
            f"{x['features_s']:.3f} s | {x['preprocessed']} / {x['cache_hits']} |"
        )
    lines += [
        "",
        f"- the cache's own effect, `prepare_features` cold against warm (what the cache replaces): "
        f"**{s['speedup_features']}x** (goal >= {cache_and_size.GOAL_CACHE_SPEEDUP:g}x: {yes(s['goal_cache_met'])})",
        f"- the whole preprocess stage, second recipe in the same process (as `quantkit build` runs its recipes): "
        f"{s['speedup_same_process']}x; {processor_share(s):.0%} of the time it saves is the processor load "
        "being warm in that process, not the cache",
        f"- the whole stage in a fresh process (a second `quantkit quantize` command): {s['speedup_fresh_process']}x: "
        "the stage is then dominated by loading the processor, i.e. transformers' first import of its processor "
        "code, which no feature cache can save",
        "",
        "## Checkpoint size (issue 7)",
        "",
        f"Language-model weight bytes as stored (quantized weights, scales, zero points, shapes) over the same "
        f"weights in bf16: `audit_checkpoint(...).size_ratio`, {s['model']}.",
        "",
        "| recipe | format | size vs bf16 | audit |",
        "|---|---|---|---|",
    ]
    for recipe, x in s["sizes"].items():
        audit = "passed" if x["audit_passed"] else f"FAILED: {', '.join(x['audit_failed'])}"
        lines.append(f"| {recipe} | {x['format']} | **{x['size_ratio']:.4f}x** | {audit} |")
    lines += [
        "",
        "Physical floor of W4A16 as shipped, group 128, bf16 scales and 4-bit zero points: "
        f"(4 + 16/128 + 4/128) / 16 = **{s['w4a16_g128_floor']:.4f}x** (plus 16 bytes of `weight_shape` per layer; "
        f"without zero points (4 + 16/128) / 16 = {(4 + 16 / 128) / 16:.4f}x). "
        "8-bit schemes: 0.5x plus one 16-bit scale per output channel (per-channel) or per tensor (static FP8).",
        "",
        REAL_WEIGHTS_HEADING,
        "",
        real_weights
        or "_Not measured yet: `make bench-real` (bench/mixed_precision.py) writes this section._",
        "",
        "## GPU serving speed (vLLM)",
        "",
        "`bench/gpu_vllm.py --bf16 MODEL --quantized CKPT...` measures seconds per sample and output tokens/s per "
        "modality (image, audio, short video, long video, text) and the speed-up over bf16, in the shape of the "
        "seed article's table 7. It needs CUDA and vLLM; on this machine it said:",
        "",
        "```",
        gpu,
        "```",
        "",
    ]
    return "\n".join(lines)


# The sections run_all writes, and the names they had before (none renamed yet): a section under
# one of these names in RESULTS.md is run_all's own, never another bench's, so a renamed section
# does not leave its stale copy behind.
OWN_HEADINGS = (
    "## Calibrate (issue 3)",
    "## Quantize overhead (issue 7)",
    "## Feature cache (issue 7)",
    "## Checkpoint size (issue 7)",
    REAL_WEIGHTS_HEADING,
    "## GPU serving speed (vLLM)",
)
FORMER_HEADINGS: tuple[str, ...] = ()


def with_other_sections(text: str, path: Path) -> str:
    """``text`` followed by every section of the RESULTS.md at ``path`` that run_all does not
    write (the start-up, memory-plan, token-weight and skills benches write their own), as they
    are: rewriting the file must not erase another bench's figures."""
    if not path.is_file():
        return text
    mine = {line for line in text.splitlines() if line.startswith("## ")} | {*OWN_HEADINGS, *FORMER_HEADINGS}
    theirs = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("## ")]
    kept = [f"{heading}\n\n{read_section(path, heading)}\n" for heading in theirs if heading not in mine]
    return "\n".join([text.rstrip("\n") + "\n", *kept])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument("--json", type=Path, help="also write every figure as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, 1 repeat: checks the scripts, not the figures"
    )
    parser.add_argument("--render", type=Path, help="only rewrite --output from the --json of an earlier run")
    args = parser.parse_args(argv)
    if args.render:
        d = json.loads(args.render.read_text(encoding="utf-8"))
        r = d["run"]
        text = render(
            d["machine"], d["versions"], r["started"], r["wall_s"], tuple(r["load"]),
            d["calibrate"], d["quantize"], d["cache_and_size"], d["gpu"],
            read_section(args.output, REAL_WEIGHTS_HEADING),
        )  # fmt: skip
        from quantkit.fsutil import write_file_atomic  # imported late: the load figures come first

        write_file_atomic(args.output, with_other_sections(text, args.output))
        return 0
    records, size, repeats, samples = (100_000, 5000, 5, 8) if not args.quick else (5000, 500, 1, 2)
    started_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    started = time.perf_counter()
    load_before = load()
    m, v = machine(), versions()
    with tempfile.TemporaryDirectory(prefix="qk-bench-") as tmp:
        work = Path(tmp)
        print(f"[1/4] calibrate: {records:,} records -> {size:,}", flush=True)
        c = calibrate_bench.run(records, size, repeats, workdir=work)
        print(calibrate_bench.report(c), flush=True)
        print(f"[2/4] quantize overhead: {samples} samples, {repeats} runs each", flush=True)
        q = quantize_overhead.run(samples, repeats, work / "quantize")
        print(quantize_overhead.report(q), flush=True)
        print("[3/4] feature cache and checkpoint sizes", flush=True)
        s = cache_and_size.run(samples, work / "quantize")
        print(cache_and_size.report(s), flush=True)
    print("[4/4] GPU serving speed", flush=True)
    gpu = gpu_section()
    print(gpu, flush=True)
    wall = time.perf_counter() - started
    real_weights = read_section(args.output, REAL_WEIGHTS_HEADING)  # a separate, longer bench
    text = render(m, v, started_at, wall, (load_before, load()), c, q, s, gpu, real_weights)
    from quantkit.fsutil import write_file_atomic  # imported late: the load figures come first

    write_file_atomic(args.output, with_other_sections(text, args.output))
    if args.json:
        payload = {
            "machine": m,
            "versions": v,
            "calibrate": c,
            "quantize": q,
            "cache_and_size": s,
            "gpu": gpu,
            "run": {"started": started_at, "wall_s": wall, "load": [load_before, load()]},
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output} ({wall / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
