"""The memory plan against what a run holds, and the plans of four real model sizes.

1. ``layers``: tiny Qwen2.5-Omni thinkers with 2, 4 and 8 decoder layers (the zoo model's
   widths), quantized with w4a16 (GPTQ) on the same text samples, each in a fresh process. Per
   layer count: the measured peak RSS (VmHWM) against the plan's host figure, and the decoder
   part alone (peak less the runtime and the model weights) against the plan's: flat in the layer
   count means the activation cache and the Hessians are one layer's, not the whole model's.
   ``--code DIR`` measures another checkout (main before this change: the basic pipeline).
2. ``real``: ``quantize``'s plan for the config-only folders in bench/configs (real shapes of
   Qwen2.5-Omni-7B, Qwen3-Omni-30B-A3B, Qwen3-VL-8B, Qwen2.5-VL-72B) with w4a16 on one GPU in
   bfloat16, 5,000 samples of 1,000 tokens, the host need (not this machine's spill decision);
   each plan's wall and CPU time from a fresh process, and the 1-minute load average after it. ``--readme docs/commands/quantize.md`` writes these rows
   as that page's table (between its ``memory-plan-table`` markers), so the table is never typed.

Each part writes its measurements, with the commit, the library versions and the load average that
went with them, into its key of ``--json`` (default bench/memory_plan.json; the other part's key
is kept), and renders RESULTS.md's "Memory plan (issue 16)" section from that file (``--results``,
default bench/RESULTS.md). ``render`` measures nothing: it rewrites the section (and with
``--readme`` the Markdown table (docs/commands/quantize.md)) from the stored file. Measuring another checkout (``--code``)
writes WORK/memory_plan.json and no RESULTS.md unless asked.

Run: python bench/memory_plan.py [layers|real|all|render] [--work DIR] [--code DIR] [--runs 2]
     [--json FILE] [--results RESULTS.md] [--readme docs/commands/quantize.md]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import ROOT, git_commit, library_versions, peak_rss_mb, replace_section, run_child  # noqa: E402

SCRIPT = Path(__file__).resolve()
LAYER_COUNTS = (2, 4, 8)
REAL = ("Qwen2.5-Omni-7B", "Qwen3-Omni-30B-A3B", "Qwen3-VL-8B", "Qwen2.5-VL-72B")
SAMPLES, SAMPLE_WORDS = 24, 320  # text samples of ~900 tokens each (the zoo tokenizer)
REAL_SAMPLES, REAL_TOKENS = 5000, 1000
MIB = 2**20
RECIPE = "w4a16"
HEADING = "## Memory plan (issue 16)"
RESULTS_JSON = ROOT / "bench" / "memory_plan.json"
GOAL = 0.25  # issue 16: the measured peak within 25% of the plan's estimate


def text_samples():
    from quantkit.models.inputs import Sample

    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "seven",
        "bright",
        "stars",
        "turn",
        "slowly",
    ]
    return [
        Sample(
            [
                {"role": "user", "content": f"Story {i}: tell it again, word by word."},
                {
                    "role": "assistant",
                    "content": " ".join(words[(i + j) % len(words)] for j in range(SAMPLE_WORDS)),
                },
            ]
        )
        for i in range(SAMPLES)
    ]


def build_variant(work: Path, layers: int) -> Path:
    """The tiny Qwen2.5-Omni thinker with ``layers`` decoder layers (random weights, seed 0)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from quantkit.zoo.models import build_zoo_model

    base = work / "models" / "tiny-qwen2.5-omni"
    if not (base / "config.json").is_file():
        build_zoo_model("tiny-qwen2.5-omni", base, seed=0, force=True)
    folder = work / "models" / f"omni-{layers}-layers"
    if (folder / "config.json").is_file():
        return folder
    config = AutoConfig.from_pretrained(base)
    config.text_config.num_hidden_layers = layers
    config.text_config.layer_types = ["full_attention"] * layers
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    for file in base.iterdir():
        if not (folder / file.name).exists() and file.suffix != ".safetensors":
            shutil.copy(file, folder / file.name)
    return folder


def child_quantize(model_dir: str, output: str) -> dict:
    from quantkit.quantize import quantize
    from quantkit.recipes import get_recipe

    result = quantize(
        Path(model_dir), Path(output), get_recipe(RECIPE), text_samples(), progress=False, force=True
    )
    memory = result.metadata.get("memory")
    return {"peak_rss_mb": peak_rss_mb(), "memory": memory, "pipeline": result.pipeline}


def child_runtime() -> dict:
    """RSS of a process that imported what quantize imports (the plan's runtime term)."""
    import llmcompressor  # noqa: F401
    import transformers  # noqa: F401

    import quantkit.quantize  # noqa: F401

    return {"peak_rss_mb": peak_rss_mb()}


def real_plan(config_dir: Path):
    """``quantize``'s plan for a real config: w4a16, one GPU, bfloat16, REAL_SAMPLES samples of
    REAL_TOKENS tokens, the host need (not this machine's spill decision)."""
    import torch

    from quantkit.models.inputs import Sample
    from quantkit.quantize import plan
    from quantkit.recipes import get_recipe

    samples = [Sample([{"role": "user", "content": "a text sample"}])] * REAL_SAMPLES
    return plan(
        Path(config_dir),
        get_recipe(RECIPE),
        samples,
        sample_tokens=[REAL_TOKENS] * REAL_SAMPLES,
        calibration_dtype=torch.bfloat16,
        host_memory=0,
        device="cuda",
        light_imports=True,
    )


def child_plan(config_dir: str) -> dict:
    from quantkit.cli.quantize import collector_paused  # what `quantize --dry-run` runs under

    started = time.perf_counter()
    with collector_paused():
        result = real_plan(Path(config_dir))
    return {
        "memory": result.memory,
        "counts": result.counts,
        "plan_s": time.perf_counter() - started,
        "cpu_s": time.process_time(),  # the whole process: interpreter, imports and the plan
    }


def provenance(code: Path = ROOT) -> dict:
    """What goes with a part's figures: when, the commit that measured them, the libraries, the
    machine's cores and its load average (other jobs share it)."""
    return {
        "measured": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(code),
        "versions": library_versions(),  # _shared.LIBRARIES, as every bench
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_before": load_average(),
    }


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def widths(folder: Path) -> dict:
    """The language model's widths of a built variant (its config.json)."""
    from transformers import AutoConfig

    text = AutoConfig.from_pretrained(folder).get_text_config()
    return {"hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size}


def layers(work: Path, code: Path, runs: int = 2) -> dict:
    """Each layer count quantized ``runs`` times, the runs alternated (run 1 of every count, then
    run 2, ...), each run with its own measure of the runtime."""
    part = provenance(code)
    folders = {count: build_variant(work, count) for count in LAYER_COUNTS}
    rows = {count: {"layers": count, "commit": part["commit"], "runs": []} for count in LAYER_COUNTS}
    for _ in range(runs):
        runtime = run_child(SCRIPT, "runtime", code=code)["peak_rss_mb"]
        for count, folder in folders.items():
            measured = run_child(SCRIPT, "quantize", str(folder), str(work / "out" / folder.name), code=code)
            row, run = (
                rows[count],
                {"peak_rss_mb": round(measured["peak_rss_mb"]), "runtime_mb": round(runtime)},
            )
            row["pipeline"] = measured["pipeline"]
            memory = measured.get("memory")
            if memory:  # checkouts before the memory plan record none
                host = memory["plan"]["host"]
                planned = {
                    "plan_host_mb": round(host["total"] / MIB),
                    "plan_runtime_mb": round(host["runtime"] / MIB),
                    "model_mb": round(host["model"] / MIB),
                    "plan_decoder_mb": round((host["total"] - host["runtime"] - host["model"]) / MIB),
                    "plan_loading_mb": round(host.get("loading", 0) / MIB),
                }
                if any(key in row and row[key] != value for key, value in planned.items()):
                    raise RuntimeError(
                        f"{count} layers: the plan changed between runs: {row} against {planned}"
                    )
                row.update(planned)
                part["tokens"] = memory["plan"]["tokens"]
                part["calibration_dtype"] = memory["plan"]["calibration_dtype"]
                run["decoder_mb"] = round(measured["peak_rss_mb"] - runtime - host["model"] / MIB)
                run["peak_vs_plan"] = round(measured["peak_rss_mb"] / row["plan_host_mb"], 3)
            row["runs"].append(run)
            print(json.dumps({"layers": count, **run}), flush=True)
    part.update(
        {
            "model": {"base": "tiny-qwen2.5-omni", **widths(folders[LAYER_COUNTS[0]])},
            "recipe": RECIPE,
            "samples": SAMPLES,
            "load_after": load_average(),
            "rows": list(rows.values()),
        }
    )
    return part


def real_row(name: str, memory: dict) -> dict:
    """One real config's plan as a row of the docs table (docs/commands/quantize.md) (sizes in GiB)."""
    return {
        "model": name,
        "recipe": RECIPE,
        "per_gpu_gib": memory["gib"]["per_gpu"],
        "hessians_gib": round(memory["per_gpu"]["hessians"] / 2**30, 2),
        "host_gib": memory["gib"]["host"],
        "model_gib": round(memory["host"]["model"] / 2**30, 1),
        "cache_gib": round(
            (memory["host"]["activation_cache"] + memory["host"]["captured_inputs"]) / 2**30, 1
        ),
        "disk_gib": memory["gib"]["disk"],
        "layer_solves": memory["layer_solves"],
    }


@contextlib.contextmanager
def bytecode_kept():
    """The children keep the bytecode Python compiles (under a temporary PYTHONPYCACHEPREFIX, the
    virtual environment untouched), as bench/startup.py's rows: what a dry run costs after the
    first, where Python may write its bytecode (``make install``)."""
    saved = {key: os.environ.get(key) for key in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    with tempfile.TemporaryDirectory(prefix="qk-plan-pycache-") as pycache:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = pycache
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def real(code: Path = ROOT) -> dict:
    part = provenance(code)
    with bytecode_kept():
        warm_up = ROOT / "bench" / "configs" / REAL[1]
        run_child(SCRIPT, "plan", str(warm_up), code=code)  # compiles the bytecode the counted runs read
        rows = [{**real_timed(name, code), "commit": part["commit"]} for name in REAL]
    part.update(
        {
            "recipe": RECIPE,
            "samples": REAL_SAMPLES,
            "tokens": REAL_TOKENS,
            "dtype": "bfloat16",
            "load_after": load_average(),
            "rows": rows,
        }
    )
    return part


def real_timed(name: str, code: Path = ROOT) -> dict:
    """One real config's plan in a fresh process: its row, the process's wall and CPU time."""
    started = time.perf_counter()
    result = run_child(SCRIPT, "plan", str(ROOT / "bench" / "configs" / name), code=code)
    row = real_row(name, result["memory"])
    row["plan_s"] = round(result["plan_s"], 1)
    row["plan_cpu_s"] = round(result["cpu_s"], 1)
    row["process_s"] = round(time.perf_counter() - started, 1)
    row["load_1min"] = round(os.getloadavg()[0], 2)  # the machine's load while it ran (2 cores here)
    print(json.dumps(row), flush=True)
    return row


TABLE_START, TABLE_END = (
    "<!-- memory-plan-table: bench/memory_plan.py real --readme -->",
    "<!-- /memory-plan-table -->",
)


def readme_table(rows: list[dict], *, commit: bool = False) -> str:
    """The rows of ``real`` as the Markdown table of docs/commands/quantize.md; ``commit``: with the commit that
    measured each row (RESULTS.md's copy)."""
    out = [
        "| model (LM quantized) | recipe | weights (bf16) | per GPU peak (of which GPTQ Hessians) "
        "| host peak: model + activation cache | checkpoint | layer solves | dry run (CPU) |"
        + (" commit |" if commit else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if commit else ""),
    ]
    for row in rows:
        out.append(
            f"| {row['model']} | {row['recipe']} | {row['model_gib']:.1f} GiB "
            f"| {row['per_gpu_gib']:.1f} GiB ({row['hessians_gib']:.1f}) "
            f"| {row['host_gib']:.0f} GiB ({row['model_gib']:.1f} + {row['cache_gib']:.1f}) "
            f"| {row['disk_gib']:.1f} GiB | {row['layer_solves']:,} | {row['plan_cpu_s']:.1f} s"
            + (f" (load {row['load_1min']:.1f}) |" if "load_1min" in row else " |")
            + (f" {row['commit']} |" if commit else "")
        )
    return "\n".join(out)


def write_readme_table(readme: Path, rows: list[dict]) -> None:
    """Replace the table between the page's markers with ``rows``."""
    from quantkit.fsutil import write_file_atomic

    text = readme.read_text(encoding="utf-8")
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: no {TABLE_START} ... {TABLE_END} markers to write the table between")
    table = f"{TABLE_START}\n{readme_table(rows)}\n{TABLE_END}"
    write_file_atomic(readme, text[:start] + table + text[end + len(TABLE_END) :])


# ---------------------------------------------------------------------- RESULTS.md


def spoken(values) -> str:
    """2, 4 and 8."""
    items = [str(v) for v in values]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def each_run(values, unit: str = "") -> str:
    return " / ".join(f"{v}" for v in values) + unit


def measured_line(part: dict) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in part["versions"].items() if version)
    return (
        f"Measured {part['measured']} at commit {part['commit']} ({versions}); {part['cores']} cores, load "
        f"average (1, 5, 15 min) before {' '.join(f'{v:.2f}' for v in part['load_before'])}, after "
        f"{' '.join(f'{v:.2f}' for v in part['load_after'])}."
    )


def layers_text(part: dict) -> list[str]:
    rows, model = part["rows"], part["model"]
    counts = [row["layers"] for row in rows]
    runs = max(len(row["runs"]) for row in rows)
    runtimes = sorted({run["runtime_mb"] for row in rows for run in row["runs"]})
    tokens = part.get("tokens")
    per_sample = f" of ~{tokens['total'] / tokens['samples']:,.0f} tokens" if tokens else ""
    labels = " / ".join(f"run {i + 1}" for i in range(runs))
    out = [
        f"**Peak host memory against the plan** (`layers`): tiny Qwen2.5-Omni thinkers ({model['base']}'s "
        f"widths: hidden {model['hidden_size']}, MLP {model['intermediate_size']}) with {spoken(counts)} decoder "
        f"layers, random weights, {part['recipe']} (GPTQ, the {rows[0].get('pipeline', '?')} pipeline on "
        f"captured decoder inputs), {part['samples']} text samples{per_sample}, "
        f"{part.get('calibration_dtype', '?')} calibration on the CPU, each quantize in a fresh process, "
        f'{runs} run(s) of every layer count, alternated. Peak is VmHWM of that process; "decoder part" is '
        f"the peak less the runtime (a process that imported torch, transformers, llmcompressor and quantkit, "
        f"measured before each run: {each_run(runtimes, ' MB')}) and the model; the plan's is its host total "
        "less its runtime and model terms. " + measured_line(part),
        "",
        f"| decoder layers | peak RSS ({labels}) | plan host | peak / plan | decoder part measured ({labels}) "
        "| plan's decoder part | commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratios = [f"{run['peak_vs_plan']:.2f}" for run in row["runs"] if "peak_vs_plan" in run]
        decoder = [run["decoder_mb"] for run in row["runs"] if "decoder_mb" in run]
        out.append(
            f"| {row['layers']} | {each_run([run['peak_rss_mb'] for run in row['runs']], ' MB')} "
            f"| {row.get('plan_host_mb', '-')} MB | {each_run(ratios) or '-'} "
            f"| {each_run(decoder, ' MB') if decoder else '-'} | {row.get('plan_decoder_mb', '-')} MB "
            f"| {row['commit']} |"
        )
    return out + [""] + layers_verdicts(rows)


def layers_verdicts(rows: list[dict]) -> list[str]:
    """What the table says against issue 16's goals, from its own figures."""
    planned = [row for row in rows if "plan_host_mb" in row]
    if not planned:
        return ["- The measured checkout records no memory plan: nothing to hold the peaks against."]
    ratios = [run["peak_vs_plan"] for row in planned for run in row["runs"]]
    outside = sorted(
        {row["layers"] for row in planned for run in row["runs"] if abs(run["peak_vs_plan"] - 1) > GOAL}
    )
    within = (
        f"Within {GOAL:.0%} of the plan at every layer count"
        if not outside
        else f"**Not** within {GOAL:.0%} of the plan at {spoken(outside)} decoder layers"
    )
    means = {row["layers"]: sum(r["decoder_mb"] for r in row["runs"]) / len(row["runs"]) for row in planned}
    spread = max(
        max(r["decoder_mb"] for r in row["runs"]) - min(r["decoder_mb"] for r in row["runs"])
        for row in planned
    )
    fewest, most = min(means), max(means)
    growth = means[most] - means[fewest]
    flat = (
        "flat in the layer count (the change is within the run-to-run spread)"
        if abs(growth) <= spread
        else "the change is beyond the run-to-run spread"
    )
    levels = [
        r["decoder_mb"] / row["plan_decoder_mb"]
        for row in planned
        for r in row["runs"]
        if row["plan_decoder_mb"]
    ]
    runtime = [r["runtime_mb"] for row in planned for r in row["runs"]]
    plan_runtime = planned[0]["plan_runtime_mb"]
    out = [
        f"- {within} (peak / plan {min(ratios):.2f}-{max(ratios):.2f}).",
        f"- The decoder part changes by {growth:+.0f} MB from {fewest} to {most} decoder layers (means of the "
        f"runs) and by up to {spread:.0f} MB between runs of the same model: {flat}.",
    ]
    if levels:
        out.append(
            f"- Its level is {min(levels):.2f}-{max(levels):.2f}x the plan's decoder part; the plan's runtime term "
            f"({plan_runtime} MB) is {plan_runtime - max(runtime):.0f}-{plan_runtime - min(runtime):.0f} MB above the "
            "bare imports measured here (quantkit's modules beyond them, a loaded processor), and the plan's host "
            "total carries that margin."
        )
    loading = sorted({row["plan_loading_mb"] for row in planned if "plan_loading_mb" in row})
    out.append(
        "- Beyond what these sizes show: loading a bfloat16 checkpoint in float32 holds the checkpoint's tensors "
        "while casting, which the plan counts where it exceeds what calibration holds (`host.loading`"
        + (f": {each_run(loading, ' MB')} in these plans" if loading else "")
        + "). The processor outputs of every sample (`prepared.rows`) are freed once the decoder inputs are "
        "captured; until then they sit next to the captured inputs, which the plan does not count (see "
        "docs/limits.md)."
    )
    return out


def real_text(part: dict) -> list[str]:
    return [
        f"**The four real plans** (`real`): {part['recipe']}, one GPU, {part['dtype']}, {part['samples']:,} "
        f"samples of {part['tokens']:,} tokens, the host need (not this machine's spill decision). The table in "
        "docs/commands/quantize.md is these rows (`--readme docs/commands/quantize.md` writes it). The dry run builds one decoder layer per kind "
        '(dense / sparse) and multiplies (`tests/test_plan.py` holds that to the whole-tree plan). "dry run '
        '(CPU)" is the CPU time of a fresh process that makes the plan in-process, with the 1-minute load '
        "average after it. " + measured_line(part),
        "",
        readme_table(part["rows"], commit=True),
    ]


def section(data: dict) -> str:
    """RESULTS.md's memory-plan section, every figure from ``data`` (bench/memory_plan.json)."""
    out = [
        "`bench/memory_plan.py` writes this section from `bench/memory_plan.json` (`layers` and `real` "
        "measure their part and store it there; `render` rewrites the section from the file).",
        "",
    ]
    out += layers_text(data["layers"]) if "layers" in data else ["_`layers` not measured yet._"]
    out.append("")
    out += real_text(data["real"]) if "real" in data else ["_`real` not measured yet._"]
    out += [
        "",
        'Start-up and dry-run CPU time on these configs as a user runs the command: the "Start-up and dry '
        'run" section below (`bench/startup.py`). The before/after timings of the plan at earlier commits '
        "are history: `git log -p -- bench/RESULTS.md`.",
    ]
    return "\n".join(out)


def stored(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def store(path: Path, key: str, part: dict) -> dict:
    """``part`` under ``key`` of the JSON at ``path``, the other parts kept; the whole record."""
    from quantkit.fsutil import write_file_atomic

    data = {**stored(path), key: part}
    write_file_atomic(path, json.dumps(data, indent=1) + "\n")
    return data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("part", nargs="?", default="all", choices=["layers", "real", "all", "render"])
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantkit-bench-memory"))
    parser.add_argument("--code", type=Path, default=ROOT)
    parser.add_argument("--runs", type=int, default=2, help="with layers: runs of every layer count")
    parser.add_argument(
        "--json", type=Path, help=f"the measurements (default {RESULTS_JSON.relative_to(ROOT)})"
    )
    parser.add_argument("--results", type=Path, help="the RESULTS.md to render (default bench/RESULTS.md)")
    parser.add_argument("--readme", type=Path, help="with real or render: write the table into this Markdown file (make: docs/commands/quantize.md)")
    parser.add_argument("--child", nargs="+")
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        result = {"quantize": child_quantize, "runtime": child_runtime, "plan": child_plan}[kind](*rest)
        print(json.dumps(result))
        return
    own = args.code.resolve() == ROOT  # another checkout's figures do not overwrite this one's
    path = args.json or (RESULTS_JSON if own else args.work / "memory_plan.json")
    results = args.results or (ROOT / "bench" / "RESULTS.md" if own else None)
    data = stored(path)
    if args.part in ("layers", "all"):
        args.work.mkdir(parents=True, exist_ok=True)
        data = store(path, "layers", layers(args.work, args.code, args.runs))
    if args.part in ("real", "all"):
        data = store(path, "real", real(args.code))
    if args.part != "render":
        print(f"wrote {path}")
    if args.readme and "real" in data:
        write_readme_table(args.readme, data["real"]["rows"])
        print(f"wrote the table into {args.readme}")
    if results:
        replace_section(results, HEADING, section(data))
        print(f"wrote the {HEADING.removeprefix('## ')} section of {results}")


if __name__ == "__main__":
    main()
