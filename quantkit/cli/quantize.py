"""`quantkit quantize` and `quantkit recipes`."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import json
import os
import subprocess
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from quantkit import terminal
from quantkit.cli._common import AdapterFile, FeatureCache, Force, OutputDir, SubsampleSeed, console


class KvCache(StrEnum):
    fp8 = "fp8"


class CalibrationDtype(StrEnum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"


class Offload(StrEnum):
    cpu = "cpu"
    disk = "disk"


# The command's options (shared Annotated types: the signature reads as the option list).
ModelFolder = Annotated[
    Path, typer.Argument(help="Model folder (config.json, safetensors, processor).", show_default=False)
]
RecipeName = Annotated[str, typer.Option(help="Recipe name (see `quantkit recipes`) or a recipe YAML file.")]
CalibSet = Annotated[
    Path | None,
    typer.Option(help="Calibration-set folder from `quantkit calibrate` (recipes that need data)."),
]
NumSamples = Annotated[
    int | None,
    typer.Option(
        min=1, help="Use a stratified subsample of this many samples (keeps the set's proportions)."
    ),
]
MaxSeqLen = Annotated[
    int | None, typer.Option(min=1, help="Truncate text-only samples / drop longer media samples.")
]
KvCacheOption = Annotated[KvCache | None, typer.Option(help="Also quantize the KV cache (fp8).")]
AvgBits = Annotated[
    float | None,
    typer.Option(
        help="W4A16 recipes: keep the most sensitive layers at 8 bits (W8A16) while the average "
        "weight bits stay at or under this (e.g. 4.5). Ranked by --sensitivity, or measured on "
        "8 calibration samples first (a second-order estimate, seconds on small models).",
        min=4.0,
        max=8.0,
    ),
]
SensitivityFile = Annotated[
    Path | None,
    typer.Option(help="Ranking from `quantkit sensitivity -o FILE` for --avg-bits (skips measuring)."),
]
GroupSize = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="W4A16 recipes: weights per scale (default: the recipe's, else the largest of 128, 64, "
        "32 dividing every layer; layers it does not divide stay at 8 bits).",
    ),
]
TrustRemoteCode = Annotated[
    bool,
    typer.Option("--trust-remote-code", help="Allow the model folder's own Python code (off by default)."),
]
Nproc = Annotated[
    int,
    typer.Option(
        min=1,
        help="Calibrate data-parallel on this many ranks (relaunches under torch.distributed.run; one "
        "GPU per rank, or CPU processes with gloo). Each rank takes a stratified shard of the samples; "
        "GPTQ statistics are summed across ranks; rank 0 writes.",
    ),
]
OffloadOption = Annotated[
    Offload | None,
    typer.Option(
        help="Load the model through compressed-tensors offloading for models larger than device "
        "memory: cpu (weights in host memory, shared by all ranks) or disk (what does not fit in host "
        "memory goes to files beside --output).",
    ),
]
MaxCpuMemory = Annotated[
    float | None,
    typer.Option(
        help="With --offload disk: GiB of host memory for weights (default: what is free, less 5 GB).",
        min=0.0,
    ),
]
CalibrationDtypeOption = Annotated[
    CalibrationDtype,
    typer.Option(
        help="Dtype the model is calibrated in. auto: bfloat16 with a CUDA GPU (half the memory), "
        "float32 on CPUs (4x faster matmuls there). Weights are saved in the model's own dtype either way.",
    ),
]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the plan (targets, precision, memory per GPU / host / disk) without loading "
        "weights (config.json suffices) and write it as JSON (--plan-json).",
    ),
]
PlanJson = Annotated[
    Path | None,
    typer.Option(
        help="With --dry-run: where the plan's JSON goes (default: OUTPUT.plan.json beside --output)."
    ),
]
AllowKnownFailure = Annotated[
    bool,
    typer.Option(
        "--allow-known-failure", help="Quantize even where a library is known not to reload the result."
    ),
]


def default_cache_dir() -> Path:
    from quantkit.fsutil import cache_root

    return cache_root("features")


def recipes() -> None:
    """List the built-in recipes: scheme, whether they need calibration data, checkpoint format and
    the hardware they suit. Pass a name to `quantkit quantize --recipe`, or your own YAML file."""
    from quantkit.recipes import list_recipes

    table = Table(title="Recipes")
    for header in ("recipe", "scheme", "method", "needs data", "format"):
        table.add_column(header, no_wrap=True)
    infos = list_recipes()
    for info in infos:
        table.add_row(
            info.name, info.scheme, info.method, "yes" if info.needs_data else "no", info.checkpoint_format
        )
    console.print(table)
    for info in infos:  # long text reads better as lines than as a narrow column
        console.print(f"[bold]{info.name}[/]: {info.hardware}")


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while a dry run imports torch, transformers (and
    llmcompressor for MoE experts): ~4,400 modules whose objects all live to the end, which its
    full passes walk again and again (measured: 1.5-2.5 of a dry run's ~7 CPU s); the plan itself
    frees little. Re-enabled after, as the pool reader's pause does (survivors moved to the oldest
    generation). At exit everything left is frozen, so the interpreter's last collections skip it
    (~1 s more): freezing collects nothing, so cycles made while paused stay uncollected and their
    finalizers do not run; the process is ending, and the dry run writes its plan before."""
    from quantkit.pool.read import gc_paused

    try:
        with gc_paused():
            yield
    finally:
        atexit.unregister(gc.freeze)  # once, however many dry runs one process makes
        atexit.register(gc.freeze)


def _dry_run_collector_paused(command):
    @functools.wraps(command)
    def run(*args, **kwargs):
        if not kwargs.get("dry_run"):
            return command(*args, **kwargs)
        with collector_paused():
            return command(*args, **kwargs)

    return run


@_dry_run_collector_paused
def quantize(
    model: ModelFolder,
    recipe: RecipeName,
    output: OutputDir,
    calib: CalibSet = None,
    num_samples: NumSamples = None,
    max_seq_len: MaxSeqLen = None,
    kv_cache: KvCacheOption = None,
    avg_bits: AvgBits = None,
    sensitivity: SensitivityFile = None,
    group_size: GroupSize = None,
    adapter: AdapterFile = None,
    trust_remote_code: TrustRemoteCode = False,
    cache_dir: FeatureCache = None,
    seed: SubsampleSeed = 0,
    nproc: Nproc = 1,
    offload: OffloadOption = None,
    max_cpu_memory: MaxCpuMemory = None,
    calibration_dtype: CalibrationDtypeOption = CalibrationDtype.auto,
    dry_run: DryRun = False,
    plan_json: PlanJson = None,
    allow_known_failure: AllowKnownFailure = False,
    force: Force = False,
) -> None:
    """Quantize the language model only (vision / audio towers, projectors, mergers and lm_head stay
    in full precision) and write a compressed-tensors checkpoint that vLLM loads.

    Calibration samples go through the model's own processor and chat template (images, video,
    audio, video with sound). The run proves calibration reached every decoder layer and the
    towers, refuses non-finite scales, checks that exactly the language model's Linear layers
    were quantized, and writes atomically.

    Examples:

        quantkit quantize models/omni --recipe w4a16 --calib calib -o out/omni-w4a16
        quantkit quantize models/omni --recipe fp8-dynamic -o out/omni-fp8 --dry-run
    """
    plan_target = _check_paths(
        model, output, calib, sensitivity, adapter, cache_dir, plan_json, dry_run, force
    )
    from quantkit.quantize import quantize as run_quantize  # torch: after the checks above

    chosen, resolved_adapter = _recipe_and_adapter(
        model, recipe, kv_cache, group_size, avg_bits, sensitivity, adapter, trust_remote_code, nproc, offload,
        max_cpu_memory, calib,
    )  # fmt: skip
    drawn = None
    if calib is not None and chosen.needs_data:
        from quantkit.models.samples import draw_samples

        drawn = draw_samples(
            model, calib, adapter=resolved_adapter, num_samples=num_samples, seed=seed, config_only_ok=True
        )
    samples = drawn.samples if drawn else []
    labels = drawn.labels if drawn else None
    if nproc > 1 and not _launched_by_torchrun() and not dry_run:
        _relaunch(
            nproc, len(samples), model=model, recipe=recipe, output=output, calib=calib, num_samples=num_samples,
            max_seq_len=max_seq_len, kv_cache=kv_cache, avg_bits=avg_bits, sensitivity=sensitivity,
            group_size=group_size, adapter=adapter, trust_remote_code=trust_remote_code, cache_dir=cache_dir,
            seed=seed, calibration_dtype=calibration_dtype, offload=offload, max_cpu_memory=max_cpu_memory,
            allow_known_failure=allow_known_failure, force=force,
        )  # fmt: skip
    main_rank = os.environ.get("RANK", "0") == "0"
    offload_value = offload.value if offload else None
    cpu_bytes = int(max_cpu_memory * 2**30) if max_cpu_memory is not None else None
    if dry_run:
        _dry_run(
            model, chosen, samples, labels, drawn, plan_target, adapter=resolved_adapter, avg_bits=avg_bits,
            sensitivity=sensitivity, calibration_dtype=_calibration_dtype(calibration_dtype),
            offload=offload_value, max_cpu_memory=cpu_bytes,
        )  # fmt: skip
        return
    result = run_quantize(
        model, output, chosen, samples, sample_labels=labels, calib_info=drawn.info if drawn else None,
        adapter=resolved_adapter, force=force, allow_known_failure=allow_known_failure,
        cache_dir=cache_dir or default_cache_dir(), max_seq_len=max_seq_len, avg_bits=avg_bits,
        sensitivity=sensitivity, offload=offload_value, calibration_dtype=_calibration_dtype(calibration_dtype),
        max_cpu_memory=cpu_bytes, progress=main_rank, processor=drawn.processor if drawn else None,
    )  # fmt: skip
    if result.wrote:
        print_result(result)


def _check_paths(model, output, calib, sensitivity, adapter, cache_dir, plan_json, dry_run, force) -> Path:
    """Before importing torch or reading anything heavy (processor, set, weights): the model
    folder and its files, an output that would overwrite an input, one that cannot be written.
    Returns where a dry run's plan goes."""
    from quantkit.errors import InputError
    from quantkit.fsutil import (
        check_cache_writable,
        check_output_file,
        check_output_free,
        check_writable,
        refuse_overlap,
    )
    from quantkit.modelfiles import check_model_folder

    check_model_folder(model)
    inputs = {
        "model folder": model,
        "calibration set": calib,
        "sensitivity table": sensitivity,
        "adapter file": adapter,
    }
    refuse_overlap(output, {**inputs, "feature cache": cache_dir or default_cache_dir()})
    refuse_overlap(cache_dir, inputs, option="--cache-dir")
    plan_target = plan_json or output.with_name(output.name + ".plan.json")
    if dry_run:
        if len(plan_target.name.encode("utf-8", "surrogateescape")) > 255:
            raise InputError(
                f"the plan's file name is {len(plan_target.name.encode('utf-8', 'surrogateescape'))} bytes, "
                "more than the 255 a file name may have",
                path=plan_target,
                hint="give --output (or --plan-json) a shorter name",
            )
        check_output_file(
            plan_target,
            force,
            inputs,
            option="--plan-json" if plan_json is not None else "the plan (OUTPUT.plan.json)",
        )
        check_writable(plan_target, option="--plan-json" if plan_json else "--output", kind="file")
    else:
        check_output_free(output, force)
        if calib is not None:  # (the cache holds calibration samples' processed inputs)
            check_cache_writable(cache_dir or default_cache_dir())
    return plan_target


def _recipe_and_adapter(
    model, recipe, kv_cache, group_size, avg_bits, sensitivity, adapter, trust_remote_code, nproc, offload,
    max_cpu_memory, calib,
):  # fmt: skip
    """The recipe with the command line's overrides, and the model's adapter; options that do not
    go together are refused."""
    from quantkit.errors import InputError
    from quantkit.models.adapters import adapter_for
    from quantkit.quantize.preflight import with_options
    from quantkit.recipes import resolve_recipe

    chosen = resolve_recipe(recipe, kv_cache_fp8=True if kv_cache is KvCache.fp8 else None)
    chosen = with_options(chosen, group_size=group_size)
    if sensitivity is not None and avg_bits is None:
        raise InputError("--sensitivity ranks layers for --avg-bits: pass --avg-bits too (e.g. 4.5)")
    if max_cpu_memory is not None and offload is not Offload.disk:
        raise InputError("--max-cpu-memory applies to --offload disk")
    if nproc > 1 and not chosen.needs_data:
        raise InputError(
            f"--nproc splits calibration samples across ranks; recipe {chosen.name!r} uses none",
            hint="drop --nproc (data-free recipes take seconds on one process)",
        )
    if nproc > 1:
        from quantkit.quantize.distributed import refuse_shared_weight_smoothing

        refuse_shared_weight_smoothing(chosen)
    resolved_adapter = adapter_for(model, adapter)
    if trust_remote_code:
        resolved_adapter = resolved_adapter.model_copy(update={"trust_remote_code": True})
    if chosen.needs_data and calib is None:
        raise InputError(
            f"recipe {chosen.name!r} calibrates on data: pass --calib SET (made with `quantkit calibrate`)",
            hint="or choose a data-free recipe such as fp8-dynamic",
        )
    return chosen, resolved_adapter


def _launched_by_torchrun() -> bool:
    from quantkit.quantize.distributed import launched_by_torchrun

    return launched_by_torchrun()


def _relaunch(nproc: int, samples: int, **options) -> None:
    """Run the command on ``nproc`` ranks under torch.distributed.run; exits with their status."""
    from quantkit.errors import InputError
    from quantkit.quantize.distributed import relaunch_command

    if samples < nproc:
        raise InputError(f"{samples} calibration sample(s) for --nproc {nproc}: every rank needs one")
    argv = _relaunch_argv(**options)
    console.print(f"starting {nproc} ranks: torch.distributed.run --nproc-per-node={nproc}")
    console.file.flush()  # before the ranks write to the same stream
    # torchrun's own log and the ranks' library output go where ours does (quantkit.log,
    # unless verbose); rank 0's tables and progress still reach the terminal
    code = subprocess.call(relaunch_command(nproc, argv), stdout=terminal.child_stdout())
    raise typer.Exit(code if code in (0, 1, 2) else 1)


def _dry_run(model, chosen, samples, labels, drawn, plan_target: Path, **options) -> None:
    """Print the plan and write it as JSON."""
    from quantkit.quantize import plan as make_plan
    from quantkit.quantize.plan import write_plan_json

    planned = make_plan(
        model,
        chosen,
        samples,
        sample_labels=labels,
        sample_tokens=drawn.tokens if drawn else None,
        light_imports=True,
        **options,
    ).to_dict()
    print_plan(planned, drawn)
    write_plan_json(plan_target, planned)
    console.print(f"wrote {plan_target}")


def _calibration_dtype(choice: CalibrationDtype):
    import torch

    if choice is CalibrationDtype.auto:
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, choice.value)


def _relaunch_argv(**options) -> list[str]:
    """The quantize command line every rank runs (rebuilt from the parsed options: the process's
    own argv is not this command's when called in-process, e.g. from tests)."""
    argv = ["quantize", str(options.pop("model"))]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value.value if isinstance(value, StrEnum) else value)]
    return argv


def _counts_table(counts: dict, title: str) -> Table:
    table = Table("module group", "quantized", "kept in full precision", title=title)
    for group, row in counts.items():
        if row["quantized"] or row["kept"]:
            table.add_row(group, str(row["quantized"]), str(row["kept"]))
    return table


def print_plan(plan: dict, drawn) -> None:
    console.print(
        f"[bold]plan[/]: {plan['architecture']} (adapter {plan['adapter']}), recipe {plan['recipe']} "
        f"({plan['scheme']} -> {plan['checkpoint_format']}), pipeline {plan['pipeline']}"
    )
    console.print(_counts_table(plan["counts"], "Linear layers"))
    if plan["needs_data"]:
        console.print(f"samples: {plan['samples']} by modality {json.dumps(plan['samples_by_modality'])}")
        if drawn and drawn.left_out:
            console.print(f"left out (modality the model does not take): {json.dumps(drawn.left_out)}")
    print_precision(plan.get("precision"))
    if plan.get("checkpoint_bytes"):
        console.print(f"checkpoint: about {plan['checkpoint_bytes'] / 2**20:.1f} MiB")
    if plan["known_failure"]:
        console.print(f"[yellow]known failure:[/] {plan['known_failure']}")
    if plan.get("memory"):
        from quantkit.quantize.plan import MemoryPlan

        memory = {k: v for k, v in plan["memory"].items() if k != "gib"}
        for line in MemoryPlan(**memory).lines():
            console.print(line, highlight=False)


def print_precision(precision: dict | None) -> None:
    """Group size, the layers kept at 8 bits and the average bits (W4A16 recipes)."""
    if not precision:
        return
    group = precision.get("group_size")
    console.print(
        f"precision: {precision['low_scheme']} group {group if group else '-'}; "
        f"{len(precision['high'])} layer(s) at 8 bits ({precision['high_scheme']}); "
        f"average {precision['avg_bits']:.3f} bits per weight"
        + (
            f" (budget {precision['avg_bits_requested']})"
            if precision.get("avg_bits_requested") is not None
            else ""
        )
    )
    for unit in precision.get("units") or []:
        if unit["bits"] == 8:
            console.print(f"  8 bits: {unit['unit']} ({unit['reason']})")
    for note in precision.get("notes") or []:
        console.print(f"  note: {note}")


def print_result(result) -> None:
    console.print(_counts_table(result.counts, f"{result.recipe} on {result.architecture}"))
    calls = result.metadata.get("calibration", {})
    if result.samples_used:
        console.print(
            f"calibrated on {result.samples_used} samples ({result.preprocessed} preprocessed, "
            f"{result.cache_hits} from the feature cache), pipeline {result.pipeline}"
            f"{f' on {result.world_size} ranks' if result.world_size > 1 else ''}; "
            f"tower calls {json.dumps(calls.get('tower_calls', {}))}"
        )
    print_precision(result.metadata.get("precision"))
    if result.dropped_samples:
        console.print(f"[yellow]{len(result.dropped_samples)} sample(s) dropped[/] (see quantkit.json)")
    console.print(
        f"wrote {result.output} ({result.checkpoint_format}) in {result.wall_time_s:.1f} s, "
        f"peak RSS {result.peak_rss_mb:.0f} MB"
    )
