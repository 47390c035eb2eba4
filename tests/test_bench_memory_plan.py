"""bench/memory_plan.py's RESULTS.md section: rendered from the measurements it stores in its JSON
(bench/memory_plan.json), every row naming the commit that measured it (the measuring itself
quantizes models in fresh processes: bench only)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]

import memory_plan as mp  # noqa: E402


def part(commit: str) -> dict:
    return {
        "measured": "2026-01-01 00:00 UTC",
        "commit": commit,
        "versions": {"torch": "9.9", "transformers": "8.8"},
        "cores": 3,
        "load_before": [1.11, 1.22, 1.33],
        "load_after": [2.11, 2.22, 2.33],
    }


def layer_row(layers: int, peaks: list[int], commit: str, plan_host: int = 1300) -> dict:
    runtime, model, plan_decoder = 900, 50 + 5 * layers, 190
    return {
        "layers": layers,
        "commit": commit,
        "pipeline": "sequential",
        "plan_host_mb": plan_host,
        "plan_runtime_mb": 1126,
        "model_mb": model,
        "plan_decoder_mb": plan_decoder,
        "runs": [
            {
                "peak_rss_mb": peak,
                "runtime_mb": runtime + i,
                "decoder_mb": peak - runtime - i - model,
                "peak_vs_plan": round(peak / plan_host, 3),
            }
            for i, peak in enumerate(peaks)
        ],
    }


def sample_data() -> dict:
    layers = {
        **part("aaa1111"),
        "model": {"base": "tiny-qwen2.5-omni", "hidden_size": 256, "intermediate_size": 512},
        "recipe": "w4a16",
        "samples": 24,
        "tokens": {"samples": 24, "total": 21600, "max": 910, "source": "measured"},
        "calibration_dtype": "float32",
        "rows": [layer_row(2, [1185, 1239], "aaa1111"), layer_row(8, [1317, 1219], "aaa1111")],
    }
    real_row = {
        "model": "Qwen2.5-Omni-7B",
        "recipe": "w4a16",
        "per_gpu_gib": 5.8,
        "hessians_gib": 1.6,
        "host_gib": 96.0,
        "model_gib": 16.6,
        "cache_gib": 78.6,
        "disk_gib": 7.6,
        "layer_solves": 196,
        "plan_s": 2.0,
        "plan_cpu_s": 5.4,
        "process_s": 6.0,
        "load_1min": 3.3,
        "commit": "bbb2222",
    }
    real = {**part("bbb2222"), "recipe": "w4a16", "samples": 5000, "tokens": 1000, "dtype": "bfloat16"}
    return {"layers": layers, "real": {**real, "rows": [real_row]}}


def row_of(text: str, first_cell: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))


def test_the_section_is_rendered_from_the_stored_figures():
    data = sample_data()
    text = mp.section(data)
    assert "| 2 | 1185 / 1239 MB | 1300 MB | 0.91 / 0.95 |" in text
    assert "load average (1, 5, 15 min) before 1.11 1.22 1.33, after 2.11 2.22 2.33" in text
    assert "torch 9.9, transformers 8.8" in text and "hidden 256, MLP 512" in text
    changed = copy.deepcopy(data)
    changed["layers"]["rows"][0]["runs"][0]["peak_rss_mb"] = 1234
    changed["real"]["rows"][0]["host_gib"] = 97.0
    changed["layers"]["load_before"] = [0.5, 0.6, 0.7]
    other = mp.section(changed)
    assert other != text
    assert "| 2 | 1234 / 1239 MB |" in other and "| 97 GiB (16.6 + 78.6) |" in other
    assert "before 0.50 0.60 0.70" in other and "before 1.11 1.22 1.33" not in other.split("**The four")[0]


def test_every_row_names_the_commit_that_measured_it():
    text = mp.section(sample_data())
    for layers in (2, 8):
        assert row_of(text, str(layers)).endswith("| aaa1111 |")
    assert row_of(text, "Qwen2.5-Omni-7B").endswith("| bbb2222 |")
    assert "at commit aaa1111" in text and "at commit bbb2222" in text
    # the docs page's copy of the table carries no commit column, the same figures
    readme = mp.readme_table(sample_data()["real"]["rows"])
    assert "bbb2222" not in readme and row_of(text, "Qwen2.5-Omni-7B").startswith(
        row_of(readme, "Qwen2.5-Omni-7B")
    )


def test_the_verdicts_follow_the_figures():
    data = sample_data()
    text = mp.section(data)
    ratios = [run["peak_vs_plan"] for row in data["layers"]["rows"] for run in row["runs"]]
    assert (
        f"Within 25% of the plan at every layer count (peak / plan {min(ratios):.2f}-{max(ratios):.2f})"
        in text
    )
    assert "flat in the layer count" in text  # the 8-layer mean is 26 MB above 2's; runs differ by up to 99
    data["layers"]["rows"][1] = layer_row(8, [1700, 1710], "aaa1111")
    text = mp.section(data)
    assert "**Not** within 25% of the plan at 8 decoder layers" in text
    assert "the change is beyond the run-to-run spread" in text


def test_render_rewrites_only_its_section_from_the_file(tmp_path):
    stored = tmp_path / "memory_plan.json"
    stored.write_text(json.dumps(sample_data()), encoding="utf-8")
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Benchmark results\n\n## Calibrate (issue 3)\n\nkept\n\n## Memory plan (issue 16)\n\n"
        "typed 0.89-0.98\n\n## Start-up and dry run (issue 16)\n\nalso kept\n",
        encoding="utf-8",
    )
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{mp.TABLE_START}\nold\n{mp.TABLE_END}\nafter\n", encoding="utf-8")
    mp.main(["render", "--json", str(stored), "--results", str(results), "--readme", str(readme)])
    text = results.read_text(encoding="utf-8")
    assert "typed 0.89-0.98" not in text and "kept" in text and "also kept" in text
    assert mp.section(sample_data()) in text
    assert text.index("## Memory plan") < text.index("## Start-up and dry run")
    table = mp.readme_table(sample_data()["real"]["rows"])
    assert readme.read_text(encoding="utf-8") == f"intro\n{mp.TABLE_START}\n{table}\n{mp.TABLE_END}\nafter\n"


def test_a_measured_part_keeps_the_other_parts_figures(tmp_path):
    stored = tmp_path / "memory_plan.json"
    data = sample_data()
    mp.store(stored, "real", data["real"])
    whole = mp.store(stored, "layers", data["layers"])
    assert whole == data == json.loads(stored.read_text(encoding="utf-8"))
    only_layers = mp.section({"layers": data["layers"]})
    assert "_`real` not measured yet._" in only_layers and "bbb2222" not in only_layers
