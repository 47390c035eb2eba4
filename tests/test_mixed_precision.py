"""Group size selection and mixed precision (W4A16 + 8-bit layers) end to end: the plan, the
budget, the config groups both loaders read, the checkpoint on disk, transformers and vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantkit.errors import InputError
from quantkit.models import adapter_for
from quantkit.models.targets import resolve_targets
from quantkit.precision.mixed import (
    choose_group_size,
    fusion_unit,
    fusion_units,
    plan_precision,
    unit_patterns,
)
from quantkit.precision.table import SensitivityRow, SensitivityTable, save_table
from quantkit.quantize import plan, quantize
from quantkit.quantize.resolved import build_modifiers
from quantkit.recipes import Recipe, get_recipe
from quantkit.sensitivity import sensitivity

sys.path.insert(0, str(Path(__file__).parent))
from test_sensitivity import DAMAGED, damage, text_samples  # noqa: E402
from test_verify import served_or_skip  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Attempting to save a model with offloaded modules")


def tensors(output: Path) -> dict[str, tuple]:
    found = {}
    for path in sorted(output.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                found[key] = tuple(handle.get_slice(key).get_shape())
    return found


@pytest.fixture(scope="session")
def damaged_qwen3(zoo_model, tmp_path_factory) -> Path:
    return damage(zoo_model("tiny-qwen3"), tmp_path_factory.mktemp("damaged-mp") / "tiny-qwen3-damaged")


@pytest.fixture(scope="session")
def odd_qwen3(zoo_model, tmp_path_factory) -> Path:
    """SmolLM2's problem in miniature: hidden 192 (a multiple of 64, not of 128) and intermediate
    200 (a multiple of no candidate group size)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from quantkit.export.files import copy_sidecar_files

    source = zoo_model("tiny-qwen3")
    output = tmp_path_factory.mktemp("odd") / "odd-qwen3"
    config = json.loads((source / "config.json").read_text())
    config.update(
        hidden_size=192, intermediate_size=200, num_attention_heads=3, num_key_value_heads=1, head_dim=64
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in config.items() if k != "architectures"}))
    model.to(torch.bfloat16)
    model.save_pretrained(output)
    copy_sidecar_files(source, output)
    return output


def synthetic_table(names: list[str], scores: dict[str, float], params: dict[str, int]) -> SensitivityTable:
    rows = [
        SensitivityRow(
            name=n, layers=[n], params=params[n], kl=scores.get(n, 0.0), top1=1.0, rel_logit_mse=0.0
        )
        for n in names
    ]
    for rank, row in enumerate(sorted(rows, key=lambda r: -r.kl), start=1):
        row.rank = rank
    return SensitivityTable("m", "a", {}, "layer", "replay", 1, ["x"], 1, 1, rows)


# ------------------------------------------------------------------------------ group size


def test_group_size_is_the_largest_candidate_that_divides_every_layer():
    assert choose_group_size({"a": 576, "b": 1536}).group_size == 64  # SmolLM2-135M
    assert choose_group_size({"a": 256, "b": 512}).group_size == 128
    odd = choose_group_size({"a": 192, "b": 200})
    assert (odd.group_size, odd.unfit) == (64, {"b": 200})
    assert "no candidate divides stay at 8 bits: b (200)" in odd.describe()
    none = choose_group_size({"a": 100})
    assert (none.group_size, none.unfit) == (None, {"a": 100})
    # non-nested candidates: the one that fits the most weights wins
    shapes = {"a": 192, "b": 96, "c": 128}  # 96 divides a and b, 64 divides a and c
    wide = choose_group_size(shapes, (96, 64), {"a": 1, "b": 10, "c": 1})
    assert (wide.group_size, wide.unfit) == (96, {"c": 128})
    assert choose_group_size(shapes, (96, 64), {"a": 1, "b": 1, "c": 10}).unfit == {"b": 96}


def test_fusion_units_follow_vllm_fused_layers():
    names = [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_proj",
        "model.layers.0.mlp.up_proj",
        "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp.experts.3.gate_proj",
        "model.layers.1.mlp.experts.7.down_proj",
    ]
    units = fusion_units(names)
    assert list(units) == [
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_up_proj",
        "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp.experts",
    ]
    assert fusion_unit("model.layers.1.mlp.experts.7.down_proj") == "model.layers.1.mlp.experts"


def test_patterns_match_the_unit_under_every_loader_naming():
    units = {
        "model.layers.2.self_attn.qkv_proj": [f"model.layers.2.self_attn.{p}_proj" for p in "qkv"],
        "model.layers.2.mlp.down_proj": ["model.layers.2.mlp.down_proj"],
        "model.layers.1.mlp.experts": ["model.layers.1.mlp.experts.0.up_proj"],
    }
    from quantkit.models.adapters import matches_any

    patterns = unit_patterns(list(units), units, "model")
    hits = [
        "model.layers.2.self_attn.q_proj",  # transformers (text)
        "language_model.model.layers.2.self_attn.k_proj",  # vLLM (Qwen-VL)
        "model.language_model.layers.2.self_attn.v_proj",  # transformers (Qwen3-VL)
        "thinker.model.layers.2.mlp.down_proj",  # Omni serving layout
        "model.layers.2.mlp.down_proj",
        "model.layers.1.mlp.experts",  # vLLM's FusedMoE layer
        "model.layers.1.mlp.experts.5.gate_proj",
    ]
    misses = [
        "model.layers.12.self_attn.q_proj",
        "model.layers.2.self_attn.o_proj",
        "model.layers.2.mlp.down_proj_extra",
        "model.layers.2.mlp.up_proj",
        "model.layers.1.mlp.gate",
        "model.xlayers.2.mlp.down_proj",
    ]
    assert all(matches_any(n, patterns) for n in hits), patterns
    assert not any(matches_any(n, patterns) for n in misses), patterns


# ------------------------------------------------------------------------------ the budget


def test_budget_is_respected_and_follows_the_ranking(zoo_model):
    model_dir = zoo_model("tiny-qwen3")
    adapter = adapter_for(model_dir)
    model = adapter.meta_model(model_dir)
    names = resolve_targets(model, adapter).quantize
    params = {n: model.get_submodule(n).weight.numel() for n in names}
    scores = {
        "model.layers.1.mlp.down_proj": 1.0,  # 131k weights
        "model.layers.3.self_attn.o_proj": 0.9,  # 65k: more KL per promoted bit
        "model.layers.0.mlp.gate_proj": 0.5,
        "model.layers.0.mlp.up_proj": 0.5,  # gate/up promoted together (393k with gate)
    }
    table = synthetic_table(names, scores, params)
    recipe = get_recipe("w4a16")
    for avg in (4.1, 4.25, 4.5, 5.0, 6.0):
        result = plan_precision(model, names, recipe, avg_bits=avg, sensitivity=table, root="model")
        assert result.avg_bits <= avg + 1e-9, (avg, result.avg_bits)
        for unit in result.units:  # fused shards share their bits
            assert len({n in result.high for n in unit.layers}) == 1
    at = plan_precision(model, names, recipe, avg_bits=4.5, sensitivity=table, root="model")
    assert set(at.high) == {"model.layers.3.self_attn.o_proj", "model.layers.1.mlp.down_proj"}
    assert at.avg_bits == pytest.approx(4 + 4 * (65536 + 131072) / sum(params.values()))
    assert at.effective_bits > at.avg_bits  # scales
    wide = plan_precision(model, names, recipe, avg_bits=5.0, sensitivity=table, root="model")
    assert {"model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"} <= set(wide.high)
    full = plan_precision(model, names, recipe, avg_bits=8.0, sensitivity=table, root="model")
    assert set(full.high) == set(scores) | {"model.layers.0.mlp.up_proj"}  # zero-KL layers stay at 4
    with_scales = plan_precision(
        model, names, recipe, avg_bits=4.5, sensitivity=table, root="model", count_overhead=True
    )
    assert with_scales.effective_bits <= 4.5 and len(with_scales.high) < len(at.high) + 1
    for bad in (3.5, 4.0, 9.0):
        with pytest.raises(InputError, match="must lie in"):
            plan_precision(model, names, recipe, avg_bits=bad, sensitivity=table)
    wrong = synthetic_table(names[:-1], scores, params)
    with pytest.raises(InputError, match="does not cover 1 targeted layer"):
        plan_precision(model, names, recipe, avg_bits=4.5, sensitivity=wrong)


# ------------------------------------------------------------------------------ odd shapes


def test_odd_shapes_pick_group_64_and_keep_unfit_layers_at_8_bits(odd_qwen3, tmp_path):
    """The old early refusal is gone: group 64 for the 192-wide layers, down_proj (200 in-features,
    no candidate divides it) at 8 bits, reported in the plan, quantkit.json and the card."""
    samples = text_samples()
    dry = plan(odd_qwen3, get_recipe("w4a16"), samples)
    assert dry.group_size == 64
    assert sorted(dry.precision["high"]) == [f"model.layers.{i}.mlp.down_proj" for i in range(4)]
    assert all("in-features 200" in why for why in dry.precision["high"].values())

    result = quantize(odd_qwen3, tmp_path / "out", get_recipe("w4a16"), samples, progress=False)
    precision = result.precision
    assert precision.group_size == 64 and set(precision.high) == set(dry.precision["high"])
    metadata = json.loads((result.output / "quantkit.json").read_text())
    assert metadata["resolved_scheme"]["weights"]["group_size"] == 64
    assert metadata["precision"]["avg_bits"] == pytest.approx(precision.avg_bits, abs=1e-4)
    card = (result.output / "README.md").read_text()
    assert (
        "## Precision" in card and "group size 64" in card and "no group size in 128, 64, 32 divides" in card
    )
    on_disk = tensors(result.output)
    assert on_disk["model.layers.0.mlp.down_proj.weight_packed"] == (192, 200 // 4)  # 8-bit: 4 per int32
    assert on_disk["model.layers.0.mlp.gate_proj.weight_packed"] == (200, 192 // 8)  # 4-bit: 8 per int32
    assert on_disk["model.layers.0.mlp.gate_proj.weight_scale"] == (200, 192 // 64)
    model = adapter_for(result.output).load_model(result.output, dtype=torch.bfloat16)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.isfinite(model(input_ids=ids).logits).all()

    # A group size (the recipe's) that divides nothing is refused before any work, naming one that fits
    # (issue 34: not an all-8-bit "w4a16").
    strict = Recipe.model_validate({**get_recipe("w4a16").model_dump(), "group_size": 128})
    with pytest.raises(InputError, match="divides none of the targeted layers"):
        plan(odd_qwen3, strict, samples)
    with pytest.raises(InputError, match="divides none of the targeted layers"):
        quantize(odd_qwen3, tmp_path / "refused", strict, samples, avg_bits=4.5, progress=False)
    assert not (tmp_path / "refused").exists()


# ------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="session")
def mixed_checkpoints(damaged_qwen3, tmp_path_factory):
    """The damaged model quantized three ways: plain W4A16, --avg-bits 4.5 (ranking measured by
    quantize itself), and the same with W8A8 for the promoted layers."""
    root = tmp_path_factory.mktemp("mixed")
    samples = text_samples()
    recipe = get_recipe("w4a16")
    w8a8 = Recipe.model_validate({**recipe.model_dump(), "promoted_scheme": "W8A8"})
    return {
        "plain": quantize(damaged_qwen3, root / "plain", recipe, samples, progress=False),
        "mixed": quantize(damaged_qwen3, root / "mixed", recipe, samples, avg_bits=4.5, progress=False),
        "w8a8": quantize(damaged_qwen3, root / "w8a8", w8a8, samples, avg_bits=4.5, progress=False),
    }


def test_mixed_checkpoint_keeps_the_damaged_layer_at_8_bits(mixed_checkpoints, damaged_qwen3):
    result = mixed_checkpoints["mixed"]
    precision = result.precision
    assert DAMAGED in precision.high and precision.high[DAMAGED].startswith("sensitive: rank 1 ")
    assert precision.avg_bits <= 4.5 and precision.avg_bits > 4.0
    assert result.stage_times_s["sensitivity"] > 0 and result.sensitivity.ranked()[0].name == DAMAGED
    assert result.checkpoint_format == "pack-quantized"

    config = json.loads((result.output / "config.json").read_text())["quantization_config"]
    groups = config["config_groups"]
    assert groups["group_1"]["targets"] == ["Linear"] and groups["group_1"]["weights"]["num_bits"] == 4
    assert (
        groups["group_0"]["weights"]["num_bits"] == 8
        and groups["group_0"]["weights"]["strategy"] == "channel"
    )
    assert groups["group_0"]["targets"] == precision.high_patterns
    on_disk = tensors(result.output)
    assert on_disk[DAMAGED + ".weight_packed"] == (256, 512 // 4)
    assert on_disk["model.layers.2.mlp.up_proj.weight_packed"] == (512, 256 // 8)

    from quantkit.verify.audit import audit_checkpoint

    for name in ("mixed", "w8a8"):  # config groups, tensors and architecture agree
        audit = audit_checkpoint(mixed_checkpoints[name].output)
        assert audit.passed, [c for c in audit.to_dict()["checks"] if not c.get("passed", True)]

    metadata = json.loads((result.output / "quantkit.json").read_text())
    assert metadata["precision"]["avg_bits_requested"] == 4.5
    assert DAMAGED in metadata["precision"]["high"]
    assert metadata["precision"]["sensitivity"]["samples"] == len(text_samples())
    card = (result.output / "README.md").read_text()
    assert "--avg-bits 4.5 (met: yes)" in card and "model.layers.2.mlp.down_proj" in card

    # Reloads with transformers (no "Could not match" surprises: every layer gets its planned bits)
    # and is closer to the original than plain W4A16 on the same damaged model.
    adapter = adapter_for(damaged_qwen3)
    processor = adapter.load_processor(damaged_qwen3)
    from quantkit.models.inputs import processor_inputs

    inputs = processor_inputs(processor, text_samples()[0])
    with torch.no_grad():
        reference = adapter.load_model(damaged_qwen3, dtype=torch.float32)(**inputs).logits
    errors = {}
    for name in ("plain", "mixed", "w8a8"):
        model = adapter_for(mixed_checkpoints[name].output).load_model(
            mixed_checkpoints[name].output, dtype=torch.float32
        )
        assert model.get_submodule(DAMAGED).quantization_scheme.weights.num_bits == (
            4 if name == "plain" else 8
        )
        with torch.no_grad():
            logits = model(**inputs).logits
        assert torch.isfinite(logits).all()
        errors[name] = float((logits - reference).pow(2).mean() / reference.pow(2).mean())
    print(f"\nrelative logit MSE on the damaged model: {errors}")
    assert errors["mixed"] < errors["plain"] and errors["w8a8"] < errors["plain"]


def test_a_saved_sensitivity_table_drives_plan_and_quantize(damaged_qwen3, tmp_path):
    table = sensitivity(damaged_qwen3, text_samples(), granularity="unit", progress=False)
    path = save_table(table, tmp_path / "sensitivity.json")
    dry = plan(damaged_qwen3, get_recipe("w4a16"), text_samples(), avg_bits=4.5, sensitivity=path)
    assert DAMAGED in dry.precision["high"] and dry.precision["avg_bits"] <= 4.5
    undecided = plan(damaged_qwen3, get_recipe("w4a16"), text_samples(), avg_bits=4.5)
    assert not undecided.precision["high"] and "no sensitivity ranking yet" in undecided.precision["notes"][0]
    with pytest.raises(InputError, match="--avg-bits applies to 4-bit weight recipes"):
        plan(damaged_qwen3, get_recipe("fp8-dynamic"), [], avg_bits=4.5)


@pytest.fixture(scope="session")
def asym_group_32(zoo_model, tmp_path_factory):
    recipe = Recipe(
        name="asym", hardware="any", scheme="W4A16", method="gptq", group_size=32, symmetric=False
    )
    out = tmp_path_factory.mktemp("asym") / "asym"
    return quantize(zoo_model("tiny-qwen3"), out, recipe, text_samples(), progress=False)


def test_asymmetric_group_32_writes_zero_points(asym_group_32):
    result = asym_group_32
    config = json.loads((result.output / "config.json").read_text())["quantization_config"]
    (group,) = config["config_groups"].values()
    assert (group["weights"]["group_size"], group["weights"]["symmetric"]) == (32, False)
    on_disk = tensors(result.output)
    assert on_disk["model.layers.0.mlp.down_proj.weight_zero_point"][1] == 512 // 32
    assert result.metadata["resolved_scheme"]["weights"]["symmetric"] is False
    model = adapter_for(result.output).load_model(result.output, dtype=torch.bfloat16)
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 2, 3]])).logits).all()


@pytest.mark.slow
def test_vllm_serves_zero_points(asym_group_32):
    """Zero points: vLLM's WNA16 kernels take them (CPU: AVX-512 only; elsewhere a skip with why)."""
    from quantkit.verify.vllm_check import check_with_vllm

    vllm_or_skip()
    served_or_skip(check_with_vllm(asym_group_32.output))


def test_moe_experts_stay_symmetric_under_a_zero_point_recipe(zoo_model, tmp_path):
    """The shipped w4a16 puts zero points on attention but not on MoE experts (transformers cannot
    reload asymmetric experts); a promoted expert block goes to 8 bits, not to the symmetric group.
    Checked on the plan, the checkpoint, transformers' reload and vLLM's own matcher."""
    model_dir = zoo_model("tiny-qwen3-omni-moe")
    adapter = adapter_for(model_dir)
    from quantkit.models.loading import unfuse_experts_on_meta

    meta = adapter.meta_model(model_dir)
    unfuse_experts_on_meta(meta)
    names = resolve_targets(meta, adapter).quantize
    params = {n: meta.get_submodule(n).weight.numel() for n in names}
    promoted = [n for n in names if n.startswith("model.layers.2.mlp.experts.")]
    table = synthetic_table(names, dict.fromkeys(promoted, 1.0), params)
    recipe = get_recipe("w4a16")
    assert not recipe.symmetric
    result = quantize(
        model_dir, tmp_path / "moe", recipe, text_samples(), avg_bits=5.0, sensitivity=table, progress=False
    )
    precision = result.precision
    assert set(precision.high) == set(promoted)
    experts = {n for n in names if ".mlp.experts." in n}
    assert set(precision.symmetric_experts) == experts - set(promoted)
    assert "except 36 MoE expert layers (symmetric)" in precision.summary()

    config = json.loads((result.output / "config.json").read_text())["quantization_config"]
    groups = {
        (g["weights"]["num_bits"], g["weights"]["symmetric"]): g["targets"]
        for g in config["config_groups"].values()
    }
    assert set(groups) == {(8, True), (4, True), (4, False)}
    assert (
        groups[(4, False)] == ["Linear"] and len(groups[(4, True)]) == 3
    )  # one pattern per 4-bit expert block
    on_disk = {key.rsplit(".", 1)[0] for key in tensors(result.output) if key.endswith(".weight_zero_point")}
    assert on_disk and all(".experts." not in n for n in on_disk)
    assert "thinker.model.layers.0.self_attn.q_proj" in on_disk
    assert "MoE expert layer(s) kept symmetric" in (result.output / "README.md").read_text()
    model = adapter_for(result.output).load_model(result.output, dtype=torch.bfloat16)
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 2, 3]])).logits).all()

    python = vllm_or_skip()
    probe = {
        "thinker.model.layers.0.self_attn.qkv_proj": [4, False],
        "thinker.model.layers.0.mlp.experts.0.gate_proj": [4, True],
        "thinker.model.layers.2.mlp.experts.1.down_proj": [8, True],
        "thinker.model.layers.3.mlp.experts.3.up_proj": [4, True],
    }
    assert vllm_schemes(python, result.output, list(probe)) == probe


# ------------------------------------------------------------------------------ recipe fields


def test_gptq_settings_reach_the_modifier_through_config_groups(resolve_on):
    recipe = Recipe(
        name="x",
        hardware="any",
        scheme="W4A16",
        method="gptq",
        actorder="group",
        dampening_frac=0.05,
        group_size=64,
    )
    resolved = resolve_on(recipe)
    assert resolved.config_groups  # the precision plan's groups carry the group size
    (modifier,) = build_modifiers(resolved)
    assert (modifier.actorder, modifier.dampening_frac) == ("group", 0.05)
    config = modifier.resolve_quantization_config()
    assert {group.weights.actorder for group in config.config_groups.values()} == {"group"}
    assert {group.weights.group_size for group in config.config_groups.values()} == {64}
    default = build_modifiers(resolve_on(get_recipe("w4a16")))[0]
    assert {g.weights.actorder for g in default.resolve_quantization_config().config_groups.values()} == {
        "static"
    }
    assert resolved.to_dict()["weights"]["group_size"] == 64
    assert resolved.to_dict()["gptq"] == {"actorder": "group", "dampening_frac": 0.05}


@pytest.mark.parametrize(
    "extra",
    ["group_size: 64\n", "symmetric: false\n", "promoted_scheme: W8A8\n"],
)
def test_w4a16_only_fields_are_refused_elsewhere(tmp_path, extra):
    from quantkit.recipes import load_recipe_file

    path = tmp_path / "r.yaml"
    path.write_text("name: r\nhardware: any\nscheme: FP8_DYNAMIC\nmethod: rtn\n" + extra)
    with pytest.raises(InputError, match="only group-wise weight schemes"):
        load_recipe_file(path)


# ------------------------------------------------------------------------------ vLLM

VLLM_SCHEMES = r"""
import json, sys
import torch
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig,
)
config = json.load(open(sys.argv[1]))["quantization_config"]
quant = CompressedTensorsConfig.from_config(config)
quant.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
answer = {}
for name in json.loads(sys.argv[2]):
    found = quant.get_scheme_dict(torch.nn.Linear(1, 1), layer_name=name)
    answer[name] = None if found is None else [found["weights"].num_bits, found["weights"].symmetric]
print("ANSWER" + json.dumps(answer))
"""


def vllm_schemes(python: Path, checkpoint: Path, names: list[str]) -> dict:
    """Per vLLM layer name: [weight bits, symmetric] as vLLM's own matcher resolves the config groups."""
    return vllm_answer(python, VLLM_SCHEMES, str(checkpoint / "config.json"), json.dumps(names))


def vllm_answer(python: Path, script: str, *args: str):
    """Run ``script`` in the vLLM environment (not this checkout's PYTHONPATH); its ANSWER line, parsed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [str(python), "-P", "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    answers = [line for line in run.stdout.splitlines() if line.startswith("ANSWER")]
    assert answers, run.stderr[-3000:]
    return json.loads(answers[-1][len("ANSWER") :])


def vllm_or_skip() -> Path:
    from quantkit.verify.vllm_check import vllm_python

    python = vllm_python()
    if python is None:
        pytest.skip("no vLLM environment (make vllm-env)")
    return python


@pytest.mark.slow
def test_vllm_resolves_the_config_groups_to_the_planned_bits(mixed_checkpoints):
    """vLLM's own matcher (name first, fused q/k/v and gate/up shards together, then the class
    "Linear"), on vLLM's fused layer names: 8 bits exactly for the promoted units."""
    python = vllm_or_skip()
    result = mixed_checkpoints["mixed"]
    names = {unit.unit: unit.bits for unit in result.precision.units} | {"lm_head": None}
    found = vllm_schemes(python, result.output, list(names))
    assert {name: answer and answer[0] for name, answer in found.items()} == names


@pytest.mark.slow
def test_vllm_loads_the_mixed_checkpoint_with_w8a8_layers(mixed_checkpoints):
    """W4A16 + W8A8: vLLM's CPU backend has int8 kernels for the 8-bit layers; its 4-bit layers
    (zero points) need the WNA16 kernel (AVX-512): elsewhere a skip with vLLM's reason."""
    from quantkit.verify.vllm_check import check_with_vllm

    vllm_or_skip()
    assert mixed_checkpoints["w8a8"].checkpoint_format == "mixed-precision"
    served_or_skip(check_with_vllm(mixed_checkpoints["w8a8"].output))


@pytest.mark.slow
def test_vllm_loads_the_default_mixed_checkpoint(mixed_checkpoints):
    """W4A16 + W8A16 (--avg-bits as shipped): vLLM's CPU backend has 4-bit weight-only kernels
    only (CPUWNA16: uint4 / uint4b8), so here it is a skip with vLLM's reason; GPUs serve it."""
    from quantkit.verify.vllm_check import check_with_vllm

    vllm_or_skip()
    served_or_skip(check_with_vllm(mixed_checkpoints["mixed"].output))
