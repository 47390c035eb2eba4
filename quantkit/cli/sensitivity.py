"""`quantkit sensitivity`: rank the language model's Linear layers by how much quantizing each one
alone moves the model's output."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from quantkit.cli._common import AdapterFile, FeatureCache, Force, SubsampleSeed, console
from quantkit.recipes.schemes import SENSITIVITY_SCHEMES

# The weight-only schemes of the scheme table a layer can be measured with.
WeightScheme = StrEnum("WeightScheme", {name: name for name in SENSITIVITY_SCHEMES})


class Method(StrEnum):
    kl = "kl"
    fisher = "fisher"


class Granularity(StrEnum):
    layer = "layer"
    unit = "unit"
    block = "block"


def sensitivity(
    model: Annotated[
        Path, typer.Argument(help="Model folder (config.json, safetensors, processor).", show_default=False)
    ],
    calib: Annotated[Path, typer.Option(help="Calibration-set folder from `quantkit calibrate`.")],
    scheme: Annotated[
        WeightScheme,
        typer.Option(
            help="Weight scheme each layer is fake-quantized with (round-to-nearest). W4A16_ASYM is what "
            "the shipped w4a16 recipe writes (zero points; MoE experts stay symmetric either way)."
        ),
    ] = WeightScheme.W4A16_ASYM,
    group_size: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Group size (4-bit schemes; default: the largest of 128, 64, 32 dividing every layer).",
        ),
    ] = None,
    num_samples: Annotated[
        int, typer.Option(min=1, help="Stratified subsample of the calibration set to measure on.")
    ] = 8,
    max_seq_len: Annotated[int, typer.Option(min=1, help="Cut text-only samples to this many tokens.")] = 256,
    positions: Annotated[
        int, typer.Option(min=1, help="Scored next-token positions per sample (evenly spaced).")
    ] = 128,
    granularity: Annotated[
        Granularity,
        typer.Option(
            help="layer: each Linear; unit: fused units (q/k/v, gate/up) together; block: whole decoder "
            "blocks (large models)."
        ),
    ] = Granularity.layer,
    method: Annotated[
        Method,
        typer.Option(
            help="kl: measure each row (rows x samples partial forwards); fisher: estimate every row "
            "to second order from a few backward passes (cheaper, noisier)."
        ),
    ] = Method.kl,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the ranked table as JSON here.")
    ] = None,
    top: Annotated[int, typer.Option(min=0, help="Rows to print.")] = 20,
    adapter: AdapterFile = None,
    cache_dir: FeatureCache = None,
    seed: SubsampleSeed = 0,
    force: Force = False,
) -> None:
    """Rank the language model's Linear layers by how much quantizing each alone moves the output.

    Per layer: the mean next-token KL between the original model and the model with only that
    layer quantized (round-to-nearest with the scheme's arguments), on a stratified subsample of
    the calibration set; print the ranking and write it as JSON. `quantkit quantize --avg-bits 4.5 --sensitivity FILE` keeps the top of it at
    8 bits.

    Cost (--method kl): layers x samples forward passes, each replayed from the layer's own
    decoder block from cached block inputs (about half a forward on average); the reference runs
    once. --method fisher estimates every layer from one forward and a few backward passes.

    Example:

        quantkit sensitivity models/qwen3 --calib calib --num-samples 8 -o sens.json
    """
    from quantkit.cli.quantize import default_cache_dir
    from quantkit.fsutil import check_cache_writable, check_output_file, check_writable, refuse_overlap
    from quantkit.modelfiles import check_model_folder

    check_model_folder(model)  # before torch is imported, and hours of measuring
    cache = cache_dir or default_cache_dir()
    refuse_overlap(cache, {"model folder": model, "calibration set": calib}, option="--cache-dir")
    check_cache_writable(cache)
    if output is not None:
        inputs = {"model folder": model, "calibration set": calib, "feature cache": cache}
        check_output_file(output, force, inputs, option="--output")
        check_writable(output, kind="file")

    from quantkit.models.adapters import adapter_for
    from quantkit.models.samples import draw_samples
    from quantkit.precision.table import save_table
    from quantkit.sensitivity import sensitivity as measure

    resolved = adapter_for(model, adapter)
    drawn = draw_samples(model, calib, adapter=resolved, num_samples=num_samples, seed=seed)
    table = measure(
        model,
        drawn.samples,
        sample_labels=drawn.labels,
        scheme=scheme.value,
        group_size=group_size,
        adapter=resolved,
        granularity=granularity.value,
        max_seq_len=max_seq_len,
        max_positions=positions,
        method=method.value,
        cache_dir=cache,
        processor=drawn.processor,  # loaded once, by the draw
    )
    print_table(table, top)
    if output is not None:
        save_table(table, output)
        console.print(f"wrote {output}")


def print_table(table, top: int) -> None:
    weights = table.scheme.get("weights", {})
    rich_table = Table(
        "rank",
        "layer",
        "params",
        "KL",
        "top-1 kept",
        "rel. logit MSE",
        title=f"sensitivity to {table.scheme.get('preset')} (group {weights.get('group_size') or '-'}), "
        f"{table.granularity} granularity",
    )
    rows = table.ranked()
    for row in rows[:top]:
        rich_table.add_row(
            str(row.rank),
            row.name,
            f"{row.params:,}",
            f"{row.kl:.5f}",
            "-" if row.top1 is None else f"{row.top1:.3f}",
            "-" if row.rel_logit_mse is None else f"{row.rel_logit_mse:.2e}",
        )
    console.print(rich_table)
    if len(rows) > top:
        console.print(f"... {len(rows) - top} more rows (--top, or the JSON)")
    for name, why in table.skipped.items():
        console.print(f"[yellow]not measured[/] {name}: {why}")
    cost = table.cost
    passes = f"{cost['forward_passes']} forward passes"
    if cost.get("backward_passes"):
        passes += f" and {cost['backward_passes']} backward passes"
    console.print(
        f"{table.samples} samples, {table.positions} scored positions, mode {table.mode}: {passes} "
        f"(~{cost['forward_pass_equivalents']} single-sample forward equivalents) in {cost['wall_s']} s "
        f"({cost['s_per_row']} s per row; reference {cost['reference_s']} s)"
    )
    for note in table.notes:
        console.print(f"note: {note}")
