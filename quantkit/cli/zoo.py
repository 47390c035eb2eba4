"""`quantkit zoo ...` and `quantkit demo-pool`: tiny models and media for tests and the demo."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from quantkit.cli._common import Force, OutputDir, QuantkitCommand, Seed, console, with_verbose

app = typer.Typer(
    help="Tiny random-weight models of the supported architectures (nothing is downloaded).",
    rich_markup_mode="markdown",
)


@app.command("list")
def list_models() -> None:
    """List the tiny models `zoo build` can write."""
    from quantkit.zoo.models import TRAINED, ZOO

    table = Table()
    table.add_column("name", no_wrap=True)
    for header in ("architecture", "inputs", "description"):
        table.add_column(header)
    for entry in (*ZOO.values(), *TRAINED.values()):
        table.add_row(
            entry.name, entry.architecture, ", ".join(("text", *entry.modalities)), entry.description
        )
    console.print(table)


@app.command("build", cls=QuantkitCommand)
@with_verbose
def build(
    name: Annotated[str, typer.Argument(help="Zoo model name; see `quantkit zoo list`.")],
    output: OutputDir,
    seed: Seed = 0,
    force: Force = False,
    steps: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="tiny-omni-skills and smol-omni-skills only: training steps (per stage for smol-omni-skills; "
            "default: restore the committed weights).",
        ),
    ] = None,
) -> None:
    """Write a tiny model folder (config, bf16 safetensors, tokenizer, processor) that
    `AutoProcessor.from_pretrained` and `AutoModel*.from_pretrained` load.

    Example:

        quantkit zoo build tiny-qwen2.5-omni --output models/omni
    """
    from quantkit.zoo.models import build_zoo_model

    path = build_zoo_model(name, output, seed=seed, force=force, steps=steps, log=console.print)
    console.print(f"wrote {name} to {path}")


def demo_pool(
    output: OutputDir,
    per_task: Annotated[int, typer.Option(min=1, help="Samples per task and modality combination.")] = 12,
    seed: Seed = 0,
    force: Force = False,
    skills: Annotated[
        bool,
        typer.Option("--skills", help="Write a trained zoo model's tasks instead (its skills.json's tasks)."),
    ] = False,
    suite: Annotated[
        str, typer.Option(help="With --skills: whose tasks, tiny-omni-skills or smol-omni-skills.")
    ] = "tiny-omni-skills",
) -> None:
    """Write the built-in demo pool: a JSONL in the ms-swift / LLaMA-Factory format with real
    image, video and audio files made on the spot, covering every task family.

    Example:

        quantkit demo-pool --output demo/pool
        quantkit calibrate demo/pool/pool.jsonl --output demo/calib
        quantkit demo-pool --skills --suite smol-omni-skills --output demo/smol-pool
    """
    if skills:
        from quantkit.errors import InputError
        from quantkit.synthetic.skills_tasks import SUITES, suite_module, write_skills_pool

        if suite not in SUITES:
            raise InputError(f"unknown --suite {suite!r}", hint=f"choose one of: {', '.join(SUITES)}")
        module = suite_module({"suite": suite})
        path = write_skills_pool(output, per_task=per_task, seed=seed + 7, force=force, suite=module)
        console.print(f"wrote {path}")
        return
    from quantkit.zoo.demo_pool import write_demo_pool

    summary = write_demo_pool(output, per_task=per_task, seed=seed, force=force)
    console.print(f"wrote {summary.records} records ({summary.media_files} media files) to {summary.jsonl}")
