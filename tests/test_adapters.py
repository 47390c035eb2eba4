"""Adapters: the registry, user files, and what each built-in adapter selects on the real module trees."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from quantkit.errors import InputError
from quantkit.models import ADAPTERS_DIR, Adapter, adapter_for, builtin_adapters, load_adapter_file
from quantkit.models.adapters import matches_any
from quantkit.models.loading import unfuse_experts_on_meta
from quantkit.models.targets import (
    check_smoothquant_mappings,
    decoder_layers,
    language_model_root,
    resolve_targets,
)
from quantkit.zoo.models import ZOO

ZOO_NAMES = list(ZOO)
# Linear layers per group in the tiny zoo models (4 decoder layers; 4 experts in the MoE).
EXPECTED_COUNTS = {
    "tiny-qwen3": {"language_model": 28, "vision": 0, "audio": 0, "head": 1},
    "tiny-qwen3-vl": {"language_model": 28, "vision": 14, "audio": 0, "head": 1},
    "tiny-qwen2.5-vl": {"language_model": 28, "vision": 12, "audio": 0, "head": 1},
    "tiny-qwen2.5-omni": {"language_model": 28, "vision": 16, "audio": 13, "head": 1},
    "tiny-qwen3-omni-moe": {"language_model": 16 + 4 * 4 * 3, "vision": 14, "audio": 15, "head": 1},
}


def meta_model(model_dir: Path, adapter: Adapter):
    model = adapter.meta_model(model_dir)
    unfuse_experts_on_meta(model)
    return model


def test_every_zoo_architecture_has_exactly_one_builtin_adapter():
    adapters = builtin_adapters()
    assert len({a.name for a in adapters}) == len(adapters)
    for entry in ZOO.values():
        serving = [a.name for a in adapters if entry.architecture in a.architectures]
        assert len(serving) == 1, (entry.architecture, serving)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_adapter_for_reads_config_architecture(zoo_model, name):
    adapter = adapter_for(zoo_model(name))
    assert ZOO[name].architecture in adapter.architectures
    assert not adapter.trust_remote_code


def test_unknown_architecture_says_what_to_do(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    with pytest.raises(InputError) as err:
        adapter_for(tmp_path)
    assert "MistralForCausalLM" in err.value.message and err.value.path == tmp_path / "config.json"
    assert "--adapter" in err.value.hint and "Qwen3VLForConditionalGeneration" in err.value.hint


def test_missing_config_is_an_input_error(tmp_path: Path):
    with pytest.raises(InputError, match="config.json is missing"):
        adapter_for(tmp_path)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_targets_are_exactly_the_language_model_linears(zoo_model, name):
    model_dir = zoo_model(name)
    adapter = adapter_for(model_dir)
    plan = resolve_targets(meta_model(model_dir, adapter), adapter)
    counts = plan.counts()
    expected = EXPECTED_COUNTS[name]
    assert counts["language_model"] == {"quantized": expected["language_model"], "kept": 0}
    for group in ("vision", "audio", "head"):
        assert counts[group] == {"quantized": 0, "kept": expected[group]}
    assert counts["other"] == {"quantized": 0, "kept": 0}
    assert all(name_.startswith(adapter.language_model + ".") for name_ in plan.quantize)
    assert "lm_head" in plan.kept
    # The library gets the class target "Linear" (what vLLM can match against its own module
    # names); the ignore list computed from the positive set removes exactly everything else.
    assert plan.targets == ["Linear"]
    linears = set(plan.groups)
    assert {n for n in linears if not matches_any(n, plan.ignore)} == set(plan.quantize)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_language_model_root_from_decoder_layers_matches_adapter(zoo_model, name):
    model_dir = zoo_model(name)
    adapter = adapter_for(model_dir)
    model = meta_model(model_dir, adapter)
    layers = decoder_layers(model, adapter)
    assert len(layers) == 4
    assert language_model_root(list(layers)) == adapter.language_model


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_smoothquant_mappings_resolve_one_norm_per_layer_inside_the_language_model(zoo_model, name):
    """What llmcompressor does with the mappings (match_modules_set), checked on the real tree."""
    from compressed_tensors.utils import match_modules_set
    from torch.utils._pytree import tree_leaves

    model_dir = zoo_model(name)
    adapter = adapter_for(model_dir)
    model = meta_model(model_dir, adapter)
    check_smoothquant_mappings(model, adapter)
    assert adapter.smoothquant_mappings
    for mapping in adapter.smoothquant_mappings:
        groups = list(match_modules_set(model, tree_leaves(mapping.as_library_mapping())))
        assert len(groups) == 4  # one per decoder layer
        for *balance, smooth in groups:
            assert len(smooth) == 1
            assert len(tree_leaves(balance)) in (2, 3)  # gate/up or q/k/v


def test_unanchored_smoothquant_mapping_is_refused_on_omni(zoo_model):
    """A bare `re:.*q_proj` also matches the audio tower's attention (seen in the notes)."""
    model_dir = zoo_model("tiny-qwen2.5-omni")
    data = adapter_for(model_dir).model_dump()
    data["smoothquant_mappings"] = [
        {"balance": ["re:.*q_proj", "re:.*k_proj", "re:.*v_proj"], "smooth": "re:.*input_layernorm"}
    ]
    loose = Adapter.model_validate(data)
    with pytest.raises(InputError, match="reaches outside the language model: audio_tower"):
        check_smoothquant_mappings(meta_model(model_dir, loose), loose)


def test_moe_router_is_kept_and_experts_are_targets(zoo_model):
    model_dir = zoo_model("tiny-qwen3-omni-moe")
    adapter = adapter_for(model_dir)
    assert adapter.keep_reason("model.layers.0.mlp.gate")
    plan = resolve_targets(meta_model(model_dir, adapter), adapter)
    experts = [n for n in plan.quantize if ".mlp.experts." in n]
    assert len(experts) == 4 * 4 * 3
    assert not any(n.endswith(".mlp.gate") for n in plan.quantize)
    assert adapter.known_failure("W8A8") is not None and adapter.known_failure("W4A16") is None


def test_user_adapter_file_with_bad_field_names_line(tmp_path: Path):
    good = yaml.safe_load((ADAPTERS_DIR / "qwen3-vl.yaml").read_text())
    good["pipeline"] = "layer_sequential"  # removed from llmcompressor
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(good, sort_keys=False))
    with pytest.raises(InputError) as err:
        load_adapter_file(path)
    line = path.read_text().splitlines()[err.value.line - 1]
    assert "pipeline" in err.value.message and line.startswith("pipeline:")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"keep": [{"pattern": "re:^model.visual(", "reason": "x"}]}, "regular expression"),
        ({"vision_tower": "model.language_model.vision"}, "inside the language model"),
        ({"auto_class": "AutoModel"}, "auto_class"),
        ({"extra_field": 1}, "extra_field"),
    ],
)
def test_adapter_validation(change: dict, message: str):
    data = yaml.safe_load((ADAPTERS_DIR / "qwen3-vl.yaml").read_text())
    data.update(change)
    with pytest.raises(ValueError, match=message):
        Adapter.model_validate(data)


def test_explicit_adapter_path_wins(zoo_model, tmp_path: Path):
    data = yaml.safe_load((ADAPTERS_DIR / "qwen3-vl.yaml").read_text())
    data["name"] = "my-qwen3-vl"
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(data))
    assert adapter_for(zoo_model("tiny-qwen3-vl"), path).name == "my-qwen3-vl"


def test_documented_example_adapter_is_valid():
    text = (ADAPTERS_DIR / "README.md").read_text()
    (block,) = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    adapter = Adapter.model_validate(yaml.safe_load(block))
    assert adapter.trust_remote_code and adapter.pipeline == "basic"
    assert adapter.group_of("model.audio_tower.layers.0.fc1") == "audio"
    assert adapter.keep_reason("model.audio_deepstack_merger_list.0.linear_fc1")
    assert adapter.should_quantize("model.language_model.layers.3.mlp.down_proj")
    assert not adapter.should_quantize("model.visual.deepstack_merger_list.0.linear_fc1")
