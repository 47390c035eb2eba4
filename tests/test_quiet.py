"""Quiet by default: a command's terminal shows quantkit's own progress, tables and errors; other
libraries' logging, warnings and progress bars go to quantkit.log beside its output (the path
printed once), and -v or QUANTKIT_VERBOSE=1 streams them instead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quantkit.terminal import LOG_NAME, VERBOSE_ENV

ROOT = Path(__file__).resolve().parents[1]
# What the libraries print in a data-free quantize of a tiny model, whatever the device:
# compressed-tensors' and transformers' tqdm bars, llmcompressor's loguru lines (any level: which
# ones a machine prints depends on its device and on LLM_COMPRESSOR_LOG_LEVEL).
TQDM_BARS = ("Compressing model", "it/s]")
LOGURU_LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+ \| \w+ \| [A-Z]+ - ", re.MULTILINE)
# The environment a user's shell may carry that changes what llmcompressor prints, not where.
LIBRARY_LOG_ENV = ("LLM_COMPRESSOR_LOG_LEVEL", "LLM_COMPRESSOR_LOG_DISABLED", "LLM_COMPRESSOR_LOG_FILE")


def quantkit(*args: str, verbose_env: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    for name in (VERBOSE_ENV, *LIBRARY_LOG_ENV):
        env.pop(name, None)
    if verbose_env:
        env[VERBOSE_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-m", "quantkit", *args], capture_output=True, text=True, env=env, check=False
    )


@pytest.fixture(scope="module")
def model(zoo_model) -> Path:
    return zoo_model("tiny-qwen3")


def test_quantize_keeps_library_output_in_the_log(model, tmp_path):
    output = tmp_path / "out" / "fp8"
    run = quantkit("quantize", str(model), "--recipe", "fp8-dynamic", "--output", str(output))
    terminal = run.stdout + run.stderr
    assert run.returncode == 0, terminal
    log = tmp_path / "out" / LOG_NAME
    assert f"other libraries' output: {log}" in " ".join(run.stderr.split())  # its path, once
    assert terminal.count(str(log)) == 1
    assert "fp8-dynamic on Qwen3ForCausalLM" in run.stdout and "wrote" in run.stdout  # quantkit's own
    for line in (*TQDM_BARS, "%|", "Warning", "WARNING"):
        assert line not in terminal, f"{line!r} reached the terminal:\n{terminal}"
    assert not LOGURU_LINE.search(terminal), f"a loguru line reached the terminal:\n{terminal}"
    text = log.read_text()
    assert f"quantkit quantize {model} --recipe fp8-dynamic" in text  # the run's header
    for line in TQDM_BARS:
        assert line in text, f"{line!r} is not in {log}:\n{text}"
    assert LOGURU_LINE.search(text), f"no loguru line in {log}:\n{text}"
    assert not (output / LOG_NAME).exists()  # beside the checkpoint, never inside it


def test_verbose_streams_library_output_and_writes_no_log(model, tmp_path):
    output = tmp_path / "out" / "fp8"
    run = quantkit("quantize", str(model), "--recipe", "fp8-dynamic", "--output", str(output), "-v")
    terminal = run.stdout + run.stderr
    assert run.returncode == 0, terminal
    for line in TQDM_BARS:
        assert line in terminal, f"{line!r} did not stream with -v:\n{terminal}"
    assert LOGURU_LINE.search(terminal), f"no loguru line streamed with -v:\n{terminal}"
    assert "other libraries' output" not in terminal
    assert not (tmp_path / "out" / LOG_NAME).exists()


def test_an_error_still_reaches_the_terminal(model, tmp_path):
    output = tmp_path / "out" / "x"
    quiet = quantkit("quantize", str(model), "--recipe", "nope", "--output", str(output))
    assert quiet.returncode == 2
    assert "error: unknown recipe 'nope'" in quiet.stderr and "hint:" in quiet.stderr
    assert "Traceback" not in quiet.stderr + quiet.stdout
    assert not (tmp_path / "out").exists()  # nothing logged: no log, no folder made for it

    streamed = quantkit("quantize", str(model), "--recipe", "nope", "--output", str(output), verbose_env=True)
    assert streamed.returncode == 2 and "error: unknown recipe 'nope'" in streamed.stderr
    assert "other libraries' output" not in streamed.stderr


def test_listings_write_no_log(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "quantkit", "recipes"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "other libraries' output" not in run.stderr and not (tmp_path / LOG_NAME).exists()
