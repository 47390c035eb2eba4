"""Benchmark quantkit's overhead over a plain llmcompressor script (issue 7).

Same tiny zoo model, same calibration samples turned into the same processor inputs
(``quantkit.models.inputs.processor_inputs``), same recipe (GPTQ W4A16 with zero points, group 128,
actorder static, dampening 0.01, the imatrix_mse weight observer), same targets ("Linear" minus
quantkit's ignore list), same pipeline
(llmcompressor's ``sequential``, layer by layer at the decoder-layer class: the plain script through
``independent`` on the whole model, quantkit on the decoder alone with inputs captured once under
the library's calibration forward), both in float32 and both loading the model, calibrating and
saving a compressed checkpoint. Run alternately,
A B A B ..., each in a fresh interpreter:

  A  quantkit.quantize.quantize(model, out, resolve_recipe("w4a16"), samples)  (no feature cache)
  B  the plain script a user would write from llmcompressor's VL examples (``child_plain``)

Reports the median wall time of whole processes and of the work after imports, the ratio A/B
(goal <= 1.05), peak RSS of each, and where quantkit's extra time goes (its checks, timed inside
run A: hooks, target planning, module and scale checks, the cast back, content hashes,
metadata, atomic write). The two checkpoints' packed weights are compared as a fairness check:
the same work gives the same int4 weights, bit for bit; where they differ the report names the
first differing tensor (the layer where the runs parted). A timed step that is gone from where
the bench looks it up, or that run A no longer calls, stops the bench (exit 1, the step named)
rather than reading as 0 s.

    .venv/bin/python bench/quantize_overhead.py [--samples 8] [--repeats 3] [--workdir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

STARTED = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _shared import build_model, build_samples, median, modality_mix, peak_rss_mb, run_child  # noqa: E402

GOAL_RATIO = 1.05
RECIPE = "w4a16"


# --- setup (parent) ---------------------------------------------------------------------------


def plain_plan(model_dir: Path) -> dict:
    """What the plain script hard-codes: the recipe's GPTQ settings, the ignore list quantkit
    computes for this model, the decoder-layer class and the pipeline."""
    from quantkit.models.adapters import adapter_for
    from quantkit.models.targets import resolve_targets
    from quantkit.recipes import resolve_recipe

    adapter = adapter_for(model_dir)
    recipe = resolve_recipe(RECIPE)
    targets = resolve_targets(adapter.meta_model(model_dir), adapter)
    if adapter.pipeline != "sequential":
        raise SystemExit(f"{model_dir.name}: the plain script here mirrors the sequential pipeline only")
    return {
        "scheme": recipe.preset,  # W4A16_ASYM: the shipped w4a16 has zero points
        "actorder": recipe.actorder,
        "dampening_frac": recipe.dampening_frac,
        "weight_observer": recipe.weight_observer,  # the shipped w4a16's imatrix_mse: same work
        "targets": targets.targets,
        "ignore": targets.ignore,
        "sequential_targets": [adapter.decoder_layer],
        "auto_class": adapter.auto_class,
    }


# --- the measured children ---------------------------------------------------------------------


def child_plain(model_dir: str, samples_json: str, plan_json: str, output: str) -> dict:
    """The plain llmcompressor script (as in its Qwen-VL examples), with quantkit's processor inputs."""
    import torch
    import transformers
    from _shared import load_samples
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from torch.utils.data import DataLoader
    from transformers import AutoProcessor

    from quantkit.models.inputs import processor_inputs

    imported = time.perf_counter()
    plan = json.loads(Path(plan_json).read_text(encoding="utf-8"))
    samples, _ = load_samples(Path(samples_json))

    processor = AutoProcessor.from_pretrained(model_dir)
    inputs = [processor_inputs(processor, sample) for sample in samples]
    keys = sorted(set().union(*inputs))

    def collate(batch: list[dict]) -> dict:
        # batch size 1; every batch carries the same keys (None where a sample lacks one): the
        # sequential pipeline traces the model with the first batch's signature
        (row,) = batch
        return {key: row.get(key) for key in keys}

    loader = DataLoader(inputs, batch_size=1, shuffle=False, collate_fn=collate)
    model = getattr(transformers, plan["auto_class"]).from_pretrained(model_dir, dtype=torch.float32)
    recipe = GPTQModifier(
        scheme=plan["scheme"],
        targets=plan["targets"],
        ignore=plan["ignore"],
        actorder=plan["actorder"],
        dampening_frac=plan["dampening_frac"],
        weight_observer=plan["weight_observer"],
    )
    oneshot(
        model=model,
        processor=processor,
        dataset=loader,
        recipe=recipe,
        pipeline="independent",
        sequential_targets=plan["sequential_targets"],
        num_calibration_samples=len(inputs),
        shuffle_calibration_samples=False,
    )
    model.save_pretrained(output, save_compressed=True)
    processor.save_pretrained(output)
    done = time.perf_counter()
    return {"import_s": imported - STARTED, "work_s": done - imported, "peak_rss_mb": peak_rss_mb()}


class MovedOn(SystemExit):
    """A step the bench times is no longer where it looks it up: its figure would silently be 0."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__(
            "bench/quantize_overhead.py: quantkit's code moved on, these steps are gone from where "
            f"the bench times them: {', '.join(missing)}. Point _instrument at where they live now "
            "(or drop the bucket) before reading the overhead figures."
        )
        self.missing = missing


# Timed steps a w4a16 run of the bench's tiny model does not call: their 0 calls are expected.
NOT_CALLED_FOR_W4A16 = {
    "quantkit.quantize.run.check_smoothquant_mappings": "only recipes with SmoothQuant",
}


class NotCalled(SystemExit):
    """A step the bench times still exists but run A never called it: its figure would read 0 s."""

    def __init__(self, uncalled: list[str]) -> None:
        super().__init__(
            "bench/quantize_overhead.py: quantkit no longer calls these timed steps where the bench "
            f"wraps them (0 calls in run A): {', '.join(uncalled)}. Point _instrument at what "
            "quantize calls now (or drop the bucket) before reading the overhead figures."
        )
        self.uncalled = uncalled


def uncalled_steps(calls: dict[str, int]) -> list[str]:
    """The timed steps with no call, less those the bench's recipe is known not to call."""
    return sorted(step for step, n in calls.items() if n == 0 and step not in NOT_CALLED_FOR_W4A16)


def _instrument(spent: dict[str, float]) -> dict[str, int]:
    """Time quantkit's own steps inside ``quantize`` by wrapping them where it looks them up;
    returns the calls of each step (by qualified name), counted as they happen. Raises
    :class:`MovedOn` (exit status 1, the names in its message) when one is gone."""
    import quantkit.export as export
    import quantkit.features.processor as features
    import quantkit.quantize.run as run
    from quantkit.quantize.probe import CalibrationProbe

    missing: list[str] = []
    calls: dict[str, int] = {}

    def wrap(module, name: str, bucket: str) -> None:
        step = (
            f"{getattr(module, '__module__', '')}.{module.__qualname__}.{name}"
            if isinstance(module, type)
            else f"{module.__name__}.{name}"
        )
        original = getattr(module, name, None)
        if original is None:
            missing.append(step)
            return
        calls[step] = 0

        def timed(*args, **kwargs):
            calls[step] += 1
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[bucket] += time.perf_counter() - started

        setattr(module, name, timed)

    wrap(run, "adapter_for", "adapter lookup")
    for name in (
        "resolve_targets",
        "resolve",
        "check_smoothquant_mappings",
    ):
        wrap(run, name, "target planning and checks")
    for name in ("check_quantized_modules", "check_scales", "check_assigned"):
        wrap(run, name, "module and scale checks")
    wrap(run, "set_saved_dtype", "cast back to the saved dtype")
    wrap(run, "processor_fingerprint", "content hashes (processor files, samples)")
    wrap(features, "sample_id", "content hashes (processor files, samples)")
    wrap(run, "build_metadata", "quantkit.json metadata")
    for name in ("cover_kept_modules", "copy_sidecar_files", "write_metadata", "render_model_card"):
        wrap(export, name, "ignore cover, sidecars, quantkit.json, model card")
    wrap(run, "write_checkpoint", "_write_checkpoint")
    original_atomic = getattr(run, "atomic_output_dir", None)
    if original_atomic is None:
        missing.append(f"{run.__name__}.atomic_output_dir")
    else:
        calls[f"{run.__name__}.atomic_output_dir"] = 0

        @contextmanager
        def atomic_output_dir(*args, **kwargs):  # time its setup and its final rename, not the body
            calls[f"{run.__name__}.atomic_output_dir"] += 1
            manager = original_atomic(*args, **kwargs)
            started = time.perf_counter()
            staging = manager.__enter__()
            spent["atomic write (staging folder, rename)"] += time.perf_counter() - started
            try:
                yield staging
            except BaseException:
                if not manager.__exit__(*sys.exc_info()):
                    raise
            else:
                started = time.perf_counter()
                manager.__exit__(None, None, None)
                spent["atomic write (staging folder, rename)"] += time.perf_counter() - started

        run.atomic_output_dir = atomic_output_dir
    wrap(CalibrationProbe, "verify", "calibration hooks (count, verify)")
    wrap(CalibrationProbe, "__enter__", "calibration hooks (count, verify)")
    wrap(CalibrationProbe, "__exit__", "calibration hooks (count, verify)")
    original_hook = getattr(CalibrationProbe, "_hook", None)
    if original_hook is None:
        missing.append(f"{CalibrationProbe.__module__}.CalibrationProbe._hook")
    if missing:
        raise MovedOn(missing)
    hook_step = f"{CalibrationProbe.__module__}.CalibrationProbe._hook"
    calls[hook_step] = 0

    def _hook(self, name, is_layer):
        inner = original_hook(self, name, is_layer)

        def timed(*args):
            calls[hook_step] += 1
            started = time.perf_counter()
            try:
                return inner(*args)
            finally:
                spent["calibration hooks (count, verify)"] += time.perf_counter() - started

        return timed

    CalibrationProbe._hook = _hook
    return calls


def child_quantkit(model_dir: str, samples_json: str, output: str, cache_dir: str = "") -> dict:
    from _shared import load_samples

    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe

    imported = time.perf_counter()
    spent: dict[str, float] = defaultdict(float)
    calls = _instrument(spent)
    samples, labels = load_samples(Path(samples_json))
    result = quantize(
        Path(model_dir),
        Path(output),
        resolve_recipe(RECIPE),
        samples,
        sample_labels=labels,
        cache_dir=Path(cache_dir) if cache_dir else None,
        progress=False,
        force=True,
    )
    done = time.perf_counter()
    return {
        "import_s": imported - STARTED,
        "work_s": done - imported,
        "peak_rss_mb": peak_rss_mb(),
        "stage_times_s": result.stage_times_s,
        "spent_s": dict(spent),
        "calls": dict(calls),
    }


# --- the comparison ---------------------------------------------------------------------------


def packed_weights_equal(a: Path, b: Path) -> tuple[bool, int, list[str]]:
    """Whether both checkpoints hold the same int4 packed weights (same GPTQ work), how many, and
    which differ (in name order: the first names the layer where the two runs parted)."""
    from quantkit.verify.audit import load_tensors, read_tensor_index

    def packed(folder: Path) -> dict:
        index = read_tensor_index(folder)
        return load_tensors(folder, index, [name for name in index if name.endswith("weight_packed")])

    left, right = packed(a), packed(b)
    differ = sorted(
        k
        for k in left.keys() | right.keys()
        if k not in left or k not in right or not bool((left[k] == right[k]).all())
    )
    return not differ, len(left), differ


def run(samples: int, repeats: int, workdir: Path) -> dict:
    here = Path(__file__).resolve()
    model_dir = build_model(workdir)
    samples_json = build_samples(workdir, model_dir, samples)
    plan_json = workdir / "plain-plan.json"
    plan_json.write_text(json.dumps(plain_plan(model_dir), indent=1) + "\n", encoding="utf-8")
    runs: dict[str, list[dict]] = {"quantkit": [], "plain": []}
    for index in range(repeats):  # alternate: A B A B ...
        out_a, out_b = workdir / f"out-quantkit-{index}", workdir / f"out-plain-{index}"
        runs["quantkit"].append(run_child(here, "quantkit", str(model_dir), str(samples_json), str(out_a)))
        if index == 0 and (uncalled := uncalled_steps(runs["quantkit"][0]["calls"])):
            raise NotCalled(uncalled)
        runs["plain"].append(
            run_child(here, "plain", str(model_dir), str(samples_json), str(plan_json), str(out_b))
        )
    same, packed, differ = packed_weights_equal(workdir / "out-quantkit-0", workdir / "out-plain-0")

    def med(kind: str, key: str) -> float:
        return median(r[key] for r in runs[kind])

    qk_wall, plain_wall = med("quantkit", "process_wall_s"), med("plain", "process_wall_s")
    qk_work, plain_work = med("quantkit", "work_s"), med("plain", "work_s")
    buckets = sorted({b for r in runs["quantkit"] for b in r["spent_s"]})
    spent = {b: median(r["spent_s"].get(b, 0.0) for r in runs["quantkit"]) for b in buckets}
    write_total = spent.pop("_write_checkpoint", 0.0)
    # what write_checkpoint spends outside quantkit's own steps is the library's save_pretrained
    library_save = write_total - spent.get("ignore cover, sidecars, quantkit.json, model card", 0.0)
    stages = {
        s: median(r["stage_times_s"].get(s, 0.0) for r in runs["quantkit"])
        for s in runs["quantkit"][0]["stage_times_s"]
    }
    return {
        "model": model_dir.name,
        "recipe": RECIPE,
        "samples": samples,
        "modalities": modality_mix(samples_json),
        "repeats": repeats,
        "quantkit_process_s": round(qk_wall, 2),
        "plain_process_s": round(plain_wall, 2),
        "ratio_process": round(qk_wall / plain_wall, 3),
        "quantkit_work_s": round(qk_work, 2),
        "plain_work_s": round(plain_work, 2),
        "ratio_work": round(qk_work / plain_work, 3),
        "quantkit_import_s": round(med("quantkit", "import_s"), 2),
        "plain_import_s": round(med("plain", "import_s"), 2),
        "quantkit_runs_s": [round(r["process_wall_s"], 2) for r in runs["quantkit"]],
        "plain_runs_s": [round(r["process_wall_s"], 2) for r in runs["plain"]],
        "quantkit_peak_rss_mb": round(med("quantkit", "peak_rss_mb")),
        "plain_peak_rss_mb": round(med("plain", "peak_rss_mb")),
        "ratio_rss": round(med("quantkit", "peak_rss_mb") / med("plain", "peak_rss_mb"), 3),
        "quantkit_stage_times_s": stages,
        "quantkit_checks_s": {k: round(v, 3) for k, v in sorted(spent.items())},
        "quantkit_checks_total_s": round(sum(spent.values()), 2),
        "library_save_s": round(library_save, 2),
        "same_packed_weights": same,
        "packed_tensors": packed,
        "differing_packed": differ,
        "goal_met": qk_wall / plain_wall <= GOAL_RATIO,
    }


def report(r: dict) -> str:
    lines = [
        f"model {r['model']}, recipe {r['recipe']}, {r['samples']} samples {r['modalities']}, "
        f"{r['repeats']} runs each, alternated, fresh processes",
        f"quantkit: median {r['quantkit_process_s']:.2f} s per process (runs {r['quantkit_runs_s']}), "
        f"{r['quantkit_work_s']:.2f} s after imports, peak RSS {r['quantkit_peak_rss_mb']} MB",
        f"plain llmcompressor: median {r['plain_process_s']:.2f} s per process (runs {r['plain_runs_s']}), "
        f"{r['plain_work_s']:.2f} s after imports, peak RSS {r['plain_peak_rss_mb']} MB",
        f"wall ratio quantkit/plain: {r['ratio_process']:.3f} (whole process), {r['ratio_work']:.3f} (after imports); "
        f"peak RSS ratio {r['ratio_rss']:.3f}",
        f"quantkit stages (s): {r['quantkit_stage_times_s']}",
        f"quantkit's own steps, {r['quantkit_checks_total_s']:.2f} s in all: "
        + ", ".join(f"{k} {v:.3f} s" for k, v in r["quantkit_checks_s"].items()),
        f"the library's save_pretrained inside quantkit's write: {r['library_save_s']:.2f} s",
        f"same int4 packed weights in both checkpoints: {r['same_packed_weights']} ({r['packed_tensors']} tensors"
        + (
            f"; {len(r['differing_packed'])} differ, the first {r['differing_packed'][0]})"
            if r["differing_packed"]
            else ")"
        ),
        f"goal wall ratio <= {GOAL_RATIO}: {'met' if r['goal_met'] else 'NOT met'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        kind, *rest = argv[1:]
        out = child_plain(*rest) if kind == "plain" else child_quantkit(*rest)
        print(json.dumps(out))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--workdir", type=Path, help="keep fixtures and checkpoints here (default: a temp dir)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qk-quantize-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(args.samples, args.repeats, workdir)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
