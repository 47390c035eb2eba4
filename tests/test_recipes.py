"""Recipes: the built-in list, lookups with suggestions, YAML validation, and the modifiers they build."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantkit.errors import InputError
from quantkit.quantize.resolved import build_modifiers
from quantkit.recipes import (
    SCHEME_FORMATS,
    Recipe,
    get_recipe,
    list_recipes,
    load_recipe_file,
    resolve_recipe,
)

SQ_MAPPINGS = [
    [[r"re:^model\.layers\.\d+\.self_attn\.(q|k|v)_proj$"], r"re:^model\.layers\.\d+\.input_layernorm$"]
]


def test_builtin_recipes_listed_with_scheme_data_needs_and_hardware():
    infos = {info.name: info for info in list_recipes()}
    assert {"w8a8-sq-gptq", "fp8", "fp8-dynamic", "w4a16"} <= set(infos)  # newer ones: test_recipes_2026
    expected = {
        "w8a8-sq-gptq": ("W8A8", True, "int-quantized"),
        "fp8": ("FP8", True, "float-quantized"),
        "fp8-dynamic": ("FP8_DYNAMIC", False, "float-quantized"),
        "w4a16": ("W4A16", True, "pack-quantized"),
    }
    for name, (scheme, needs_data, fmt) in expected.items():
        info = infos[name]
        assert (info.scheme, info.needs_data, info.checkpoint_format) == (scheme, needs_data, fmt)
        assert info.hardware and info.description
        assert info.path.name == f"{name}.yaml"


def test_recipe_settings_match_the_issue():
    w8a8 = get_recipe("w8a8-sq-gptq")
    assert (w8a8.method, w8a8.smoothquant_strength) == ("gptq", 0.8)
    w4 = get_recipe("w4a16")
    assert w4.method == "gptq" and w4.smoothquant_strength is None
    assert get_recipe("fp8").method == "rtn" and get_recipe("fp8-dynamic").method == "rtn"
    assert not any(get_recipe(name).kv_cache_fp8 for name in ("w8a8-sq-gptq", "fp8", "fp8-dynamic", "w4a16"))


def test_gptq_defaults_are_the_library_defaults(resolve_on):
    from llmcompressor.modifiers.quantization import GPTQModifier

    library = GPTQModifier(scheme="W4A16", targets=["Linear"])
    recipe = Recipe(name="x", hardware="any", scheme="W4A16", method="gptq")
    assert recipe.dampening_frac == library.dampening_frac
    built = build_modifiers(resolve_on(recipe))[-1]
    # The library resolves its "static" sentinel default into the same activation ordering.
    assert built.resolve_quantization_config().config_groups["group_0"].weights.actorder == (
        library.resolve_quantization_config().config_groups["group_0"].weights.actorder
    )


def test_unknown_name_suggests_the_closest():
    with pytest.raises(InputError) as err:
        get_recipe("w8a8")
    assert "unknown recipe 'w8a8'" in err.value.message
    assert "did you mean 'w8a8-sq-gptq'" in err.value.hint
    with pytest.raises(InputError) as err:
        resolve_recipe("fp8-dinamic")
    assert "did you mean 'fp8-dynamic'" in err.value.hint


def test_resolve_takes_a_name_or_a_file(tmp_path: Path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "name: mine\nhardware: H100\nscheme: W4A16\nmethod: gptq\nactorder: null\ndampening_frac: 0.05\n"
    )
    recipe = resolve_recipe(path)
    assert (recipe.name, recipe.actorder, recipe.dampening_frac) == ("mine", None, 0.05)
    assert resolve_recipe("fp8").scheme == "FP8"


def test_invalid_field_names_file_line_and_field(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nhardware: H100\nscheme: W4A16\nmethod: gptq\ndampening_frac: 2.0\n")
    with pytest.raises(InputError) as err:
        load_recipe_file(path)
    assert err.value.path == path and err.value.line == 5
    assert "dampening_frac" in err.value.message


def test_unknown_field_is_rejected_at_its_line(tmp_path: Path):
    path = tmp_path / "typo.yaml"
    path.write_text("name: typo\nhardware: H100\nscheme: FP8\nmethod: rtn\nkv_cache_fp88: true\n")
    with pytest.raises(InputError) as err:
        load_recipe_file(path)
    assert err.value.line == 5 and "kv_cache_fp88" in err.value.message


@pytest.mark.parametrize(
    "body, field",
    [
        (
            "scheme: W4A16\nmethod: gptq\nsmoothquant_strength: 0.5\n",
            "smoothquant",
        ),  # weight-only: SQ is pointless
        ("scheme: FP8\nmethod: rtn\nactorder: group\n", "actorder"),  # GPTQ setting without GPTQ
        ("scheme: MXFP4\nmethod: rtn\n", "scheme"),  # a preset quantkit does not take
        ("scheme: W8A8\nmethod: awq\n", "method"),
    ],
)
def test_inconsistent_recipes_are_rejected(tmp_path: Path, body: str, field: str):
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nhardware: any\n" + body)
    with pytest.raises(InputError) as err:
        load_recipe_file(path)
    assert field in err.value.message


def test_w8a8_builds_smoothquant_then_gptq_on_the_resolved_targets(resolve_on):
    from llmcompressor.modifiers.quantization import GPTQModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    resolved = resolve_on(get_recipe("w8a8-sq-gptq"))
    smooth, gptq = build_modifiers(resolved, smoothquant_mappings=SQ_MAPPINGS)
    assert isinstance(smooth, SmoothQuantModifier) and smooth.smoothing_strength == 0.8
    assert smooth.mappings == SQ_MAPPINGS
    assert isinstance(gptq, GPTQModifier)
    assert (gptq.targets, gptq.ignore, gptq.scheme) == (
        resolved.targets.targets,
        resolved.targets.ignore,
        "W8A8",
    )
    assert "lm_head" in gptq.ignore  # the model's own plan, never the library's "every Linear"
    assert gptq.kv_cache_scheme is None


def test_smoothquant_without_mappings_is_refused(resolve_on):
    with pytest.raises(ValueError, match="smoothquant_mappings"):
        build_modifiers(resolve_on(get_recipe("w8a8-sq-gptq")))


def test_fp8_recipes_use_round_to_nearest(resolve_on):
    from llmcompressor.modifiers.quantization import QuantizationModifier

    for name, scheme in (("fp8", "FP8"), ("fp8-dynamic", "FP8_DYNAMIC")):
        (modifier,) = build_modifiers(resolve_on(get_recipe(name)))
        assert type(modifier) is QuantizationModifier and modifier.scheme == scheme


@pytest.mark.parametrize("name", ["w8a8-sq-gptq", "fp8", "fp8-dynamic", "w4a16"])
def test_kv_cache_option_adds_kv_cache_scheme(name: str, resolve_on):
    recipe = resolve_recipe(name, kv_cache_fp8=True)
    assert recipe.kv_cache_fp8 and recipe.needs_data  # static k/v scales come from data
    resolved = resolve_on(recipe)
    quantizer = build_modifiers(resolved, smoothquant_mappings=SQ_MAPPINGS)[-1]
    kv = quantizer.kv_cache_scheme
    assert (kv.num_bits, kv.type, kv.strategy, kv.dynamic) == (8, "float", "tensor", False)
    assert quantizer.resolve_quantization_config().kv_cache_scheme is not None
    assert resolved.to_dict()["kv_cache_scheme"]["num_bits"] == 8
    assert "kv_cache_scheme" not in resolve_on(get_recipe(name)).to_dict()


def test_resolved_scheme_reports_what_the_library_will_do(resolve_on):
    w4 = resolve_on(get_recipe("w4a16")).to_dict()
    assert w4["weights"]["num_bits"] == 4 and w4["weights"]["group_size"] == 128
    assert w4["format"] == SCHEME_FORMATS["W4A16"] == "pack-quantized"
    assert w4["gptq"] == {"actorder": "static", "dampening_frac": 0.01}
    w8 = resolve_on(get_recipe("w8a8-sq-gptq")).to_dict()
    assert w8["input_activations"]["dynamic"] is True and w8["input_activations"]["strategy"] == "token"
    assert w8["smoothquant"] == {"strength": 0.8}
    fp8 = resolve_on(get_recipe("fp8")).to_dict()
    assert fp8["input_activations"]["dynamic"] is False and fp8["weights"]["strategy"] == "tensor"


def test_scheme_table_states_the_library_presets_facts_as_the_library_has_them():
    """The scheme table's own copies of preset facts (read while a recipe is validated, before
    compressed-tensors is imported) agree with compressed-tensors' presets."""
    from compressed_tensors.quantization import preset_name_to_scheme

    from quantkit.recipes.schemes import SCHEMES, SHIPPED_PRESETS, preset_scheme

    for name, spec in SCHEMES.items():
        scheme = spec.scheme(["Linear"])
        assert scheme.weights.num_bits == spec.weight_bits, name
        inputs = scheme.input_activations
        assert (inputs is not None) == (spec.activations is not None), name
        if inputs is not None:
            assert (inputs.dynamic is True) == (spec.activations == "dynamic"), name
        if spec.per_channel_weights:  # written out: the library's preset of this name is group-wise
            assert (
                scheme.weights.strategy == "channel"
                and preset_name_to_scheme(name, ["Linear"]).weights.group_size
            )
        else:
            library = preset_name_to_scheme(name, ["Linear"])
            assert scheme.model_dump(exclude={"format"}) == library.model_dump(exclude={"format"}), name
        if spec.zero_point_preset:
            asymmetric = spec.scheme(["Linear"], symmetric=False).weights
            assert not asymmetric.symmetric and asymmetric.num_bits == spec.weight_bits, name
        assert all(SCHEMES[p].weight_bits > spec.weight_bits for p in spec.promotes_to), name
    for preset in SHIPPED_PRESETS:
        assert preset_scheme(preset, ["Linear"]).weights is not None


def test_pinned_format_is_on_the_scheme_the_modifier_gets(resolve_on):
    """W4AFP8: compressed-tensors would infer int-quantized; the table pins pack-quantized."""
    recipe = get_recipe("w4a8-fp8")
    assert recipe.spec.pin_format
    (group,) = build_modifiers(resolve_on(recipe))[-1].config_groups.values()
    assert group.format == recipe.checkpoint_format == "pack-quantized"
