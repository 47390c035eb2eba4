"""`quantkit verify`: the audit catches what has shipped broken, drift is measured per stratum, and
vLLM's own tokens are checked against transformers'."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from quantkit.cli import app
from quantkit.verify import DriftThresholds, audit_checkpoint, verify_checkpoint
from quantkit.verify.vllm_check import AGREEMENT_MARGIN, classify_failure, shipped_schemes, vllm_python

runner = CliRunner()


@pytest.fixture(scope="module")
def fp8_checkpoint(zoo_model, tmp_path_factory) -> Path:
    """A data-free FP8 checkpoint of tiny Qwen3-VL, made by quantkit itself."""
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe

    out = tmp_path_factory.mktemp("ckpt") / "qwen3vl-fp8-dynamic"
    quantize(zoo_model("tiny-qwen3-vl"), out, resolve_recipe("fp8-dynamic"), [], progress=False)
    return out


def copy_of(checkpoint: Path, tmp_path: Path) -> Path:
    target = tmp_path / checkpoint.name
    shutil.copytree(checkpoint, target)
    return target


def failed_checks(result) -> dict[str, str]:
    return {c.name: c.detail for c in result.checks if not c.passed}


def test_clean_checkpoint_passes_audit(fp8_checkpoint):
    result = audit_checkpoint(fp8_checkpoint)
    assert result.passed, failed_checks(result)
    assert result.format == "float-quantized"
    assert result.quantized_modules and all(".language_model." in n for n in result.quantized_modules)
    # FP8 weights are 1 byte instead of 2, plus one scale per output channel.
    assert 0.5 < result.size_ratio < 0.52


AUDIT_IN_A_FRESH_PROCESS = """
import sys
from pathlib import Path
from quantkit.verify import audit_checkpoint
result = audit_checkpoint(Path(sys.argv[1]))
assert result.passed, [c for c in result.checks if not c.passed]
print("sklearn after the audit:", "sklearn" in sys.modules)
import sklearn.metrics
import transformers.generation.candidate_generator as generation
print("roc_curve:", generation.roc_curve([0, 1, 1], [0.1, 0.8, 0.6])[0].tolist())
"""


def test_audit_does_not_import_scikit_learn_and_leaves_transformers_working(fp8_checkpoint):
    """An audit never generates: transformers' generation stack (imported by compressed-tensors)
    comes in without scikit-learn, and its scikit-learn names still work when called later."""
    import subprocess
    import sys

    pytest.importorskip("sklearn", reason="scikit-learn is not installed: nothing to keep out")
    run = subprocess.run(
        [sys.executable, "-c", AUDIT_IN_A_FRESH_PROCESS, str(fp8_checkpoint)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert "sklearn after the audit: False" in lines
    assert "roc_curve: [0.0, 0.0, 0.0, 1.0]" in lines, run.stdout


def test_audit_catches_quantized_vision_tower(zoo_model, tmp_path):
    """The rename failure seen in the field: an ignore list that no longer matches the vision tower."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForImageTextToText

    source = zoo_model("tiny-qwen3-vl")
    model = AutoModelForImageTextToText.from_pretrained(source, dtype=torch.bfloat16)
    stale_ignore = ["lm_head", "re:^visual\\..*"]  # the pre-rename module path: matches nothing now
    oneshot(
        model=model, recipe=QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=stale_ignore)
    )
    model.save_pretrained(tmp_path / "bad", save_compressed=True)
    result = audit_checkpoint(tmp_path / "bad")
    problems = failed_checks(result)
    assert "only the language model is quantized" in problems
    assert "model.visual.blocks.0.attn.qkv (vision)" in problems["only the language model is quantized"]
    # The config agrees with the tensors (the library wrote both): only the module groups show it.
    assert "config groups and stored tensors agree" not in problems


def test_audit_catches_ignore_entry_matching_nothing(fp8_checkpoint, tmp_path):
    checkpoint = copy_of(fp8_checkpoint, tmp_path)
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"]["ignore"].append("model.vision_tower.blocks.0.attn.qkv")
    (checkpoint / "config.json").write_text(json.dumps(config))
    problems = failed_checks(audit_checkpoint(checkpoint))
    assert (
        "'model.vision_tower.blocks.0.attn.qkv' matches nothing"
        in problems["every ignore entry matches a module"]
    )


def test_audit_catches_nan_scale(fp8_checkpoint, tmp_path):
    checkpoint = copy_of(fp8_checkpoint, tmp_path)
    tensors = load_file(checkpoint / "model.safetensors")
    key = "model.language_model.layers.1.mlp.down_proj.weight_scale"
    tensors[key] = tensors[key].clone()
    tensors[key][3] = float("nan")
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    problems = failed_checks(audit_checkpoint(checkpoint))
    assert f"{key}: 1 non-finite value(s)" in problems["every scale is finite and positive"]


def test_audit_catches_missing_quantization_config(fp8_checkpoint, tmp_path):
    checkpoint = copy_of(fp8_checkpoint, tmp_path)
    config = json.loads((checkpoint / "config.json").read_text())
    del config["quantization_config"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    result = audit_checkpoint(checkpoint)
    assert not result.passed
    assert failed_checks(result) == {
        "quantization_config present and valid": "config.json has no quantization_config"
    }


def test_audit_catches_wrong_dtype(fp8_checkpoint, tmp_path):
    checkpoint = copy_of(fp8_checkpoint, tmp_path)
    tensors = load_file(checkpoint / "model.safetensors")
    key = "model.language_model.layers.0.self_attn.q_proj.weight"
    tensors[key] = tensors[key].to(torch.bfloat16)
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    problems = failed_checks(audit_checkpoint(checkpoint))
    assert "dtype BF16" in problems["quantized tensors have the scheme's dtype and shape"]


def test_verify_cli_writes_json_and_exit_codes(fp8_checkpoint, tmp_path):
    checkpoint = copy_of(fp8_checkpoint, tmp_path)
    ok = runner.invoke(app, ["verify", str(checkpoint)])
    assert ok.exit_code == 0, ok.output
    saved = json.loads((checkpoint / "verify.json").read_text())
    assert saved["passed"] is True and saved["audit"]["passed"] is True
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"]["ignore"].append("nothing.at.all")
    (checkpoint / "config.json").write_text(json.dumps(config))
    bad = runner.invoke(app, ["verify", str(checkpoint)])
    assert bad.exit_code == 1
    assert "nothing.at.all" in bad.output
    missing = runner.invoke(app, ["verify", str(tmp_path / "nope")])
    assert missing.exit_code == 2


def test_drift_per_modality_and_task_and_threshold_breach(zoo_model, demo_pool, tmp_path):
    from quantkit.calibset import CalibrateOptions, build_calibration_set
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe

    source = zoo_model("tiny-qwen2.5-omni")
    calib = tmp_path / "calib"
    build_calibration_set([demo_pool], calib, CalibrateOptions(size=60, model=source, max_seq_len=600))
    checkpoint = tmp_path / "omni-fp8"
    quantize(source, checkpoint, resolve_recipe("fp8-dynamic"), [], progress=False)
    report = verify_checkpoint(checkpoint, reference=source, calib=calib, num_samples=6, write=False).drift
    assert report.overall.samples == 6
    modalities = {g.name for g in report.by_modality}
    assert (
        len(modalities) >= 3
        and any("audio" in m for m in modalities)
        and any("image" in m for m in modalities)
    )
    assert 0 < report.overall.kl < 0.05 and report.overall.top1 > 0.8 and report.overall.cosine > 0.99
    strict = DriftThresholds(max_kl=report.overall.kl / 10, min_top1=0.0, min_cosine=0.0)
    judged = verify_checkpoint(
        checkpoint, reference=source, calib=calib, num_samples=6, thresholds=strict, write=False
    )
    assert not judged.passed
    assert any(b.startswith("modality ") and "KL" in b for b in judged.drift.breaches)


def test_only_known_kernel_messages_are_skips():
    """vLLM's own "no kernel here" messages (stub ops, absent ops, kernel selection) read as
    skipped for a scheme quantkit ships; anything else, a NotImplementedError included, is a
    failure, and so is every one of them for a scheme quantkit does not ship."""
    absent = {
        "stage": "generate",
        "error_type": "AttributeError",
        "message": "'_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'",
    }
    assert classify_failure(absent, ["W4A16_ASYM"])[0] == "skipped"
    assert classify_failure(absent, None)[0] == "failed"
    stub = {
        "stage": "load",
        "error_type": "RuntimeError",
        "message": "_C::static_scaled_fp8_quant() expected at most 0 argument(s) but received 4 argument(s). "
        "Declaration: _C::static_scaled_fp8_quant() -> ()",
    }
    status, reason = classify_failure(stub, ["FP8"])
    assert status == "skipped" and "no kernel for FP8" in reason and "static_scaled_fp8_quant" in reason
    assert classify_failure(stub, None)[0] == "failed"
    selection = {
        "stage": "load",
        "error_type": "ValueError",
        "message": "Failed to find a kernel that can implement the WNA16 linear layer. Reasons: \n"
        "CPUWNA16 ... Quant type (uint8b128) not supported by CPUWNA16",
    }
    assert classify_failure(selection, ["W4A16_ASYM", "W8A16"])[0] == "skipped"
    # The same words for a scheme quantkit does not ship mean the export is wrong, not the CPU.
    assert classify_failure(selection, None)[0] == "failed"
    unmatched = {
        "stage": "load",
        "error_type": "NotImplementedError",
        "message": "No compressed-tensors compatible scheme was found for layer_name='x'",
    }
    assert classify_failure(unmatched, ["FP8_DYNAMIC"])[0] == "skipped"
    assert classify_failure(unmatched, None)[0] == "failed"
    for message in ("x", "Unsupported activation scheme", "not implemented for 'Half'"):
        answer = {"stage": "load", "error_type": "NotImplementedError", "message": message}
        assert classify_failure(answer, ["FP8"])[0] == "failed", message
    shape = {"stage": "generate", "error_type": "RuntimeError", "message": "mat1 must be a 2D tensor"}
    assert classify_failure(shape, ["W8A8"])[0] == "failed"
    broken = {
        "stage": "load",
        "error_type": "KeyError",
        "message": "model.layers.0.mlp.down_proj.weight_scale",
    }
    assert classify_failure(broken, ["W8A8"])[0] == "failed"


def test_shipped_schemes_names_every_recipe_and_nothing_else(fp8_checkpoint):
    config = json.loads((fp8_checkpoint / "config.json").read_text())["quantization_config"]
    assert shipped_schemes(config) == ["FP8_DYNAMIC"]
    group = config["config_groups"]["group_0"]
    group["weights"]["num_bits"] = 4  # FP4 per-channel weights: no recipe writes them
    assert shipped_schemes(config) is None
    from quantkit.precision.mixed import high_scheme  # the 8-bit layers of --avg-bits: per channel

    promoted = {"config_groups": {"group_0": high_scheme("W8A16", ["Linear"]).model_dump(mode="json")}}
    assert shipped_schemes(promoted) == ["W8A16"]


def served_or_skip(result):
    """A check vLLM could not run here is a skipped test (with vLLM's reason), never a pass."""
    if result.status == "skipped":
        pytest.skip(result.reason)
    assert result.status == "passed", result.reason


@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment (make vllm-env)")
def test_vllm_fails_a_scheme_no_one_implements(fp8_checkpoint, tmp_path):
    """A checkpoint whose quantization_config names 2-bit int per-channel weights with FP8
    per-token activations: no vLLM scheme implements that on any platform (a NotImplementedError
    at load), and quantkit must report it as a failure, not as a missing kernel."""
    from quantkit.verify.vllm_check import check_with_vllm

    checkpoint = copy_of(fp8_checkpoint, tmp_path)
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"].update(num_bits=2, type="int")
    (checkpoint / "config.json").write_text(json.dumps(config))
    result = check_with_vllm(checkpoint)
    assert result.status == "failed", result.reason
    assert "load failed: NotImplementedError" in result.reason


@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment (make vllm-env)")
def test_vllm_loads_checkpoint_and_agrees_with_transformers(fp8_checkpoint):
    from quantkit.verify.vllm_check import check_with_vllm

    result = check_with_vllm(fp8_checkpoint)
    assert result.status == "passed", result.reason
    assert {p.name for p in result.prompts} == {"text", "image"}
    assert all(p.worst_logprob_gap <= AGREEMENT_MARGIN for p in result.prompts)


def test_teacher_forced_check_rejects_tokens_from_another_model(fp8_checkpoint, tmp_path):
    """The vLLM agreement check can fail: tokens that are not this model's greedy choices are caught."""
    from transformers import AutoProcessor

    from quantkit.verify.vllm_check import _transformers_side, probe_samples

    samples = probe_samples(AutoProcessor.from_pretrained(fp8_checkpoint), tmp_path)
    foreign = {"text": [5, 900, 17, 1300, 42, 77, 1500, 3]}
    [comparison] = _transformers_side(
        fp8_checkpoint, {"text": samples["text"]}, foreign, margin=AGREEMENT_MARGIN
    )
    assert not comparison.agrees and comparison.worst_logprob_gap > AGREEMENT_MARGIN


def test_audit_catches_ignore_list_transformers_cannot_match(zoo_model, tmp_path):
    """Qwen2.5-VL is saved under older key names; an ignore list in those names alone makes
    transformers quantize the vision tower on reload (NaN logits). quantkit adds module-name
    patterns at export; without them the audit must object."""
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe

    checkpoint = tmp_path / "q25vl"
    quantize(zoo_model("tiny-qwen2.5-vl"), checkpoint, resolve_recipe("fp8-dynamic"), [], progress=False)
    assert audit_checkpoint(checkpoint).passed
    config = json.loads((checkpoint / "config.json").read_text())
    ignore = config["quantization_config"]["ignore"]
    assert "visual.blocks.0.attn.qkv" in ignore  # the on-disk name vLLM reads
    config["quantization_config"]["ignore"] = [entry for entry in ignore if not entry.startswith("re:")]
    (checkpoint / "config.json").write_text(json.dumps(config))
    problems = failed_checks(audit_checkpoint(checkpoint))
    assert (
        "model.visual.blocks.0.attn.qkv: claimed by group_0 but stored unquantized"
        in problems["config groups and stored tensors agree"]
    )


@pytest.fixture(scope="module")
def omni_set(zoo_model, demo_pool, tmp_path_factory) -> Path:
    from quantkit.calibset import CalibrateOptions, build_calibration_set

    calib = tmp_path_factory.mktemp("omni-calib") / "set"
    build_calibration_set(
        [demo_pool], calib, CalibrateOptions(size=40, model=zoo_model("tiny-qwen2.5-omni"), max_seq_len=1024)
    )
    return calib


@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment (make vllm-env)")
@pytest.mark.parametrize("recipe_name", ["fp8-dynamic", "w8a8-sq-gptq", "w4a16", "fp8"])
def test_vllm_runs_every_recipe_on_the_omni_thinker(recipe_name, zoo_model, omni_set, tmp_path):
    """vLLM loads each recipe's Omni checkpoint (serving layout) and generates for text, image and
    audio prompts in agreement with transformers; a scheme without a kernel on this machine is a
    skipped test with vLLM's reason, never a pass."""
    from quantkit.models.samples import samples_from_set
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe
    from quantkit.verify.vllm_check import check_with_vllm

    source = zoo_model("tiny-qwen2.5-omni")
    recipe = resolve_recipe(recipe_name)
    drawn = samples_from_set(omni_set, model_kinds={"image", "video", "audio"}, num_samples=12)
    out = tmp_path / recipe_name
    quantize(source, out, recipe, drawn.samples, sample_labels=drawn.labels, progress=False)
    result = check_with_vllm(out)
    if recipe_name in ("fp8-dynamic", "w8a8-sq-gptq"):  # both have CPU kernels on AVX2 and AVX-512
        assert result.status == "passed", result.reason
    served_or_skip(result)  # static FP8 (a stub op on CPU), W4A16 (AVX-512 only): skipped with why
    assert {p.name for p in result.prompts} == {"text", "image", "audio"}
    assert all(p.agrees for p in result.prompts)
