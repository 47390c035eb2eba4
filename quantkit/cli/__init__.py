"""The `quantkit` command line. Thin: each command parses options and calls one stage function."""

from __future__ import annotations

import functools
import gc
import importlib
import sys

import typer

from quantkit.cli._common import QuantkitCommand, QuantkitGroup, with_verbose

# name -> (module under quantkit.cli, function), in the order `quantkit --help` lists them; "zoo"
# (a group of its own) comes first. A call imports and builds only its own command's module.
COMMANDS = {
    "demo-pool": ("zoo", "demo_pool"),
    "calibrate": ("calibrate", "calibrate"),
    "quantize": ("quantize", "quantize"),
    "recipes": ("quantize", "recipes"),
    "sensitivity": ("sensitivity", "sensitivity"),
    "verify": ("verify", "verify"),
    "targets": ("build", "targets"),
    "eval": ("eval", "eval_command"),
    "build": ("build", "build"),
}


def _command(module: str, function: str):
    return getattr(importlib.import_module(f"quantkit.cli.{module}"), function)


@functools.cache
def make_app(only: str | None = None) -> typer.Typer:
    """The Typer app: every command, or with ``only`` that one alone (what a call of it runs, so
    it pays neither the other commands' imports nor the building of their options)."""
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
    if only is None or only == "zoo":
        app.add_typer(_command("zoo", "app"), name="zoo")
    for name, (module, function) in COMMANDS.items():
        if only is None or only == name:
            app.command(name, cls=QuantkitCommand)(with_verbose(_command(module, function)))
    if only is not None:
        app.callback()(lambda: None)  # still a group of one: `quantkit NAME ...`, as with all
    return app


def __getattr__(name: str):
    if name == "app":  # the whole app (tests run it with typer's CliRunner)
        return make_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        make_app(name if name in COMMANDS or name == "zoo" else None)()
    finally:
        # The interpreter's last collection walks every object left (a thousand modules' worth
        # after a calibrate: ~50 ms of a command's exit); frozen, they are freed by reference
        # counting alone, as at any exit. Outputs are written and closed by now.
        gc.freeze()
