"""Data loss and false passes (issue 34): no output of any command replaces or writes into an
input, --force replaces only what the command itself wrote, a checkpoint with NaN outputs never
passes, a check asked for that cannot run is exit 2, media are the files calibrate chose, two runs
never race onto one output; and the negative tests that kill the mutants the issue names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import test_faults
import torch
from fixtures_pool import TWO_TIER_HEADER, Media, write_jsonl
from safetensors.torch import load_file, save_file
from test_faults import invoke, tree_hash

from quantkit.calibset import CalibrateOptions, build_calibration_set, load_calibration_set
from quantkit.calibset.allocate import allocate
from quantkit.errors import CheckFailed, InputError
from quantkit.fsutil import atomic_output_dir
from quantkit.media import MediaError, load_image
from quantkit.verify import VerifyReport
from quantkit.verify.audit import AuditResult, Check, audit_checkpoint
from quantkit.verify.drift import DriftGroup, DriftReport, DriftThresholds
from quantkit.verify.vllm_check import VllmCheck, vllm_python

# The fault tests' model, pool, set and checkpoint (module fixtures, registered here by name).
text_model, text_pool, text_calib, checkpoint = (
    test_faults.text_model,
    test_faults.text_pool,
    test_faults.text_calib,
    test_faults.checkpoint,
)

IMAGE_TAXONOMY = (
    TWO_TIER_HEADER
    + """\
  - {name: precise, family: vision, modalities: [text, image], tier: high}
  - {name: casual, family: text, modalities: [text, image], tier: low}
"""
)


def image_pool(root: Path, image, count: int = 6) -> tuple[Path, Path]:
    """A pool of ``count`` records per task, each with the image ``image()`` gives (a path under
    ``root`` or a data URI), and its taxonomy."""
    records = [
        {
            "task": task,
            "messages": [
                {"role": "user", "content": f"<image>What colour is picture {i}?"},
                {"role": "assistant", "content": f"{task} {i}"},
            ],
            "images": [image()],
        }
        for i in range(count)
        for task in ("precise", "casual")
    ]
    taxonomy = root / "taxonomy.yaml"
    taxonomy.write_text(IMAGE_TAXONOMY)
    return write_jsonl(root / "pool.jsonl", records), taxonomy


def copy_pool(text_pool, root: Path) -> tuple[Path, Path]:
    """A private copy of the shared text pool (these tests put folders beside it)."""
    pool, taxonomy = text_pool
    (root / "pool").mkdir(parents=True)
    return Path(shutil.copy(pool, root / "pool" / pool.name)), taxonomy


def rewrite_tensors(folder: Path, change) -> None:
    """Apply ``change(tensors: dict)`` to the single safetensors file of ``folder``."""
    (file,) = sorted(folder.glob("*.safetensors"))
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def rewrite_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


# --------------------------------------------------------------------------- calibrate --force


def test_calibrate_force_never_deletes_a_folder_that_only_looks_like_a_set(text_pool, tmp_path):
    pool, taxonomy = copy_pool(text_pool, tmp_path)
    media = pool.parent / "images"  # a media folder of the pool that happens to hold a report.json
    media.mkdir()
    for i in range(3):
        (media / f"{i}.png").write_bytes(b"an image the pool names")
    (media / "report.json").write_text(json.dumps({"format": "quantkit-calibration-set"}))
    elsewhere = tmp_path / "notes"  # not an input, but not a set either: the marker alone is not enough
    elsewhere.mkdir()
    (elsewhere / "report.json").write_text(json.dumps({"format": "quantkit-calibration-set"}))
    (elsewhere / "samples.jsonl").write_text("")
    (elsewhere / "thesis.tex").write_text("months of work")
    before = tree_hash(tmp_path)
    for output, says in (
        (media, "sits inside the pool's media folder"),
        (elsewhere, "not a calibration set quantkit wrote"),
    ):
        result = invoke("calibrate", pool, "-o", output, "--taxonomy", taxonomy, "--size", 10, "--force")
        assert result.exit_code == 2, result.output
        assert says in " ".join(result.output.split()), result.output
        assert tree_hash(tmp_path) == before

    # An earlier set beside the pool (its whole signature) is replaced with --force.
    earlier = pool.parent / "calib"
    assert invoke("calibrate", pool, "-o", earlier, "--taxonomy", taxonomy, "--size", 10).exit_code == 0
    again = invoke("calibrate", pool, "-o", earlier, "--taxonomy", taxonomy, "--size", 12, "--force")
    assert again.exit_code == 0, again.output
    assert json.loads((earlier / "report.json").read_text())["size"] == 12
    # ... but not once it holds anything calibrate does not write.
    (earlier / "mine.txt").write_text("a file of the user's")
    kept = invoke("calibrate", pool, "-o", earlier, "--taxonomy", taxonomy, "--size", 10, "--force")
    assert kept.exit_code == 2 and (earlier / "mine.txt").exists(), kept.output


# --------------------------------------------------------------------------- quantize's single files and cache


def test_plan_json_never_overwrites_an_input_or_an_earlier_plan(text_model, text_calib, tmp_path):
    model_before, calib_before = tree_hash(text_model), tree_hash(text_calib)
    base = ["quantize", text_model, "--recipe", "fp8-dynamic", "--dry-run", "--calib", text_calib]
    for target, says in (
        (text_model / "config.json", "--plan-json sits inside the model folder"),
        (text_calib / "samples.jsonl", "--plan-json sits inside the calibration set"),
        (text_model, "--plan-json is the model folder"),
    ):
        result = invoke(*base, "-o", tmp_path / "q", "--plan-json", target)
        assert result.exit_code == 2, result.output
        assert says in " ".join(result.output.split()), result.output
    assert tree_hash(text_model) == model_before and tree_hash(text_calib) == calib_before

    default = tmp_path / "q.plan.json"
    default.write_text("an earlier plan")
    refused = invoke(*base, "-o", tmp_path / "q")
    assert refused.exit_code == 2 and "already exists" in refused.output, refused.output
    assert default.read_text() == "an earlier plan"
    replaced = invoke(*base, "-o", tmp_path / "q", "--force")
    assert replaced.exit_code == 0, replaced.output
    assert json.loads(default.read_text())["recipe"] == "fp8-dynamic"


def test_sensitivity_output_is_not_replaced_without_force(text_model, text_calib, tmp_path):
    table = tmp_path / "s.json"
    table.write_text("an earlier ranking")
    result = invoke("sensitivity", text_model, "--calib", text_calib, "-o", table)
    assert result.exit_code == 2 and "--output already exists" in result.output, result.output
    assert table.read_text() == "an earlier ranking"


def test_quantize_cache_dir_inside_the_calibration_set_is_refused(text_model, text_calib, tmp_path):
    before = tree_hash(text_calib)
    result = invoke(
        "quantize", text_model, "--recipe", "w4a16", "--calib", text_calib,
        "-o", tmp_path / "q", "--cache-dir", text_calib / "cache",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--cache-dir sits inside the calibration set" in " ".join(result.output.split())
    assert tree_hash(text_calib) == before and not (tmp_path / "q").exists()


def test_eval_never_writes_into_the_original(text_model, tmp_path):
    before = tree_hash(text_model)
    among = invoke("eval", text_model, text_model, "--tasks", "quantkit_prose_ppl")
    assert among.exit_code == 2 and "original model is among the checkpoints" in among.output, among.output
    inside = text_model / "nested"
    shutil.copytree(text_model, tmp_path / "copy")
    shutil.move(tmp_path / "copy", inside)
    try:
        nested = invoke("eval", text_model, inside, "--tasks", "quantkit_prose_ppl")
        assert nested.exit_code == 2 and "sits inside the original model" in nested.output, nested.output
    finally:
        shutil.rmtree(inside)
    assert tree_hash(text_model) == before


# --------------------------------------------------------------------------- non-finite results and weights


def nan_group(name: str) -> DriftGroup:
    return DriftGroup(name, 2, float("nan"), 0.0, float("nan"), 0.0, positions=1000)


def test_nan_drift_fails_with_or_without_thresholds():
    thresholds = DriftThresholds(max_kl=0.06, min_top1=0.0, min_cosine=0.9)
    assert len(thresholds.breaches(nan_group("all"))) == 2  # KL and cosine: NaN compares false
    report = DriftReport("ref", "ckpt", nan_group("all"), [nan_group("text")], [nan_group("casual")])
    assert not report.passed  # no thresholds at all: a NaN is still a failure


def test_verify_fails_a_checkpoint_whose_outputs_are_nan(checkpoint, text_model, text_calib, tmp_path):
    broken = tmp_path / "nan-ckpt"
    shutil.copytree(checkpoint, broken)
    rewrite_tensors(broken, lambda t: t["model.norm.weight"].fill_(float("nan")))
    result = invoke(
        "verify", broken, "--reference", text_model, "--calib", text_calib, "--num-samples", 2,
        "--max-kl", 1000, "--min-top1", 0, "--min-cosine", -1,
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    report = json.loads((broken / "verify.json").read_text())
    assert report["passed"] is False and report["audit"]["passed"] is True
    assert any("non-finite" in b for b in report["drift"]["breaches"]), report["drift"]["breaches"]


def test_a_source_model_with_nan_weights_is_refused_naming_the_tensor(text_model, tmp_path):
    broken = tmp_path / "nan-model"
    shutil.copytree(text_model, broken)
    name = "model.layers.1.mlp.down_proj.weight"
    rewrite_tensors(broken, lambda t: t[name].view(-1)[:3].fill_(float("inf")))
    result = invoke("quantize", broken, "--recipe", "fp8-dynamic", "-o", tmp_path / "q")
    assert result.exit_code == 2, result.output
    assert name in result.output and "non-finite" in result.output, result.output
    assert not (tmp_path / "q").exists()


# --------------------------------------------------------------------------- drift thresholds from the CLI


@pytest.mark.parametrize(
    "option, value, says",
    [("--max-kl", "0", "KL"), ("--min-top1", "1", "top-1"), ("--min-cosine", "1", "logit cosine")],
)
def test_verify_threshold_options_fail_a_checkpoint(
    checkpoint, text_model, text_calib, tmp_path, option, value, says
):
    report = tmp_path / "v.json"
    # Enough samples for the groups to reach the positions a judgement needs (min_positions).
    base = ["verify", checkpoint, "--reference", text_model, "--calib", text_calib, "--num-samples", 16]
    result = invoke(*base, option, value, "--report", report)
    assert result.exit_code == 1, result.output
    data = json.loads(report.read_text())
    assert data["passed"] is False
    assert any(b.startswith("overall all") for b in data["drift"]["breaches"]), data["drift"]
    assert all(says in b for b in data["drift"]["breaches"]), data["drift"]


# --------------------------------------------------------------------------- vLLM asked for, none here


def test_vllm_checks_without_a_vllm_environment_are_exit_2(
    checkpoint, text_model, text_calib, tmp_path, monkeypatch
):
    missing = tmp_path / "no-such-python"
    monkeypatch.setenv("QUANTKIT_VLLM_PYTHON", str(missing))
    before = tree_hash(checkpoint)
    verified = invoke("verify", checkpoint, "--vllm")
    assert verified.exit_code == 2, verified.output
    assert "--vllm needs the vLLM environment" in " ".join(verified.output.split())
    assert tree_hash(checkpoint) == before  # refused before anything ran: no verify.json written
    built = invoke(
        "build", "--target", "h20", "--model", text_model, "--calib", text_calib,
        "--output-root", tmp_path / "out", "--vllm",
    )  # fmt: skip
    assert built.exit_code == 2, built.output
    assert "--vllm needs the vLLM environment" in " ".join(built.output.split())
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_verify_report_passed_rule_for_vllm():
    audit = AuditResult("ckpt", "Qwen3ForCausalLM", "float-quantized", [Check("audit", True)])
    verdicts = {
        status: VerifyReport("ckpt", audit, vllm=VllmCheck("ckpt", status)).passed
        for status in ("passed", "skipped", "failed", "unavailable")
    }
    assert verdicts == {"passed": True, "skipped": True, "failed": False, "unavailable": False}
    assert VerifyReport("ckpt", audit).passed


# --------------------------------------------------------------------------- media of a calibration set


@pytest.fixture
def image_set(tmp_path) -> Path:
    root = tmp_path / "pool"
    pool, taxonomy = image_pool(root, Media(root).image)
    calib = tmp_path / "calib"
    build_calibration_set([pool], calib, CalibrateOptions(size=12, taxonomy=taxonomy))
    return calib


def first_image(calib: Path) -> Path:
    row = json.loads((calib / "samples.jsonl").read_text().splitlines()[0])
    return Path(row["images"][0])


def test_a_fifo_in_place_of_a_set_media_file_is_refused_not_waited_on(image_set, text_model, tmp_path):
    image = first_image(image_set)
    image.unlink()
    os.mkfifo(image)
    with pytest.raises(MediaError, match="FIFO"):
        load_image(image)  # the decoder itself refuses before opening
    command = [
        sys.executable, "-m", "quantkit", "quantize", str(text_model), "--recipe", "w4a16",
        "--calib", str(image_set), "-o", str(tmp_path / "q"),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.getcwd()}
    )
    assert done.returncode == 2, done.stderr
    assert "FIFO" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_media_file_replaced_after_calibrate_is_detected(image_set):
    load_calibration_set(image_set)  # as calibrate wrote it
    image = first_image(image_set)
    stat = image.stat()
    replacement = Media(image.parent / "other").image(size=(80, 60))
    shutil.copyfile(image.parent / "other" / replacement, image)
    with pytest.raises(InputError, match="changed after calibrate"):
        load_calibration_set(image_set)
    shutil.copyfile(image.parent / "other" / replacement, image)
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the old time, other bytes (and size)
    assert image.stat().st_size != stat.st_size
    with pytest.raises(InputError, match="changed after calibrate"):
        load_calibration_set(image_set)


def test_embedded_media_the_set_carries_are_checked_by_digest(tmp_path):
    pool, taxonomy = image_pool(tmp_path, Media(tmp_path).data_uri, count=3)
    calib = tmp_path / "calib"
    build_calibration_set([pool], calib, CalibrateOptions(size=6, taxonomy=taxonomy))
    image = first_image(calib)
    assert image.parent == calib / "media"
    data = bytearray(image.read_bytes())
    data[-5] ^= 0xFF  # same size, same time, other bytes
    stat = image.stat()
    image.write_bytes(bytes(data))
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(InputError, match="changed after calibrate"):
        load_calibration_set(calib)


# --------------------------------------------------------------------------- two runs, one output


def test_a_second_quantize_onto_a_locked_output_is_refused(text_model, tmp_path):
    output = tmp_path / "q"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / ".q.lock").write_text(f"{holder.pid}\n")
        result = invoke("quantize", text_model, "--recipe", "fp8-dynamic", "-o", output)
        assert result.exit_code == 2, result.output
        assert f"process {holder.pid}" in result.output and not output.exists(), result.output
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone: its lock is taken over, and released after the run.
    result = invoke("quantize", text_model, "--recipe", "fp8-dynamic", "-o", output)
    assert result.exit_code == 0, result.output
    assert not (tmp_path / ".q.lock").exists()


def test_an_output_another_run_finished_meanwhile_is_not_replaced_without_force(tmp_path):
    output = tmp_path / "out"
    with (
        pytest.raises(InputError, match="appeared while this run worked"),
        atomic_output_dir(output) as staging,
    ):
        (staging / "mine").write_text("second run")
        output.mkdir()  # the first run's result lands meanwhile
        (output / "theirs").write_text("first run")
    assert [p.name for p in output.iterdir()] == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --------------------------------------------------------------------------- mutants the issue names


def test_allocation_is_in_proportion_to_availability_times_weight():
    # Equal weights: past the floor of one each, the share follows what each stratum has (1 + 38/4,
    # the half going to "a" by name; without the availability factor it would be 20 / 20).
    assert allocate({"a": 100, "b": 300}, {"a": 1.0, "b": 1.0}, 40, floor=1) == {"a": 11, "b": 29}
    # Weight 3 on a stratum a third the size: equal shares.
    assert allocate({"a": 100, "b": 300}, {"a": 3.0, "b": 1.0}, 40, floor=1) == {"a": 20, "b": 20}


def test_min_per_stratum_floor_reaches_the_set(tmp_path):
    records = [
        {"task": "precise", "messages": [{"role": "user", "content": f"Rare {i}."}, {"role": "assistant", "content": "r"}]}
        for i in range(4)
    ] + [
        {"task": "casual", "messages": [{"role": "user", "content": f"Common {i}."}, {"role": "assistant", "content": "c"}]}
        for i in range(400)
    ]  # fmt: skip
    pool = write_jsonl(tmp_path / "pool.jsonl", records)
    taxonomy = tmp_path / "taxonomy.yaml"
    taxonomy.write_text(TWO_TIER_HEADER + "  - {name: precise, family: text, modalities: [text], tier: high}\n"
                        "  - {name: casual, family: text, modalities: [text], tier: low}\n")  # fmt: skip
    for floor in (1, 4):
        result = build_calibration_set(
            [pool],
            tmp_path / f"set{floor}",
            CalibrateOptions(size=40, taxonomy=taxonomy, min_per_stratum=floor),
        )
        selected = {row["name"]: row["selected"] for row in result.report["tasks"]}
        # By weight x share the rare task gets about one sample past the floor of one; a floor of 4 lifts it.
        assert selected["precise"] == 4 if floor == 4 else selected["precise"] < 4, selected


def test_the_probe_fails_when_calibration_missed_a_tower(zoo_model):
    from quantkit.models.adapters import adapter_for
    from quantkit.quantize.probe import CalibrationProbe

    model_dir = zoo_model("tiny-qwen2.5-omni")
    adapter = adapter_for(model_dir)
    skeleton = adapter.meta_model(model_dir)
    with CalibrationProbe(skeleton, adapter) as probe:
        pass  # no sample reached either tower
    probe.verify(samples=0, vision_samples=0, audio_samples=0)
    with pytest.raises(CheckFailed, match="the vision tower"):
        probe.verify(samples=0, vision_samples=1, audio_samples=0)
    with pytest.raises(CheckFailed, match="the audio tower"):
        probe.verify(samples=0, vision_samples=0, audio_samples=1)


# --------------------------------------------------------------------------- one negative test per audit check


@pytest.fixture(scope="module")
def w4a16_checkpoint(text_model, text_calib, tmp_path_factory) -> Path:
    from quantkit.calibset import load_calibration_set as load_set
    from quantkit.models.inputs import Sample
    from quantkit.quantize import quantize
    from quantkit.recipes import get_recipe

    samples = [Sample.from_row(row) for row in load_set(text_calib)][:4]
    out = tmp_path_factory.mktemp("dataloss-ckpt") / "qwen3-w4a16"
    quantize(text_model, out, get_recipe("w4a16"), samples, progress=False)
    return out


LAYER = "model.layers.0.mlp.down_proj"


def _unquantize(tensors: dict, layer: str = LAYER) -> None:
    """Store ``layer`` as a plain 16-bit weight (its quantized tensors removed)."""
    packed = tensors.pop(f"{layer}.weight_packed")
    for key in [k for k in tensors if k.startswith(f"{layer}.weight_")]:
        del tensors[key]
    rows, cols = packed.shape[0], packed.shape[1] * 8
    tensors[f"{layer}.weight"] = torch.zeros(rows, cols, dtype=torch.bfloat16)


def _ignore(config: dict, name: str) -> None:
    config["quantization_config"]["ignore"].append(name)


def _first_group(config: dict) -> dict:
    return next(iter(config["quantization_config"]["config_groups"].values()))


AUDIT_FAULTS = {
    "quantization_config present and valid": (None, lambda c: c.pop("quantization_config")),
    "config groups and stored tensors agree": (_unquantize, None),
    "every language-model Linear not kept on purpose is quantized": (
        _unquantize,
        lambda c: _ignore(c, LAYER),
    ),
    "every ignore entry matches a module": (None, lambda c: _ignore(c, "model.no_such_module")),
    "quantized tensors have the scheme's dtype and shape": (
        lambda t: t.__setitem__(f"{LAYER}.weight_packed", t[f"{LAYER}.weight_packed"][:, :-1].contiguous()),
        None,
    ),
    "every scale is finite and positive": (
        lambda t: t[f"{LAYER}.weight_scale"].view(-1)[0].fill_(0.0),
        None,
    ),
}


@pytest.mark.parametrize("check", list(AUDIT_FAULTS))
def test_each_audit_check_fails_on_its_fault(w4a16_checkpoint, tmp_path, check):
    assert audit_checkpoint(w4a16_checkpoint).passed
    damaged = tmp_path / "damaged"
    shutil.copytree(w4a16_checkpoint, damaged)
    tensors_change, config_change = AUDIT_FAULTS[check]
    if tensors_change:
        rewrite_tensors(damaged, tensors_change)
    if config_change:
        rewrite_config(damaged, config_change)
    result = audit_checkpoint(damaged)
    failed = [c.name for c in result.checks if not c.passed]
    assert check in failed, (check, result.checks)
    if check == "every language-model Linear not kept on purpose is quantized":
        assert failed == [check], result.checks  # the one check that sees an unquantized, ignored layer


def test_audit_fails_a_nan_scale_a_missing_scale_and_a_missing_zero_point(w4a16_checkpoint, tmp_path):
    cases = {
        "nan scale": (lambda t: t[f"{LAYER}.weight_scale"].view(-1)[0].fill_(float("nan")), None, "non-finite"),
        "no scale": (lambda t: t.pop(f"{LAYER}.weight_scale"), None, "no weight_scale"),
        "no zero point": (lambda t: t.pop(f"{LAYER}.weight_zero_point"), None, "no weight_zero_point"),  # w4a16 is asymmetric
        "static activations, no input_scale": (
            None,
            lambda c: _first_group(c).update(
                input_activations={"num_bits": 8, "type": "int", "strategy": "tensor", "dynamic": False, "symmetric": True}
            ),
            "no input_scale",
        ),
        "weight files truncated": ("truncate", None, "truncated"),
    }  # fmt: skip
    for name, (tensors_change, config_change, says) in cases.items():
        damaged = tmp_path / name.replace(" ", "-").replace(",", "")
        shutil.copytree(w4a16_checkpoint, damaged)
        if tensors_change == "truncate":
            (file,) = damaged.glob("*.safetensors")
            os.truncate(file, file.stat().st_size - 64)
        elif tensors_change:
            rewrite_tensors(damaged, tensors_change)
        if config_change:
            rewrite_config(damaged, config_change)
        result = audit_checkpoint(damaged)
        details = " ".join(c.detail for c in result.checks if not c.passed)
        assert not result.passed and says in details, (name, result.checks)


@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment (make vllm-env)")
def test_verify_and_build_vllm_through_the_cli(checkpoint, text_model, tmp_path):
    """With the vLLM environment: `verify --vllm` and `build --vllm` run vLLM on the fp8-dynamic
    checkpoint (which vLLM's CPU backend runs: it must pass, not skip) and record it."""
    verified = invoke("verify", checkpoint, "--vllm", "--report", tmp_path / "v.json")
    assert verified.exit_code == 0, verified.output
    assert json.loads((tmp_path / "v.json").read_text())["vllm"]["status"] == "passed"
    from test_build_gate import target, targets_file

    targets = targets_file(tmp_path, target("fp8", "fp8-dynamic"))
    out = tmp_path / "out"
    built = invoke(
        "build", "--target", "fp8", "--targets-file", targets, "--model", text_model,
        "--output-root", out, "--vllm",
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    entries = json.loads((out / "build.json").read_text())["checkpoints"]
    assert [entry["vllm"] for entry in entries] == ["passed"], entries
