"""The benchmark scripts run and print their figures (speed targets live in bench/, not in tests)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
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
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert figures["selected"] == 200
    # (c) with and without a bytecode cache, and the CPU pairs: the ratios are those of the figures
    # the same JSON holds (written rounded to ms: a (a) of some 30 ms leaves a ratio ~2% off)
    def same(ratio, value):
        return ratio == pytest.approx(value, rel=0.03)

    assert figures["command_uncached_s"] > 0 and figures["parse_process_cpu_s"] > 0
    assert same(figures["ratio_command"], figures["command_s"] / figures["parse_process_s"])
    assert same(figures["ratio_command_uncached"], figures["command_uncached_s"] / figures["parse_process_s"])
    pairs = zip(figures["command_cpu_runs_s"], figures["parse_process_cpu_runs_s"], strict=True)
    assert same(figures["ratio_command_cpu"], statistics.median(c / p for c, p in pairs))
    assert figures["goal_command_met"] == (figures["command_s"] / figures["parse_process_s"] <= 3)


def test_calibrate_bench_without_a_cache_reads_no_existing_bytecode(tmp_path):
    """PYTHONDONTWRITEBYTECODE only stops writing: the run without a cache also points the prefix
    at an empty folder, so no .pyc beside the sources (or anywhere) is read."""
    bench = bench_module("calibrate_bench")
    empty = tmp_path / "empty"
    empty.mkdir()
    env = bench._env(bench.ROOT, empty, cached=False)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONPYCACHEPREFIX"] == str(empty)
    probe = "import sys, quantkit.taskassign as m; print(m.__cached__, sys.dont_write_bytecode)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert proc.stdout.split()[0].startswith(str(empty)) and proc.stdout.split()[1] == "True"
    assert not any(empty.rglob("*.pyc"))  # nothing written there either


def test_overhead_bench_fails_naming_a_step_that_moved():
    """A step the quantize-overhead bench times that is gone from where it looks it up stops the
    bench (exit 1, the step named), instead of timing it as 0 s."""
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); import quantkit.quantize.run as run; "
        "del run.check_scales; import quantize_overhead; quantize_overhead._instrument({})"
    )
    proc = run_script("-c", code, timeout=120)
    assert proc.returncode == 1
    assert "quantkit.quantize.run.check_scales" in proc.stderr and "moved on" in proc.stderr


def test_overhead_bench_fails_naming_a_step_no_longer_called():
    """A timed step that still exists but quantize no longer calls stops the bench (exit 1, the
    step named) instead of timing it as 0 s; a step that was called, or that the bench's recipe
    is known not to call, is not named."""
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); import quantize_overhead as qo; "
        "import quantkit.export as export; calls = qo._instrument({})\n"
        "try:\n    export.render_model_card({})\nexcept Exception:\n    pass\n"
        "raise qo.NotCalled(qo.uncalled_steps(calls))"
    )
    proc = run_script("-c", code, timeout=120)
    assert proc.returncode == 1
    assert "quantkit.quantize.run.check_scales" in proc.stderr and "0 calls in run A" in proc.stderr
    assert "render_model_card" not in proc.stderr and "check_smoothquant_mappings" not in proc.stderr


def test_gpu_bench_skips_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the skip path does not apply")
    proc = run_script(str(BENCH / "gpu_vllm.py"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipped" in proc.stdout and "CUDA" in proc.stdout


def test_startup_bench_repeats_each_command(tmp_path):
    """Every command runs at least twice (a warm-up, then the counted runs): a dry run that refused
    to replace the plan its warm-up wrote stopped `make bench` here."""
    out = tmp_path / "startup.json"
    proc = run_script(str(BENCH / "startup.py"), "--quick", "--json", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {row["command"]: row for row in json.loads(out.read_text(encoding="utf-8"))["rows"]}
    dry_runs = [name for name in rows if name.startswith("quantize --dry-run")]
    assert len(dry_runs) == 2  # with the bytecode cache and without
    assert all(rows[name]["cpu_s"] > 0 for name in dry_runs)
    assert "torch" in rows[dry_runs[0]]["imports"] and rows["quantkit --help"]["imports"] == []


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


def bench_module(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def test_a_failed_write_leaves_the_stored_rows_intact(tmp_path):
    """bench/real_weights.json (and the other stores of measured rows) are rewritten whole after
    each run: a row JSON cannot encode, or a write cut short (a full disk, a kill mid-write), must
    leave the previous file as it was, not a truncated one that loses every stored row."""
    write_json = bench_module("_shared").write_json
    store = tmp_path / "real_weights.json"
    write_json(store, {"runs": {"w4a16": {"ppl": 46.98}}}, indent=2)
    before = store.read_bytes()

    with pytest.raises(TypeError):  # serialisation fails: nothing is written
        write_json(store, {"runs": {"w4a16": {"ppl": 46.98}, "w8a8": {"model": object()}}}, indent=2)
    assert store.read_bytes() == before

    pytest.importorskip("resource", reason="RLIMIT_FSIZE (a write cut short) needs POSIX")
    # The write itself fails part-way: a child whose file-size limit is below the new file's size
    # (the real kernel refusal, EFBIG, as on a full disk) rewrites the store.
    child = (
        "import resource, signal, sys\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "from _shared import write_json\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "rows = {f'run-{i}': {'ppl': float(i), 'note': 'x' * 64} for i in range(1000)}\n"
        "try:\n"
        f"    write_json({str(store)!r}, {{'runs': rows}}, indent=2)\n"
        "except OSError as error:\n"
        "    print(error.errno)\n"
        "    sys.exit(3)\n"
    )
    proc = run_script("-c", child)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert store.read_bytes() == before
    assert json.loads(before)["runs"] == {"w4a16": {"ppl": 46.98}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real_weights.json"]  # no partial left


def test_run_all_keeps_the_sections_other_benches_wrote(tmp_path):
    """run_all rewrites RESULTS.md whole; the sections other benches wrote (start-up, memory plan,
    token weights) stay, its own are replaced."""
    run_all = bench_module("run_all")
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Benchmark results\n\n## Calibrate (issue 3)\n\nold 3.90\n\n"
        "## Start-up and dry run (issue 16)\n\n| quantkit --help | 0.8 s |\n\n## Memory plan (issue 16)\n\n0.95\n"
    )
    text = run_all.with_other_sections("# Benchmark results\n\n## Calibrate (issue 3)\n\nnew 3.10\n", results)
    assert "new 3.10" in text and "old 3.90" not in text and text.count("## Calibrate") == 1
    assert "| quantkit --help | 0.8 s |" in text and "## Memory plan (issue 16)\n\n0.95" in text


def test_run_all_drops_its_own_section_it_no_longer_writes(tmp_path):
    """A section run_all owns but did not write this time (renamed, or left out) is not kept as
    though another bench had written it."""
    run_all = bench_module("run_all")
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Benchmark results\n\n## GPU serving speed (vLLM)\n\nstale\n\n## Memory plan (issue 16)\n\n0.95\n"
    )
    text = run_all.with_other_sections("# Benchmark results\n\n## GPU speed\n\nnew\n", results)
    assert "stale" not in text and "## GPU serving speed" not in text
    assert "## Memory plan (issue 16)\n\n0.95" in text


def test_source_hash_follows_the_files_that_made_a_row(tmp_path):
    """A cached real-weights row is keyed by the quantkit files its process had loaded: a change
    to one of them changes the key, a change elsewhere (or to documentation) does not."""
    shared = bench_module("_shared")
    for folder in shared.SOURCE_DIRS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    used = ["quantkit/quantize/run.py", "recipes/w4a16.yaml"]
    before, whole = shared.source_hash(tmp_path, used), shared.source_hash(tmp_path)
    (tmp_path / "quantkit" / "NOTES.md").write_text("prose only\n")
    audit = tmp_path / "quantkit" / "verify" / "audit.py"
    audit.write_text(audit.read_text() + "\n# a change outside the quantize path\n")
    assert shared.source_hash(tmp_path, used) == before and shared.source_hash(tmp_path) != whole
    run = tmp_path / "quantkit" / "quantize" / "run.py"
    run.write_text(run.read_text() + "\n# a change to the quantize path\n")
    assert shared.source_hash(tmp_path, used) != before

    import quantkit.quantize  # noqa: F401 - loaded, so it made whatever this process measures

    loaded = shared.loaded_sources()
    assert "quantkit/quantize/run.py" in loaded and "recipes/w4a16.yaml" in loaded
    assert set(loaded) <= set(shared.source_files())


def test_rows_name_their_commit_and_stale_rows_say_so():
    mp = bench_module("mixed_precision")
    state = {"bench": "b" * 64, "versions": {"torch": "1"}, "commit": "1234567"}
    changed = {**state, "bench": "c" * 64, "commit": "89abcde"}
    settings = {"calib_samples": 2, "eval_windows": 2, "window": 512}
    spec, files = {"run": "rtn-g64"}, ["quantkit/quantize/run.py"]
    made = mp.provenance("rtn-g64", spec, settings, state, files)
    now = mp.provenance("rtn-g64", spec, settings, changed, files)
    assert made["key"] != now["key"]
    assert made["key"] == mp.provenance("rtn-g64", spec, settings, state, files)["key"]
    assert made["key"] != mp.provenance("rtn-g64", spec, settings, state, None)["key"]
    row = {"ppl": 40.0, "kl": 0.5, "top1": 0.6, "reference_ppl": 36.0, "provenance": made}
    legacy = {**row, "provenance": {"commit": "1679748 or earlier", "legacy": True}}
    assert mp.made_by(row, made) == "1234567 (current)"
    assert mp.made_by(row, now) == "stale (measured at 1234567)"
    assert mp.made_by(legacy, now) == "stale (measured at 1679748 or earlier; before rows were keyed)"
    saved = {
        "settings": settings,
        "reference": {"ppl": 36.0, "tokens": 10},
        "runs": {"rtn-g64": row, "quantkit-w4a16": legacy},
    }
    expected = {"rtn-g64": made, "quantkit-w4a16": now}
    section = mp.results_section(saved, "test", expected)
    assert "| rtn-g64 | - | - | 40.00 | +11.1% | 0.500 | 0.600 | seconds | 1234567 (current) |" in section
    assert "stale (measured at 1679748 or earlier; before rows were keyed)" in section
    assert mp.current_rows(saved["runs"], expected) == {"rtn-g64": row}
    # A row other code made keeps its last figures, marked stale with the commit that measured them.
    saved["runs"]["rtn-g64"] = {**row, "ppl": 77.0, "kl": 0.777, "provenance": now}
    section = mp.results_section(saved, "test", {"rtn-g64": made, "quantkit-w4a16": now})
    assert "| rtn-g64 | - | - | 77.00 | +113.9% | 0.777 | 0.600 | seconds | stale (measured at 89abcde) |" in section
    assert "| - | - | - | - | - | - | - |" not in section  # no blank row


def test_real_weights_rows_are_keyed_by_the_text_and_the_model_folder(tmp_path, monkeypatch):
    """A SmolLM2 row is current only on the Jargon File bytes and the converted model folder it
    was measured on: the folder is converted once and kept, the text comes from a Debian package."""
    mp = bench_module("mixed_precision")
    converted, linked = tmp_path / "converted", tmp_path / "parts-template"
    converted.mkdir()
    (converted / "config.json").write_text('{"hidden_size": 8}')
    (converted / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    linked.mkdir()
    for item in converted.iterdir():  # as with_parts_template links the converted folder
        (linked / item.name).symlink_to(item)
    text = tmp_path / "jargon.txt.gz"
    text.write_bytes(b"first edition")
    monkeypatch.setattr(mp, "JARGON", (tmp_path / "absent.gz", text))
    made = mp.input_digests(linked)
    assert made == mp.input_digests(converted)  # the links are read through

    weights = bytearray((converted / "model.safetensors").read_bytes())
    weights[100] ^= 1
    (converted / "model.safetensors").write_bytes(bytes(weights))
    other_model = mp.input_digests(linked)
    assert other_model["model"] != made["model"] and other_model["text"] == made["text"]
    text.write_bytes(b"second edition")
    assert mp.input_digests(linked)["text"] not in (made["text"], other_model["text"])
    monkeypatch.setattr(mp, "JARGON", (tmp_path / "absent.gz",))
    assert mp.input_digests(linked)["text"] == "missing"

    state = {"bench": "b" * 64, "versions": {"torch": "1"}, "commit": "1234567"}
    settings = {"calib_samples": 2, "eval_windows": 2, "window": 512}
    row_key = mp.provenance("rtn-g64", {"run": "rtn-g64"}, {**settings, "inputs": made}, state, None)
    now_key = mp.provenance("rtn-g64", {"run": "rtn-g64"}, {**settings, "inputs": other_model}, state, None)
    row = {"ppl": 40.0, "kl": 0.5, "top1": 0.6, "reference_ppl": 36.0, "provenance": row_key}
    assert mp.made_by(row, now_key) == "stale (measured at 1234567)"


def test_goals_put_each_scheme_under_the_bar_of_its_class():
    """nvfp4 quantizes weights and activations to FP4 (W4A4): no W4A16 bar judges it, and the
    goals say no bar covers it; nvfp4-a16 (weight-only FP4) stands under both W4A16 bars. Each
    bar's text comes from GOALS."""
    mp = bench_module("mixed_precision")
    reference = {"ppl": 40.0, "tokens": 10}
    rows = {
        name: {"ppl": 40.0 * (1 + change / 100), "kl": 0.1, "top1": 0.9, "avg_bits": bits}
        for name, change, bits in [("quantkit-nvfp4", 50.0, 4.0), ("quantkit-nvfp4-a16", 20.0, 4.0), ("quantkit-fp8", 1.0, 8.0)]
    }
    lines = mp.verdicts(rows, reference)
    by_run = {name: [line for line in lines if f": {name} (" in line] for name in rows}
    w4a16 = [g for g in mp.GOALS if g["scheme"] == "W4A16"]
    assert len(by_run["quantkit-nvfp4-a16"]) == len(w4a16) >= 2
    assert all(line.startswith("- W4A16 ") for line in by_run["quantkit-nvfp4-a16"])
    (nvfp4,) = by_run["quantkit-nvfp4"]
    assert nvfp4.startswith("- W4A4: no bar") and "fp4 weights, fp4 activations" in nvfp4
    (fp8,) = by_run["quantkit-fp8"]
    (bar,) = [g for g in mp.GOALS if g["scheme"] == "W8A8"]
    assert fp8.startswith(f"- W8A8 perplexity change <= +{bar['limit']:g}% (issue {bar['issue']})") and "(met)" in fp8
    for goal in w4a16:
        assert any(f"<= +{goal['limit']:g}%" in line for line in by_run["quantkit-nvfp4-a16"])


def test_stored_bits_are_read_from_the_checkpoint(zoo_model, tmp_path):
    """The bench's "avg bits / with scales" come from the tensors a checkpoint stores: FP8 with a
    16-bit scale per output channel is 8 + 16 / in_features bits per weight."""
    import torch

    from quantkit.models import adapter_for
    from quantkit.quantize import quantize
    from quantkit.recipes import get_recipe

    mp = bench_module("mixed_precision")
    source = zoo_model("tiny-qwen3")
    result = quantize(source, tmp_path / "fp8d", get_recipe("fp8-dynamic"), [], progress=False)
    model = adapter_for(source).load_model(source, dtype=torch.bfloat16)
    shapes = [model.get_submodule(name).weight.shape for name in result.quantized_modules]
    count = sum(o * i for o, i in shapes)
    expected = (8 * count + 16 * sum(o for o, _ in shapes)) / count
    bits = mp.stored_bits(result.output)
    assert bits["avg_bits"] == 8.0 and abs(bits["effective_bits"] - expected) < 1e-3, bits


@pytest.mark.parametrize(
    ("recipe", "packing"),
    [("w4a16", "int4 in int32, weight_shape stored"), ("fp8-dynamic", "unpacked")],
)
def test_stored_bits_count_every_packed_weight(zoo_model, tmp_path, recipe, packing):
    """However a format packs its weights, the bench counts each weight once: the stored weight
    bits over the model's own Linear shapes are the scheme's num_bits (round-to-nearest, so no
    calibration set is needed). These formats' counts come from ``weight_shape`` or the tensor
    itself; FP4's, derived from num_bits, is held to an independent count below."""
    import torch
    from compressed_tensors.quantization import preset_name_to_scheme

    from quantkit.models import adapter_for
    from quantkit.quantize import quantize
    from quantkit.recipes import get_recipe

    mp = bench_module("mixed_precision")
    source = zoo_model("tiny-qwen3")
    shipped = get_recipe(recipe)
    # round-to-nearest with the library's range: w4a16's imatrix_mse observer would need data
    rtn = shipped.model_copy(update={"method": "rtn", "weight_observer": None})
    result = quantize(source, tmp_path / recipe, rtn, [], progress=False)
    num_bits = preset_name_to_scheme(shipped.scheme, ["Linear"]).weights.num_bits
    model = adapter_for(source).load_model(source, dtype=torch.bfloat16)
    shapes = [model.get_submodule(name).weight.shape for name in result.quantized_modules]
    # 32 bits (an int32) hold a whole number of weights only when in_features divide evenly
    assert shapes and all(i * num_bits % 32 == 0 for _, i in shapes), (packing, shapes)
    stored = mp.stored_bits(result.output)
    assert stored["avg_bits"] == num_bits, (packing, stored)
    assert stored["effective_bits"] > num_bits, (packing, stored)


def test_fp4_stored_bits_match_an_independent_count(zoo_model, tmp_path):
    """NVFP4 packs two FP4 weights per uint8 and stores no ``weight_shape``, so the bench counts
    its weights from the packed tensor and the scheme's num_bits (which would make "avg bits" the
    scheme's num_bits whatever the count). Held here to counts that share none of that path: the
    weights are the sum of out_features x in_features over the quantized Linear modules of the
    model itself; the scales, from the checkpoint's config, one group scale (its scale_dtype) per
    group_size weights of a row and one global scale per layer (the checkpoint's dtype)."""
    import torch

    from quantkit.models import adapter_for
    from quantkit.quantize import quantize
    from quantkit.recipes import get_recipe

    mp = bench_module("mixed_precision")
    source = zoo_model("tiny-qwen3")
    rtn = get_recipe("nvfp4-a16").model_copy(update={"method": "rtn"})
    result = quantize(source, tmp_path / "nvfp4-a16", rtn, [], progress=False)
    model = adapter_for(source).load_model(source, dtype=torch.bfloat16)
    layers = [model.get_submodule(name) for name in result.quantized_modules]
    assert layers and all(isinstance(layer, torch.nn.Linear) for layer in layers)
    weights = sum(layer.out_features * layer.in_features for layer in layers)
    config = json.loads((result.output / "config.json").read_text())
    (group,) = config["quantization_config"]["config_groups"].values()
    args = group["weights"]
    scale_bits = 8 * getattr(torch, args["scale_dtype"].removeprefix("torch.")).itemsize
    global_bits = 8 * getattr(torch, config.get("dtype") or config["torch_dtype"]).itemsize
    scales = sum(
        layer.out_features * (layer.in_features // args["group_size"]) * scale_bits + global_bits for layer in layers
    )
    stored = mp.stored_bits(result.output)
    assert stored["avg_bits"] == args["num_bits"], stored
    assert abs(stored["effective_bits"] - (args["num_bits"] * weights + scales) / weights) < 1e-3, stored


def tiny_llama(folder: Path, hidden: int):
    """A one-layer random Llama with ``hidden`` in-features, saved (oneshot reads the folder)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)


@pytest.mark.parametrize("hidden", [128, 192])
def test_a_checkpoint_whose_forward_raises_is_the_runs_failure(tmp_path, hidden):
    """llmcompressor's FP8_BLOCK preset quantizes activations in groups of 128 at run time: on
    in-features 128 does not divide, the checkpoint it writes cannot run a forward pass, and the
    bench records that as the run's failure, naming the constraint; where 128 divides them, there
    is no constraint to break and the checkpoint runs."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    mp = bench_module("mixed_precision")
    model = tiny_llama(tmp_path / "base", hidden)
    ref = mp.Reference(model, [torch.randint(0, 256, (32,))])
    scheme = mp.run_scheme("plain-fp8-block", {})
    constraint = mp.shape_constraint(scheme, mp.linear_widths(tmp_path / "base"))
    oneshot(model=model, recipe=[QuantizationModifier(targets=["Linear"], scheme="FP8_BLOCK", ignore=["lm_head"])])
    model.save_pretrained(tmp_path / "fp8-block", save_compressed=True)
    refused = mp.forward_failure(mp.load_checkpoint(tmp_path / "fp8-block"), ref, constraint)
    if hidden % 128:
        # q/k/v/o and gate/up take `hidden` in-features, down_proj 2 x hidden (384: 128 divides it)
        assert constraint and f"in-features {hidden} it does not divide" in constraint, constraint
        assert f"{sum(1 for w in mp.linear_widths(tmp_path / 'base').values() if w % 128)} layer(s)" in constraint
        assert refused and refused.startswith(f"the written checkpoint does not run ({constraint}): "), refused
    else:
        assert constraint is None and refused is None


def test_an_error_no_scheme_constraint_explains_stops_the_bench(tmp_path):
    """A forward pass that raises where the run's scheme has no shape constraint the model
    breaks (here: token ids beyond the vocabulary, as a fault in the code would) is not a failed
    row: the error propagates, and so does one from quantization under the same rule."""
    import torch

    mp = bench_module("mixed_precision")
    model = tiny_llama(tmp_path / "base", 128)
    ref = mp.Reference(model, [torch.randint(0, 256, (32,))])
    ref.evals = [torch.full((32,), 10_000)]
    assert mp.shape_constraint(mp.run_scheme("plain-fp8-block", {}), mp.linear_widths(tmp_path / "base")) is None
    with pytest.raises(IndexError):
        mp.forward_failure(model, ref, None)
    with pytest.raises(ValueError, match="a fault"):
        mp.documented_failure(ValueError("a fault"), None, "quantization raised")
    text = mp.documented_failure(ValueError("bad width"), "weights in groups of 128: ...", "quantization raised")
    assert text == "quantization raised (weights in groups of 128: ...): ValueError: bad width"
