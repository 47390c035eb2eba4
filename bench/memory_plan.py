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
   each plan's wall and CPU time from a fresh process, and the 1-minute load average after it. ``--readme README.md`` writes these rows
   as the README's table (between its ``memory-plan-table`` markers), so the table is never typed.

Run: python bench/memory_plan.py [layers|real|all] [--work DIR] [--code DIR] [--readme README.md]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import ROOT, peak_rss_mb, run_child  # noqa: E402

SCRIPT = Path(__file__).resolve()
LAYER_COUNTS = (2, 4, 8)
REAL = ("Qwen2.5-Omni-7B", "Qwen3-Omni-30B-A3B", "Qwen3-VL-8B", "Qwen2.5-VL-72B")
SAMPLES, SAMPLE_WORDS = 24, 320  # text samples of ~900 tokens each (the zoo tokenizer)
REAL_SAMPLES, REAL_TOKENS = 5000, 1000
MIB = 2**20


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
        Path(model_dir), Path(output), get_recipe("w4a16"), text_samples(), progress=False, force=True
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
        get_recipe("w4a16"),
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


def layers(work: Path, code: Path) -> list[dict]:
    runtime = run_child(SCRIPT, "runtime", code=code)["peak_rss_mb"]
    rows = []
    for count in LAYER_COUNTS:
        folder = build_variant(work, count)
        measured = run_child(SCRIPT, "quantize", str(folder), str(work / "out" / folder.name), code=code)
        row = {"layers": count, "peak_rss_mb": round(measured["peak_rss_mb"]), "runtime_mb": round(runtime)}
        row["pipeline"] = measured["pipeline"]
        memory = measured.get("memory")
        if memory:  # checkouts before the memory plan record none
            host = memory["plan"]["host"]
            row["plan_host_mb"] = round(host["total"] / MIB)
            row["model_mb"] = round(host["model"] / MIB)
            row["plan_decoder_mb"] = round((host["total"] - host["runtime"] - host["model"]) / MIB)
            row["decoder_mb"] = round(measured["peak_rss_mb"] - runtime - host["model"] / MIB)
            row["peak_vs_plan"] = round(measured["peak_rss_mb"] / row["plan_host_mb"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def real_row(name: str, memory: dict) -> dict:
    """One real config's plan as a row of the README's table (sizes in GiB)."""
    return {
        "model": name,
        "recipe": "w4a16",
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


def real() -> list[dict]:
    with bytecode_kept():
        run_child(SCRIPT, "plan", str(ROOT / "bench" / "configs" / REAL[1]))  # the warm-up compiles it
        return [real_timed(name) for name in REAL]


def real_timed(name: str) -> dict:
    """One real config's plan in a fresh process: its row, the process's wall and CPU time."""
    started = time.perf_counter()
    result = run_child(SCRIPT, "plan", str(ROOT / "bench" / "configs" / name))
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


def readme_table(rows: list[dict]) -> str:
    """The rows of ``real`` as the README's Markdown table."""
    out = [
        "| model (LM quantized) | recipe | weights (bf16) | per GPU peak (of which GPTQ Hessians) "
        "| host peak: model + activation cache | checkpoint | layer solves | dry run (CPU) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        out.append(
            f"| {row['model']} | {row['recipe']} | {row['model_gib']:.1f} GiB "
            f"| {row['per_gpu_gib']:.1f} GiB ({row['hessians_gib']:.1f}) "
            f"| {row['host_gib']:.0f} GiB ({row['model_gib']:.1f} + {row['cache_gib']:.1f}) "
            f"| {row['disk_gib']:.1f} GiB | {row['layer_solves']:,} | {row['plan_cpu_s']:.1f} s"
            + (f" (load {row['load_1min']:.1f}) |" if "load_1min" in row else " |")
        )
    return "\n".join(out)


def write_readme_table(readme: Path, rows: list[dict]) -> None:
    """Replace the table between the README's markers with ``rows``."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: no {TABLE_START} ... {TABLE_END} markers to write the table between")
    table = f"{TABLE_START}\n{readme_table(rows)}\n{TABLE_END}"
    readme.write_text(text[:start] + table + text[end + len(TABLE_END) :], encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("part", nargs="?", default="all", choices=["layers", "real", "all"])
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantkit-bench-memory"))
    parser.add_argument("--code", type=Path, default=ROOT)
    parser.add_argument("--readme", type=Path, help="with real: write the table into this README")
    parser.add_argument("--child", nargs="+")
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        result = {"quantize": child_quantize, "runtime": child_runtime, "plan": child_plan}[kind](*rest)
        print(json.dumps(result))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    if args.part in ("layers", "all"):
        layers(args.work, args.code)
    if args.part in ("real", "all"):
        rows = real()
        if args.readme:
            write_readme_table(args.readme, rows)
            print(f"wrote the table into {args.readme}")


if __name__ == "__main__":
    main()
