"""`--help` is the first thing a user reads: paragraphs wrapped by the renderer (never the
docstrings' hard wraps), examples kept as literal lines."""

from __future__ import annotations

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from quantkit.cli import app

WIDTH = 80
ENV = {"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)}
runner = CliRunner()


def _commands(group, prefix: tuple[str, ...] = ()):
    for name, command in sorted(group.commands.items()):
        yield (*prefix, name)
        if hasattr(command, "commands"):  # a group (zoo)
            yield from _commands(command, (*prefix, name))


COMMANDS = [(), *_commands(get_command(app))]


def _description(text: str) -> list[list[str]]:
    """The prose between the usage line and the first panel, as paragraphs of lines; literal
    blocks (examples: indented further than prose) and list items are left out."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next((i for i, line in enumerate(lines) if line.lstrip().startswith("╭")), len(lines))
    paragraphs, current = [], []
    for line in lines[start:end]:
        prose = line.startswith(" ") and not line.startswith("  ") and line.strip()
        if prose and not line.strip().startswith("•"):
            current.append(line.rstrip())
        elif current:
            paragraphs.append(current)
            current = []
    return [*paragraphs, current] if current else paragraphs


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "quantkit" for c in COMMANDS])
def test_help_paragraphs_are_wrapped_by_the_renderer(command):
    result = runner.invoke(app, [*command, "--help"], env=ENV)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, result.output
    paragraphs = _description(result.output)
    assert paragraphs, result.output
    for paragraph in paragraphs:
        for line, following in zip(paragraph, paragraph[1:], strict=False):
            # A line ends inside a paragraph only where the next word would not have fitted
            # (the renderer's wrap), never before a short fragment (a docstring's hard wrap).
            next_word = following.split()[0]
            assert len(line) + 1 + len(next_word) > WIDTH - 2, (
                f"hard wrap in `{' '.join(command)} --help`:\n{line}\n{following}"
            )


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "quantkit" for c in COMMANDS])
def test_examples_are_not_wrapped(command):
    """Example lines (literal blocks) start with `quantkit` or continue one ending in a backslash."""
    result = runner.invoke(app, [*command, "--help"], env=ENV)
    lines = result.output.splitlines()
    end = next((i for i, line in enumerate(lines) if line.lstrip().startswith("╭")), len(lines))
    literal = [line.strip() for line in lines[:end] if line.startswith("  ") and line.strip()]
    literal = [line for line in literal if not line.startswith(("•", "Usage:"))]
    for previous, line in zip(["\\"] + literal, literal, strict=False):
        assert line.startswith("quantkit ") or previous.endswith("\\"), result.output


def test_examples_stay_literal_lines():
    result = runner.invoke(app, ["quantize", "--help"], env=ENV)
    examples = [
        line.strip() for line in result.output.splitlines() if line.strip().startswith("quantkit quantize")
    ]
    assert len(examples) == 2 and all("--recipe" in line for line in examples), result.output
