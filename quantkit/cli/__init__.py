"""The `quantkit` command line. Thin: each command parses options and calls one stage function."""

from __future__ import annotations

import os

import typer

from quantkit.cli import build, calibrate, quantize, sensitivity, verify, zoo
from quantkit.cli import eval as eval_cmd
from quantkit.cli._common import QuantkitGroup

app = typer.Typer(
    cls=QuantkitGroup,
    name="quantkit",
    help=(
        "Offline post-training quantization for omni (image, video, audio, text) LLMs.\n\n"
        "Flow: pool JSONL -> `calibrate` -> `quantize --recipe NAME` -> compressed-tensors checkpoint "
        "that vLLM loads. Exit codes: 0 success, 1 a check failed, 2 bad input or usage."
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",  # the renderer wraps paragraphs; indented examples stay literal
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(zoo.app, name="zoo")
app.command("demo-pool")(zoo.demo_pool)
app.command("calibrate")(calibrate.calibrate)
app.command("quantize")(quantize.quantize)
app.command("recipes")(quantize.recipes)
app.command("sensitivity")(sensitivity.sensitivity)
app.command("verify")(verify.verify)
app.command("targets")(build.targets)
app.command("eval")(eval_cmd.eval_command)
app.command("build")(build.build)


def _quiet_libraries() -> None:
    """Library chatter (llmcompressor's INFO lines, per-file progress bars) buries quantkit's own
    tables; QUANTKIT_VERBOSE=1 keeps it."""
    if os.environ.get("QUANTKIT_VERBOSE"):
        return
    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> None:
    _quiet_libraries()
    app()
