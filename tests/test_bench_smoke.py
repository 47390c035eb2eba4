"""The benchmark scripts run and print their figures (speed targets live in bench/, not in tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def run_script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def test_calibrate_bench_runs_at_small_scale(tmp_path):
    out = tmp_path / "figures.json"
    proc = run_script(
        str(BENCH / "calibrate_bench.py"),
        *("--records", "2000", "--size", "200", "--repeats", "1", "--per-task", "2", "--json", str(out)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for figure in ("calibrate wall:", "peak RSS:", "ratio b/a:", "goal ratio <= 3:", "heavy imports"):
        assert figure in proc.stdout
    # a plain calibrate imports neither torch nor transformers
    assert "heavy imports during calibrate: none" in proc.stdout
    assert '"selected": 200' in out.read_text(encoding="utf-8")


def test_gpu_bench_skips_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the skip path does not apply")
    proc = run_script(str(BENCH / "gpu_vllm.py"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipped" in proc.stdout and "CUDA" in proc.stdout


def test_gpu_bench_renders_prompts_without_vllm(zoo_model):
    model = zoo_model("tiny-qwen3-vl")
    proc = run_script(str(BENCH / "gpu_vllm.py"), "--bf16", str(model), "--plan-only", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split(" max_tokens")[0]: line for line in proc.stdout.splitlines()}
    assert "<|image_pad|>" in lines["bf16 image"]
    assert "<|video_pad|>" in lines["bf16 video_long"] and "max_tokens=4096" in lines["bf16 video_long"]
    assert "takes no such input" in lines["bf16 audio"]  # a vision-language model: no audio row


def test_results_sections_are_replaced_in_place(tmp_path):
    """bench/run_all.py and bench/mixed_precision.py write different sections of one RESULTS.md;
    neither may erase the other's."""
    sys.path.insert(0, str(BENCH))
    try:
        from _shared import read_section, replace_section
    finally:
        sys.path.remove(str(BENCH))
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Benchmark results\n\n## Calibrate\n\nratio 5.5\n\n## Real weights\n\nold\n\n## GPU\n\nskipped\n"
    )
    replace_section(results, "## Real weights", "| run | ppl |\n|---|---|\n| w4a16 | 46.98 |")
    text = results.read_text()
    assert "ratio 5.5" in text and "skipped" in text and "old" not in text
    assert read_section(results, "## Real weights") == "| run | ppl |\n|---|---|\n| w4a16 | 46.98 |"
    replace_section(results, "## Sizes", "0.258x")  # a section not there yet is appended
    assert read_section(results, "## Sizes") == "0.258x" and read_section(results, "## GPU") == "skipped"
