"""`quantkit quantize` and `quantkit recipes`."""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from quantkit.cli._common import Force, OutputDir, console


class KvCache(StrEnum):
    fp8 = "fp8"


def default_cache_dir() -> Path:
    base = os.environ.get("QUANTKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "quantkit"
    )
    return Path(base) / "features"


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


def quantize(
    model: Annotated[
        Path, typer.Argument(help="Model folder (config.json, safetensors, processor).", show_default=False)
    ],
    recipe: Annotated[str, typer.Option(help="Recipe name (see `quantkit recipes`) or a recipe YAML file.")],
    output: OutputDir,
    calib: Annotated[
        Path | None,
        typer.Option(help="Calibration-set folder from `quantkit calibrate` (recipes that need data)."),
    ] = None,
    num_samples: Annotated[
        int | None,
        typer.Option(help="Use a stratified subsample of this many samples (keeps the set's proportions)."),
    ] = None,
    max_seq_len: Annotated[
        int | None, typer.Option(help="Truncate text-only samples / drop longer media samples.")
    ] = None,
    kv_cache: Annotated[KvCache | None, typer.Option(help="Also quantize the KV cache (fp8).")] = None,
    adapter: Annotated[
        Path | None,
        typer.Option(
            help="Adapter YAML for an architecture quantkit has none for (recipes/adapters/README.md)."
        ),
    ] = None,
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            "--trust-remote-code", help="Allow the model folder's own Python code (off by default)."
        ),
    ] = False,
    cache_dir: Annotated[
        Path | None,
        typer.Option(help="Processed-feature cache (default: $QUANTKIT_CACHE/features or ~/.cache/quantkit/features)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the --num-samples subsample.")] = 0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan without loading weights.")
    ] = False,
    allow_known_failure: Annotated[
        bool,
        typer.Option(
            "--allow-known-failure", help="Quantize even where a library is known not to reload the result."
        ),
    ] = False,
    force: Force = False,
) -> None:
    """Quantize the language model only (vision / audio towers, projectors, mergers and lm_head stay
    in full precision) and write a compressed-tensors checkpoint that vLLM loads.

    Calibration samples go through the model's own processor and chat template (images, video,
    audio, video with sound). The run proves calibration reached every decoder layer and the
    towers, refuses non-finite scales, checks that exactly the language model's Linear layers
    were quantized, and writes atomically.

    Examples:
      quantkit quantize models/omni --recipe w4a16 --calib calib --output out/omni-w4a16
      quantkit quantize models/omni --recipe fp8-dynamic --output out/omni-fp8 --dry-run
    """
    from quantkit.errors import InputError
    from quantkit.models.adapters import adapter_for
    from quantkit.models.inputs import processor_capabilities
    from quantkit.quantize import plan as make_plan
    from quantkit.quantize import quantize as run_quantize
    from quantkit.quantize.calibration_set import samples_from_set
    from quantkit.recipes import resolve_recipe

    chosen = resolve_recipe(recipe, kv_cache_fp8=True if kv_cache is KvCache.fp8 else None)
    resolved_adapter = adapter_for(model, adapter)
    if trust_remote_code:
        resolved_adapter = resolved_adapter.model_copy(update={"trust_remote_code": True})
    if chosen.needs_data and calib is None:
        raise InputError(
            f"recipe {chosen.name!r} calibrates on data: pass --calib SET (made with `quantkit calibrate`)",
            hint="or choose a data-free recipe such as fp8-dynamic",
        )
    drawn = None
    if calib is not None and chosen.needs_data:
        kinds = processor_capabilities(resolved_adapter.load_processor(model))
        drawn = samples_from_set(calib, model_kinds=kinds, num_samples=num_samples, seed=seed)
    samples = drawn.samples if drawn else []
    labels = drawn.labels if drawn else None

    if dry_run:
        print_plan(
            make_plan(model, chosen, samples, sample_labels=labels, adapter=resolved_adapter).to_dict(), drawn
        )
        return
    result = run_quantize(
        model,
        output,
        chosen,
        samples,
        sample_labels=labels,
        calib_info=drawn.info if drawn else None,
        adapter=resolved_adapter,
        force=force,
        allow_known_failure=allow_known_failure,
        cache_dir=cache_dir or default_cache_dir(),
        max_seq_len=max_seq_len,
    )
    print_result(result)


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
    if plan["known_failure"]:
        console.print(f"[yellow]known failure:[/] {plan['known_failure']}")


def print_result(result) -> None:
    console.print(_counts_table(result.counts, f"{result.recipe} on {result.architecture}"))
    calls = result.metadata.get("calibration", {})
    if result.samples_used:
        console.print(
            f"calibrated on {result.samples_used} samples ({result.preprocessed} preprocessed, "
            f"{result.cache_hits} from the feature cache), pipeline {result.pipeline}; "
            f"tower calls {json.dumps(calls.get('tower_calls', {}))}"
        )
    if result.dropped_samples:
        console.print(f"[yellow]{len(result.dropped_samples)} sample(s) dropped[/] (see quantkit.json)")
    console.print(
        f"wrote {result.output} ({result.checkpoint_format}) in {result.wall_time_s:.1f} s, "
        f"peak RSS {result.peak_rss_mb:.0f} MB"
    )
