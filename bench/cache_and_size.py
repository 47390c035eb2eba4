"""Benchmark the feature cache and the checkpoint sizes (issue 7).

Four ``quantize`` calls on one tiny zoo model and one set of calibration samples, sharing one
``cache_dir``:

  1. w4a16         cold, fresh process: every sample decoded, run through the processor, cached
  2. fp8 (static)  warm, same process as 1 (as ``quantkit build`` runs several recipes)
  3. w8a8-sq-gptq  warm, fresh process (as a second ``quantkit quantize`` command)
  4. fp8-dynamic   data-free, fresh process

Feature cache: its own effect is ``prepare_features`` (what the cache replaces: decoding media and
running the processor) cold against warm (goal: >= 5x). Beside it, ``stage_times_s["preprocess"]``
of the cold run against the warm ones, which adds loading the processor: in the same process that
load is warm too (transformers' lazy imports done once), in a fresh process it dominates and no
cache can save it.

Size: ``audit_checkpoint(out).size_ratio`` per recipe, i.e. the language model's stored weight
bytes (quantized weights, scales, zero points, shapes) over the same weights in 16 bits; each
checkpoint's audit must pass. The physical floor of W4A16 with group 128 and 16-bit scales is
(4 + 16/128) / 16 = 33/128 = 0.2578.

    .venv/bin/python bench/cache_and_size.py [--samples 8] [--workdir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _shared import build_model, build_samples, median, modality_mix, peak_rss_mb, run_child  # noqa: E402

GOAL_CACHE_SPEEDUP = 5.0
# The shipped w4a16: 4-bit weights plus one 16-bit scale and one 4-bit zero point per 128 weights.
W4A16_G128_FLOOR = (4 + 16 / 128 + 4 / 128) / 16


def child(model_dir: str, samples_json: str, cache_dir: str, out_root: str, recipes: str) -> dict:
    """``quantize`` each recipe (comma-separated) in turn in this one process, like ``quantkit
    build`` does; audit each checkpoint."""
    from _shared import load_samples

    import quantkit.features.processor as processor_stage
    from quantkit.models.adapters import Adapter
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe
    from quantkit.verify.audit import audit_checkpoint

    spent = {"features": 0.0, "processor": 0.0}

    def timed(function, bucket: str):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[bucket] += time.perf_counter() - started

        return wrapper

    # the cache's own share, where the quantize stage looks it up
    processor_stage.prepare_features = timed(processor_stage.prepare_features, "features")
    Adapter.load_processor = timed(Adapter.load_processor, "processor")  # the rest of the stage
    samples, labels = load_samples(Path(samples_json))
    results = []
    for recipe in recipes.split(","):
        spent.update(features=0.0, processor=0.0)
        clock = time.perf_counter()
        output = Path(out_root) / f"ckpt-{recipe}"
        result = quantize(
            Path(model_dir),
            output,
            resolve_recipe(recipe),
            samples,
            sample_labels=labels,
            cache_dir=Path(cache_dir),
            progress=False,
            force=True,
        )
        wall = time.perf_counter() - clock
        audit = audit_checkpoint(output)
        results.append(
            {
                "recipe": recipe,
                "stage_times_s": result.stage_times_s,
                "features_s": spent["features"],
                "processor_s": spent["processor"],
                "cache_hits": result.cache_hits,
                "preprocessed": result.preprocessed,
                "quantize_s": wall,
                "checkpoint_format": result.checkpoint_format,
                "size_ratio": audit.size_ratio,
                "lm_bytes_16bit": audit.language_model_bytes_16bit,
                "lm_bytes_stored": audit.language_model_bytes_stored,
                "audit_passed": audit.passed,
                "audit_failed": [c.name for c in audit.checks if not c.passed],
            }
        )
    return {"results": results, "peak_rss_mb": peak_rss_mb(), "process_s": time.perf_counter() - STARTED}


# Which recipes run in which process: the first two share one (as `quantkit build` runs several
# recipes), the others start fresh, so the cache is seen both ways.
PROCESSES = (("w4a16", "fp8"), ("w8a8-sq-gptq",), ("fp8-dynamic",))


def run(samples: int, workdir: Path) -> dict:
    here = Path(__file__).resolve()
    model_dir = build_model(workdir)
    samples_json = build_samples(workdir, model_dir, samples)
    cache = workdir / "feature-cache"
    if cache.exists():
        shutil.rmtree(cache)  # the first call must be cold
    runs = []
    for recipes in PROCESSES:
        child_result = run_child(
            here, str(model_dir), str(samples_json), str(cache), str(workdir), ",".join(recipes)
        )
        for index, entry in enumerate(child_result["results"]):
            entry["process"] = "same process as the previous" if index else "fresh process"
            runs.append(entry)
    by_recipe = {r["recipe"]: r for r in runs}
    cold, same, fresh = by_recipe["w4a16"], by_recipe["fp8"], by_recipe["w8a8-sq-gptq"]

    def stage(r: dict) -> float:
        return r["stage_times_s"]["preprocess"]

    return {
        "model": model_dir.name,
        "samples": samples,
        "modalities": modality_mix(samples_json),
        "cold": {k: cold[k] for k in ("recipe", "preprocessed", "cache_hits", "features_s", "processor_s")}
        | {"preprocess_s": stage(cold)},
        "warm_same_process": {
            k: same[k] for k in ("recipe", "preprocessed", "cache_hits", "features_s", "processor_s")
        }
        | {"preprocess_s": stage(same)},
        "warm_fresh_process": {
            k: fresh[k] for k in ("recipe", "preprocessed", "cache_hits", "features_s", "processor_s")
        }
        | {"preprocess_s": stage(fresh)},
        "speedup_same_process": round(stage(cold) / max(stage(same), 0.01), 1),
        "speedup_fresh_process": round(stage(cold) / max(stage(fresh), 0.01), 1),
        "speedup_features": round(
            cold["features_s"] / max(median([same["features_s"], fresh["features_s"]]), 1e-3), 1
        ),
        "goal_cache_met": cold["features_s"] / max(median([same["features_s"], fresh["features_s"]]), 1e-3)
        >= GOAL_CACHE_SPEEDUP,
        "sizes": {
            r["recipe"]: {
                "size_ratio": round(r["size_ratio"], 4),
                "format": r["checkpoint_format"],
                "lm_bytes_16bit": r["lm_bytes_16bit"],
                "lm_bytes_stored": r["lm_bytes_stored"],
                "audit_passed": r["audit_passed"],
                "audit_failed": r["audit_failed"],
            }
            for r in runs
        },
        "w4a16_g128_floor": round(W4A16_G128_FLOOR, 4),
        "runs": [
            {
                k: r[k]
                for k in ("recipe", "process", "stage_times_s", "cache_hits", "preprocessed", "quantize_s")
            }
            for r in runs
        ],
    }


def report(r: dict) -> str:
    cold, same, fresh = r["cold"], r["warm_same_process"], r["warm_fresh_process"]

    def line(label: str, x: dict) -> str:
        return (
            f"  {label}: {x['recipe']} preprocess stage {x['preprocess_s']:.2f} s = processor load "
            f"{x['processor_s']:.2f} s + features {x['features_s']:.3f} s "
            f"({x['preprocessed']} processed, {x['cache_hits']} from the cache)"
        )

    lines = [
        f"model {r['model']}, {r['samples']} samples {r['modalities']}",
        "feature cache (stage_times_s['preprocess'] of quantize calls sharing one cache_dir):",
        line("cold, fresh process", cold),
        line("warm, same process ", same),
        line("warm, fresh process", fresh),
        f"  the cache's own effect, prepare_features cold against warm: {r['speedup_features']}x "
        f"(goal >= {GOAL_CACHE_SPEEDUP:g}x: {'met' if r['goal_cache_met'] else 'NOT met'})",
        f"  whole preprocess stage: second recipe in the same process {r['speedup_same_process']}x faster "
        f"(processor load warm too); in a fresh process {r['speedup_fresh_process']}x",
        "size of the language model's weights against 16 bits (audit_checkpoint(...).size_ratio):",
    ]
    for recipe, s in r["sizes"].items():
        audit = "audit passed" if s["audit_passed"] else f"AUDIT FAILED: {s['audit_failed']}"
        lines.append(
            f"  {recipe:13s} {s['size_ratio']:.4f}x  ({s['lm_bytes_stored']:,} of {s['lm_bytes_16bit']:,} bytes, "
            f"{s['format']}, {audit})"
        )
    lines.append(
        f"  W4A16 group-128 floor (4 bits + one 16-bit scale and one 4-bit zero point per 128 weights): {r['w4a16_g128_floor']:.4f}x"
    )
    lines.append(
        "runs: "
        + "; ".join(
            f"{x['recipe']} ({x['process']}) {x['quantize_s']:.1f} s {x['stage_times_s']}" for x in r["runs"]
        )
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        print(json.dumps(child(*argv[1:])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument(
        "--workdir", type=Path, help="keep fixtures and checkpoints here (default: a temp dir)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qk-cache-size-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(args.samples, workdir)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
